"""Small helpers shared by the store, the profile and the bundle: atomic writes that follow the
umask, hashing, bounded reads of the files users hand iron, and number options."""

from __future__ import annotations

import argparse
import errno
import hashlib
import math
import os
import stat
import tempfile
from pathlib import Path
from typing import BinaryIO

#: The most bytes iron reads from a file a user gives it whole (a profile, a model's
#: config.json, tokenizer.json or chat template): far above any real one (a 50,000-entry
#: profile is 5 MiB, the largest tokenizers 35 MiB), low enough that a wrong path (a disk
#: image, /dev/zero) is refused instead of filling memory.
MAX_USER_FILE = 64 << 20


class RefusedFile(OSError):
    """A file iron will not read: not a regular file, or larger than its limit.  An
    ``OSError``, so every caller that reports unreadable files reports these in one line;
    ``str()`` is the reason alone."""

    def __str__(self) -> str:
        return self.strerror


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "a special file"


def open_regular(path: str | os.PathLike) -> BinaryIO:
    """``path`` opened for reading if it is a regular file (after symlinks), else
    ``RefusedFile``: a FIFO would block the open and a device (/dev/zero) never ends.  The
    check is on the opened file, so nothing can swap the file in between."""
    # O_NONBLOCK: opening a FIFO for reading would wait for a writer; on a file it does nothing
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise RefusedFile(errno.EINVAL, f"it is {_kind(mode)}, not a regular file")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bounded(path: str | os.PathLike, what: str, limit: int = MAX_USER_FILE) -> bytes:
    """The bytes of the regular file ``path``, refused (``RefusedFile``, naming ``what`` and
    ``limit``) before reading when it is larger than ``limit``, and cut off there if it grows
    while read.  Other ``OSError``s (no such file, no permission) pass through."""
    with open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        data = f.read(limit + 1) if size <= limit else b""
        if size > limit or len(data) > limit:
            most = f"{limit >> 20} MiB" if limit % (1 << 20) == 0 else f"{limit} bytes"
            raise RefusedFile(errno.EFBIG, f"it is {max(size, len(data))} bytes, over the "
                                           f"{most} limit for {what}")
    return data


def umask() -> int:
    """This process's umask, read without changing it (another thread may be creating files)."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # no /proc: the classic way, briefly changing it
    os.umask(mask)
    return mask


def write_aside(path: Path, data: bytes) -> str:
    """``data`` written and fsynced to a new temporary file beside ``path``; its name.

    The file gets the mode ``open()`` would give it (0666 less the umask), not ``mkstemp``'s
    0600, so that what iron writes is as readable as what git or pip write."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~umask())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return tmp


def make_temp_dir(parent: Path, prefix: str) -> Path:
    """A new folder in ``parent`` with the mode ``mkdir`` would give it (0777 less the umask),
    not ``mkdtemp``'s 0700: it becomes a cache entry or a bundle others may read."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    os.chmod(tmp, 0o777 & ~umask())
    return tmp


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the new one, never half."""
    tmp = write_aside(path, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def sha256_file(path: Path) -> str:
    """The sha256 of a regular file (anything else is ``RefusedFile``: a link to /dev/zero
    would never end)."""
    with open_regular(path) as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def sources_digest(paths) -> str:
    """sha256 of the names and contents of ``paths`` (source files): a stamp of the code that
    makes some output, so a cache of that output is not reused once the code changed.  The
    contents, not size and time: an edit that keeps both (same length, within the clock's
    tick) must count too, and a few dozen source files hash in milliseconds."""
    digest = hashlib.sha256()
    for path in sorted(Path(p) for p in paths):
        digest.update(f"{path.name}\0{sha256_file(path)}\0".encode())
    return digest.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def finite_float(text: str) -> float:
    """An ``argparse`` type: a number, refusing nan and inf (which compare false with every
    bound, so range checks written as ``x <= 0`` let them through)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value
