"""The last stretch to the NPU, where the mlir-aie toolchain is installed: Peano compiles the
core kernels, ``aiecc.py`` turns the custom-form module into an xclbin and an instruction
stream.  The command lines are those of mlir-aie's programming examples (their Makefiles):

    $PEANO_INSTALL_DIR/bin/clang++ -O2 -std=c++20 --target=aie2-none-unknown-elf
        -I$MLIR_AIE_INCLUDE_DIR -c k.cc -o k.o
    aiecc.py --no-xchesscc --no-xbridge --peano $PEANO_INSTALL_DIR --aie-generate-xclbin
             --xclbin-name=final.xclbin --aie-generate-npu-insts --npu-insts-name=insts.bin
             --no-compile-host design.mlir

(``aie2p-none-unknown-elf`` for npu2; ``MLIR_AIE_INCLUDE_DIR`` is mlir-aie's ``include``
directory, which holds the AIE API, ``aie_api/aie.hpp``.)  This path has only run against a
stand-in aiecc.py here: no mlir-aie toolchain is installable on the machines iron is
developed on.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from ...errors import CompileError
from .design import Design

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


def run_aiecc(folder: Path, design: Design) -> None:
    """Compile ``folder``'s design (written by the npu target) into final.xclbin + insts.bin."""
    peano = peano_dir()
    from .mlir import object_file

    include = os.environ.get("MLIR_AIE_INCLUDE_DIR")
    if not include or not (Path(include) / "aie_api" / "aie.hpp").exists():
        raise CompileError("aiecc.py is on PATH but the AIE API is not: set "
                           "MLIR_AIE_INCLUDE_DIR to mlir-aie's include directory (it must hold "
                           "aie_api/aie.hpp)")
    run([str(peano / "bin" / "clang++"), "-O2", "-std=c++20",
         f"--target={PEANO_TARGET[design.device]}", "-Ikernels", f"-I{include}", "-c",
         f"kernels/{design.kernel_source}", "-o", object_file(design.kernel_source)], folder)
    run([shutil.which("aiecc.py") or "aiecc.py", "--no-xchesscc", "--no-xbridge", "--peano",
         str(peano), "--aie-generate-xclbin", "--xclbin-name=final.xclbin",
         "--aie-generate-npu-insts", "--npu-insts-name=insts.bin", "--no-compile-host",
         "design.mlir"], folder)
    for name in ("final.xclbin", "insts.bin"):
        if not (folder / name).is_file():
            raise CompileError(f"aiecc.py ran but wrote no {name} in {folder}")
