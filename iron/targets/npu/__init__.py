"""The npu1 / npu2 targets: a design per resolved instance, checked, rendered, emulated.

A resolved operator instance on an NPU becomes a ``Design`` (``designs``): tiles, object FIFOs,
core loops and the runtime sequence, drawn the way upstream IRON's designs are.  Its legality is
measured against the device's resources (``check``, numbers in ``resources``) as part of the
operator's legality (``NpuTarget.rules``), so a profile entry whose FIFOs overflow a tile is
refused at graph set-up with the figures.  Compiling an instance writes its design artifacts
into the artifact store: the design as JSON, its MLIR-AIE module in custom and generic form
(``mlir``, in the syntax of the pinned mlir-aie; ``verify`` checks the generic form against
its op definitions, ``ods``), the core kernels' sources (AIE API C++), and ``step.json``
(design and both modules in one file: what a bundle carries); where ``aiecc.py`` is on PATH,
aiecc turns the custom form into an xclbin and an instruction stream (``aiecc``).  Operators without a design are placed on the
host: they run with their numpy maths between NPU calls.  The program "executor" of the target
is the core kernels built for the host through the host AIE API header, which the emulator
(``emulator``, ``runner``) calls.  A program's consecutive NPU steps run as one folded
configuration, one dispatch (``fold``: a module of several devices and a main sequence of
``aiex.configure`` / ``aiex.run``); ``report`` counts a bundle's dispatches and splits its
modelled time.

Running on the NPU itself needs XRT's ``pyxrt`` and a runner iron does not have, so the target
is unavailable for running unless emulated: ``target.emulated()`` (``Graph.emulate``,
``--emulate``) runs programs through the emulator.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import shutil
import subprocess
from pathlib import Path
from typing import Iterator, Sequence

from ...devices import Device
from ...errors import CompileError, DeviceError
from ...operator import Operator, Rule
from ...paths import KERNELS_DIR
from ...program import Program
from ...store import Entry
from ..base import Recipe, Target
from ..cost import Estimate
from . import kernels
from .resources import resources
from .rules import RULES

RECIPE_VERSION = 3
SOURCE_DIR = KERNELS_DIR / "npu"
HOST_FLAGS = ("-O3", "-fPIC", "-shared", "-std=c++17")
KERNEL_HEADERS = ("iron_aie.h", "aie_api_host.h")
HOST_LIBRARY = "cores.so"
STEP_FILE = "step.json"
#: A context bucket's design files (``buckets``) go in ``bucket<positions>/`` of the step's.
BUCKET_DIR = "bucket"
DESIGN_FILE, MLIR_FILE, GENERIC_FILE = "design.json", "design.mlir", "design.generic.mlir"


@functools.lru_cache(maxsize=1 << 14)
def operator_class(name: str) -> type[Operator]:
    """The operator class a recipe read back from a file names.  The registry fills as
    ``iron.operators`` is imported, which a build that reuses recorded programs never does
    otherwise (it opens no application), so it is imported here."""
    from ... import operators  # noqa: F401

    try:
        return Operator.registry[name]
    except KeyError:
        raise CompileError(f"recipe names operator {name!r}, which iron does not define (it "
                           f"has {', '.join(sorted(Operator.registry))})") from None


def design_of(op: Operator, device: str):
    """The design of a resolved instance on ``device`` (None: placed on the host)."""
    from .designs import design_for

    return design_for(op, resources(device))


@functools.lru_cache(maxsize=1 << 14)
def target_rules(op: Operator, device: str) -> tuple[Rule, ...]:
    """The rules ``NpuTarget.rules`` yields, once per instance: resolving and the tuner ask
    for them many times, and drawing and measuring a design is the expensive part."""
    from .check import design_rules
    from .designs import family_rules

    res = resources(device)
    family = tuple(family_rules(op, res))
    if not all(r.ok for r in family):
        return family
    design = design_of(op, device)
    return family if design is None else family + tuple(design_rules(design, res,
                                                                     op.tunables()))


@functools.lru_cache(maxsize=1 << 14)
def cost_of(op: Operator, device: str) -> Estimate | None:
    """``NpuTarget.cost``, once per instance (the tuner asks for each candidate's twice)."""
    from .cost import design_estimate

    design = design_of(op, device)
    return None if design is None else design_estimate(design)


def digest_of(paths: Sequence[Path]) -> str:
    return hashlib.sha256(json.dumps(digests(paths), sort_keys=True).encode()).hexdigest()[:16]


def digests(paths: Sequence[Path]) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}


def missing_runtime() -> list[str]:
    """What running on a real NPU needs and this machine lacks."""
    missing = []
    if shutil.which("aiecc.py") is None:
        missing.append("aiecc.py (mlir-aie)")
    if importlib.util.find_spec("pyxrt") is None:
        missing.append("pyxrt (XRT Python bindings)")
    return missing or ["an XRT runner, which iron does not have yet"]


def aiecc_identity() -> str | None:
    """Where aiecc.py is on PATH, its path: a different toolchain is a different artifact."""
    path = shutil.which("aiecc.py")
    return None if path is None else str(Path(path).resolve())


class NpuTarget(Target):
    """Designs for one NPU device; ``emulate`` runs programs in the emulator."""

    kind = "npu"
    RULES = RULES

    def __init__(self, device: Device | None = None, emulate: bool = False):
        self.device, self.emulate = device, emulate

    def on(self, dev: Device) -> NpuTarget:
        return type(self)(dev, self.emulate)

    def emulated(self) -> NpuTarget:
        return type(self)(self.device, emulate=True)

    def _dev(self) -> Device:
        if self.device is None:
            raise DeviceError("the npu target needs a device: use target_for(device)")
        return self.device

    # ---- legality ---------------------------------------------------------------------------

    def claims(self, cls: type[Operator]) -> bool:
        """Every operator: one without a design runs on the host between NPU calls."""
        return hasattr(cls, "kernel")

    def rules(self, op: Operator, dev: Device) -> Iterator[Rule]:
        """The class's shape rules (``rules.RULES``), then that ``op``'s design fits ``dev``'s
        memories, DMA channels, descriptors and patterns."""
        shape = list(super().rules(op, dev))
        yield from shape
        if all(r.ok for r in shape):
            yield from target_rules(op, dev.name)

    def placement(self, op: Operator) -> str:
        return "host" if design_of(op, self._dev().name) is None else "npu"

    def tolerance(self, cls: type[Operator]) -> tuple[float, float]:
        return kernels.tolerance(cls, self._dev().name)

    # ---- the cost model ----------------------------------------------------------------------

    def cost(self, op: Operator) -> Estimate | None:
        """The modelled time of a legal instance's design (``cost.design_estimate``); None for an
        instance placed on the host, which the npu does not run."""
        return cost_of(op, self._dev().name)

    def cost_version(self) -> str:
        """A digest of the model's sources: the designs, their data, the model, the numbers."""
        names = ("cost.py", "ir.py", "designs.py", "resources.py", "kernels.py",
                 "qmatrix.py")
        return digest_of([Path(__file__).with_name(n) for n in names]
                         + sorted(SOURCE_DIR.glob("*.cc")) + [SOURCE_DIR / "iron_aie.h"])

    # ---- recipes and artifacts ----------------------------------------------------------------

    def recipe(self, op: Operator | None) -> Recipe:
        from .buckets import bucket_designs
        from .mlir import SYNTAX

        if op is None:  # the core kernels built for the host: what the emulator calls, built
            # for the architecture of the device's cores (kernels.arch)
            sources = tuple(sorted(SOURCE_DIR.glob("*.cc")) + sorted(SOURCE_DIR.glob("*.h")))
            description = {"recipe": RECIPE_VERSION, "target": "npu-host-cores",
                           "arch": kernels.arch(self._dev().name),
                           "sources": digests(sources), "compiler": cxx_compiler()[1],
                           "flags": list(HOST_FLAGS)}
            return Recipe("cores", (), description, sources)
        dev = self._dev()
        design = design_of(op, dev.name)
        sources = () if design is None else (SOURCE_DIR / design.kernel_source,
                                             *(SOURCE_DIR / h for h in KERNEL_HEADERS))
        description = {
            "recipe": RECIPE_VERSION, "target": dev.name, "operator": type(op).__name__,
            "fields": op.config(), "placement": "host" if design is None else "npu",
            "sources": digests(sources), "mlir_syntax": SYNTAX, "aiecc": aiecc_identity(),
            # the design itself: a change of how it is drawn (a FIFO's depth) is a new artifact
            "design": None if design is None else design_digest(design),
            # and each context bucket's (``buckets``): compiled with the step
            "buckets": {str(b): design_digest(d)
                        for b, d in bucket_designs(op, dev.name).items()}}
        return Recipe(design.kernel_source if design else "host", (), description, sources)

    def build(self, recipe: Recipe, folder: Path) -> None:
        d = recipe.description
        if d["target"] == "npu-host-cores":
            return build_host_cores(folder, d["arch"])
        op = operator_class(d["operator"])(**d["fields"])
        design = design_of(op, d["target"])
        if design is None:
            (folder / STEP_FILE).write_text(json.dumps(
                {"placement": "host", "operator": op.describe(True),
                 "why": "no npu design yet: it runs with its numpy maths on the host between "
                        "NPU calls"}, indent=1))
            return
        from .aiecc import run_aiecc
        from .buckets import bucket_designs

        step = write_design(folder, design, recipe.sources)
        if d["aiecc"]:
            run_aiecc(folder, design)
        step["buckets"] = []
        for b, bucketed in bucket_designs(op, d["target"]).items():
            sub = folder / f"{BUCKET_DIR}{b}"
            sub.mkdir()
            step["buckets"].append({"positions": b, **write_design(sub, bucketed,
                                                                   recipe.sources)})
            if d["aiecc"]:
                run_aiecc(sub, bucketed)
        (folder / STEP_FILE).write_text(json.dumps(step))

    def artifact(self, entry: Entry) -> Path:
        library = entry.file(HOST_LIBRARY)
        return library if library.exists() else entry.file(STEP_FILE)

    # ---- running ------------------------------------------------------------------------------

    def unavailable(self, dev: Device) -> str | None:
        if self.emulate:
            return None
        return (f"running on {dev} itself needs {', '.join(missing_runtime())}; run it in the "
                "emulator instead (graph.emulate(...), or --emulate)")

    def executable(self, program: Program, step_files: Sequence[Path],
                   runtime_file: Path | None):
        self.require_available(program.device)
        from .runner import Emulated

        return Emulated(program, step_files, runtime_file)


def design_digest(design) -> str:
    return hashlib.sha256(json.dumps(design.to_json(), sort_keys=True).encode()).hexdigest()[:16]


def write_design(folder: Path, design, sources: Sequence[Path]) -> dict:
    """A design's files in ``folder`` (its JSON, its module in custom and generic form, the
    kernel sources aiecc compiles with it); returns what its step file says of it."""
    from .mlir import render

    doc, custom, generic = design.to_json(), render(design), render(design, generic=True)
    (folder / DESIGN_FILE).write_text(json.dumps(doc, indent=1))
    (folder / MLIR_FILE).write_text(custom)
    (folder / GENERIC_FILE).write_text(generic)
    (folder / "kernels").mkdir()
    for path in sources:
        shutil.copy2(path, folder / "kernels" / path.name)
    return {"placement": "npu", "design": doc, "mlir": custom, "mlir_generic": generic}


def cxx_compiler() -> tuple[str, str]:
    """The host C++ compiler (``$CXX`` or ``c++``) and its identity: the core kernels are C++
    (the AIE API is a C++ library), built for the host with its host implementation."""
    from ..cpu.build import toolchain

    return toolchain("CXX", "c++", "the npu emulator builds the core kernels with a C++ "
                     "compiler: none found as $CXX or c++ on PATH (install g++)")


def build_host_cores(folder: Path, arch: str) -> None:
    """The kernels for the host, as ``arch``'s cores (``aie2`` or ``aie2p``) would run them:
    the host AIE API header refuses what that architecture's API does not offer."""
    cxx, _ = cxx_compiler()
    command = [cxx, *HOST_FLAGS, f"-DIRON_AIE_ARCH={kernels.AIE_ARCH[arch]}", f"-I{SOURCE_DIR}",
               *map(str, sorted(SOURCE_DIR.glob("*.cc"))), "-o", str(folder / HOST_LIBRARY),
               "-lm"]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise CompileError(f"building the npu core kernels for the host failed:\n$ "
                           f"{' '.join(command)}\n{result.stderr.strip()}")


TARGET = NpuTarget()
