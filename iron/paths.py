"""Where generated files go: everything under the project's ``build/`` folder.

Read once, at the entry points: ``$IRON_BUILD_DIR`` moves the whole build folder and
``$IRON_CACHE_DIR`` moves only the artifact cache.  Outside a source checkout (an installed
iron, a bundle run elsewhere) the build folder is ``~/.cache/iron``.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
KERNELS_DIR = PACKAGE_DIR / "kernels"


def project_root() -> Path | None:
    """The source checkout iron runs from, if it does (holds pyproject.toml beside iron/)."""
    root = PACKAGE_DIR.parent
    return root if (root / "pyproject.toml").is_file() else None


def build_dir() -> Path:
    env = os.environ.get("IRON_BUILD_DIR")
    if env:
        return Path(env)
    root = project_root()
    return root / "build" if root else Path.home() / ".cache" / "iron"


def cache_dir() -> Path:
    env = os.environ.get("IRON_CACHE_DIR")
    return Path(env) if env else build_dir() / "ops"
