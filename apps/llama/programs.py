"""The programs of a Llama-family bundle: each graph of ``model.py`` recorded and resolved
for a device at the bundle's shapes (``iron.lm.layout`` names them), the batched decode
programs sharing the one-row programs' tunables."""

from __future__ import annotations

import dataclasses

import numpy as np

import iron
from iron.errors import ShapeError
from iron.lm.layout import DECODE, HEAD, PREFILL, PREFILL_TAIL, decode_slots

from .config import LlamaConfig
from .model import Decoder, Head, SlotDecoder
from .weights import Formats


def match_tunables(program: iron.Program, like: list) -> iron.Program:
    """``program`` with every step's tunables taken from the same step of ``like`` (operators
    in the same order): a tunable may change a kernel's order of summation (a GEMV's
    ``tile_size_input``, attention's ``tile_size``), so a batched program that shares the
    one-row program's tunables computes each row with exactly the one-row arithmetic."""
    if len(program.steps) != len(like):
        raise ShapeError(f"cannot match tunables: {len(program.steps)} steps against "
                         f"{len(like)}")
    steps = []
    for step, other in zip(program.steps, like):
        if not isinstance(step.op, type(other)):
            raise ShapeError(f"cannot match tunables of {step.op.describe()} to "
                             f"{other.describe()}: different operators")
        op = dataclasses.replace(step.op, **other.tunable_values())
        steps.append(dataclasses.replace(step, op=iron.resolve(
            op, program.device, {n: f"matched to {other.describe()}" for n in op.tunables()})))
    return dataclasses.replace(program, steps=steps)


def tail_chunk(chunk: int) -> int:
    """Rows of the prefill program for a prompt's last rows: half a chunk."""
    return max(1, chunk // 2)


def batch_sizes(batch: int) -> list[int]:
    """Rows of the batched decode programs: powers of two from 2 up to ``batch`` (a step of n
    sequences runs the smallest that holds them)."""
    sizes = [2]
    while sizes[-1] * 2 <= batch:
        sizes.append(sizes[-1] * 2)
    return [b for b in sizes if b <= batch]


def record(config: LlamaConfig, ctx: int, chunk: int, device=None, profile=None,
           formats: Formats | None = None, batch: int = 1) -> dict:
    """The programs of a Llama bundle, recorded and resolved for ``device``: decode, prefill,
    prefill_tail, head, and ``decode_slots<B>`` for each of ``batch_sizes(batch)``."""
    token = iron.spec((1,), np.int32)
    graph = {"device": device, "profile": profile, "formats": formats}

    def rows(n: int):
        return iron.spec((n,), np.int32)

    def prefill(n: int):
        return Decoder(config, n, ctx, **graph).record(rows(n), rows(n))

    reports = iron.profile.batch_reports(profile if isinstance(profile, iron.Profile) else None)
    with reports:  # entries that do not fit this host: one warning line for all the programs
        programs = {
            DECODE: Decoder(config, 1, ctx, **graph).record(token, token),
            PREFILL: prefill(chunk),
            PREFILL_TAIL: prefill(tail_chunk(chunk)),
            HEAD: Head(config, **graph).record((1, config.hidden_size)),
        }
        one_row = programs[DECODE].ops + programs[HEAD].ops
        sizes = batch_sizes(batch)
        for b in sizes:
            # the cpu kernels do not depend on the slot count and a runtime sizes the cache for
            # its own (iron.lm.batch); an npu design moves exactly its slots' caches, so on an
            # npu every batched program takes the one cache of the largest batch's slots (n
            # sequences run the smallest b >= n, the rows past n padding)
            slots = max(sizes) if iron.device(device).kind == "npu" else b
            program = SlotDecoder(config, b, ctx, slots=slots, **graph).record(
                rows(b), rows(b), rows(b))
            programs[decode_slots(b)] = match_tunables(program, one_row)
    return programs
