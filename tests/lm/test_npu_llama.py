"""SmolLM2 on an NPU, emulated: the npu2 bundle of the embedded checkpoint, built with the
committed npu2 profile as ``doit device=npu2`` builds it, completes a prompt with the answer
the model gives on the cpu."""

import json
import subprocess
import sys

import iron
from iron.pipeline.app import app_profile, load_app
from iron.pipeline.bundle import write_bundle
import pytest

pytestmark = pytest.mark.slow  # end to end: bundles, servers, doit runs


@pytest.fixture(scope="module")
def npu2_bundle(smollm2, tmp_path_factory):
    """The npu2 bundle as ``doit device=npu2`` builds it (default context and batch)."""
    profile = app_profile("llama", "npu2")  # profiles/llama/npu2.json, the cost model's choices
    assert len(profile) > 0
    return write_bundle(load_app("llama", smollm2), iron.device("npu2"), profile,
                        tmp_path_factory.mktemp("npu2") / "npu2")


def test_emulated_smollm2_on_npu2_answers_paris(npu2_bundle):
    bundle = npu2_bundle
    manifest = json.loads((bundle / "manifest.json").read_text())
    for name, program in manifest["programs"].items():  # all but the embedding gather on the npu
        for step, placement in zip(program["steps"], program["placements"], strict=True):
            assert placement == ("host" if step["operator"] == "Embedding" else "npu"), (
                name, step["operator"], step["fields"])
    run = [sys.executable, "-m", "iron.lm.run", str(bundle), "--prompt",
           "The capital of France is", "--max-new-tokens", "4", "--json"]
    emulated = subprocess.run(run + ["--emulate"], capture_output=True, text=True, timeout=600)
    assert emulated.returncode == 0, emulated.stderr
    assert '"text": " Paris.' in emulated.stdout, emulated.stdout
    refused = subprocess.run(run, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.startswith(f"error: {bundle}: running on npu2 itself needs")


def test_emulated_npu2_decode_meets_the_kl_gate_against_float32(smollm2, smollm2_reference,
                                                                tmp_path):
    """The KL gate of the npu2 decode (``test_llama.NPU2``: 1.5x the mean it reached, 2x its
    tails), teacher-forced through the emulated npu2 bundle's decode program, whose
    RMSNorm, QKVRoPE, Attention, residual adds and SwiGLU run as their designs (KV cache in the
    emulated DRAM; Attention runs one compiled sequence at every position, reading every key
    tile and masking past the position).  20 positions of one
    text (each emulated token takes seconds), at a 2048-position context."""
    from test_llama import NPU2, assert_accurate, decode_logits, kl_stats, token_ids
    from iron.lm.generate import LanguageModel
    from iron.lm.texts import TEXTS

    bundle = write_bundle(load_app("llama", smollm2, context=2048), iron.device("npu2"),
                          app_profile("llama", "npu2"), tmp_path / "npu2")
    model = LanguageModel(bundle, emulate=True)
    decode = model.bundle.manifest["programs"]["decode"]
    placed = {step["operator"]: p for step, p in zip(decode["steps"], decode["placements"])}
    assert placed["Attention"] == placed["QKVRoPE"] == "npu", placed
    ids = token_ids(model, TEXTS[0])[:20]
    kl, agree = kl_stats(smollm2_reference.logits(ids), decode_logits(model, ids))
    print("emulated npu2 decode", end=": ")
    assert_accurate(kl, agree, NPU2)


def test_an_emulated_batched_decode_step_is_each_rows_own_decode(npu2_bundle):
    """One step of the bundle's ``decode_slots2`` (SlotQKVRoPE and SlotAttention moving both
    slots' caches in one compiled sequence, the kernels choosing each row's slot) gives each
    row, bit for bit, the logits and cache rows of the one-row decode on its own slot's cache
    (random keys and values; two positions, the slots crossed)."""
    import numpy as np

    from iron.pipeline.bundle import Bundle
    from iron.tensor import bfloat16

    b = Bundle.open(npu2_bundle)
    weights = b.weights()
    slotted = b.executable("decode_slots2", weights, emulate=True)
    one, head = (b.executable(n, weights, emulate=True) for n in ("decode", "head"))
    rng = np.random.default_rng(0)
    caches = {n: (rng.standard_normal(t.shape) * 0.5).astype(bfloat16)
              for n, t in b.program("decode_slots2").named("state").items()}
    slotted.bind_state({n: a.copy() for n, a in caches.items()})
    tokens, pos, slot = (np.array(v, np.int32) for v in ([42, 1337], [17, 5], [1, 0]))
    (logits,) = slotted.run([tokens, pos, slot])
    for r in range(2):
        one.bind_state({n: a[slot[r]].copy() for n, a in caches.items()})
        (hidden,) = one.run([tokens[r:r + 1], pos[r:r + 1]])
        (want,) = head.run([hidden])
        assert np.array_equal(logits[r].view(np.uint16), want[0].view(np.uint16)), r
        for n in caches:
            assert np.array_equal(slotted.state(n)[slot[r]].view(np.uint16),
                                  one.state(n).view(np.uint16)), (r, n)


def test_the_npu2_bundle_runs_packed_and_its_merged_devices_verify(npu2_bundle):
    """The bundle's decode executable runs the folds as ``foldfiles`` renders them, consecutive
    designs merged into one aie.device where their columns fit (iron.targets.npu.coresidence),
    fewer loads per token than one device per design; every module of the bundle, the merged
    devices included, passes every rule of ``verify``."""
    from iron.pipeline.bundle import Bundle
    from iron.targets.npu.foldfiles import bundle_folds
    from iron.targets.npu.report import bundle_report

    b = Bundle.open(npu2_bundle)
    decode = b.executable("decode", b.weights(), emulate=True)
    running = [s.fold for s in decode.segments if not isinstance(s, int)]
    rendered = [f for p, f in bundle_folds(npu2_bundle) if p == "decode"]
    assert [[(c.symbol, len(c.members)) for c in f.configurations] for f in running] == \
        [[(c.symbol, len(c.members)) for c in f.configurations] for f in rendered]
    assert any(c.merged for f in rendered for c in f.configurations)
    token = bundle_report(npu2_bundle)[0]
    assert 0 < token.packed_loads < token.loads == token.npu_steps
    verify = subprocess.run([sys.executable, "-m", "iron.targets.npu.verify", str(npu2_bundle)],
                            capture_output=True, text=True, timeout=1200)
    assert verify.returncode == 0 and "module(s) verify" in verify.stdout, verify.stderr
