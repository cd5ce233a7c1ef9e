"""Tunables are bounded by the ranges the cpu kernels state, before anything is compiled.

A profile's ``prefetch: 2**70`` once reached gcc as ``-DIRON_PREFETCH=1180591620717411303424``,
which it truncated to 0 with a warning nobody saw, while the artifact key recorded 2^70."""

from __future__ import annotations

import numpy as np
import pytest

import iron
from iron.operators import GEMV
from iron.resolution import resolve
from iron.targets.cpu.ranges import stated_ranges


class QuantizedGEMV(iron.Graph):
    def body(self, w, x):
        return GEMV.step(w, x, weight_format="q4_1")


def test_a_profile_value_past_the_kernels_range_is_refused_naming_entry_value_and_range(
        tmp_path, monkeypatch):
    profile = tmp_path / "cpu.json"
    profile.write_text('{"device": "cpu", "entries": [\n'
                       f'  {{"operator": "GEMV", "M": 64, "prefetch": {2**70}}}\n]}}\n')
    graph = QuantizedGEMV("cpu")
    graph.profile = profile

    def no_compile(*args, **kwargs):
        raise AssertionError("a compile started before the value was checked")

    monkeypatch.setattr("iron.targets.cpu.target.build", no_compile)
    with pytest.raises(iron.ResolveError) as e:  # 64 rows of 40 bytes: q4_1, K = 64
        graph(np.zeros((64, 40), np.uint8), np.zeros(64, iron.bfloat16))
    message = str(e.value)
    assert (f'prefetch={2**70} (from profile entry {{"operator": "GEMV", "M": 64, "prefetch": '
            f'{2**70}}} ({profile} line 2)) breaks the rule 1 <= prefetch <= 65536 (the range '
            "qmatmul.h states for IRON_PREFETCH)") in message, message


def test_a_tunable_no_kernel_narrows_is_bounded_as_an_int():
    op = GEMV(M=576, K=576, tile_size_output=2**40)
    with pytest.raises(iron.ResolveError) as e:
        resolve(op, "cpu")
    assert str(e.value) == (
        f"{op.describe()} on cpu: tile_size_output=1099511627776 (from the constructor) breaks "
        "the rule 1 <= tile_size_output <= 2147483647 (the range iron_cpu.h states for "
        "IRON_TILE_SIZE_OUTPUT)")


@pytest.mark.parametrize("shape", GEMV.test_shapes, ids=str)
def test_every_prefetch_the_tuner_tries_lies_in_the_stated_range(shape):
    low, high, _ = stated_ranges()["IRON_PREFETCH"]
    values = GEMV(**shape).space(iron.device("cpu"))["prefetch"]
    assert values and all(low <= v <= high for v in values), values
