"""The operator registry: a new operator is its declaration and its kernel, nothing else."""

import numpy as np
import pytest
from opcases import OneStep, assert_close, case_inputs, operators_under_test

import iron
from iron.operator import Operator
from iron.pipeline.app import Application
from iron.operators import Elementwise
from iron.resolution import legal_settings
from iron.tuning.measure import TargetBenchmark
from iron.tuning.tuner import TuneOptions, tune

NEGATE_C = """\
#include "iron_cpu.h"

#define IRON_ARITY 1
static inline float iron_element(float x, float unused) { (void)unused; return -x; }

#include "iron_elementwise.h"
"""


class OnlyStep(iron.Graph):
    def __init__(self, cls, device, profile):
        super().__init__(device, profile)
        self.cls = cls

    def body(self, x):
        return self.cls.step(x)


def test_a_new_operator_needs_only_its_declaration_and_its_kernel(tmp_path):
    """A toy operator declared here, with its kernel in a folder of its own: the kernel tests'
    catalogue lists it, the cpu target compiles it, the tuner tunes it into a profile."""
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "toy_negate.c").write_text(NEGATE_C)

    class ToyNegate(Elementwise):
        """``-x``."""

        kernel = "toy_negate"
        kernel_root = tmp_path
        arity = 1
        test_shapes = ({"shape": (256,)},)

        def reference(self, x):
            return -x

    class ToyApp(Application):
        name = "toy"

        def programs(self, device, profile):
            return {"main": OnlyStep(ToyNegate, device, profile).record((256,))}

        def weights(self):
            return iter(())  # its one program has no weights

    try:
        assert ToyNegate in operators_under_test()
        cls, fields, inputs = case_inputs("ToyNegate", ToyNegate.test_shapes[0],
                                          np.random.default_rng(0))
        graph = OneStep(cls, fields)
        out = graph(*inputs)
        assert_close("ToyNegate", out, graph.reference(*inputs))
        assert np.array_equal(out, -inputs[0])
        result = tune(ToyApp(), "cpu", TuneOptions(profile_path=tmp_path / "toy.json",
                                                   log_path=tmp_path / "toy.jsonl",
                                                   in_program=False),
                      benchmark=TargetBenchmark(min_time=0.005, blocks=4,
                                                quiet=None))  # timings unused
        (outcome,) = result.outcomes
        assert outcome.measured == outcome.total == len(legal_settings(ToyNegate(size=256)))
        assert outcome.rejected == 0
        assert "ToyNegate" in (tmp_path / "toy.json").read_text()
    finally:
        del Operator.registry["ToyNegate"]


def test_an_operator_named_like_another_is_refused_naming_both_modules():
    with pytest.raises(iron.FieldError, match=r"test_operators\..*GEMV has the name of "
                       r"iron\.operators\.matrix\.GEMV"):
        class GEMV(Operator):
            kernel = "gemv"
    assert Operator.registry["GEMV"].__module__ == "iron.operators.matrix"


def test_every_registered_operator_declares_its_test_facts():
    """The kernel tests and the tuner read these off the class; a concrete operator without
    them would silently drop out of the kernel tests."""
    for cls in Operator.registry.values():
        if hasattr(cls, "kernel") and cls.__module__.startswith("iron."):
            assert cls.test_shapes, f"{cls.__name__} declares no test_shapes"
            rtol, atol = cls.tolerance
            # at most one bf16 rounding beyond the check's one-ulp allowance: a 1% systematic
            # error must fail the kernel tests (iron/operator.py states each bound's reason)
            assert 0 <= rtol <= 2.0 ** -8 and 0 <= atol <= 2.0 ** -8, (cls.__name__,
                                                                      cls.tolerance)
