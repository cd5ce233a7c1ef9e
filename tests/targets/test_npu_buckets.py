"""What a runtime sequence per context bucket would move (``iron/targets/npu/buckets.py``):
the buckets, the bytes each KV-cache design's sequence moves at each, and the report's table.
The buckets are priced, not built: the last one is what the bundle's designs move."""

import dataclasses

from iron.operators import Attention, CacheWrite, QKVRoPE, SlotAttention
from iron.targets import npu
from iron.targets.npu.buckets import bucket_costs, context_buckets, moved_bytes
from iron.targets.npu.cost import design_estimate

ATTEND = Attention(rows=1, heads=9, kv_heads=3, head_dim=64, ctx=2048, tile_size=64,
                   num_aie_columns=3)
ROTATE = QKVRoPE(rows=1, heads=9, kv_heads=3, head_dim=64, ctx=2048)
KV_ROW = 3 * 64 * 2  # bytes of one position of one cache (keys or values), every KV head


def test_the_buckets_are_powers_of_two_up_to_the_context():
    assert context_buckets(8192, 64) == [64, 128, 256, 512, 1024, 2048, 4096, 8192]
    assert context_buckets(300, 64) == [64, 128, 256, 300]
    assert context_buckets(48, 64) == [48] and context_buckets(1) == [1]


def test_a_bucket_moves_its_positions_of_the_cache_and_the_last_is_the_built_design():
    """Attention reads keys and values (2 caches), QKVRoPE reads and writes them (4),
    CacheWrite reads and writes one (2): each
    bucket twice the one before in its cache part, the rest (queries, rows, positions,
    frequencies, outputs) the same; the last bucket is the design the bundle holds."""
    for op, caches in ((ATTEND, 2), (ROTATE, 4), (CacheWrite(kv_heads=3, ctx=2048, head_dim=64,
                                                             rows=1), 2)):
        buckets = bucket_costs([op, op], "npu2")  # two layers
        fixed = buckets[0].bytes - 2 * caches * buckets[0].positions * KV_ROW
        assert fixed > 0
        for b in buckets:
            assert b.bytes == fixed + 2 * caches * b.positions * KV_ROW, (op, b)
        built = npu.design_of(op, "npu2")
        assert buckets[-1].positions == 2048 and buckets[-1].bytes == 2 * moved_bytes(built)
        assert buckets[-1].seconds == 2 * design_estimate(built).seconds
        assert [b.seconds for b in buckets] == sorted(b.seconds for b in buckets)


def test_slotted_buckets_move_every_slot_and_other_steps_move_nothing():
    slot = SlotAttention(rows=2, slots=4, heads=9, kv_heads=3, head_dim=64, ctx=2048,
                         tile_size=64, num_aie_columns=3)
    one, four = (bucket_costs([op], "npu2") for op in (ATTEND, slot))
    assert [b.positions for b in four] == [64, 128, 256, 512, 1024, 2048]
    for a, b in zip(one, four):  # 3 more slots' keys and values, a second row's query and
        # output, and per column the relay's 2 positions and 2 slots instead of 1 position
        assert b.bytes - a.bytes == 3 * 2 * a.positions * KV_ROW + 2 * 9 * 64 * 2 + 3 * 3 * 4
    assert bucket_costs([dataclasses.replace(ATTEND, ctx=64)], "npu2")[0].positions == 64
    assert bucket_costs([], "npu2") == []
