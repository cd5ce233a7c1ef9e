"""The operator model: an operator is a frozen declaration of what a step computes and how it runs.

An operator class declares

- ``param()`` fields: what makes it this operator — its shape (``size``, ``M``, ``K``, ...),
  taken from the step's inputs, and semantic constants (``scalar_factor``, ``eps``, ...), given
  at the call;
- ``tunable()`` fields: how it runs (``tile_size``, ``num_aie_columns``, ...). They never change
  the result beyond floating-point rounding, only the speed;
- ``signature``: which inputs it takes and which outputs it makes (shapes and dtypes);
- ``space`` and ``rules``: the candidate values of each tunable on a device and the legality
  rules every resolved instance must satisfy, in the device's figures (``iron.devices``): an
  operator never asks which kind of device it is; a target adds what its own kernels need
  (``iron/targets/<kind>/rules.py``) and ``iron.resolution`` fills and checks tunables;
- ``reference``: its maths in numpy float32, and ``tolerance``, how close a kernel's output
  must come to it;
- ``test_shapes`` and ``example``: the cases the kernel tests run (odd and minimum sizes
  included; every legal setting of ``test_shapes[sweep_shape]``), and ``example_input``:
  realistic values for one input (token ids in range, positions mid-context), which the tuner
  times on.

The kernel tests and the tuner loop over ``Operator.registry``, so adding an operator is its
declaration and its kernel, nothing else.  Profiles are applied to operators from outside
(``iron.profile``); kernels live in ``<kernel_root>/<target>/<kernel>.c`` (``iron/kernels/``
unless the class says otherwise).

Every subclass is made a frozen, keyword-only dataclass by ``__init_subclass__``, so a concrete
operator is a short class body and its instances are hashable values.
"""

from __future__ import annotations

import dataclasses
import math
import struct
from dataclasses import MISSING
from pathlib import Path
from typing import Any, ClassVar, Iterable, Iterator, Mapping, NamedTuple

import numpy as np

from .devices import Device
from .errors import FieldError, ShapeError
from .paths import KERNELS_DIR
from .recording import current_recording
from .tensor import Tensor, bfloat16

PARAM = "param"
TUNABLE = "tunable"


#: Tolerances at the bound the arithmetic allows (``Operator.tolerance``): a kernel and the
#: reference round the same float32 result to bf16 once, which ``iron.tuning.check``'s
#: one-ulp allowance (2^-8 to 2^-7 of the value) already covers; a 1% systematic error is
#: beyond every one of these.
#: Adds, products, copies: nothing beyond that rounding.
EXACT = (0.0, 0.0)
#: exp, rsqrt, sin/cos evaluated by the kernel's own approximation: up to one more bf16
#: rounding's worth, 2^-8 of the value (a lookup-table exp, as upstream's AIE2 kernels use, is
#: accurate to bf16; the cpu's polynomials to float32); 2^-24 absolute near zero.
APPROXIMATED = (2.0 ** -8, 2.0 ** -24)

#: float32 sums of K products in the kernel's own order: they differ from numpy's by about
#: sqrt(K) * 2^-24 * sum|a * b|, under 2^-12 at the test inputs' scale (K <= 1536, weights of
#: scale 0.1, activations of scale 1); 2^-10 absolute leaves room for the worst orders.
ACCUMULATED = (0.0, 2.0 ** -10)


def param(default: Any = MISSING, choices: tuple[str, ...] = (), optional: bool = False) -> Any:
    """Declare a field that makes the operator what it is (a shape or a semantic constant).

    A string param names one of ``choices``; it reaches a kernel as its index in them.
    An ``optional`` param (a variant's switch added to an existing operator, such as Qwen2's
    q/k/v biases on ``QKVRoPE``) is left out of ``config`` and ``describe`` while it holds its
    default, so the instances that predate it keep their identity: their artifact keys, the
    programs bundles store and the kernel macros (a kernel reads an absent one as its default).
    """
    return dataclasses.field(default=default, metadata={"iron": PARAM, "choices": choices,
                                                        "optional": optional})


def tunable() -> Any:
    """Declare a field that only changes how fast the operator runs; unset until resolved."""
    return dataclasses.field(default=None, metadata={"iron": TUNABLE})


class Rule(NamedTuple):
    """One legality rule: whether it holds, the fields it constrains, and its text."""

    ok: bool
    fields: tuple[str, ...]
    text: str


def rule(ok: bool, fields: str, text: str) -> Rule:
    """A ``Rule``; ``fields`` is a space-separated list of the field names it constrains."""
    return Rule(bool(ok), tuple(fields.split()), text)


class Operator:
    """Base of every operator; see the module docstring."""

    kernel: ClassVar[str]  # name of the kernel source, e.g. "axpy" -> kernels/cpu/axpy.c
    kernel_root: ClassVar[Path] = KERNELS_DIR  # holds <target>/<kernel>.c
    inplace: ClassVar[Mapping[int, int]] = {}  # output index -> input index it overwrites
    #: (rtol, atol) against ``reference``: an output element may differ by ``atol + rtol *
    #: |ref|`` plus one bf16 ulp (see ``iron.tuning.check``). The default, ``EXACT``, is for
    #: float32 maths whose only error is the output's rounding; operators with an
    #: approximated function or a long float32 sum state theirs, with the reason.
    tolerance: ClassVar[tuple[float, float]] = EXACT
    test_shapes: ClassVar[tuple[dict[str, Any], ...]] = ()  # keyword arguments of ``example``
    sweep_shape: ClassVar[int] = -1  # the test shape whose every legal setting is tested
    registry: ClassVar[dict[str, type[Operator]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        dataclasses.dataclass(frozen=True, kw_only=True)(cls)
        known = Operator.registry.get(cls.__name__)
        if known is not None and known.__qualname__ == cls.__qualname__ \
                and known.__module__ == cls.__module__:
            known = None  # the same class defined again (a module reloaded)
        if known is not None:
            raise FieldError(
                f"operator {cls.__module__}.{cls.__qualname__} has the name of "
                f"{known.__module__}.{known.__qualname__}: operators are found by class name "
                "(profiles, bundles), so each needs its own; rename one")
        Operator.registry[cls.__name__] = cls

    # ---- field kinds --------------------------------------------------------------------

    @classmethod
    def params(cls) -> tuple[str, ...]:
        return _field_kinds(cls)[0]

    @classmethod
    def tunables(cls) -> tuple[str, ...]:
        return _field_kinds(cls)[1]

    @classmethod
    def choices(cls, name: str) -> tuple[str, ...]:
        """The values a string param may take (empty for a numeric field)."""
        return next(f.metadata.get("choices", ()) for f in dataclasses.fields(cls)
                    if f.name == name)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return cls.params() + cls.tunables()

    @classmethod
    def check_field_names(cls, names: Iterable[str], where: str) -> None:
        """Reject names that are neither a param nor a tunable of ``cls``, listing the real ones."""
        unknown = sorted(set(names) - set(cls.field_names()))
        if unknown:
            raise FieldError(
                f"{where}: {cls.__name__} has no field {', '.join(map(repr, unknown))}; its params "
                f"are {', '.join(cls.params()) or '(none)'} and its tunables are "
                f"{', '.join(cls.tunables()) or '(none)'}")

    # ---- what subclasses declare ----------------------------------------------------------

    @classmethod
    def shape_params(cls, *inputs: Tensor) -> dict[str, Any]:
        """The param values implied by the inputs' shapes."""
        raise NotImplementedError

    #: Params a call may give that ``shape_params`` needs to read the inputs' shapes (a
    #: quantized weight's row of bytes means K values only for a known format).
    shape_fields: ClassVar[tuple[str, ...]] = ()

    def signature(self, *inputs: Tensor) -> list[tuple[tuple[int, ...], Any]]:
        """Check the inputs' shapes and dtypes; return each output's (shape, dtype)."""
        raise NotImplementedError

    def space(self, dev: Device) -> dict[str, list[int]]:
        """Candidate values of every tunable on ``dev``, most preferred first."""
        raise NotImplementedError

    def rules(self, dev: Device) -> Iterator[Rule]:
        """The rules a fully resolved instance must satisfy on any device, in ``dev``'s figures.

        What a target's kernels or designs need beyond them is the target's to say
        (``iron/targets/<kind>/rules.py``); ``iron.resolution`` chains the two."""
        if "num_aie_columns" in self.tunables():
            yield rule(self.num_aie_columns <= dev.columns, "num_aie_columns",
                       f"num_aie_columns <= {dev.columns} (the columns of {dev})")

    def reference(self, *arrays: np.ndarray) -> np.ndarray | tuple[np.ndarray, ...]:
        """The operator's maths on float32 (or int32) numpy arrays, before output rounding."""
        raise NotImplementedError

    @classmethod
    def example(cls, rng: np.random.Generator, **shape: Any) -> tuple[dict[str, Any], list]:
        """(call fields, input arrays) of one test case, at one of ``test_shapes``."""
        raise NotImplementedError(f"{cls.__name__} declares no example test case")

    def example_input(self, index: int, shape: tuple[int, ...], dtype: Any,
                      rng: np.random.Generator) -> np.ndarray:
        """Realistic values for input ``index`` of this instance: what the tuner times on.

        Floating-point inputs are normal numbers (matrices scaled to weight-sized ones); an
        operator with integer or float32 inputs (token ids, positions, frequencies) overrides
        this for them.
        """
        if np.dtype(dtype).kind in "iu" or np.dtype(dtype) == np.float32:
            raise FieldError(f"{type(self).__name__}.example_input must say what input {index} "
                             f"({np.dtype(dtype).name} {shape}) holds")
        scale = 0.1 if len(shape) == 2 else 1.0
        return (rng.standard_normal(shape) * scale).astype(dtype)

    # ---- derived behaviour ---------------------------------------------------------------

    def describe(self, tunables: bool = False) -> str:
        """``AXPY(size=2048, scalar_factor=1.5)``: the instance as a person reads it."""
        names = self.shown(self.field_names() if tunables else self.params())
        return f"{type(self).__name__}({', '.join(f'{n}={getattr(self, n)!r}' for n in names)})"

    def config(self) -> dict[str, Any]:
        """Every field value, JSON-ready: what identifies a resolved instance (an optional
        param at its default left out, see ``param``)."""
        return {n: getattr(self, n) for n in self.shown(self.field_names())}

    def shown(self, names: Iterable[str]) -> tuple[str, ...]:
        """``names`` without the optional params that hold their defaults."""
        defaults = _optional_defaults(type(self))
        return tuple(n for n in names
                     if n not in defaults or getattr(self, n) != defaults[n])

    def tunable_values(self) -> dict[str, Any]:
        return {n: getattr(self, n) for n in self.tunables()}

    def kernel_macros(self) -> dict[str, int]:
        """Every field as a validated integer compile-time constant for the kernel source.

        Floats travel as their float32 bit pattern (``IRON_EPS_BITS``), booleans as 0 / 1, so
        nothing but integers ever reaches a compiler command line.
        """
        macros = {}
        for name, value in self.config().items():
            key = f"IRON_{name.upper()}"
            if isinstance(value, str):
                choices = self.choices(name)
                if value not in choices:
                    raise FieldError(f"{self.describe()}: {name}={value!r} is not one of "
                                     f"{', '.join(choices) or '(no string values)'}")
                macros[key] = choices.index(value)
            elif isinstance(value, bool):
                macros[key] = int(value)
            elif isinstance(value, int):
                macros[key] = value
            elif isinstance(value, float):
                macros[key + "_BITS"] = struct.unpack("<I", struct.pack("<f", value))[0]
            else:
                raise FieldError(f"{self.describe()}: field {name}={value!r} is not a number")
        return macros

    @classmethod
    def step(cls, *inputs: Tensor, **fields: Any) -> Tensor | tuple[Tensor, ...]:
        """Record one step of this operator in the graph being recorded; return its outputs."""
        return current_recording().add_step(cls, inputs, fields)


# ---- helpers the operator declarations share ------------------------------------------------

_FIELD_KINDS: dict[type, tuple[tuple[str, ...], tuple[str, ...]]] = {}


def _field_kinds(cls: type) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(params, tunables) of an operator class, read from its dataclass fields once: a
    profile of many entries asks for them once per entry."""
    kinds = _FIELD_KINDS.get(cls)
    if kinds is None:
        fields = dataclasses.fields(cls)
        kinds = _FIELD_KINDS[cls] = (
            tuple(f.name for f in fields if f.metadata.get("iron") == PARAM),
            tuple(f.name for f in fields if f.metadata.get("iron") == TUNABLE))
    return kinds


_OPTIONAL: dict[type, dict[str, Any]] = {}


def _optional_defaults(cls: type) -> dict[str, Any]:
    """Name -> default of each optional param of an operator class (see ``param``)."""
    found = _OPTIONAL.get(cls)
    if found is None:
        found = _OPTIONAL[cls] = {f.name: f.default for f in dataclasses.fields(cls)
                                  if f.metadata.get("optional")}
    return found


def expect(ok: bool, op: Operator | type, message: str) -> None:
    """Raise ``ShapeError`` naming the operator when an input does not fit."""
    if not ok:
        name = op.describe() if isinstance(op, Operator) else op.__name__
        raise ShapeError(f"{name}: {message}")


def expect_dtype(t: Tensor, dtype: Any, op: Operator, what: str) -> None:
    expect(np.dtype(t.dtype) == np.dtype(dtype), op,
           f"{what} must be {np.dtype(dtype).name}, got {np.dtype(t.dtype).name}")


def pow2_tiles(n: int, lo: int = 1, hi: int | None = None) -> list[int]:
    """Powers of two that divide ``n`` within [lo, hi], plus ``n`` itself; largest first."""
    hi = n if hi is None else min(n, hi)
    tiles = {1 << i for i in range(n.bit_length()) if n % (1 << i) == 0 and lo <= 1 << i <= hi}
    if n <= hi or not tiles:
        tiles.add(n if n <= hi else max(d for d in range(1, hi + 1) if n % d == 0))
    return sorted(tiles, reverse=True)


def columns(dev: Device, work_bytes: int | None = None) -> list[int]:
    """Column counts to try, preferred first: all of them, except that an operator touching
    fewer than ``dev.parallel_bytes`` prefers a single column (a cpu thread team's start)."""
    counts = list(range(dev.columns, 0, -1))
    if work_bytes is not None and work_bytes < dev.parallel_bytes:
        counts.reverse()
    return counts


def numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def normal(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    """bf16 normal numbers: the floating-point inputs of test cases."""
    return (rng.standard_normal(shape) * scale).astype(bfloat16)


def mid_context(n: int, ctx: int | None = None) -> np.ndarray:
    """``n`` consecutive int32 positions in the middle of a context (1000 on, if none)."""
    start = max(0, (ctx - n) // 2) if ctx is not None else 1000
    return np.arange(start, start + n, dtype=np.int32)


def rope_frequencies(head_dim: int, theta: float = 10000.0) -> np.ndarray:
    """RoPE's float32 inverse frequencies for ``head_dim``, the plain-theta rule."""
    return (1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)).astype(
        np.float32)


__all__ = ["Operator", "param", "tunable", "rule", "Rule", "expect", "expect_dtype",
           "pow2_tiles", "columns", "numel", "bfloat16", "normal", "mid_context",
           "rope_frequencies"]
