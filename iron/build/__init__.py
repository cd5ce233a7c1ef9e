"""Building: the artifact store, the doit task graph and model bundles."""
