"""Resolution: defaults per device and the legality rules, whatever the value's source."""

import dataclasses

import numpy as np
import pytest
from opcases import OneStep, operators_under_test

import iron
from iron.operators import AXPY, GEMM, GEMV, Attention, RMSNorm
from iron.operator import Operator
from iron.resolution import legal_settings, resolve
from iron.targets import KINDS, target_of_kind


class Scaled(iron.Graph):
    def __init__(self, dev="cpu", **call):
        super().__init__(dev)
        self.call = call

    def body(self, x, y):
        return AXPY.step(x, y, scalar_factor=1.5, **self.call)


@pytest.mark.parametrize("dev", ["cpu", "npu1", "npu2"])
@pytest.mark.parametrize("op", [
    AXPY(size=2048, scalar_factor=1.5), GEMV(M=1536, K=576), GEMM(M=64, K=576, N=1536),
    RMSNorm(rows=4, size=576, weighted=True),
    Attention(rows=1, heads=9, kv_heads=3, head_dim=64, ctx=2048)])
def test_resolve_fills_every_tunable_legally(dev, op):
    r = resolve(op, dev)
    assert all(getattr(r, n) is not None for n in r.tunables())
    setting = {n: getattr(r, n) for n in r.tunables()}
    assert setting in legal_settings(r, dev)
    assert all(getattr(r, n) == getattr(op, n) for n in op.params())  # what it computes kept
    assert all(getattr(op, n) is None for n in op.tunables())  # resolve returns a copy


def test_npu_defaults_follow_the_column_count():
    op = AXPY(size=4096, scalar_factor=1.0)
    assert resolve(op, "npu1").num_aie_columns == 4
    assert resolve(op, "npu2").num_aie_columns == 8
    big = AXPY(size=1 << 20, scalar_factor=1.0)
    assert resolve(big, "cpu").num_aie_columns == iron.device("cpu").columns


def test_small_cpu_work_prefers_one_thread():
    # a thread team's fork and join costs more than 24 KB of elementwise work
    assert resolve(AXPY(size=4096, scalar_factor=1.0), "cpu").num_aie_columns == 1


def test_record_works_for_every_device():
    for dev in ("cpu", "npu1", "npu2"):
        op = Scaled(dev).record(x=(4096,), y=(4096,)).ops[0]
        assert op.size == 4096 and op.num_aie_columns >= 1


def test_too_many_columns_names_instance_field_value_source_and_rule():
    graph = Scaled("npu2", num_aie_columns=16)
    with pytest.raises(iron.ResolveError) as e:
        graph.record(x=(4096,), y=(4096,))
    message = str(e.value)
    assert message.startswith("AXPY(size=4096, scalar_factor=1.5) on npu2: num_aie_columns=16 "
                              "(from the call)")
    assert "num_aie_columns <= 8" in message


def test_tile_that_does_not_divide_names_the_profile_entry():
    graph = Scaled()
    graph.profile = iron.Profile().add(AXPY, size=2048, tile_size=1000)
    with pytest.raises(iron.ResolveError) as e:
        graph.record(x=(2048,), y=(2048,))
    message = str(e.value)
    assert 'tile_size=1000 (from profile entry {"operator": "AXPY", "size": 2048' in message
    assert "size % (num_aie_columns * tile_size) == 0" in message
    assert "legal settings include" in message


def test_default_source_is_named_when_the_default_cannot_fit():
    # 16 columns given by the constructor leave no legal default tile for npu1
    with pytest.raises(iron.ResolveError, match=r"num_aie_columns=16 \(from the constructor\)"):
        resolve(AXPY(size=2048, scalar_factor=1.0, num_aie_columns=16), "npu1")
    with pytest.raises(iron.ResolveError, match=r"tile_m=7 \(from the default on npu1\).*"
                       r"M % \(tile_m \* 4\) == 0 \(4 compute tiles per column of npu1\)"):
        resolve(GEMM(M=7, K=3, N=5), "npu1")


@pytest.mark.parametrize("value", [2.0, "4", 0, -2, True])
def test_call_with_a_non_integer_tunable_is_rejected(value):
    with pytest.raises(iron.ResolveError, match=r"num_aie_columns=.* \(from the call\) breaks "
                       r"the rule: a tunable is a positive integer"):
        Scaled(num_aie_columns=value).record(x=(2048,), y=(2048,))


def test_npu_memory_and_channel_rules():
    with pytest.raises(iron.ResolveError, match=r"L1 of core tile \(0, 2\): in0_0_0 2 x 32768 B "
                       r"\+ in1_0_0 2 x 32768 B \+ out_0_0 2 x 32768 B \+ stack 1024 B = "
                       r"197632 B \(193 KiB\) <= 65536 B"):
        resolve(AXPY(size=65536, scalar_factor=1.0, tile_size=16384, num_aie_columns=1), "npu2")
    with pytest.raises(iron.ResolveError, match=r"DMA channels out of shim tile \(0, 0\): 4 "
                       r"\(in0_0_0, in1_0_0, in0_0_1, in1_0_1\) <= 2"):
        resolve(AXPY(size=4096, scalar_factor=1.0, num_channels=2, tile_size=512,
             num_aie_columns=1), "npu2")
    assert resolve(AXPY(size=4096, scalar_factor=1.0, num_channels=1), "npu2")


def test_unknown_field_and_missing_param_at_the_call():
    class Bad(iron.Graph):
        def body(self, x, y):
            return AXPY.step(x, y, scalar=1.5)

    with pytest.raises(iron.FieldError, match="AXPY has no field 'scalar'.*scalar_factor"):
        Bad().record((8,), (8,))

    class Missing(iron.Graph):
        def body(self, x, y):
            return AXPY.step(x, y)

    with pytest.raises(iron.FieldError, match="scalar_factor"):
        Missing().record((8,), (8,))


def test_shape_mismatch_is_reported_at_the_step():
    with pytest.raises(iron.ShapeError, match="input 1 has shape"):
        Scaled().record(x=(2048,), y=(1024,))


def test_step_outside_a_graph_is_an_error():
    with pytest.raises(iron.ShapeError, match="inside a Graph's body"):
        AXPY.step(np.zeros(4), np.zeros(4), scalar_factor=1.0)


def test_unknown_device():
    with pytest.raises(iron.DeviceError, match="unknown device 'tpu'"):
        iron.device("tpu")


def test_device_from_environment(monkeypatch):
    monkeypatch.setenv("IRON_DEVICE", "npu1")
    assert iron.device().name == "npu1"
    assert Scaled.__mro__[1]().device.name == "npu1"


def test_running_on_an_npu_is_a_clear_error():
    x = np.ones(4096, iron.bfloat16)
    with pytest.raises(iron.DeviceError, match="running on npu2 itself needs .*"
                       r"run it in the emulator instead \(graph.emulate"):
        Scaled("npu2")(x, x)


def test_program_fields_are_attributes():
    program = Scaled().record(x=(1024,), y=(1024,))
    op = program.ops[0]
    assert op.size == 1024 and op.scalar_factor == 1.5
    assert isinstance(op.num_aie_columns, int)


def test_a_profile_entry_beyond_a_fixed_device_figure_is_an_error_naming_it():
    """npu2 has 8 columns on every host: an entry asking 16 is a mistake in the profile, not a
    host that differs, so it raises instead of falling back to the defaults."""
    graph = Scaled("npu2")
    graph.profile = iron.Profile(device="npu2").add(AXPY, size=4096, num_aie_columns=16)
    with pytest.raises(iron.ResolveError) as e:
        graph.record(x=(4096,), y=(4096,))
    message = str(e.value)
    assert 'num_aie_columns=16 (from profile entry {"operator": "AXPY", "size": 4096' in message
    assert "num_aie_columns <= 8 (the columns of npu2)" in message
    assert not graph.profile.fallbacks


def test_a_profile_entry_beyond_this_hosts_cores_falls_back_with_a_warning():
    """The cpu's columns are this host's cores: an entry tuned on a bigger host takes the
    defaults here, and the profile records which rule it broke."""
    cores = iron.device("cpu").columns
    graph = Scaled("cpu")
    more = 1 << cores.bit_length()  # a power of two above this host's cores: legal on a bigger host
    graph.profile = iron.Profile(device="cpu").add(AXPY, size=4096, num_aie_columns=more)
    op = graph.record(x=(4096,), y=(4096,)).ops[0]
    assert op.num_aie_columns <= cores
    (rule_text,) = graph.profile.fallbacks.values()
    assert rule_text == f"num_aie_columns <= {cores} (the columns of cpu)"


def test_every_operator_has_rules_on_every_target_that_claims_it():
    """A target states what its kernels need of each operator class it runs (an entry for
    the class or a base class in iron/targets/<kind>/rules.py, possibly own_rules_only)."""
    for kind in KINDS:
        target = target_of_kind(kind)
        claimed = [cls for cls in operators_under_test() if target.claims(cls)]
        assert claimed, f"the {kind} target claims no operator"
        for cls in claimed:
            target.class_rules(cls)  # raises ResolveError naming the class and the module


def test_a_target_without_rules_for_a_class_refuses_it_naming_the_module():
    class Unruled(Operator):
        kernel = "axpy"
        size: int = iron.param()

        def space(self, dev):
            return {}

    try:
        with pytest.raises(iron.ResolveError, match=r"Unruled has no rules on the cpu target.*"
                           r"iron/targets/cpu/rules\.py"):
            resolve(Unruled(size=8), "cpu")
    finally:
        del Operator.registry["Unruled"]


@pytest.mark.parametrize("dev", ["cpu", "npu1", "npu2"])
def test_operators_never_ask_the_device_kind(dev):
    """An operator's own rules and candidates read a device's figures, never its kind: the
    same figures under another kind give the same answers for every test case."""
    real = iron.device(dev)
    other = dataclasses.replace(real, kind="other")
    rng = np.random.default_rng(0)
    for cls in operators_under_test():
        for shape in cls.test_shapes:
            fields, inputs = cls.example(rng, **shape)
            recorded = OneStep(cls, fields).record_like(inputs).ops[0]
            op = dataclasses.replace(recorded, **{n: None for n in cls.tunables()})
            space = op.space(real)
            assert op.space(other) == space, cls.__name__
            for setting in legal_settings(op, real)[:50]:
                full = dataclasses.replace(op, **setting)
                assert list(full.rules(other)) == list(full.rules(real)), full.describe(True)
