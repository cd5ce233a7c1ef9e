"""Programs on an NPU device, run through the emulator: designed steps as their designs would
run, host-placed steps with their numpy maths, every tensor rounded to its dtype in between.

Consecutive NPU steps run as one folded configuration (``fold``): one dispatch of a main
runtime sequence that configures each step's design in turn and runs its sequence on the
fold's device buffers; between folds the host runs its steps on the tensors the folds hand
back.  ``fold=False`` gives every NPU step a fold of its own, one dispatch each."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from ...errors import BundleError, ShapeError
from ...program import Program, upcast
from .ir import Design, design_from_json
from .buckets import at_bucket, bucket_positions, covering, reached
from .fold import Array, Configured, Fold, plan, starts


@functools.lru_cache(maxsize=1024)
def step_file(path: str) -> tuple[Design | None, dict[int, Design]]:
    """The design in a step file (``step.json``), None for a host placement, and its context
    buckets' designs (positions -> design; none but for a KV-cache step, ``buckets``)."""
    try:
        doc = json.loads(Path(path).read_text())
        if doc["placement"] == "host":
            return None, {}
        return design_from_json(doc["design"]), {
            int(b["positions"]): design_from_json(b["design"]) for b in doc.get("buckets", ())}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise BundleError(f"{path}: not a readable npu step file ({e})") from None


def step_design(path: str) -> Design | None:
    """The design in a step file, None for a host placement."""
    return step_file(path)[0]


def step_buckets(path: str) -> dict[int, Design]:
    """The context buckets' designs in a step file (positions -> design)."""
    return step_file(path)[1]


def bucket_plans(program: Program, designs: Sequence[Design | None],
                 variants: Sequence[Mapping[int, Design]], fold: bool, pack: bool = True
                 ) -> dict[int, list[int | Fold]]:
    """Per context bucket of the program's KV-cache steps, the program planned with each of
    them at that bucket (``buckets.at_bucket``): the same segments as the whole-context plan,
    the folds holding KV-cache steps running their bucket's designs (packed with their
    neighbours as the whole context's are, ``pack``)."""
    sizes = sorted({b for v in variants for b in v})
    return {b: plan(program, [d if d is None else at_bucket(d, v, b)
                              for d, v in zip(designs, variants)], fold, pack) for b in sizes}


def changed_folds(whole: Sequence[int | Fold], plans: Mapping[int, Sequence[int | Fold]]
                  ) -> dict[int, dict[int, Fold]]:
    """Per segment index of the whole-context plan whose fold some bucket's plan changes (runs
    other designs in), that fold per bucket changing it."""
    out: dict[int, dict[int, Fold]] = {}
    for k, segment in enumerate(whole):
        for b, segments in plans.items():
            if isinstance(segment, Fold) and any(
                    a is not w for a, w in zip(segments[k].designs, segment.designs)):
                out.setdefault(k, {})[b] = segments[k]
    return out


class Bucketed(Configured):
    """A fold holding KV-cache steps with context buckets: at each dispatch the smallest bucket
    covering the last position its steps' rows reach (read from the fold's own positions
    tensors, put by the host before the dispatch) picks which of the compiled folds runs;
    every fold of the choice has the whole one's steps and host-buffer layout."""

    def __init__(self, fold: Fold, array: Array, program: Program,
                 variants: dict[int, Fold]):
        super().__init__(fold, array)
        self.variants = variants
        self.sizes = sorted(variants)  # and past the last: the whole context, ``self.fold``
        self.sources = []  # (op, its positions tensor) of every KV-cache run
        for run in fold.runs:
            op = program.steps[run.step].op
            design = fold.designs[run.design]
            names = [a.name.split("+")[0] for a in design.args]  # "pos+slot": slots packed
            if bucket_positions(op) and "pos" in names:
                self.sources.append((op, starts(design, run.tensors)[names.index("pos")]))
        if any(t not in fold.reads for _, t in self.sources):
            self.variants, self.sizes = {}, []  # positions made inside: whole context
        self.chosen: list[int | None] = []  # the bucket of every dispatch (None: whole)

    def reached(self) -> int:
        return max(reached(op, self.view(t, "i32")) for op, t in self.sources)

    def dispatch(self, fold: Fold | None = None) -> None:
        position = self.reached() if self.sizes else 0
        bucket = (covering(self.sizes, position) if self.sizes and position < self.sizes[-1]
                  else None)
        self.chosen.append(bucket)
        super().dispatch(fold or (self.fold if bucket is None else self.variants[bucket]))


def emulate_host_step(step, env: dict[int, np.ndarray], program: Program) -> None:
    """A host-placed step: its numpy maths on the arrays of ``env`` (index -> array in the
    tensor's dtype)."""
    result = step.op.reference(*(upcast(env[i]) for i in step.inputs))
    result = result if isinstance(result, tuple) else (result,)
    for i, r in zip(step.outputs, result):
        env[i] = np.asarray(r).astype(program.tensors[i].dtype)


def emulate_fold(configured: Configured, env: dict[int, np.ndarray], program: Program) -> None:
    """One dispatch of a folded configuration: the tensors it takes from the host written into
    its buffers, its main sequence run, the tensors the host reads back taken out."""
    for t in configured.fold.reads:
        configured.put(t, env[t])
    configured.dispatch()
    for t in configured.fold.writes:
        tensor = program.tensors[t]
        env[t] = configured.get(t, np.dtype(tensor.dtype), tensor.shape)


def emulate_program(program: Program, segments: Sequence[int | Configured],
                    arrays: Sequence[np.ndarray],
                    weights: Mapping[str, np.ndarray] = {},
                    state: dict[str, np.ndarray] | None = None) -> list[np.ndarray]:
    """``Program.reference``'s contract, computed by the emulator; ``state`` is updated in
    place (its arrays are written, not replaced)."""
    if len(arrays) != len(program.inputs):
        raise ShapeError(f"the program takes {len(program.inputs)} inputs, got {len(arrays)}")
    env: dict[int, np.ndarray] = {}
    state = {} if state is None else state
    for i, a in zip(program.inputs, arrays):
        t = program.tensors[i]
        a = np.asarray(a)
        if a.shape != t.shape:
            raise ShapeError(f"input {t.name!r} has shape {a.shape}, the program expects "
                             f"{t.shape}")
        env[i] = a.astype(t.dtype, copy=False)
    for t in program.tensors:
        if t.kind == "weight":
            if t.name not in weights:
                raise ShapeError(f"weight {t.name!r} {t.shape} is not bound")
            env[t.index] = np.asarray(weights[t.name]).astype(t.dtype, copy=False)
        elif t.kind == "state":
            env[t.index] = np.array(state.get(t.name, np.zeros(t.shape, t.dtype)), t.dtype)
    for segment in segments:
        if isinstance(segment, Configured):
            emulate_fold(segment, env, program)
        else:
            emulate_host_step(program.steps[segment], env, program)
    for t in program.tensors:
        if t.kind == "state":
            if t.name in state:
                state[t.name][...] = env[t.index]
            else:
                state[t.name] = env[t.index]
    return [env[i] for i in program.outputs]


class Emulated:
    """A program on an NPU device, run by the emulator, with the cpu executable's interface
    (``bind_weights``, ``bind_state``, ``run``, ``reset_state``).  ``pack`` (the default, as
    the bundle's folds are rendered): consecutive designs share one configuration where the
    array has room (``coresidence``, on a device with folds), so stepping between them loads
    nothing; ``pack=False`` gives each design its own.  ``buckets``: a fold of KV-cache steps
    runs the designs of the smallest context bucket covering the position (``Bucketed``);
    False runs the whole-context designs at every position."""

    def __init__(self, program: Program, step_files: Sequence[Path], library: Path,
                 fold: bool = True, pack: bool = True, buckets: bool = True):
        self.program, self.step_files = program, list(step_files)
        self.designs = [step_design(str(p)) for p in step_files]
        self.library = str(library)
        self.array = Array(self.library)
        self.segments = self.configure(plan(program, self.designs, fold, pack), bucket_plans(
            program, self.designs, [step_buckets(str(p)) if buckets else {}
                                    for p in step_files], fold, pack))
        self.weights: dict[str, np.ndarray] = {}
        self.states = {name: np.zeros(t.shape, t.dtype)
                       for name, t in program.named("state").items()}

    def configure(self, whole: list[int | Fold], buckets: dict[int, list[int | Fold]]
                  ) -> list[int | Configured]:
        """The plan's folds in the emulator; one holding KV-cache steps with context buckets
        (a fold that differs in some bucket's plan) as ``Bucketed``."""
        changed = changed_folds(whole, buckets)
        return [s if isinstance(s, int) else
                Bucketed(s, self.array, self.program, changed[k]) if k in changed else
                Configured(s, self.array) for k, s in enumerate(whole)]

    def bind_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        for name, t in self.program.named("weight").items():
            if name not in weights:
                raise ShapeError(f"weight {name!r} {t.shape} is not bound")
            self.weights[name] = weights[name]

    def bind_state(self, states: Mapping[str, np.ndarray]) -> None:
        for name, t in self.program.named("state").items():
            if name in states:
                if states[name].shape != t.shape or states[name].dtype != t.dtype:
                    raise ShapeError(f"state {name!r} must be a {t.dtype} array of shape "
                                     f"{t.shape}")
                self.states[name] = states[name]

    def state(self, name: str) -> np.ndarray:
        return self.states[name]

    def reset_state(self) -> None:
        for a in self.states.values():
            a[...] = 0

    def run(self, arrays: Sequence[np.ndarray], copy: bool = True) -> list[np.ndarray]:
        return emulate_program(self.program, self.segments, arrays, self.weights, self.states)

    def dispatches(self) -> int:
        """NPU dispatches so far: one per fold per call."""
        return sum(s.dispatches for s in self.segments if isinstance(s, Configured))

    def run_timed(self, arrays: Sequence[np.ndarray], seconds: np.ndarray) -> list[np.ndarray]:
        return self.run(arrays)
