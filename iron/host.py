"""This machine, as the devices, the cpu target's builds, bundles, profiles, its cost model and
the tuner see it.

Every fact about the host CPU is read here, once: ``/proc/cpuinfo`` (its model name and ISA
feature flags, ``info()``), the last-level cache size, and the usable cores (the process's
affinity, lowered by ``$IRON_THREADS``: ``usable_cores``).  It is a bottom-layer service, so
that the cpu device's figures, its target and the layers above read one module.

- ``identity()``: what ``-march=native`` code depends on (model and flags, hashed), part of
  every native artifact's key; ``summary()``: what a tuned profile records of its host.
- The ``-march`` level is an explicit build choice (``doit march=...``, which holds it for the
  recording with ``march_level``; else ``$IRON_MARCH``; ``native`` by default).  The
  features a level requires are read from the compiler itself: the ISA macros
  ``cc -march=LEVEL -dM -E`` predefines beyond plain ``-march=x86-64`` (``__AVX2__``,
  ``__AVX512BF16__``, ``__AMX_TILE__``, ...), named as Linux names them in ``/proc/cpuinfo``
  (``avx2``, ``avx512_bf16``, ``amx_tile``).  Whatever kernels are added later, the list
  follows the flags they are compiled with.

Nothing here imports numpy, a device or a target: a no-op ``doit`` reads these facts.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import subprocess
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import NamedTuple

from .errors import DeviceError

DEFAULT_MARCH = "native"
#: A level gcc and clang accept: ``native``, ``x86-64-v3``, ``znver4``, ``sapphirerapids``...
MARCH_PATTERN = re.compile(r"[a-z0-9][a-z0-9_.-]{0,40}")
#: Macros whose /proc/cpuinfo flag is not the macro's name in lower case (underscores aside).
CPUINFO_ALIASES = {
    "BMI": "bmi1", "LAHF_SAHF": "lahf_lm", "LZCNT": "abm", "PCLMUL": "pclmulqdq",
    "PRFCHW": "3dnowprefetch", "RDRND": "rdrand", "SHA": "sha_ni", "SSE3": "pni",
    "CRC32": "sse4_2", "SHSTK": "user_shstk",
}


def affinity_cores() -> int:
    """Cores this process may run on: its affinity mask, not the machine's count (under
    ``taskset -c 0`` or a one-CPU container it is one)."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def usable_cores() -> int:
    """``affinity_cores``, lowered by ``$IRON_THREADS``."""
    cores = affinity_cores()
    limit = os.environ.get("IRON_THREADS")
    if limit:
        return min(cores, parse_threads(limit, "$IRON_THREADS"))
    return cores


def parse_threads(value: str | int, where: str) -> int:
    """A thread count from text: a positive integer, or an error naming ``where``."""
    text = str(value).strip()
    if not re.fullmatch(r"[0-9]{1,4}", text) or int(text) < 1:
        raise DeviceError(f"{where}={value!r}: the thread count must be a positive integer")
    return int(text)


#: The level ``march_level`` holds for the code it wraps (a build's choice), if any.
_LEVEL: ContextVar[str | None] = ContextVar("iron_march_level", default=None)


def march() -> str:
    """The -march level builds use: the one ``march_level`` holds, else ``$IRON_MARCH``, else
    ``native``; validated."""
    return _LEVEL.get() or check_march(os.environ.get("IRON_MARCH") or DEFAULT_MARCH,
                                       "$IRON_MARCH")


@contextmanager
def march_level(level: str | None):
    """Build at ``level`` inside the ``with`` block (``None``: as ``march()`` says outside it),
    without touching the environment, so one process can build for two levels."""
    token = _LEVEL.set(None if level is None else check_march(level))
    try:
        yield
    finally:
        _LEVEL.reset(token)


def check_march(level: str, where: str = "march") -> str:
    if not MARCH_PATTERN.fullmatch(level):
        raise DeviceError(f"{where}={level!r}: not a -march level (letters, digits, '-', '_', "
                          "'.'; e.g. native or x86-64-v3)")
    return level


def normalize(flag: str) -> str:
    """Feature names compared without case or underscores: AVX512_BF16 == avx512bf16."""
    return flag.lower().replace("_", "")


class CpuInfo(NamedTuple):
    """What /proc/cpuinfo says of the CPU: its model name, its ISA feature flags, and a hash
    of both (what ``-march=native`` code depends on)."""

    model: str
    features: frozenset[str]
    identity: str


@functools.lru_cache(maxsize=None)
def info() -> CpuInfo:
    """This host's CPU, read once ("unknown" and no features where it cannot be read)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return CpuInfo("unknown", frozenset(), "unknown")
    fields = dict(re.findall(r"^(model name|flags)\s*:\s*(.*)$", text, re.M))
    return CpuInfo(fields.get("model name", "unknown").strip() or "unknown",
                   frozenset(fields.get("flags", "").split()),
                   hashlib.sha256(repr(sorted(fields.items())).encode()).hexdigest()[:16])


def model() -> str:
    """The host CPU's model name, as /proc/cpuinfo gives it."""
    return info().model


def features() -> frozenset[str]:
    """The host CPU's ISA feature flags, as /proc/cpuinfo names them."""
    return info().features


def identity() -> str:
    """What ``-march=native`` code depends on: the CPU's model and feature flags, hashed
    (part of the key of every artifact built for ``native``)."""
    return info().identity


@functools.lru_cache(maxsize=None)
def cache_bytes() -> int:
    """The last-level cache as Linux reports it (32 MiB when it reports none): what a benchmark
    must stream past for its data to come from memory."""
    try:
        text = Path("/sys/devices/system/cpu/cpu0/cache/index3/size").read_text().strip()
        return int(text[:-1]) * 1024 if text.endswith("K") else int(text)
    except (OSError, ValueError):
        return 32 << 20


def _isa_macros(cc: str, level: str) -> set[str]:
    result = subprocess.run([cc, f"-march={level}", "-dM", "-E", "-x", "c", os.devnull],
                            capture_output=True, text=True)
    if result.returncode != 0:
        first = (result.stderr.strip().splitlines() or ["(no message)"])[0]
        raise DeviceError(f"march={level!r}: the compiler {cc} rejects -march={level}: {first}")
    return set(re.findall(r"^#define __([A-Z][A-Z0-9_]*)__ 1$", result.stdout, re.M))


@functools.lru_cache(maxsize=None)
def required_features(cc: str, level: str) -> tuple[str, ...]:
    """The CPU features code built with ``-march=level`` may use, as /proc/cpuinfo names them.

    For ``native`` a macro with no flag of that name on this host is a naming gap (the host
    has the feature, since the compiler saw it there), so it is left out; for a named level it
    is kept under its lower-case name and a host without it is refused.
    """
    added = _isa_macros(cc, level) - _isa_macros(cc, "x86-64")
    by_name = {normalize(f): f for f in features()}
    found = set()
    for macro in added:
        name = CPUINFO_ALIASES.get(macro, macro.lower())
        if normalize(name) in by_name:
            found.add(by_name[normalize(name)])
        elif level != "native":
            found.add(name)
    return tuple(sorted(found))


def missing_features(required, flags=None) -> list[str]:
    """The features in ``required`` that ``flags`` (this host's by default) lack."""
    have = {normalize(f) for f in (features() if flags is None else flags)}
    return [f for f in required if normalize(f) not in have]


def compiler_stamp() -> list:
    """The C compiler's resolved path, size and time: changes when the compiler does, read
    without running it (the full identity, ``cc --version``, goes into every artifact key)."""
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None:
        return []
    real = os.path.realpath(cc)
    st = os.stat(real)
    return [real, st.st_size, st.st_mtime_ns]


#: The kernel code paths a build can take, each with the features it needs (as /proc/cpuinfo
#: names them): the ``#if defined(__X__)`` branches of ``iron/kernels/cpu``.  A test checks that
#: every ISA macro the kernels branch on is named here.
KERNEL_PATHS = (
    ("avx2", ("avx2", "fma")),
    ("avx512", ("avx512f",)),
    ("vnni", ("avx512_vnni", "avx512bw")),
    ("bf16", ("avx512_bf16", "avx512vl")),  # attention's bf16 dot products: 256-bit forms
    ("amx", ("amx_tile", "amx_bf16", "avx512_bf16")),
)


def isa_class(features) -> str:
    """The kernel paths ``features`` enable, joined: ``avx2`` on a Zen 3 or with
    ``-march=x86-64-v3``, ``avx2-avx512-vnni-bf16`` on a Zen 4, ``...-amx`` on a Sapphire
    Rapids; ``x86-64`` when not even AVX2 is there."""
    have = {normalize(f) for f in features}
    paths = [name for name, needs in KERNEL_PATHS
             if all(normalize(f) in have for f in needs)]
    return "-".join(paths) or "x86-64"


def class_name(cores: int | None = None, level: str | None = None) -> str:
    """The host class a cpu profile is tuned for and chosen by: the kernel paths the build's
    -march level compiles (read from the compiler, see ``required_features``) and the usable
    cores, e.g. ``avx2-2t``.  Two hosts of one class run the same code with the same team, so
    a setting tuned on one applies to the other; a setting tuned for another class never
    does (its profile is another file)."""
    level = level or march()
    cc = shutil.which(os.environ.get("CC", "cc")) or "cc"
    return f"{isa_class(required_features(cc, level))}-{cores or usable_cores()}t"


def summary() -> dict:
    """What a profile records about the host it was tuned on: its class (which the profile's
    file name gives too), and the CPU model and -march level as information."""
    return {"class": class_name(), "cpu": model(), "cores": usable_cores(), "march": march()}
