"""Graphs and programs: a graph's ``body`` is recorded into a program of resolved steps.

Recording runs ``body`` on symbolic tensors.  Each ``Op.step(...)`` inside it takes its shape
params from the inputs, its semantic params from the call, and each tunable from the call, else
the graph's profile, else the default ``iron.resolution`` chooses (see ``iron.profile``).  The
result, a ``Program``, lists the resolved operator instances in order; a target compiles and
runs it, and ``Program.reference`` evaluates it with every operator's numpy maths.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from typing import Any, Mapping, Sequence

import numpy as np

from .devices import Device
from .devices import device as get_device
from .errors import FieldError, ResolveError, ShapeError
from .operator import Operator
from .profile import Profile, as_profile, batch_reports
from .program import Program, Step
from .recording import current_recording, start, stop
from .resolution import resolve, rules
from .targets import executable_for, target_for
from .tensor import Tensor, TensorSpec, bfloat16


def host_rules_broken(op: Operator, dev: Device) -> list[str]:
    """The rules ``op`` (its unset tunables at their defaults) breaks on ``dev`` only because
    of how many columns this host gives ``dev``: empty if ``dev``'s figures are the same on
    every host (an NPU's columns: a profile entry beyond them is a mistake), if ``op`` also
    breaks a rule on a device with any number of columns, or if it breaks none."""
    if dev.fixed:
        return []
    roomy = dataclasses.replace(dev, columns=1 << 16)
    try:
        full = resolve(op, roomy)
    except ResolveError:
        return []
    return [r.text for r in rules(full, dev) if not r.ok]


class Recording:
    """The program under construction while a graph's body runs."""

    def __init__(self, dev: Device, profile: Profile):
        self.device = dev
        self.profile = profile
        self.tensors: list[Tensor] = []
        self.steps: list[Step] = []
        self.by_name: dict[str, Tensor] = {}

    def tensor(self, shape: tuple[int, ...], dtype: Any, kind: str = "temp",
               name: str | None = None) -> Tensor:
        if name is not None:
            known = self.by_name.get(name)
            if known is not None:
                if (known.shape, np.dtype(known.dtype), known.kind) != (
                        tuple(shape), np.dtype(dtype), kind):
                    raise ShapeError(f"{kind} {name!r} declared twice with different shapes: "
                                     f"{known} and {tuple(shape)}")
                return known
        t = Tensor(len(self.tensors), tuple(int(n) for n in shape), dtype, kind, name)
        self.tensors.append(t)
        if name is not None:
            self.by_name[name] = t
        return t

    def add_step(self, cls: type[Operator], inputs: tuple[Tensor, ...],
                 fields: Mapping[str, Any]) -> Tensor | tuple[Tensor, ...]:
        where = f"{cls.__name__}.step"
        cls.check_field_names(fields, where)
        for i, t in enumerate(inputs):
            if not isinstance(t, Tensor) or self.tensors[t.index] is not t:
                raise ShapeError(f"{where}: input {i} is a {type(t).__name__}, not a tensor of "
                                 "this graph; pass the body's arguments or earlier steps' outputs")
        shape = cls.shape_params(*inputs, **{n: fields[n] for n in cls.shape_fields
                                             if n in fields})
        for name, value in fields.items():
            if name in shape and shape[name] != value:
                raise FieldError(f"{where}: {name}={value!r} disagrees with the inputs, which "
                                 f"give {name}={shape[name]!r}")
        try:
            op = cls(**{**fields, **shape})
        except TypeError as e:
            raise FieldError(f"{where}: {e}; its params are {', '.join(cls.params())}") from None
        op.signature(*inputs)  # shape errors before any tunable is looked at
        call = {n for n in cls.tunables() if fields.get(n) is not None}
        sources = {n: "the call" for n in call}
        chosen, used = {}, {}
        for name, (value, entry) in self.profile.lookup(op).items():
            if name not in call:
                chosen[name] = value
                sources[name] = entry.describe()
                used[name] = entry
        try:
            resolved = resolve(dataclasses.replace(op, **chosen), self.device, sources)
        except ResolveError:
            # An entry tuned on a host with more cores breaks only this host's column rule:
            # the instance takes the defaults and the profile says so once.  An entry that
            # would break a rule on any host, or a fixed device's figure (16 columns on an
            # npu2 of 8), is a mistake in the profile, reported as such.
            broken = host_rules_broken(dataclasses.replace(op, **chosen), self.device)
            if not broken:
                raise
            resolved = resolve(op, self.device, {n: sources[n] for n in call})
            self.profile.fall_back(set(used.values()), broken[0])
        op = resolved
        outputs = []
        for i, (shape_, dtype) in enumerate(op.signature(*inputs)):
            alias = cls.inplace.get(i)
            outputs.append(inputs[alias] if alias is not None else self.tensor(shape_, dtype))
        self.steps.append(Step(op, tuple(t.index for t in inputs),
                               tuple(t.index for t in outputs)))
        return outputs[0] if len(outputs) == 1 else tuple(outputs)


class Graph:
    """A model: subclass it and write ``body``, calling operators' ``step``.

    A graph is bound to a device (``iron.device()`` unless told otherwise) and may carry a
    profile (a ``Profile``, a JSON file, or a folder holding ``<device>.json``) and named
    weights (``graph.weights``) that ``self.weight(...)`` tensors in ``body`` read.
    """

    def __init__(self, device: Device | str | None = None, profile: Any = None):
        self.device = get_device(device)
        self.profile = profile
        self.weights: dict[str, np.ndarray] = {}

    def body(self, *inputs: Tensor) -> Tensor | tuple[Tensor, ...]:
        raise NotImplementedError(f"{type(self).__name__} must define body()")

    # ---- state that survives a subclass forgetting super().__init__() ------------------------

    @property
    def device(self) -> Device:
        return self.__dict__.get("_device") or get_device()

    @device.setter
    def device(self, value: Device | str | None) -> None:
        self.__dict__["_device"] = get_device(value)

    @property
    def profile(self) -> Any:
        return self.__dict__.get("_profile")

    @profile.setter
    def profile(self, value: Any) -> None:
        if isinstance(value, (str, os.PathLike)) and not os.path.exists(value):
            raise FileNotFoundError(f"profile {os.fspath(value)!r} does not exist")
        if isinstance(value, (str, os.PathLike)) and os.path.isfile(value):
            Profile.load(value)  # report a malformed file at assignment, not at first run
        self.__dict__["_profile"] = value

    @property
    def weights(self) -> dict[str, np.ndarray]:
        return self.__dict__.setdefault("_weights", {})

    @weights.setter
    def weights(self, value: Mapping[str, np.ndarray]) -> None:
        self.__dict__["_weights"] = dict(value)

    # ---- declarations inside body --------------------------------------------------------

    def weight(self, name: str, shape: tuple[int, ...], dtype: Any = bfloat16) -> Tensor:
        """A named tensor bound once, from ``graph.weights`` or a bundle (model parameters)."""
        return current_recording().tensor(shape, dtype, "weight", name)

    def state(self, name: str, shape: tuple[int, ...], dtype: Any = bfloat16) -> Tensor:
        """A named tensor that persists across calls, starting at zero (e.g. a KV cache)."""
        return current_recording().tensor(shape, dtype, "state", name)

    # ---- recording and running -----------------------------------------------------------

    def record(self, *shapes: Any, **named_shapes: Any) -> Program:
        """Record ``body`` at the given input shapes (tuples, or ``iron.spec(shape, dtype)``)."""
        signature = inspect.signature(self.body)
        try:
            bound = signature.bind(*shapes, **named_shapes)
        except TypeError as e:
            raise ShapeError(f"{type(self).__name__}.record: {e}") from None
        rec = Recording(self.device, as_profile(self.profile, self.device.name))
        token = start(rec)
        reports = batch_reports(rec.profile)  # one warning line for entries that do not fit
        reports.__enter__()
        try:
            params = signature.parameters
            tensors, call_args, call_kwargs = [], [], {}
            for name, value in bound.arguments.items():
                variadic = params[name].kind == inspect.Parameter.VAR_POSITIONAL
                for i, v in enumerate(value if variadic else (value,)):
                    s = as_spec(v)
                    t = rec.tensor(s.shape, s.dtype, "input", f"{name}{i}" if variadic else name)
                    tensors.append(t)
                    if variadic or params[name].kind == inspect.Parameter.POSITIONAL_ONLY:
                        call_args.append(t)
                    else:
                        call_kwargs[name] = t
            result = self.body(*call_args, **call_kwargs)
        finally:
            stop(token)
            reports.__exit__(None, None, None)
        outputs = result if isinstance(result, tuple) else (result,)
        for o in outputs:
            if not isinstance(o, Tensor):
                raise ShapeError(f"{type(self).__name__}.body must return tensors, got {o!r}")
        return Program(self.device, rec.tensors, rec.steps,
                       [t.index for t in tensors], [o.index for o in outputs])

    def record_like(self, arrays: Sequence[np.ndarray]) -> Program:
        return self.record(*(TensorSpec(tuple(np.shape(a)), np.asarray(a).dtype) for a in arrays))

    def __call__(self, *arrays: np.ndarray) -> np.ndarray | tuple[np.ndarray, ...]:
        """Record, resolve, compile what is missing (cached) and run on the bound device."""
        arrays = tuple(np.asarray(a) for a in arrays)
        key = (self.device.name, profile_key(self.profile, self.device),
               tuple((a.shape, a.dtype.str) for a in arrays))
        cache = self.__dict__.setdefault("_executables", {})
        exe = cache.get(key)
        if exe is None:
            exe = cache[key] = executable_for(self.record_like(arrays))
            exe.bind_weights(self.weights)
        outputs = exe.run(arrays)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def emulate(self, *arrays: np.ndarray) -> np.ndarray | tuple[np.ndarray, ...]:
        """Run on the bound NPU device in the emulator: every designed step as its design
        would run (DMA transfers, FIFOs, core loops calling the host-built core kernels),
        host-placed steps with their numpy maths."""
        arrays = tuple(np.asarray(a) for a in arrays)
        exe = target_for(self.device).emulated().load(self.record_like(arrays))
        exe.bind_weights(self.weights)
        outputs = exe.run(arrays)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def reference(self, *arrays: np.ndarray) -> np.ndarray | tuple[np.ndarray, ...]:
        """The same steps under the same profile, computed with numpy reference maths."""
        outputs = self.record_like(arrays).reference(arrays, self.weights)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)


def as_spec(value: Any) -> TensorSpec:
    if isinstance(value, TensorSpec):
        return value
    if isinstance(value, int):
        return TensorSpec((value,))
    if isinstance(value, (tuple, list)) and all(isinstance(n, int) for n in value):
        return TensorSpec(tuple(value))
    raise ShapeError(f"an input shape is a tuple of ints or iron.spec(shape, dtype), got {value!r}")


def profile_key(profile: Any, dev: Device) -> str:
    """The profile's current content: an edited profile file makes the graph record again."""
    return as_profile(profile, dev.name).dumps()
