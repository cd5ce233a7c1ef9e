"""Batched decode over KV-cache slots: a sequence's logits are bit-identical alone and in any
batch, the batched GEMV computes each row as the one-row GEMV does, and the engine's
continuous batching gives each request the tokens it gets alone."""

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import iron
from iron.lm.batch import Engine, Request, SlotModel
from iron.lm.generate import Sampler
from iron.lm.grammar import Constrained, JsonGrammars
from iron.operators import GEMV
from iron.targets import cpu

from opcases import OneStep

pytestmark = pytest.mark.slow  # end to end: bundles, servers, doit runs

PROMPTS = ["The capital of France is", "Once upon a time", "def fib(n):", "Water boils at",
           "1, 2, 3,", "My favourite colour is"]


@pytest.mark.parametrize("tile_size_input", [1, 2, 4])
def test_batched_gemv_rows_are_bit_identical_to_one_row(tile_size_input):
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((192, 100)) * 0.1).astype(iron.bfloat16)  # K % 16 != 0: tails too
    x = rng.standard_normal((5, 100)).astype(iron.bfloat16)
    fields = {"tile_size_input": tile_size_input, "tile_size_output": 64}
    batched = OneStep(GEMV, fields)(w, x)
    one = cpu.load(OneStep(GEMV, fields).record_like([w, x[0]]))
    for b in range(5):
        row = one.run([w, x[b]])[0]
        assert np.array_equal(batched[b].view(np.uint16), row.view(np.uint16)), b


@pytest.fixture(scope="module")
def slot_model(smollm2_bundle):
    return SlotModel(smollm2_bundle, slots=8)


@pytest.fixture(scope="module")
def prompts(slot_model):
    tok = slot_model.tokenizer()
    return [tok.encode(p, add_special_tokens=False).ids for p in PROMPTS]


def test_batched_logits_are_bit_identical_to_decoding_alone(slot_model, prompts):
    """Three sequences (padded to the 4-row program) and all six (the 8-row one), at different
    positions in different slots, against the one-sequence decode program on each."""
    m, steps = slot_model, 3
    alone = []
    for ids in prompts:
        logits = m.prefill_slot(0, ids)
        rows, token = [], int(np.argmax(logits))
        for i in range(steps):
            m.position = len(ids) + i
            logits = m.decode_rows([0], [token], [len(ids) + i])[0]
            rows.append(logits.copy())
            token = int(np.argmax(logits))
        alone.append(rows)
    for group in ([1, 3, 4], list(range(6))):
        slots = [7 - i for i in range(len(group))]  # not the slot each ran in alone
        tokens = []
        for s, g in zip(slots, group):
            tokens.append(int(np.argmax(m.prefill_slot(s, prompts[g]))))
        for i in range(steps):
            logits = m.decode_rows(slots, tokens, [len(prompts[g]) + i for g in group])
            for row, g in zip(logits, group):
                assert np.array_equal(row.view(np.uint16), alone[g][i].view(np.uint16)), (g, i)
            tokens = [int(np.argmax(row)) for row in logits]


def test_engine_gives_each_request_its_tokens_alone(smollm2_model, slot_model, prompts):
    """Six greedy requests on four slots: four decode together, two join as slots free up
    (after shorter requests finish), and every one gets the tokens it gets alone."""
    lengths = [10, 4, 12, 6, 9, 8]
    alone = [smollm2_model.generate(ids, n, Sampler(), stop_at_eos=False)[0]
             for ids, n in zip(prompts, lengths)]
    engine = Engine(SlotModel(slot_model.bundle, slots=4, weights=slot_model.weights))
    got = {i: [] for i in range(len(prompts))}
    reasons = {}

    def request(i):
        return Request(prompts[i], lengths[i], Sampler(), got[i].append,
                       lambda reason, stats, i=i: reasons.__setitem__(i, (reason, stats)),
                       stop_at_eos=False)

    for i in range(len(prompts)):
        engine.submit(request(i))
    engine.run_until_idle()
    for i in range(len(prompts)):
        assert got[i] == alone[i], (PROMPTS[i], got[i], alone[i])
        assert reasons[i][0] == "length" and reasons[i][1].new_tokens == lengths[i]
    assert engine.batch_rows / engine.steps > 2  # they did decode together
    assert sorted(engine.free) == [0, 1, 2, 3] and not engine.active


def test_a_long_prompt_is_prefilled_over_steps_while_others_decode(smollm2_model, slot_model,
                                                                   prompts):
    """A prompt of five chunks joins a decoding request: its prefill takes three steps of at
    most two chunks (the budget), the running request gets a token at each step on the way,
    and both get the tokens they get alone."""
    m = slot_model
    long_ids = (sum(prompts, []) * 40)[:5 * m.chunk - 3]
    alone_a = smollm2_model.generate(prompts[2], 12, Sampler(), stop_at_eos=False)[0]
    alone_b = smollm2_model.generate(long_ids, 4, Sampler(), stop_at_eos=False)[0]
    engine = Engine(SlotModel(m.bundle, slots=2, weights=m.weights))
    assert engine.prefill_budget == 2 * m.chunk
    got_a, got_b, a_when_b_starts = [], [], []

    def on_b(token):
        if not got_b:
            a_when_b_starts.append(len(got_a))
        got_b.append(token)

    engine.submit(Request(prompts[2], 12, Sampler(), got_a.append, lambda *_: None,
                          stop_at_eos=False))
    engine.step()  # a's prefill and its first step
    engine.step()
    before = len(got_a)
    engine.submit(Request(long_ids, 4, Sampler(), on_b, lambda *_: None, stop_at_eos=False))
    engine.run_until_idle()
    assert got_a == alone_a and got_b == alone_b
    assert a_when_b_starts == [before + 2]  # two steps of two chunks, each with a's token


def test_engine_cancel_frees_the_slot(slot_model, prompts):
    engine = Engine(slot_model)
    seen, reasons = [], []
    req = Request(prompts[0], 50, Sampler(), lambda t: seen.append(t) or len(seen) < 100,
                  lambda reason, stats: reasons.append(reason))
    engine.submit(req)
    engine.step()
    engine.step()
    req.cancel()
    engine.step()
    assert reasons == ["cancelled"] and len(seen) == 3  # prefill's token, then one a step
    assert not engine.active and len(engine.free) == slot_model.slots


def test_engine_refuses_what_does_not_fit(slot_model, prompts):
    engine = Engine(slot_model)
    ctx = slot_model.context
    with pytest.raises(iron.errors.IronError, match="context holds"):
        engine.check(ctx, 1)
    with pytest.raises(iron.errors.IronError, match="max_tokens=.* does not fit"):
        engine.check(10, ctx)


def test_a_sampler_that_raises_fails_its_own_request_and_not_the_others(smollm2_model,
                                                                         slot_model, prompts):
    """One request's sampler raises at its third token (and another's at its start): those two
    end with an error naming it, and the request decoding beside them gets every token it
    gets alone; the slots are free again."""
    class Breaks(Sampler):
        def __init__(self, at: int):
            super().__init__()
            self.at, self.calls = at, 0

        def start(self, prompt):
            if self.at == 0:
                raise ValueError("cannot start")
            super().start(prompt)

        def __call__(self, logits):
            self.calls += 1
            if self.calls == self.at:
                raise RuntimeError("broken at token 3")
            return super().__call__(logits)

    alone = smollm2_model.generate(prompts[0], 8, Sampler(), stop_at_eos=False)[0]
    engine = Engine(SlotModel(slot_model.bundle, slots=4, weights=slot_model.weights))
    got, reasons = {i: [] for i in range(3)}, {}
    samplers = [Sampler(), Breaks(3), Breaks(0)]
    for i in range(3):
        engine.submit(Request(prompts[i], 8, samplers[i], got[i].append,
                              lambda reason, stats, i=i: reasons.__setitem__(i, reason),
                              stop_at_eos=False))
    engine.run_until_idle()
    assert got[0] == alone and reasons[0] == "length"
    assert reasons[1] == "error: sampling: RuntimeError: broken at token 3" and len(got[1]) == 2
    assert reasons[2] == "error: sampling: ValueError: cannot start" and got[2] == []
    assert sorted(engine.free) == [0, 1, 2, 3] and not engine.active and not engine.prefilling


# ---- the prompt cache ------------------------------------------------------------------------

def test_a_prefix_kept_in_a_slot_prefills_to_the_bits_of_a_full_prefill(slot_model, prompts):
    """A slot holding the first k tokens of a prompt (written by another sequence that went on
    differently) prefills the rest from k: the logits are the full prefill's, bit for bit, for
    a split inside the first chunk, at its edge and past it."""
    m = slot_model
    ids = (prompts[0] + prompts[1] + prompts[3]) * 8  # past one 64-token chunk
    full = m.prefill_slot(0, ids).copy()
    for k in (1, 5, 63, 64, 70, len(ids) - 1):
        m.prefill_slot(1, ids[:k] + prompts[2] * 3)  # the prefix, then something else
        done = k
        while done < len(ids):
            done, logits = m.prefill_part(1, ids, done)
        assert np.array_equal(logits.view(np.uint16), full.view(np.uint16)), k


def run_requests(engine, requests):
    """Submit (prompt, max_new_tokens) one at a time, each after the last has finished; each
    request's greedy tokens and stats."""
    out = []
    for prompt, n in requests:
        got, done = [], []
        engine.submit(Request(prompt, n, Sampler(), got.append,
                              lambda reason, stats: done.append((reason, stats)),
                              stop_at_eos=False))
        engine.run_until_idle()
        assert done and done[0][0] == "length", done
        out.append((got, done[0][1]))
    return out


def test_a_conversation_reuses_its_history_and_gets_the_tokens_of_a_full_prefill(
        slot_model, prompts):
    """Turn 2 resends turn 1's prompt and answer plus a new message: with the cache it
    prefills only what is new, and its tokens are those of an engine without a cache."""
    first = prompts[0]
    (answer, stats1), = run_requests(Engine(slot_model, prompt_cache=False), [(first, 8)])
    second = first + answer + prompts[4]
    cold = run_requests(Engine(slot_model, prompt_cache=False), [(first, 8), (second, 8)])
    engine = Engine(slot_model)
    warm = run_requests(engine, [(first, 8), (second, 8)])
    assert [tokens for tokens, _ in warm] == [tokens for tokens, _ in cold]
    assert warm[0][1].cached_tokens == 0 and cold[1][1].cached_tokens == 0
    # every token fed in turn 1 (the prompt and all answers but the last) is kept
    assert warm[1][1].cached_tokens == len(first) + len(answer) - 1
    assert (engine.cache_hits, engine.cache_tokens) == (1, len(first) + len(answer) - 1)
    again = run_requests(engine, [(second, 8)])  # the same prompt: all but its last token
    assert again[0][1].cached_tokens == len(second) - 1 and again[0][0] == warm[1][0]


def test_without_the_prompt_cache_no_tokens_are_kept(slot_model, prompts):
    """``Engine(prompt_cache=False)`` (``--no-prompt-cache``) records no slot's tokens for
    reuse, so a repeated prompt is prefilled whole."""
    engine = Engine(slot_model, prompt_cache=False)
    runs = run_requests(engine, [(prompts[0], 4), (prompts[0], 4)])
    assert engine.cached == [[] for _ in range(slot_model.slots)]
    assert [stats.cached_tokens for _, stats in runs] == [0, 0]
    assert (engine.cache_hits, engine.cache_tokens) == (0, 0)


def test_the_least_recently_released_slot_is_overwritten_first(smollm2_bundle, prompts):
    model = SlotModel(smollm2_bundle, slots=2)
    engine = Engine(model)
    a, b, c = prompts[0] * 2, prompts[1] * 2, prompts[2] * 2
    run_requests(engine, [(a, 2), (b, 2)])  # a in one slot, b in the other
    assert run_requests(engine, [(a + b, 2)])[0][1].cached_tokens == len(a)
    # a's slot was given up last: c overwrites b's, so a's turn (now a + b) is still kept
    assert run_requests(engine, [(c, 2)])[0][1].cached_tokens == 0
    assert run_requests(engine, [(a + b + c, 2)])[0][1].cached_tokens == len(a + b)
    assert run_requests(engine, [(b, 2)])[0][1].cached_tokens == 0  # b was evicted


def test_a_sequence_waiting_for_its_grammar_mask_sits_out_while_the_others_decode(
        slot_model, prompts):
    """A grammar's masks are computed on an executor, off the thread that runs the steps.
    While its mask is not in (here the executor is busy, as with a heavy schema's mask), the
    sequence keeps its logits and sits out the decode steps; another request decodes all its
    tokens meanwhile, the tokens it gets alone. Once the executor is free the sequence goes
    on, and its text follows the schema."""
    pytest.importorskip("llguidance")
    tok = slot_model.tokenizer()
    grammars = JsonGrammars(tok, sorted(slot_model.eos), slot_model.meta.vocab_size)
    (alone, _), = run_requests(Engine(slot_model), [(prompts[0], 12)])
    busy = threading.Event()
    opened = threading.Timer(60, busy.set)  # a guard: a step that waits for the mask ends
    with ThreadPoolExecutor(1) as executor:
        executor.submit(busy.wait)
        shaped = Constrained(Sampler(), grammars.matcher({"type": "object"}),
                             slot_model.meta.vocab_size, executor)
        engine = Engine(slot_model)
        plain, constrained, done = [], [], {}
        engine.submit(Request(prompts[0], 12, Sampler(), plain.append,
                              lambda reason, _: done.setdefault("plain", reason),
                              stop_at_eos=False))
        engine.submit(Request(prompts[1], 40, shaped, constrained.append,
                              lambda reason, _: done.setdefault("shaped", reason)))
        opened.start()
        for _ in range(50):
            if "plain" in done:
                break
            engine.step()
        assert busy.is_set() is False, "a step waited for the grammar's mask"
        assert (done, plain, constrained) == ({"plain": "length"}, alone, [])
        assert engine.only_held()
        busy.set()
        engine.run_until_idle()
    opened.cancel()
    assert done["shaped"] in ("stop", "length") and constrained
    text = tok.decode(constrained)
    if done["shaped"] == "stop":
        assert isinstance(json.loads(text), dict), text
    assert text.startswith("{"), text
