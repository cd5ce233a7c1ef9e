"""Applications built with iron: each is a package with an App class (see iron.pipeline.app)."""
