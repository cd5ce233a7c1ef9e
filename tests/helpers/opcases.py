"""Operator test cases, read off the operator registry: each class's ``test_shapes``, its
``example`` inputs and its ``tolerance``. The kernel tests loop over these."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess

import numpy as np

import iron
from iron.operator import Operator
from iron.targets import cpu
from iron.tuning.check import assert_close  # noqa: F401  (the tests' comparison)


class OneStep(iron.Graph):
    """A graph of a single step: ``cls.step(*inputs, **fields)``."""

    def __init__(self, cls, fields=None, device="cpu"):
        super().__init__(device)
        self.cls, self.fields = cls, dict(fields or {})

    def body(self, *inputs):
        return self.cls.step(*inputs, **self.fields)


def tolerance_on(name: str, device: str) -> tuple[float, float]:
    """The tolerance of operator ``name``'s kernel on ``device`` (``Target.tolerance``)."""
    from iron.targets import target_for

    return target_for(iron.device(device)).tolerance(Operator.registry[name])


def operators_under_test() -> list[type[Operator]]:
    """Every registered operator that declares test shapes, by name."""
    return sorted((c for c in Operator.registry.values() if c.test_shapes),
                  key=lambda c: c.__name__)


def case_inputs(name: str, shape: dict, rng) -> tuple[type, dict, list]:
    """(operator class, call fields, input arrays) for one named case at one shape."""
    cls = Operator.registry[name]
    fields, inputs = cls.example(rng, **shape)
    return cls, fields, inputs


#: Shapes per operator: odd and minimum sizes, the Llama shapes of SmolLM2.
SHAPES = {c.__name__: list(c.test_shapes) for c in operators_under_test()}

#: The shape of each operator whose every legal tunable setting is run.
SWEEP = {c.__name__: c.test_shapes[c.sweep_shape] for c in operators_under_test()}


SMALL = [
    ("AXPY", {"shape": (1024,)}), ("ElementwiseAdd", {"shape": (512,)}),
    ("ElementwiseMul", {"shape": (2, 256)}), ("SiLU", {"shape": (512,)}),
    ("SwiGLU", {"rows": 2, "size": 256}),
    ("RMSNorm", {"rows": 8, "size": 64, "weighted": True}),
    ("RMSNorm", {"rows": 4, "size": 96, "weighted": False}),
    ("Softmax", {"rows": 8, "size": 64}),
    ("GEMV", {"M": 64, "K": 32, "batches": 1}), ("GEMV", {"M": 32, "K": 48, "batches": 3}),
    ("GEMM", {"M": 32, "K": 64, "N": 64}),
    ("GEMV", {"M": 32, "K": 48, "batches": 2, "output_dtype": "float32"}),  # logits
    ("GEMM", {"M": 32, "K": 64, "N": 64, "output_dtype": "float32"}),
]


def build(name, shape, march, tmp_path, rng, tunables=None):
    """The kernel of a one-step program compiled with -march=``march`` (nothing runs, so any
    host builds for any level): (program, inputs, library path, disassembly or None)."""
    cls, fields, inputs = case_inputs(name, shape, rng)
    program = OneStep(cls, {**fields, **(tunables or {})}).record_like(inputs)
    op = program.ops[0]
    recipe = cpu.recipe_for(op)
    lib = tmp_path / f"kernel-{march}.so"
    cmd = [cpu.compiler()[0], *cpu.flags(march), f"-I{cpu.SOURCE_DIR}",
           *(f"-D{m}={v}" for m, v in recipe.macros), str(cpu.kernel_source(op)),
           "-o", str(lib)]
    subprocess.run(cmd, check=True, capture_output=True)
    code = (subprocess.run(["objdump", "-d", str(lib)], capture_output=True).stdout
            if shutil.which("objdump") else None)
    return program, inputs, lib, code


def run_built(name, shape, march, tmp_path, rng, tunables=None):
    """The kernel of a one-step program compiled with -march=``march`` and run here on random
    inputs: its output, the reference's, and the library's disassembly (or None)."""
    program, inputs, lib, code = build(name, shape, march, tmp_path, rng, tunables)
    (shape_, dtype), = program.ops[0].signature(
        *(program.tensors[i] for i in program.steps[0].inputs))
    out = np.zeros(shape_, dtype)
    arrays = [np.ascontiguousarray(a) for a in inputs] + [out]
    args = (ctypes.c_void_p * len(arrays))(*(a.ctypes.data for a in arrays))
    ctypes.CDLL(str(lib)).iron_kernel(args)
    return out, program.reference(inputs)[0], code


def assert_builds_agree(name, shape, wide, narrow, instruction, tmp_path, seed):
    """The kernel compiled with -march=``wide`` (whose code must match the regular expression
    ``instruction``, where objdump can tell) and with -march=``narrow`` gives the same bits on
    the same inputs, and agrees with the reference."""
    out, reference, code = run_built(name, shape, wide, tmp_path, np.random.default_rng(seed))
    other, _, _ = run_built(name, shape, narrow, tmp_path, np.random.default_rng(seed))
    if code is not None:  # really the wide kernel
        assert re.search(instruction, code), f"-march={wide} code has no {instruction!r}"
    differ = np.flatnonzero(out.view(np.uint16) != other.view(np.uint16))
    assert differ.size == 0, (f"{name}: {differ.size} of {out.size} outputs differ between "
                              f"-march={wide} and -march={narrow}")
    assert_close(name, out, reference)
