"""The folded configurations of an npu bundle, read from its manifest: for ``verify BUNDLE``
and for writing them as files (``python -m iron.targets.npu.foldfiles BUNDLE OUT``).

It reads bundles, so it sits above the pipeline layer (``scripts/import_cycles.py``), unlike
``fold`` itself, which the npu target's executables use.
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
from pathlib import Path

from ...errors import IronError
from ...paths import KERNELS_DIR
from ...pipeline.bundle import Bundle, read_manifest
from ...util import atomic_write_bytes
from .aiecc import run_full_elf
from .fold import Fold, folds_on, plan, render
from .runner import bucket_plans, changed_folds, step_buckets, step_design


def bundle_folds(path: Path):
    """(program name, fold) for every fold of every program of the npu bundle at ``path``, as
    its executables fold them; none on a device without folds (npu1: each NPU step is its own
    xclbin, ``fold.folds_on``)."""
    return ((name, fold) for name, fold, whole in all_folds(path) if whole is None)


def bucket_folds(path: Path):
    """(program name, fold, the whole-context fold it stands for) for every fold a context
    bucket changes, at that bucket (named ``<fold>.bucket<positions>``)."""
    return ((name, fold, whole) for name, fold, whole in all_folds(path) if whole is not None)


def all_folds(path: Path):
    """(program name, fold, None) for every fold of the bundle at ``path``, each followed by
    (program name, bucket fold, that fold) for each context bucket changing it."""
    bundle = Bundle.open(path)
    for name, doc in bundle.manifest["programs"].items():
        paths = [str(bundle.path / k) for k in doc["kernels"]]
        program, designs = bundle.program(name), [step_design(p) for p in paths]
        whole = plan(program, designs)
        changed = changed_folds(whole, bucket_plans(program, designs,
                                                    [step_buckets(p) for p in paths], True))
        for k, segment in enumerate(whole):
            if isinstance(segment, Fold) and folds_on(segment.device):
                yield name, segment, None
                for b, fold in changed.get(k, {}).items():
                    yield (name, dataclasses.replace(fold, name=f"{segment.name}.bucket{b}"),
                           segment)


def main(argv: list[str] | None = None) -> int:
    """``python -m iron.targets.npu.foldfiles BUNDLE OUT``: write each fold's module, custom and
    generic form, as ``OUT/<program>.<fold>.mlir`` / ``.generic.mlir`` (``verify BUNDLE``
    checks the same modules without writing); where aiecc.py is on PATH, also compile each into
    ``OUT/<program>.<fold>/fold.elf`` with aiecc's full-ELF option (``aiecc.run_full_elf``,
    the kernels from iron's sources).  An npu1 bundle has no folds: nothing is written."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m iron.targets.npu.foldfiles BUNDLE OUT", file=sys.stderr)
        return 2
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    n = 0
    try:
        for program, fold, _ in all_folds(Path(argv[0])):
            for generic, suffix in ((False, ".mlir"), (True, ".generic.mlir")):
                atomic_write_bytes(out / f"{program}.{fold.name}{suffix}",
                                   render(fold, generic).encode())
            if shutil.which("aiecc.py"):
                run_full_elf(out / f"{program}.{fold.name}", fold, KERNELS_DIR / "npu")
            n += 1
    except IronError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    device = read_manifest(Path(argv[0]))["device"]
    if not folds_on(device):
        print(f"the {device} bundle has no folds (no full-ELF flow: each NPU step is its own "
              "xclbin); nothing written")
        return 0
    compiled = " and compiled each to a full ELF" if n and shutil.which("aiecc.py") else ""
    print(f"wrote {n} folded configurations into {out}{compiled}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
