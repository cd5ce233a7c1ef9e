"""The two lowering preconditions of ``iron/targets/npu/trip_rules.py``, on modules as
``verify`` parses them: no acquire under a trip count known only at run time (unless the core
declares dynamic lowering, then none inside a conditional), and no more runtime-sequence
buffers than aiecc's xclbin kernel declares.  Each is shown rejecting what it should."""

import dataclasses

from iron.operators import Attention, QKVRoPE, SlotAttention, SlotQKVRoPE
from iron.targets import npu
from iron.targets.npu.design import Arg, Call, Tile
from iron.targets.npu.mlir import render
from iron.targets.npu.trip_rules import RULES, constant_trip_counts, sequence_arguments
from iron.targets.npu.verify import violations as rule_violations

DECODE = Attention(rows=1, heads=9, kv_heads=3, head_dim=64, ctx=256, tile_size=64,
                   num_aie_columns=3)
PREFILL = dataclasses.replace(DECODE, rows=16, num_aie_columns=4)
SLOT = SlotAttention(rows=4, heads=9, kv_heads=3, head_dim=64, ctx=256, tile_size=64,
                     num_aie_columns=4)


def violations(text: str, rules=RULES) -> list[str]:
    return rule_violations(text, rules)


def found(text: str, rule) -> list[str]:
    return violations(text, (rule,))


def module(design) -> str:
    return render(design, generic=True)


def test_attention_designs_meet_both_rules():
    for op in (DECODE, PREFILL):
        assert violations(module(npu.design_of(op, "npu2"))) == []


def test_a_key_loop_counted_at_run_time_is_refused():
    """SlotAttention's key loop takes its bound from a kernel's count of the position."""
    messages = found(module(npu.design_of(SLOT, "npu2")), constant_trip_counts)
    assert len(messages) == 4  # one per column
    assert "core tile (0, 2): a loop whose bound comes from arith.index_cast" in messages[0]
    assert "acquires kv_0" in messages[0] and "unrollForLoops" in messages[0]


def test_an_outer_loop_with_a_run_time_bound_is_refused_for_the_acquires_inside_it():
    """The loop over a column's units made to take its bound from a kernel's count: the key
    loop inside keeps constant bounds, the acquires of both loops count."""
    d = npu.design_of(PREFILL, "npu2")
    core = next(c for c in d.cores if c.tile == Tile(0, 2))
    count = Call("attn_tiles", ("pos_0", 0, 0, 3, 8, 1, 64, 256), "units")
    counted = dataclasses.replace(core, body=(
        core.body[0], count, dataclasses.replace(core.body[1], dynamic="units"),
        *core.body[2:]))
    d = dataclasses.replace(d, cores=tuple(counted if c is core else c for c in d.cores))
    messages = found(module(d), constant_trip_counts)
    assert len(messages) == 1 and "acquires kv_0, out_0, q_0" in messages[0], messages


SMALL = SlotAttention(rows=1, heads=2, kv_heads=1, head_dim=16, ctx=64, tile_size=16,
                      num_aie_columns=1)
CORE = '"aie.core"(%tile_0_2) ({'
KV = '"aie.objectfifo.acquire"() <{objFifo_name = @kv_0, port = 1 : i32, size = 1 : i32}> ' \
     ': () -> !aie.objectfifosubview<memref<32x16xbf16>>'


def test_dynamic_lowering_lifts_the_loop_rule_but_not_an_acquire_under_a_conditional():
    text = module(npu.design_of(SMALL, "npu2"))
    assert text.count(CORE) == 1 and KV in text and found(text, constant_trip_counts)
    lowered = text.replace(CORE, '"aie.core"(%tile_0_2) <{dynamic_objfifo_lowering = true}> '
                           '({\n%yes = "arith.constant"() <{value = true}> : () -> i1')
    assert found(lowered, constant_trip_counts) == []
    at = lowered.index(KV)
    at = lowered.rindex("\n", 0, at) + 1
    guarded = (lowered[:at] + f'"scf.if"(%yes) ({{\n%extra = {KV}\n"scf.yield"() : () -> ()\n'
               '}, {\n"scf.yield"() : () -> ()\n}) : (i1) -> ()\n' + lowered[at:])
    messages = found(guarded, constant_trip_counts)
    assert len(messages) == 1 and "inside an scf.if" in messages[0]
    assert "peelCyclostaticAcquires" in messages[0]


def test_more_buffers_than_aieccs_kernel_declares_are_refused():
    d = npu.design_of(DECODE, "npu2")
    assert len(d.args) == 5 and found(module(d), sequence_arguments) == []
    more = dataclasses.replace(d, args=(*d.args, Arg("extra", 16)))
    messages = found(module(more), sequence_arguments)
    assert len(messages) == 1 and "takes 6 buffers" in messages[0]
    assert "python/compiler/aiecc/main.py, emit_design_kernel_json" in messages[0]


def test_the_designs_still_over_the_limits_are_named():
    """QKVRoPE's sequence takes its three inputs, the two caches and its three outputs;
    SlotQKVRoPE's the slots too, and it loops on the count of rows stored and past the
    cache (a loop of 0 or 1 per row)."""
    shape = dict(rows=8, heads=9, kv_heads=3, head_dim=64, ctx=256)
    text = module(npu.design_of(QKVRoPE(**shape), "npu2"))
    assert found(text, constant_trip_counts) == []
    assert [m for m in found(text, sequence_arguments) if "takes 8 buffers" in m]
    text = module(npu.design_of(SlotQKVRoPE(**shape), "npu2"))
    assert len(found(text, constant_trip_counts)) == 2
    assert [m for m in found(text, sequence_arguments) if "takes 9 buffers" in m]
