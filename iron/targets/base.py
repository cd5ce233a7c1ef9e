"""The target interface: what a device kind provides to graphs, the build, bundles and the tuner.

A target turns resolved operator instances into artifacts and programs into executables.  Every
layer above it (``Graph.__call__``, ``iron.pipeline``'s bundles and doit tasks, the tuner) goes
through ``target_for(device)`` and these methods, never through a target module directly, so a
new device kind is one package implementing ``Target`` (``TARGET``) and its ``rules``:

- ``recipe(op)``: everything that goes into one artifact (``op=None``: the program executor,
  if the target has one), hashed into the artifact key, with the source files it reads (the
  doit tasks' file dependencies);
- ``build(recipe, folder)``: write the artifact's files into ``folder``; the store makes it
  atomic and content-addressed (``compile`` / ``compile_all`` wrap it);
- ``artifact(entry)``: the one file of a store entry that a bundle carries for a step;
- ``executable(program, step_files, runtime_file)``: a loaded program from such files (a bundle
  loads without a compiler); ``load(program, store)`` compiles what is missing, then loads;
- ``unavailable(device)``: why this machine cannot run the target's executables (a missing toolchain
  or runtime), or ``None``; the tuner refuses to measure on such a target;
- ``RULES``: what the target's kernels or designs need of each operator class it claims
  (``claims(cls)``), beyond the operator's own rules: a dict from class to a function
  ``(op, dev) -> rules`` in ``iron/targets/<kind>/rules.py``, found along the class's MRO, so
  a subclass shares its family's entry.  ``rules(op, dev)`` yields them (on an NPU followed by
  the check that the instance's design fits the device's resources); ``iron.resolution``
  chains them after the operator's own.  ``placement(op)``: where a step runs;
- ``on(dev)``: the target for one device of its kind; ``emulated()``: a target whose
  executables run in an emulator (only targets that have one).
- ``cost(op)``: the modelled time of an instance with its bottleneck (``iron.targets.cost``),
  or ``None`` when the target has no cost model; the tuner ranks candidates by it;
  ``cost_version()`` names the model (a digest of its sources), so logged estimates of an
  earlier model are not reused.

An ``Executable`` binds weights once, keeps state (a KV cache) across calls, runs the program
(``run``) and, for the tuner, runs it timing each step (``run_timed``).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Protocol, Sequence

import numpy as np

from ..devices import Device
from ..errors import DeviceError, ResolveError
from ..operator import Operator, Rule
from ..program import Program
from ..cache import default_store
from ..store import Entry, Store, artifact_key
from .cost import Estimate


def own_rules_only(op: Operator, dev: Device) -> Iterable[Rule]:
    """A ``RULES`` entry for a class whose kernel needs nothing beyond the operator's rules."""
    return ()


@dataclass(frozen=True)
class Recipe:
    """Everything that goes into one artifact, and the key it hashes to.

    ``description`` is JSON data: what the key hashes and the store's manifest records.
    ``sources`` are the files it was made from (the doit compile task's ``file_dep``).
    ``to_json`` / ``from_json`` carry a recipe between processes and runs (the build keeps
    its recipes in a file); a target's ``build`` checks what it takes from one, since it may
    come from a file.
    """

    name: str  # the kernel's name, e.g. "gemv"; "runtime" for a program executor
    macros: tuple[tuple[str, int], ...]
    description: dict[str, Any]
    sources: tuple[Path, ...] = ()

    @property
    def key(self) -> str:
        return artifact_key(self.description)

    @property
    def operator(self) -> str:
        return self.description.get("operator") or self.name

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "macros": [list(m) for m in self.macros],
                "description": self.description, "sources": [str(p) for p in self.sources]}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Recipe:
        """The recipe ``to_json`` wrote."""
        return cls(doc["name"], tuple((str(m), v) for m, v in doc["macros"]),
                   doc["description"], tuple(Path(s) for s in doc["sources"]))


class Executable(Protocol):
    """A program loaded on a target, its buffers allocated once and reused across calls."""

    program: Program

    def bind_weights(self, weights: Mapping[str, np.ndarray]) -> None: ...

    def bind_state(self, states: Mapping[str, np.ndarray]) -> None: ...

    def state(self, name: str) -> np.ndarray: ...

    def reset_state(self) -> None: ...

    def run(self, arrays: Sequence[np.ndarray], copy: bool = True) -> list[np.ndarray]: ...

    def run_timed(self, arrays: Sequence[np.ndarray],
                  seconds: np.ndarray) -> list[np.ndarray]: ...


class Target:
    """Base of every target; see the module docstring.  Subclasses set ``kind``."""

    kind: str

    def recipe(self, op: Operator | None) -> Recipe:
        raise NotImplementedError

    def build(self, recipe: Recipe, folder: Path) -> None:
        raise NotImplementedError

    def artifact(self, entry: Entry) -> Path:
        raise NotImplementedError

    def executable(self, program: Program, step_files: Sequence[Path],
                   runtime_file: Path | None) -> Executable:
        raise NotImplementedError

    def unavailable(self, dev: Device) -> str | None:
        return None

    def requirements(self) -> dict[str, Any]:
        """What a host needs to run this target's artifacts, as a bundle's manifest records it:
        ``march`` (the -march level, or ""), ``isa`` (CPU features, as /proc/cpuinfo names
        them) and ``cpu`` (the model of the build host)."""
        return {"march": "", "isa": [], "cpu": ""}

    #: Operator class -> the rules this target adds for it (see the module docstring).
    RULES: Mapping[type, Callable[[Operator, Device], Iterable[Rule]]] = {}

    def claims(self, cls: type[Operator]) -> bool:
        """Whether this target runs instances of ``cls`` (every claimed class needs rules)."""
        return True

    def class_rules(self, cls: type[Operator]) -> Callable[[Operator, Device], Iterable[Rule]]:
        """This target's rule function for ``cls``: the ``RULES`` entry of its nearest class."""
        for base in cls.__mro__:
            if base in self.RULES:
                return self.RULES[base]
        raise ResolveError(
            f"{cls.__name__} has no rules on the {self.kind} target: say what its kernels need "
            f"beyond the operator's own rules with an entry for it (or a base class) in "
            f"iron/targets/{self.kind}/rules.py (own_rules_only when nothing)")

    def rules(self, op: Operator, dev: Device) -> Iterator[Rule]:
        """The rules this target adds to ``op``'s own on ``dev``."""
        yield from self.class_rules(type(op))(op, dev)

    def value_rules(self, op: Operator) -> Iterator[Rule]:
        """Rules on each set tunable alone (its kernel's range of values), checked by
        ``resolve`` before it searches for the unset ones: a value no setting can make legal
        is refused at once, not after every combination has been tried."""
        return iter(())

    def placement(self, op: Operator) -> str:
        return self.kind

    def on(self, dev: Device) -> Target:
        return self

    def emulated(self) -> Target:
        raise DeviceError(f"the {self.kind} target has no emulator: it runs programs itself")

    def cost(self, op: Operator) -> Estimate | None:
        return None

    def tolerance(self, cls: type[Operator]) -> tuple[float, float]:
        """How close this target's kernel for ``cls`` must come to the reference: the
        operator's own ``tolerance``, unless the target's kernels approximate more coarsely
        and say so here."""
        return cls.tolerance

    def ignored_tunables(self, op: Operator) -> frozenset[str]:
        """Tunables of ``op`` that this target's kernel does not read: settings differing only
        in them run the same code, so a pruned sweep measures one of them."""
        return frozenset()

    def cost_version(self) -> str:
        """What identifies the cost model: a changed model must not reuse logged estimates."""
        return "1"

    # ---- derived behaviour ------------------------------------------------------------------

    @property
    def has_runtime(self) -> bool:
        """Whether programs run through an executor artifact of their own (``recipe(None)``)."""
        return True

    def key(self, op: Operator | None) -> str:
        return self.recipe(op).key

    def compile(self, recipe: Recipe, store: Store | None = None) -> Entry:
        """The store entry of ``recipe``, built if needed; a failure leaves nothing behind."""
        return (store or default_store()).get_or_build(recipe.key, recipe.description,
                                                       lambda folder: self.build(recipe, folder))

    def compile_all(self, ops: Sequence[Operator | None], store: Store | None = None,
                    jobs: int | None = None) -> list[Entry]:
        """Compile the distinct recipes of ``ops`` (in parallel), returning an entry per op."""
        recipes = [self.recipe(op) for op in ops]
        entries = self.compile_recipes(recipes, store, jobs)
        return [entries[r.key] for r in recipes]

    def compile_recipes(self, recipes: Iterable[Recipe], store: Store | None = None,
                        jobs: int | None = None) -> dict[str, Entry]:
        """The entry of each distinct recipe, by key, compiled in parallel where missing."""
        distinct = {r.key: r for r in recipes}
        with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
            return dict(zip(distinct, pool.map(lambda r: self.compile(r, store),
                                               distinct.values())))

    def load(self, program: Program, store: Store | None = None) -> Executable:
        """Compile what is missing and return a ready executable of ``program``."""
        self.require_available(program.device)
        entries = self.compile_all([*program.ops, *([None] if self.has_runtime else [])], store)
        runtime = self.artifact(entries.pop()) if self.has_runtime else None
        return self.executable(program, [self.artifact(e) for e in entries], runtime)

    def require_available(self, dev: Device) -> None:
        reason = self.unavailable(dev)
        if reason:
            raise DeviceError(reason)
