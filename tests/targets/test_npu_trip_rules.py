"""The two lowering preconditions of ``iron/targets/npu/trip_rules.py``, on modules as
``verify`` parses them, both in its table: no acquire under a trip count known only at run
time (unless the core declares dynamic lowering, then none inside a conditional), and no more
runtime-sequence buffers than aiecc's xclbin kernel declares.  Each is shown rejecting what it
should: the designs all meet both, so the loops counted at run time are made by editing a
design's module (a bound read off the positions the core holds), and a sixth buffer by adding
an argument to a design."""

import dataclasses
import re

import pytest

from iron.operators import Attention, CacheWrite, QKVRoPE, SlotAttention, SlotQKVRoPE
from iron.targets import npu
from iron.targets.npu.ir import Arg
from iron.targets.npu.mlir import render
from iron.targets.npu.preconditions import RULES as VERIFIED
from iron.targets.npu.trip_rules import constant_trip_counts, sequence_arguments
from iron.targets.npu.verify import Problem, check_text
from iron.targets.npu.verify import violations as rule_violations

DECODE = Attention(rows=1, heads=9, kv_heads=3, head_dim=64, ctx=256, tile_size=64,
                   num_aie_columns=3)
PREFILL = dataclasses.replace(DECODE, rows=16, num_aie_columns=4)
SHAPE = dict(rows=4, heads=9, kv_heads=3, head_dim=64, ctx=256)
SLOT = SlotAttention(**SHAPE, slots=4, tile_size=64, num_aie_columns=3)


def violations(text: str, rules=(constant_trip_counts, sequence_arguments)) -> list[str]:
    return rule_violations(text, rules)


def found(text: str, rule) -> list[str]:
    return violations(text, (rule,))


def module(design) -> str:
    return render(design, generic=True)


POSITIONS = re.compile(r'(%e\d+) = "aie.objectfifo.subview.access"\(%s\d+\) <\{index = 0 : '
                       r'i32\}> : \(!aie.objectfifosubview<(memref<\d+xi32>)>\)')


def bounded_at_run_time(text: str, fifo: str) -> str:
    """``text`` with the loop around the first acquire of ``fifo`` in column 0's working core
    bounded by the first position the core holds, read at run time (``memref.load`` of the
    positions' element, ``arith.index_cast``), as a kernel counting tiles from it would."""
    core = text.index('"aie.core"(%tile_0_2)')
    at = text.index(f"objFifo_name = @{fifo}, port", core)
    loop = text.rindex('"scf.for"(', core, at)
    start = text.rindex("\n", 0, loop) + 1
    lo, hi, step = text[loop + len('"scf.for"('):text.index(")", loop)].split(", ")
    element, memref = POSITIONS.search(text, core).groups()
    indent = text[start:loop]
    bound = (f'{indent}%word = "memref.load"({element}, {lo}) : ({memref}, index) -> i32\n'
             f'{indent}%bound = "arith.index_cast"(%word) : (i32) -> index\n')
    return (text[:start] + bound + text[start:loop]
            + f'"scf.for"({lo}, %bound, {step})' + text[text.index(")", loop) + 1:])


def test_the_kv_cache_designs_meet_both_rules():
    """Every KV-cache design loops a constant number of times and takes at most 5 buffers:
    CacheWrite 4, the others 5 (the slotted forms' slots packed behind the positions, QKVRoPE's
    q behind its rows and its caches written in place)."""
    for op, buffers in ((DECODE, 5), (PREFILL, 5), (SLOT, 5), (QKVRoPE(**SHAPE), 5),
                        (SlotQKVRoPE(**SHAPE, slots=4), 5),
                        (CacheWrite(kv_heads=3, ctx=256, head_dim=64, rows=4), 4)):
        d = npu.design_of(op, "npu2")
        assert len(d.args) == buffers, op
        assert violations(module(d)) == [], op


def test_a_key_loop_counted_at_run_time_is_refused():
    """The key loop of column 0 bounded by the position its core holds."""
    messages = found(bounded_at_run_time(module(npu.design_of(DECODE, "npu2")), "kv_0"),
                     constant_trip_counts)
    assert len(messages) == 1, messages
    assert "core tile (0, 2): a loop whose bound comes from arith.index_cast" in messages[0]
    assert "acquires kv_0" in messages[0] and "unrollForLoops" in messages[0]


def test_verify_refuses_a_loop_counted_at_run_time():
    """The trip-count rule is in ``verify``'s table (``preconditions.RULES``): the module of a
    design whose key loop is bounded at run time is refused with the rule's message."""
    assert constant_trip_counts in VERIFIED
    text = module(npu.design_of(DECODE, "npu2"))
    check_text(text)
    with pytest.raises(Problem, match=r"core tile \(0, 2\): a loop whose bound comes from "
                       r"arith.index_cast at run time acquires kv_0.*unrollForLoops"):
        check_text(bounded_at_run_time(text, "kv_0"))


def test_an_outer_loop_with_a_run_time_bound_is_refused_for_the_acquires_inside_it():
    """The loop over a column's units bounded at run time: the key loop inside keeps constant
    bounds, the acquires of both loops count."""
    messages = found(bounded_at_run_time(module(npu.design_of(PREFILL, "npu2")), "q_0"),
                     constant_trip_counts)
    assert len(messages) == 1 and "acquires kv_0, out_0, q_0" in messages[0], messages


CORE = '"aie.core"(%tile_0_2) ({'
KV = '"aie.objectfifo.acquire"() <{objFifo_name = @kv_0, port = 1 : i32, size = 1 : i32}> ' \
     ': () -> !aie.objectfifosubview<memref<128x64xbf16>>'


def test_dynamic_lowering_lifts_the_loop_rule_but_not_an_acquire_under_a_conditional():
    text = bounded_at_run_time(module(npu.design_of(DECODE, "npu2")), "kv_0")
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
    """A sixth runtime buffer on a design of five: the rule finds it and ``verify`` (its
    table, ``preconditions.RULES``) refuses the module."""
    assert sequence_arguments in VERIFIED
    d = npu.design_of(DECODE, "npu2")
    assert len(d.args) == 5 and found(module(d), sequence_arguments) == []
    check_text(module(d))
    more = dataclasses.replace(d, args=(*d.args, Arg("extra", 16)))
    messages = found(module(more), sequence_arguments)
    assert len(messages) == 1 and "takes 6 buffers" in messages[0]
    assert "python/compiler/aiecc/main.py, emit_design_kernel_json" in messages[0]
    with pytest.raises(Problem, match=r"takes 6 buffers.*\[sequence_arguments\]"):
        check_text(module(more))
