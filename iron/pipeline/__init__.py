"""The build pipeline: the application interface, model bundles and the doit task graph."""
