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

A store may sit over a remote tier shared by a team (``iron.remote_cache``, given to the store,
never imported by it): a byte store of keys and bytes (``Tier``).  An entry missing here is
fetched from it before it is built: the tier verifies the object's bytes as stored, then the
store unpacks them (``unpack``) and checks them as it checks any entry (the manifest names this
key and hashes to it, every output matches its hash).  Whatever fails after the tier's check,
an archive that does not decompress included, rejects the object in one warning line and the
entry is built here.  An entry built here is packed (``pack``) and uploaded.
``iron.cache.default_store`` is the store the environment configures.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import re
import shutil
import time
import uuid
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

from .errors import IronError
from .jsonfile import loads
from .paths import cache_dir
from .util import make_temp_dir, sha256_bytes, sha256_file

MANIFEST = "manifest.json"
USED = "used"  # an empty file whose mtime is the entry's last use
#: A shared cache keeps an entry nothing references until nothing has used it for this long.
SHARED_KEEP_DAYS = 7
#: A temporary folder younger than this is left alone even if unlocked (a build between
#: creating it and taking its lock).
TEMP_GRACE_SECONDS = 60
#: Largest entry unpacked from a remote object (declared uncompressed size of all members).
MAX_UNPACKED = 1 << 30
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # fixed, so one entry always packs to the same bytes


class Tier(Protocol):
    """What a store needs of the remote tier below it (``iron.remote_cache.RemoteCache``)."""

    writes: bool  # whether ``put`` uploads: entries are packed only then

    def get(self, key: str) -> bytes | None:
        """The verified bytes stored under ``key``, or None (a miss, unreachable, rejected)."""

    def put(self, key: str, body: bytes) -> bool:
        """Store ``body`` under ``key`` unless something is there; never raises."""

    def reject(self, key: str, reason: str) -> None:
        """Report (one warning line) that the bytes of ``key`` were unusable."""

    def hit(self, key: str) -> None:
        """Report that the bytes of ``key`` were installed."""


class BadObject(ValueError):
    """Bytes from the remote tier that do not unpack into an entry of their key."""


@contextlib.contextmanager
def locked_temp_folder(parent: Path, prefix: str):
    """A fresh folder in ``parent`` held under an exclusive ``flock`` until the block ends
    (then deleted if it is still there); ``collect_temp`` never removes a held one."""
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = make_temp_dir(parent, prefix)  # as the umask allows: others may read the result
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

    def __init__(self, root: Path | str | None = None, remote: Tier | None = None):
        self.root = Path(root) if root is not None else cache_dir()
        self.remote = remote

    def path(self, key: str) -> Path:
        return self.root / key

    def lookup(self, key: str) -> Entry | None:
        """The entry for ``key`` if it is present and intact, else None."""
        path = self.path(key)
        try:
            manifest = loads((path / MANIFEST).read_text())
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
            entry = self._fetch(key)
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
        if self.remote is not None and self.remote.writes:
            self.remote.put(key, pack(entry))
        return entry

    def _fetch(self, key: str) -> Entry | None:
        """The entry for ``key`` from the remote tier, installed here; None on a miss or when
        its bytes do not make a good entry (rejected, in one warning line)."""
        body = self.remote.get(key)
        if body is None:
            return None
        try:
            files = unpack(key, body)
        except BadObject as e:
            self.remote.reject(key, str(e))
            return None
        except Exception as e:  # whatever a damaged archive raises: zlib.error, EOFError, ...
            kind = type(e).__qualname__
            if type(e).__module__ != "builtins":
                kind = f"{type(e).__module__}.{kind}"
            self.remote.reject(key, f"it does not unpack: {kind}: {e}")
            return None

        def fill(folder: Path) -> None:
            for name, content in files.items():
                (folder / name).write_bytes(content)

        entry = self.install(key, fill)
        if entry is None:  # cannot happen for a checked object unless the disk lies
            self.remote.reject(key, "it unpacked but its local copy does not verify")
            return None
        self.remote.hit(key)
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


def pack(entry: Entry) -> bytes:
    """An entry as bytes for the remote tier: a zip of its manifest (byte for byte) and outputs,
    always the same bytes for the same entry."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name in [MANIFEST, *sorted(entry.manifest["outputs"])]:
            info = zipfile.ZipInfo(name, _ZIP_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, (entry.path / name).read_bytes())
    return buffer.getvalue()


def unpack(key: str, body: bytes) -> dict[str, bytes]:
    """The files (manifest included) of the entry ``pack`` made ``body`` of, checked as
    ``Store.lookup`` checks an entry: the manifest is for ``key`` and hashes to it, names only
    plain files, and every output matches its hash.  ``BadObject`` says what is wrong; a
    damaged archive may raise anything zipfile and zlib raise."""
    archive = zipfile.ZipFile(io.BytesIO(body))
    infos = archive.infolist()
    names = [i.filename for i in infos]
    if len(set(names)) != len(names):
        raise BadObject("an archive member appears twice")
    if sum(i.file_size for i in infos) > MAX_UNPACKED:
        raise BadObject(f"it unpacks to more than {MAX_UNPACKED >> 20} MiB")
    if MANIFEST not in names:
        raise BadObject(f"it has no {MANIFEST}")
    manifest = archive.read(MANIFEST)
    try:
        doc = loads(manifest)
        named, outputs = doc["key"], doc["outputs"]
        hashes_to = artifact_key(doc["inputs"])
    except (ValueError, KeyError, TypeError) as e:
        raise BadObject(f"malformed manifest: {type(e).__name__}: {e}") from None
    if named != key or hashes_to != key:
        raise BadObject(f"its manifest is for key {named if named != key else hashes_to}, "
                        f"not {key}")
    if not isinstance(outputs, dict) or not outputs:
        raise BadObject("its manifest lists no outputs")
    if set(names) != {*outputs, MANIFEST}:
        raise BadObject(f"members {sorted(names)} are not the manifest's outputs "
                        f"{sorted(outputs)}")
    files = {MANIFEST: manifest}
    for name, digest in outputs.items():
        if not _NAME.fullmatch(name) or name == MANIFEST:
            raise BadObject(f"output name {name!r} is not a plain file name")
        content = archive.read(name)
        if hashlib.sha256(content).hexdigest() != digest:
            raise BadObject(f"{name} does not match its hash in the manifest")
        files[name] = content
    return files
