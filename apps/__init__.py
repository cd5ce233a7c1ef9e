"""Applications built with iron: each is a package with an App class (see iron.pipeline.app).

``DEFAULT_APP`` is the one ``doit`` builds when no ``app=`` is given."""

DEFAULT_APP = "llama"
