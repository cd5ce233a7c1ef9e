"""A shared tier behind the local artifact store: one machine compiles, the others download.

As in sccache, ccache's remote storage or Bazel's remote cache, a store entry that is missing
locally is looked up in a shared location before it is built, and an entry built here is
uploaded for the others.  The location is anything ``fsspec`` opens: ``s3://bucket/prefix``
(with ``s3fs``), ``file:///shared/dir``, ...  Configuration comes from the environment, read
once per process by ``from_env``:

- ``IRON_REMOTE_CACHE=URL``: the location; unset, there is no remote tier.
- ``IRON_REMOTE_CACHE_KEY``: the HMAC-SHA256 key that signs every uploaded manifest.
- ``IRON_REMOTE_CACHE_MODE=rw|ro``: ``ro`` never writes; the default is ``rw`` with a key and
  ``ro`` without one.

Trust: a shared compiled library is code that this process will load.  So every object is
signed, and a reader with the key accepts an object only if its signature verifies, its
manifest names the key it was asked for and hashes to it, and every output matches its hash;
anything else is rejected with one warning line and built here instead.  The rule without a
key: only a local location (``file://`` or a plain path) may be used, and only read: objects
are then checked against their hashes, and trust rests on who may write that directory (its
permissions).  Any other URL without a key is refused, and so is ``rw`` without a key.

Each entry is one object, ``<URL>/<key>.zip``, holding the entry's ``manifest.json`` (the local
store's manifest, byte for byte), ``signature`` (hex HMAC-SHA256 of the manifest) and the
output files.  Objects are written once and never overwritten: on S3 with a conditional PUT
(``If-None-Match: *``), in a directory with a hard link (``link`` fails if the name exists);
so of two concurrent writers of one key, one object survives, whole.  Other fsspec backends
fall back to fsspec's check-then-write, which a racing writer can defeat; a reader still
rejects whatever does not verify.  A rejected object is left in place (write-once): each reader
rejects it and builds locally until someone removes it.

The remote tier never breaks a build: an unreachable location costs one warning line, after
which this process goes on without it.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import io
import json
import os
import re
import sys
import threading
import zipfile
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from .errors import IronError
from .util import write_aside

if TYPE_CHECKING:  # the store imports this module; only its type is needed here
    from .store import Entry, Store

MANIFEST = "manifest.json"
SIGNATURE = "signature"
#: Prefixed to the manifest before it is signed, so a signature means "an iron cache entry".
DOMAIN = b"iron-remote-cache-v1\n"
MIN_KEY_CHARS = 32
#: Largest object accepted (declared uncompressed size of all members).
MAX_BYTES = 1 << 30
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # fixed, so one entry always packs to the same bytes


class RemoteCacheError(IronError, ValueError):
    """The remote cache is misconfigured (bad URL, mode or key for the trust rule)."""


class Rejected(Exception):
    """A remote object that does not verify; the message says why."""


def signature(secret: bytes, manifest: bytes) -> str:
    return hmac.new(secret, DOMAIN + manifest, hashlib.sha256).hexdigest()


def is_local(url: str) -> bool:
    """Whether ``url`` names a directory on this machine (or a mount of it)."""
    scheme = url.split("://", 1)[0] if "://" in url else "file"
    return scheme in ("file", "local")


class RemoteCache:
    """One remote location; counts what it did (``hits``, ``misses``, ``uploads``, ...)."""

    def __init__(self, url: str, mode: str | None = None, secret: str | bytes | None = None,
                 out: TextIO | None = None, **storage_options: Any):
        if isinstance(secret, str):
            secret = secret.encode()
        mode = mode or ("rw" if secret else "ro")
        where = f"IRON_REMOTE_CACHE={url}"
        if mode not in ("rw", "ro"):
            raise RemoteCacheError(f"IRON_REMOTE_CACHE_MODE={mode!r}: must be rw or ro")
        if secret is not None and len(secret) < MIN_KEY_CHARS:
            raise RemoteCacheError(
                f"IRON_REMOTE_CACHE_KEY is {len(secret)} characters; a signing key needs at "
                f"least {MIN_KEY_CHARS} (make one with: python -c 'import secrets; "
                "print(secrets.token_hex(32))')")
        if not secret and not is_local(url):
            raise RemoteCacheError(
                f"{where}: without IRON_REMOTE_CACHE_KEY only a local directory (file://) can "
                "be read, since a downloaded library is code and only a signature says who "
                "built it; set IRON_REMOTE_CACHE_KEY to the team's signing key")
        if not secret and mode == "rw":
            raise RemoteCacheError(
                f"{where} with IRON_REMOTE_CACHE_MODE=rw: uploads are signed, so writing needs "
                "IRON_REMOTE_CACHE_KEY; set it, or use IRON_REMOTE_CACHE_MODE=ro")
        self.url = url.rstrip("/")
        self.mode = mode
        self.secret = secret or None
        self.out = out
        self.storage_options = storage_options
        self.counts: Counter[str] = Counter()
        self.disabled: str | None = None  # why this process stopped using the tier
        self._lock = threading.Lock()
        self._fs_pid: tuple[Any, str, int] | None = None
        self._filesystem()  # a URL fsspec cannot open is refused now, not at the first build

    def __getstate__(self) -> dict[str, Any]:
        """Sent to another process (doit -n, a Dask worker): configuration only."""
        state = dict(self.__dict__, counts=Counter(), _fs_pid=None, out=None)
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _lock=threading.Lock())

    def __repr__(self) -> str:
        return f"RemoteCache({self.url!r}, {self.mode})"

    def _filesystem(self) -> tuple[Any, str]:
        """The fsspec filesystem and root path, opened once per process (a fork opens anew)."""
        if self._fs_pid is None or self._fs_pid[2] != os.getpid():
            try:
                import fsspec
            except ImportError:
                raise RemoteCacheError(f"IRON_REMOTE_CACHE={self.url}: the remote cache needs "
                                       "fsspec; install iron[remote]") from None
            try:
                fs, root = fsspec.core.url_to_fs(self.url, **self.storage_options)
            except (ImportError, ValueError) as e:
                raise RemoteCacheError(f"IRON_REMOTE_CACHE={self.url}: fsspec cannot open it "
                                       f"({e}); for s3:// install iron[remote]") from None
            self._fs_pid = (fs, root, os.getpid())
        return self._fs_pid[0], self._fs_pid[1]

    def object_path(self, key: str) -> str:
        return f"{self._filesystem()[1]}/{key}.zip"

    def object_url(self, key: str) -> str:
        return f"{self.url}/{key}.zip"

    # ---- counting and warnings ----------------------------------------------------------------

    def _count(self, what: str) -> None:
        with self._lock:
            self.counts[what] += 1

    def take_counts(self) -> dict[str, int]:
        """The counts since the last call (a doit task reports its own share this way)."""
        with self._lock:
            counts, self.counts = dict(self.counts), Counter()
        return counts

    def _warn(self, text: str) -> None:
        print(f"warning: remote cache: {text}", file=self.out or sys.stderr, flush=True)

    def _give_up(self, doing: str, error: BaseException) -> None:
        self.disabled = f"{doing} failed: {type(error).__name__}: {error}"
        self._warn(f"{self.url}: {self.disabled}; going on without the remote cache in this "
                   "process")

    # ---- reading --------------------------------------------------------------------------------

    def fetch(self, store: Store, key: str) -> Entry | None:
        """Download ``key`` into ``store`` if the remote has a good object; None on a miss.

        A rejected object counts as ``rejected`` and is reported in one warning line.
        """
        if self.disabled:
            return None
        fs, _ = self._filesystem()
        try:
            data = fs.cat_file(self.object_path(key))
        except FileNotFoundError:
            self._count("misses")
            return None
        except Exception as e:  # an unreachable server must not break the build
            self._give_up("reading", e)
            return None
        try:
            manifest, files = self.verify(key, data)
        except Rejected as e:
            self._count("rejected")
            self._warn(f"rejected {self.object_url(key)} ({e}); building it here")
            return None

        def fill(folder: Path) -> None:
            for name, content in files.items():
                (folder / name).write_bytes(content)
            (folder / MANIFEST).write_bytes(manifest)

        entry = store.install(key, fill)
        if entry is None:  # cannot happen for a verified object unless the disk lies
            self._count("rejected")
            self._warn(f"{self.object_url(key)} verified but its local copy did not; building "
                       "it here")
            return None
        self._count("hits")
        return entry

    def verify(self, key: str, data: bytes) -> tuple[bytes, dict[str, bytes]]:
        """The manifest bytes and output files of a good object, or raise ``Rejected``."""
        from .store import artifact_key  # the store imports this module

        try:
            archive = zipfile.ZipFile(io.BytesIO(data))
            infos = archive.infolist()
        except (zipfile.BadZipFile, ValueError, OSError) as e:
            raise Rejected(f"not a zip archive: {e}") from None
        names = [i.filename for i in infos]
        if len(set(names)) != len(names):
            raise Rejected("an archive member appears twice")
        if sum(i.file_size for i in infos) > MAX_BYTES:
            raise Rejected(f"larger than {MAX_BYTES >> 20} MiB")
        if MANIFEST not in names or SIGNATURE not in names:
            raise Rejected(f"no {MANIFEST} or no {SIGNATURE}")
        try:
            manifest = archive.read(MANIFEST)
            signed = archive.read(SIGNATURE).decode("ascii").strip()
        except (zipfile.BadZipFile, UnicodeDecodeError, OSError) as e:
            raise Rejected(f"unreadable: {e}") from None
        if self.secret is not None and not hmac.compare_digest(
                signed, signature(self.secret, manifest)):
            raise Rejected("the signature does not verify with IRON_REMOTE_CACHE_KEY")
        try:
            doc = json.loads(manifest)
            outputs = doc["outputs"]
            if doc["key"] != key or artifact_key(doc["inputs"]) != key:
                raise Rejected(f"its manifest is for key {doc['key']}, not {key}")
            if not isinstance(outputs, dict) or not outputs:
                raise Rejected("its manifest lists no outputs")
        except (ValueError, KeyError, TypeError) as e:
            raise Rejected(f"malformed manifest: {e}") from None
        expected = {*outputs, MANIFEST, SIGNATURE}
        if set(names) != expected:
            raise Rejected(f"members {sorted(names)} are not the manifest's outputs "
                           f"{sorted(outputs)}")
        files = {}
        for name, digest in outputs.items():
            if not _NAME.fullmatch(name) or name in (MANIFEST, SIGNATURE):
                raise Rejected(f"output name {name!r} is not a plain file name")
            try:
                content = archive.read(name)
            except (zipfile.BadZipFile, OSError) as e:
                raise Rejected(f"{name} unreadable: {e}") from None
            if hashlib.sha256(content).hexdigest() != digest:
                raise Rejected(f"{name} does not match its hash in the manifest")
            files[name] = content
        return manifest, files

    # ---- writing --------------------------------------------------------------------------------

    def publish(self, entry: Entry) -> bool:
        """Upload a freshly built local entry unless the remote has one; True if written."""
        if self.mode != "rw" or self.disabled:
            return False
        assert self.secret is not None  # rw without a key is refused at construction
        try:
            data = self.pack(entry)
            written = self.put_once(self.object_path(entry.key), data)
        except Exception as e:
            self._give_up("uploading", e)
            return False
        self._count("uploads" if written else "already_there")
        return written

    def pack(self, entry: Entry) -> bytes:
        """The object of ``entry``: manifest, signature and outputs, always the same bytes."""
        manifest = (entry.path / MANIFEST).read_bytes()
        members = [(MANIFEST, manifest),
                   (SIGNATURE, signature(self.secret, manifest).encode())]
        members += [(name, (entry.path / name).read_bytes())
                    for name in sorted(entry.manifest["outputs"])]
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as archive:
            for name, content in members:
                info = zipfile.ZipInfo(name, _ZIP_TIME)
                info.compress_type = zipfile.ZIP_DEFLATED
                info.external_attr = 0o644 << 16
                archive.writestr(info, content)
        return buffer.getvalue()

    def put_once(self, path: str, data: bytes) -> bool:
        """Write ``data`` at ``path`` unless something is there; True if this call wrote it."""
        fs, _ = self._filesystem()
        if is_local(self.url):
            return _link_once(Path(path), data)
        try:
            fs.pipe_file(path, data, mode="create")
        except FileExistsError:
            return False
        return True

    def summary(self, counts: dict[str, int]) -> str:
        """One line for the end of a run."""
        c = Counter(counts)
        line = (f"remote cache {self.url} ({self.mode}): {c['hits']} hits (downloaded), "
                f"{c['misses']} misses, {c['uploads']} uploads")
        extra = [f"{c['rejected']} rejected"] if c["rejected"] else []
        if c["already_there"]:
            extra.append(f"{c['already_there']} already uploaded by another writer")
        return line + (f", {', '.join(extra)}" if extra else "")


def _link_once(path: Path, data: bytes) -> bool:
    """Create ``path`` with ``data`` atomically, never replacing it: write aside, then link."""
    tmp = write_aside(path, data)
    try:
        os.chmod(tmp, 0o644)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        return True
    finally:
        os.unlink(tmp)


@functools.lru_cache(maxsize=None)
def from_env() -> RemoteCache | None:
    """The remote tier the environment configures (read once per process), or None."""
    url = os.environ.get("IRON_REMOTE_CACHE", "").strip()
    if not url:
        return None
    return RemoteCache(url, os.environ.get("IRON_REMOTE_CACHE_MODE") or None,
                       os.environ.get("IRON_REMOTE_CACHE_KEY") or None)
