"""The last stretch to the NPU, where the mlir-aie toolchain is installed: Peano compiles the
core kernels, ``aiecc.py`` turns the custom-form module into an xclbin and an instruction
stream.  The command lines are those of mlir-aie's programming examples (their Makefiles):

    $PEANO_INSTALL_DIR/bin/clang++ -O2 -std=c++20 --target=aie2-none-unknown-elf
        -I$MLIR_AIE_INCLUDE_DIR -c k.cc -o k.o
    aiecc.py --no-xchesscc --no-xbridge --peano $PEANO_INSTALL_DIR --aie-generate-xclbin
             --xclbin-name=final.xclbin --aie-generate-npu-insts --npu-insts-name=insts.bin
             --no-compile-host design.mlir

(``aie2p-none-unknown-elf`` for npu2; ``MLIR_AIE_INCLUDE_DIR`` is mlir-aie's ``include``
directory, which holds the AIE API, ``aie_api/aie.hpp``.)

A fold (several designs behind one dispatch, ``fold``) is one module of several devices; aiecc
bundles its configurations (PDIs) and its main instruction stream into one ELF, as upstream
IRON compiles its fused Llama (``AieccFullElfCompilationRule`` in amd/IRON's
``iron/common/compilation/base.py``):

    aiecc.py --no-xchesscc --no-xbridge --peano $PEANO_INSTALL_DIR --no-compile-host
             --generate-full-elf --full-elf-name=fold.elf fold.mlir

(``--generate-full-elf`` and ``--full-elf-name`` as mlir-aie's ``python/compiler/aiecc/
cl_arguments.py`` declares them; IRON adds ``--dynamic-objFifos``, which iron's statically
lowered designs do not ask for, and ``--expand-load-pdis``, which the pinned aiecc.py does not
declare.)  Only npu2 has this flow (``fold.FULL_ELF_DEVICES``).

Neither path has run against a real aiecc.py: only against a stand-in here, which checks the
command lines; no mlir-aie toolchain is installable on the machines iron is developed on.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from ...errors import CompileError
from .ir import Design
from .fold import Fold, render

PEANO_TARGET = {"npu1": "aie2-none-unknown-elf", "npu2": "aie2p-none-unknown-elf"}


def peano_dir() -> Path:
    env = os.environ.get("PEANO_INSTALL_DIR")
    if not env or not (Path(env) / "bin" / "clang++").exists():
        raise CompileError("aiecc.py is on PATH but Peano is not: set PEANO_INSTALL_DIR to the "
                           "llvm-aie install (it must hold bin/clang++)")
    return Path(env)


def run(command: list[str], cwd: Path) -> None:
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        raise CompileError(f"$ {' '.join(command)}\n{result.stderr.strip()}")


def aie_api_include() -> Path:
    include = os.environ.get("MLIR_AIE_INCLUDE_DIR")
    if not include or not (Path(include) / "aie_api" / "aie.hpp").exists():
        raise CompileError("aiecc.py is on PATH but the AIE API is not: set "
                           "MLIR_AIE_INCLUDE_DIR to mlir-aie's include directory (it must hold "
                           "aie_api/aie.hpp)")
    return Path(include)


def compile_kernel(folder: Path, design: Design, peano: Path) -> None:
    """Peano's object file of ``design``'s kernel source (in ``folder/kernels``), the file its
    ``func.func`` declarations link with."""
    from .mlir import object_file

    run([str(peano / "bin" / "clang++"), "-O2", "-std=c++20",
         f"--target={PEANO_TARGET[design.device]}", "-Ikernels", f"-I{aie_api_include()}", "-c",
         f"kernels/{design.kernel_source}", "-o", object_file(design.kernel_source)], folder)


def aiecc() -> str:
    return shutil.which("aiecc.py") or "aiecc.py"


def expect(folder: Path, *names: str) -> None:
    for name in names:
        if not (folder / name).is_file():
            raise CompileError(f"aiecc.py ran but wrote no {name} in {folder}")


def run_aiecc(folder: Path, design: Design) -> None:
    """Compile ``folder``'s design (written by the npu target) into final.xclbin + insts.bin."""
    peano = peano_dir()
    compile_kernel(folder, design, peano)
    run([aiecc(), "--no-xchesscc", "--no-xbridge", "--peano", str(peano),
         "--aie-generate-xclbin", "--xclbin-name=final.xclbin", "--aie-generate-npu-insts",
         "--npu-insts-name=insts.bin", "--no-compile-host", "design.mlir"], folder)
    expect(folder, "final.xclbin", "insts.bin")


#: What ``run_full_elf`` writes: the fold's module and the ELF aiecc makes of it.
FOLD_MLIR, FOLD_ELF = "fold.mlir", "fold.elf"


def full_elf_command(peano: Path) -> list[str]:
    """aiecc.py's command line for a fold's full ELF (see the module docstring)."""
    return [aiecc(), "--no-xchesscc", "--no-xbridge", "--peano", str(peano), "--no-compile-host",
            "--generate-full-elf", f"--full-elf-name={FOLD_ELF}", FOLD_MLIR]


def run_full_elf(folder: Path, fold: Fold, kernels: Path) -> None:
    """Compile ``fold`` into ``folder/fold.elf``: its module written as ``fold.mlir``, each
    distinct kernel source (from ``kernels``) compiled by Peano, then aiecc's full ELF.  Only
    where aiecc.py is installed, and only on a device with folds (``fold.render`` refuses the
    others)."""
    from ...util import atomic_write_bytes

    peano = peano_dir()
    text = render(fold)
    (folder / "kernels").mkdir(parents=True, exist_ok=True)
    for source in sorted({d.kernel_source for d in fold.kernel_designs()}):
        shutil.copy2(kernels / source, folder / "kernels" / source)
    for header in sorted(kernels.glob("*.h")):
        shutil.copy2(header, folder / "kernels" / header.name)
    atomic_write_bytes(folder / FOLD_MLIR, text.encode())
    for design in {d.kernel_source: d for d in fold.kernel_designs()}.values():
        compile_kernel(folder, design, peano)
    run(full_elf_command(peano), folder)
    expect(folder, FOLD_ELF)
