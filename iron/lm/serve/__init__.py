"""An OpenAI-compatible HTTP server for a Llama bundle (``python -m iron.lm.serve``, ``iron
serve``), in layers as llama.cpp's server splits them:

- ``request``: a request body checked and parsed into a ``Generation`` (pure: it needs only a
  ``ModelView`` of the model, never a bundle);
- ``bridge``: the model, its continuous-batching engine stepped on the event loop, admission
  and the hand-off of a ``Generation`` to the engine;
- ``limits`` and ``http``: the limits on clients and the HTTP guards that enforce them;
- ``routes``: the endpoints, whole replies and server-sent events;
- ``cli``: the command line (its ``--help`` describes what the server does and refuses).
"""

from .bridge import DEFAULT_SLOTS, GATHER_SECONDS, Server, sampling_defaults
from .cli import main
from .http import allowed_host
from .limits import Limits
from .request import LLAMA_SERVER_SAMPLING, BadRequest, Generation, ModelView
from .routes import create_app, uvicorn_config

__all__ = ["DEFAULT_SLOTS", "GATHER_SECONDS", "LLAMA_SERVER_SAMPLING", "BadRequest",
           "Generation", "Limits", "ModelView", "Server", "allowed_host", "create_app", "main",
           "sampling_defaults", "uvicorn_config"]
