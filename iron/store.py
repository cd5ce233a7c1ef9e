"""The artifact store: compiled operator instances, content-addressed, built atomically.

An artifact's key is the hash of everything that can change its bytes (the target supplies
that description: operator, fields, device, kernel sources and headers, compiler identity,
flags, recipe version).  Entries live in ``<cache>/<key>/``; each is built in a temporary folder
beside it and renamed into place, with a ``manifest.json`` recording what went in and the hash
of every file that came out.  An entry whose manifest is missing or whose files do not match it
is damaged: it is moved aside and rebuilt, never loaded.  Two processes building one key both
succeed: the first rename wins and the other discards its copy.

Garbage collection is safe beside running builds and other checkouts: a build holds a lock on
its temporary folder (``flock``, released by the kernel if the process dies), and ``collect``
removes only temporary folders nobody holds that are older than a minute.  Each lookup stamps
the entry's ``used`` file, so a cache shared between checkouts (``$IRON_CACHE_DIR``) drops
only entries nothing has used for ``SHARED_KEEP_DAYS`` days, unless told otherwise.

A store may have a remote tier (``iron.remote_cache``) shared by a team: an entry missing here
is downloaded from it before it is built, and an entry built here is uploaded to it.  The
default store (no folder given) takes its remote tier from the environment.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .errors import IronError
from .remote_cache import RemoteCache, from_env as remote_from_env
from .paths import cache_dir
from .util import sha256_bytes, sha256_file

MANIFEST = "manifest.json"
USED = "used"  # an empty file whose mtime is the entry's last use
#: A shared cache keeps an entry nothing references until nothing has used it for this long.
SHARED_KEEP_DAYS = 7
#: A temporary folder younger than this is left alone even if unlocked (a build between
#: creating it and taking its lock).
TEMP_GRACE_SECONDS = 60


@contextlib.contextmanager
def locked_temp_folder(parent: Path, prefix: str):
    """A fresh folder in ``parent`` held under an exclusive ``flock`` until the block ends
    (then deleted if it is still there); ``collect_temp`` never removes a held one."""
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    except OSError as e:
        raise IronError(f"cannot create a build folder in {parent} ({e.strerror}); make it "
                        "writable or point $IRON_BUILD_DIR / $IRON_CACHE_DIR elsewhere") from None
    fd = os.open(tmp, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        os.close(fd)


def collect_temp(folders, grace: float = TEMP_GRACE_SECONDS) -> list[Path]:
    """Remove the folders of ``folders`` that no process holds and that are older than
    ``grace`` seconds; return those removed."""
    removed = []
    for path in folders:
        try:
            if time.time() - path.stat().st_mtime < grace:
                continue
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # a running build holds it
        try:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        finally:
            os.close(fd)
    return removed


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
        self.touch(key)
        return Entry(key, path, manifest)

    def touch(self, key: str) -> None:
        """Stamp ``key`` as used now (what a shared cache's garbage collection goes by)."""
        try:
            (self.path(key) / USED).touch()
        except OSError:
            pass  # a read-only cache is still a cache

    def last_used(self, key: str) -> float:
        for name in (USED, MANIFEST):
            try:
                return (self.path(key) / name).stat().st_mtime
            except OSError:
                continue
        return 0.0

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
        with locked_temp_folder(self.root, f".tmp-{key}-") as tmp:
            fill(tmp)
            self._install(key, tmp)
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

    def collect(self, keep: set[str], max_idle_days: float | None) -> tuple[list[str], int]:
        """Remove entries not in ``keep`` (only those unused for ``max_idle_days``, when
        given) and abandoned temporary folders; return (removed keys, temp folders removed)."""
        cutoff = None if max_idle_days is None else time.time() - max_idle_days * 86400
        removed = [k for k in self.keys() if k not in keep
                   and (cutoff is None or self.last_used(k) < cutoff)]
        for key in removed:
            self.remove(key)
        temp = []
        if self.root.is_dir():
            temp = collect_temp(p for p in self.root.iterdir()
                                if p.name.startswith((".tmp-", ".trash-")) and p.is_dir())
        return removed, len(temp)
