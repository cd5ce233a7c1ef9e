"""The artifact store this process uses: the local store (``$IRON_CACHE_DIR``, else
``build/ops``) over the remote tier the environment configures (``$IRON_REMOTE_CACHE``).

Neither ``iron.store`` nor ``iron.remote_cache`` imports the other: the store is given its
tier, and this is where the two are put together for the targets and the build.
"""

from __future__ import annotations

from .remote_cache import from_env
from .store import Store


def default_store() -> Store:
    """A store of the configured cache folder over the configured remote tier (read once)."""
    return Store(remote=from_env())
