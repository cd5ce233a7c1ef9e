"""A shared byte store beneath the local artifact store: one machine compiles, the others
download.

As in sccache, ccache's remote storage or Bazel's remote cache, a store entry that is missing
locally is looked up in a shared location before it is built, and an entry built here is
uploaded for the others.  This module knows only keys and bytes: the local store
(``iron.store``) packs an entry into bytes, hands them to ``put``, and unpacks and checks what
``get`` returns; it is given a ``RemoteCache`` and never imports this module, and this module
never imports it.  The location is anything ``fsspec`` opens: ``s3://bucket/prefix`` (with
``s3fs``), ``file:///shared/dir``, ...  Configuration comes from the environment, read once per
process by ``from_env``:

- ``IRON_REMOTE_CACHE=URL``: the location; unset, there is no remote tier.
- ``IRON_REMOTE_CACHE_KEY``: the HMAC-SHA256 key that signs every uploaded object.
- ``IRON_REMOTE_CACHE_MODE=rw|ro``: ``ro`` never writes; the default is ``rw`` with a key and
  ``ro`` without one.

Each key is one object, ``<URL>/<key>.v2``, the stored bytes being a header line
(``iron-remote-cache-v2``), the body (what the store packed), and a trailer line holding the
HMAC-SHA256 of the header, the key and the body, then the sha256 of the key and every byte
before it (so a reader without the key still sees any flipped byte).  (``.v2``: objects of the
earlier format, a signed manifest inside a zip, are simply not looked at.)

Trust: a shared compiled library is code that this process will load.  So every object is
verified over its bytes as stored, before anything decompresses or unpacks them: a reader with
the key accepts an object only if its hash and its signature verify for the key it asked for,
so a flipped byte anywhere (header, body, trailer) or an object copied under another key's name
is rejected with one warning line and built here instead.  What the store then finds wrong in
verified bytes (an archive that does not unpack, a manifest for another key) it reports through
``reject``, with the same one line.  The rule without a key: only a local location (``file://``
or a plain path) may be used, and only read: objects are then checked against their hash, and
trust rests on who may write that directory (its permissions).  Any other URL without a key is
refused, and so is ``rw`` without a key.

Objects are written once and never overwritten: on S3 with a conditional PUT
(``If-None-Match: *``), in a directory with a hard link (``link`` fails if the name exists); so
of two concurrent writers of one key, one object survives, whole.  Other fsspec backends fall
back to fsspec's check-then-write, which a racing writer can defeat; a reader still rejects
whatever does not verify.  A rejected object is left in place (write-once): each reader rejects
it and builds locally until someone removes it.

The remote tier never breaks a build: an unreachable location costs one warning line, after
which this process goes on without it.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import os
import re
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any, TextIO

from .errors import IronError
from .util import write_aside

HEADER = b"iron-remote-cache-v2\n"
SUFFIX = ".v2"
_TRAILER = re.compile(rb"\n([0-9a-f]{64}) ([0-9a-f]{64})\n")  # signature, hash
TRAILER_BYTES = 1 + 64 + 1 + 64 + 1
MIN_KEY_CHARS = 32
#: Largest object read (a compiled entry is kilobytes to a few megabytes).
MAX_BYTES = 1 << 30


class RemoteCacheError(IronError, ValueError):
    """The remote cache is misconfigured (bad URL, mode or key for the trust rule)."""


class Rejected(Exception):
    """A remote object that does not verify; the message says why."""


def _signed_part(key: str, body: bytes) -> bytes:
    return HEADER + key.encode() + b"\n" + body


def signature(secret: bytes, key: str, body: bytes) -> str:
    """The HMAC-SHA256 of an object's header, key and body: what a reader with the key checks."""
    return hmac.new(secret, _signed_part(key, body), hashlib.sha256).hexdigest()


def _digest(key: str, before: bytes) -> bytes:
    return hashlib.sha256(key.encode() + b"\n" + before).hexdigest().encode()


def seal(key: str, body: bytes, secret: bytes) -> bytes:
    """The stored bytes of ``body`` under ``key``: header, body, then its signature and hash."""
    before = HEADER + body + f"\n{signature(secret, key, body)} ".encode()
    return before + _digest(key, before) + b"\n"


def unseal(key: str, data: bytes, secret: bytes | None) -> bytes:
    """The body of the stored bytes ``data`` of ``key`` if its hash (and, with ``secret``, its
    signature) verify, else ``Rejected``; nothing in ``data`` is interpreted before that."""
    if len(data) > MAX_BYTES:
        raise Rejected(f"larger than {MAX_BYTES >> 20} MiB")
    if not data.startswith(HEADER):
        raise Rejected(f"not an iron cache object: it does not start with "
                       f"{HEADER[:-1].decode()}")
    trailer = _TRAILER.fullmatch(data, len(data) - TRAILER_BYTES)
    if len(data) < len(HEADER) + TRAILER_BYTES or trailer is None:
        raise Rejected("its trailer (hash and signature) is missing or damaged")
    if _digest(key, data[:len(data) - 65]) != trailer[2]:
        raise Rejected(f"its bytes do not match its hash for key {key}")
    body = data[len(HEADER):len(data) - TRAILER_BYTES]
    if secret is not None and not hmac.compare_digest(
            trailer[1], signature(secret, key, body).encode()):
        raise Rejected("the signature does not verify with IRON_REMOTE_CACHE_KEY")
    return body


def signing_key(environ=os.environ) -> bytes | None:
    """``IRON_REMOTE_CACHE_KEY`` as a key, or None when it is unset; too short a key is refused
    in one line. Bundles are signed with the same key (``iron.pipeline.bundle``)."""
    secret = environ.get("IRON_REMOTE_CACHE_KEY") or None
    return check_key(secret.encode()) if secret is not None else None


def check_key(secret: bytes) -> bytes:
    """``secret``, if it is long enough to sign with."""
    if len(secret) < MIN_KEY_CHARS:
        raise RemoteCacheError(
            f"IRON_REMOTE_CACHE_KEY is {len(secret)} characters; a signing key needs at "
            f"least {MIN_KEY_CHARS} (make one with: python -c 'import secrets; "
            "print(secrets.token_hex(32))')")
    return secret


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
        if secret is not None:
            check_key(secret)
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
        return f"{self._filesystem()[1]}/{key}{SUFFIX}"

    def object_url(self, key: str) -> str:
        return f"{self.url}/{key}{SUFFIX}"

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

    # ---- the byte store ------------------------------------------------------------------------

    @property
    def writes(self) -> bool:
        """Whether ``put`` uploads (``rw`` and still reachable): the store packs only then."""
        return self.mode == "rw" and not self.disabled

    def get(self, key: str) -> bytes | None:
        """The verified body stored under ``key``; None on a miss, when the location is
        unreachable, or when the object is rejected (one warning line)."""
        if self.disabled:
            return None
        fs, _ = self._filesystem()
        try:  # bounded: at most MAX_BYTES + 1 bytes of an object are read
            data = fs.cat_file(self.object_path(key), start=0, end=MAX_BYTES + 1)
        except FileNotFoundError:
            self._count("misses")
            return None
        except Exception as e:  # an unreachable server must not break the build
            self._give_up("reading", e)
            return None
        try:
            return unseal(key, data, self.secret)
        except Rejected as e:
            self.reject(key, str(e))
            return None

    def reject(self, key: str, reason: str) -> None:
        """Count the object of ``key`` as rejected, in one warning line (its caller builds the
        entry here instead)."""
        self._count("rejected")
        self._warn(f"rejected {self.object_url(key)} ({reason}); building it here")

    def hit(self, key: str) -> None:
        """Count a body ``get`` returned that its caller installed."""
        self._count("hits")

    def put(self, key: str, body: bytes) -> bool:
        """Upload ``body`` under ``key``, signed, unless an object is there; True if written."""
        if not self.writes:
            return False
        assert self.secret is not None  # rw without a key is refused at construction
        try:
            written = self.put_once(self.object_path(key), seal(key, body, self.secret))
        except Exception as e:
            self._give_up("uploading", e)
            return False
        self._count("uploads" if written else "already_there")
        return written

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
    tmp = write_aside(path, data)  # readable as the umask allows, like any file iron writes
    try:
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
