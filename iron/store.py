"""The artifact store: compiled operator instances, content-addressed, built atomically.

An artifact's key is the hash of everything that can change its bytes (the target supplies
that description: operator, fields, device, kernel sources and headers, compiler identity,
flags, recipe version).  Entries live in ``<cache>/<key>/``; each is built in a temporary folder
beside it and renamed into place, with a ``manifest.json`` recording what went in and the hash
of every file that came out.  An entry whose manifest is missing or whose files do not match it
is damaged: it is moved aside and rebuilt, never loaded.  Two processes building one key both
succeed: the first rename wins and the other discards its copy.

A store may have a remote tier (``iron.remote_cache``) shared by a team: an entry missing here
is downloaded from it before it is built, and an entry built here is uploaded to it.  The
default store (no folder given) takes its remote tier from the environment.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .remote_cache import RemoteCache, from_env as remote_from_env
from .paths import cache_dir
from .util import sha256_bytes, sha256_file

MANIFEST = "manifest.json"


def artifact_key(description: dict[str, Any]) -> str:
    """The key of an artifact: a hash of its JSON description (key order does not matter)."""
    return sha256_bytes(json.dumps(description, sort_keys=True).encode())[:32]


@dataclass(frozen=True)
class Entry:
    """A good cache entry: its folder and its manifest."""

    key: str
    path: Path
    manifest: dict[str, Any]

    def file(self, name: str) -> Path:
        return self.path / name


class Store:
    """A folder of artifacts keyed by ``artifact_key``."""

    def __init__(self, root: Path | str | None = None,
                 remote: RemoteCache | None = None):
        if root is None and remote is None:
            remote = remote_from_env()  # the default store is the configured one
        self.root = Path(root) if root is not None else cache_dir()
        self.remote = remote

    def path(self, key: str) -> Path:
        return self.root / key

    def lookup(self, key: str) -> Entry | None:
        """The entry for ``key`` if it is present and intact, else None."""
        path = self.path(key)
        try:
            manifest = json.loads((path / MANIFEST).read_text())
            outputs = manifest["outputs"]
            if manifest["key"] != key or not outputs:
                return None
            for name, digest in outputs.items():
                if sha256_file(path / name) != digest:
                    return None
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return Entry(key, path, manifest)

    def get_or_build(self, key: str, inputs: dict[str, Any],
                     build: Callable[[Path], None]) -> Entry:
        """The entry for ``key``, building it with ``build(tmpdir)`` if it is absent or damaged.

        ``build`` writes its outputs into the folder it is given; on failure it raises and
        nothing is left in the cache.
        """
        entry = self.lookup(key)
        if entry is not None:
            return entry
        if self.remote is not None:
            entry = self.remote.fetch(self, key)
            if entry is not None:
                return entry

        def fill(folder: Path) -> None:
            build(folder)
            outputs = {p.name: sha256_file(p) for p in sorted(folder.iterdir()) if p.is_file()}
            manifest = {"key": key, "inputs": inputs, "outputs": outputs}
            (folder / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))

        entry = self.install(key, fill)
        if entry is None:
            raise RuntimeError(f"artifact {key} was built but does not verify in {self.root}")
        if self.remote is not None:
            self.remote.publish(entry)
        return entry

    def install(self, key: str, fill: Callable[[Path], None]) -> Entry | None:
        """Install the entry ``fill(tmpdir)`` writes (outputs and manifest); None if it does
        not verify.  Nothing is left behind when ``fill`` raises."""
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=self.root))
        try:
            fill(tmp)
            self._install(key, tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return self.lookup(key)

    def _install(self, key: str, tmp: Path) -> None:
        target = self.path(key)
        for _ in range(3):
            try:
                os.rename(tmp, target)
                return
            except OSError:
                if self.lookup(key) is not None:
                    return  # another process installed a good copy first
                self._discard(target)
        raise RuntimeError(f"could not install artifact {key} in {self.root}")

    def _discard(self, path: Path) -> None:
        """Move a damaged entry out of the way, then delete it."""
        trash = path.with_name(f".trash-{path.name}-{uuid.uuid4().hex[:8]}")
        try:
            os.rename(path, trash)
        except OSError:
            return
        shutil.rmtree(trash, ignore_errors=True)

    def keys(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if not p.name.startswith("."))

    def remove(self, key: str) -> None:
        self._discard(self.path(key))
