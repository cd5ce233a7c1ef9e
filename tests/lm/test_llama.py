"""The Llama application against an independent float32 implementation (transformers on
torch CPU), on the embedded SmolLM2 checkpoint and a tiny Llama-3-style one.

Accuracy is judged as AMD's IRON judges its Llama on the NPU: KL divergence between the
float32 model's next-token distribution and iron's, teacher-forced, mean <= 0.02, p90 <= 0.04,
max <= 0.2, and top-1 agreement >= 95%.
"""

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from conftest import make_bundle
from iron.errors import IronError
from iron.lm.generate import LanguageModel
from iron.lm.texts import TEXTS
from iron.tuning.check import bf16_ulp

pytestmark = pytest.mark.slow  # end to end: bundles, servers, doit runs


def log_softmax(x):
    x = np.asarray(x, np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def kl_stats(ref_logits, logits):
    """KL(reference || iron) per position, and the top-1 agreement."""
    p, q = log_softmax(ref_logits), log_softmax(logits)
    kl = (np.exp(p) * (p - q)).sum(axis=-1)
    agree = (ref_logits.argmax(-1) == logits.argmax(-1)).mean()
    return kl, agree


@dataclass(frozen=True)
class Gate:
    """The most KL(float32 reference || iron) per position a model may show: its mean, 90th
    percentile and maximum, and the least top-1 agreement."""

    mean: float
    p90: float
    max: float
    top1: float = 0.95


#: SmolLM2 on its own Q4_1 / Q8_0 blocks against transformers' float32 on the same GGUF file
#: reaches KL mean 0.0031, p90 0.0074, max 0.029, top-1 97.9% over 143 positions (decode and
#: prefill alike, 2026-12-05, x rounded per 32 values in o_proj and the MLP; 0.0024, 0.0053,
#: 0.020, 96.5% with x per 16 everywhere). The gate was set at 1.5x the mean and 2x the tails
#: of 2026-12-04 (0.0026, 0.0060, 0.020), so a kernel twice as wrong as that fails (a 3% error
#: in SiLU alone took the mean to 0.0054); the goal is a mean of at most 0.01.
SMOLLM2 = Gate(mean=0.004, p90=0.012, max=0.04)
#: A Q4_K_M file of hidden size 256 (``benchmarks/make_gguf.py``, test_kquant.py) reaches KL
#: mean 0.0008, p90 0.0017, max 0.0029, top-1 100% (decode and prefill); the same margins.
KQUANT = Gate(mean=0.0012, p90=0.0035, max=0.006)
#: The emulated npu2 decode (bf16 products in its attention, its kernels' own exponential)
#: reached KL mean 0.0049, p90 0.0123, max 0.0217, top-1 20 of 20 (test_npu_llama.py); the same
#: margins.
NPU2 = Gate(mean=0.0075, p90=0.025, max=0.045)
#: The tiny random checkpoints' distributions are nearly flat (weights of scale 0.02): their KL
#: stays below 1e-5, so this gate only catches gross errors and their tests also bound each
#: logit's error.
TINY = Gate(mean=1e-4, p90=2e-4, max=1e-3)


def assert_accurate(kl, agree, gate: Gate = SMOLLM2):
    stats = (f"KL mean {kl.mean():.5f} p90 {np.percentile(kl, 90):.5f} max {kl.max():.5f} "
             f"top-1 {agree:.3f} over {kl.size} positions")
    print(stats)
    assert kl.mean() <= gate.mean, f"{stats}: the mean is above {gate.mean}"
    assert np.percentile(kl, 90) <= gate.p90, f"{stats}: p90 is above {gate.p90}"
    assert kl.max() <= gate.max, f"{stats}: the max is above {gate.max}"
    assert agree >= gate.top1, f"{stats}: top-1 agreement is below {gate.top1}"


def decode_logits(model, ids):
    model.reset()
    return np.stack([model.decode(t).astype(np.float32) for t in ids])


def prefill_logits(model, ids):
    model.reset()
    hidden = model.prefill_hidden(ids)
    return np.stack([model.head(hidden[i:i + 1]).astype(np.float32) for i in range(len(ids))])


def token_ids(model, text):
    return model.tokenizer().encode(text, add_special_tokens=False).ids


@pytest.mark.parametrize("path", ["decode", "prefill"])
def test_smollm2_matches_float32_reference(smollm2_model, smollm2_reference, path):
    kls, agrees = [], []
    for text in TEXTS:
        ids = token_ids(smollm2_model, text)[:48]
        assert len(ids) >= 40
        ref = smollm2_reference.logits(ids)
        ours = (decode_logits if path == "decode" else prefill_logits)(smollm2_model, ids)
        kl, agree = kl_stats(ref, ours)
        kls.append(kl)
        agrees.append(agree)
    kl = np.concatenate(kls)
    print(path, end=": ")
    assert_accurate(kl, float(np.mean(agrees)))


def test_smollm2_completes_paris_and_tells_a_story(smollm2_model, smollm2_reference):
    tok = smollm2_model.tokenizer()
    ids = token_ids(smollm2_model, "The capital of France is")
    out, _ = smollm2_model.generate(ids, 8)
    assert "Paris" in tok.decode(out)
    story_prompt = token_ids(smollm2_model, "Once upon a time, there was a little")
    story, stats = smollm2_model.generate(story_prompt, 40)
    text = tok.decode(story)
    assert len(text.split()) >= 25, text
    # coherent by the float32 model's own judgement: every token iron chose is among its top 3
    # (exact greedy agreement over 40 tokens is too strict: bf16 and float32 differ at near-ties)
    ref = smollm2_reference.logits(story_prompt + story)[len(story_prompt) - 1:-1]
    ranks = [(row > row[t]).sum() for row, t in zip(ref, story)]
    assert max(ranks) < 3, (ranks, text)
    assert story[:4] == smollm2_reference.greedy(story_prompt, 4), text
    assert stats.new_tokens == 40 and stats.decode_tokens_per_second > 0


def test_same_prompt_twice_gives_identical_tokens(smollm2_model):
    ids = token_ids(smollm2_model, TEXTS[0])[:20]
    first, _ = smollm2_model.generate(ids, 24)
    second, _ = smollm2_model.generate(ids, 24)
    assert first == second


@pytest.mark.parametrize("length", [1, 32, 40, 70, 100])
def test_prompt_of_one_token_one_chunk_and_several_chunks(smollm2_model, smollm2_reference,
                                                          length):
    """1 and 32 tokens: the tail program; 40: one padded chunk; 70: a chunk and a tail;
    100: a chunk and a padded chunk. The top token is the reference's, or one the reference
    puts within two bf16 steps of its top (the hidden states are bf16 and the weights the
    file's blocks: 40 tokens end on such a near-tie, 13.27 against 13.20, where a step is
    0.0625)."""
    ids = (token_ids(smollm2_model, " ".join(TEXTS)) * 3)[:length]
    assert len(ids) == length
    assert (smollm2_model.chunk, smollm2_model.tail_chunk) == (64, 32)
    smollm2_model.reset()
    logits = smollm2_model.prefill(ids).astype(np.float32)
    ref = smollm2_reference.logits(ids)[-1]
    kl, _ = kl_stats(ref[None], logits[None])
    assert kl[0] <= 0.05
    assert ref[logits.argmax()] >= ref.max() - 2 * bf16_ulp(ref.max())


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_tiny_llama3_checkpoint_matches_reference(tmp_path, dtype):
    """A bf16 checkpoint's bundle binds bf16 matrices; a float16 one's binds the file's own
    halves (format f16), and both match transformers' float32 model of the same stored values.
    Every logit is within 1% of the largest (0.5% measured for either dtype: the bf16
    activations between steps, not the weights, set the error here)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from llama_reference import LlamaReference
    from tiny_llama import write_tiny_llama

    from iron.pipeline.bundle import Bundle

    checkpoint = write_tiny_llama(tmp_path / "tiny", seed=3, dtype=dtype)
    config = json.loads((checkpoint / "config.json").read_text())
    assert config["rope_scaling"]["rope_type"] == "llama3"
    assert not config["tie_word_embeddings"]
    assert (checkpoint / "model.safetensors.index.json").exists()
    bundle = Bundle.open(make_bundle(checkpoint, tmp_path / "bundle", chunk=8))
    formats = bundle.meta["weight_formats"]
    if dtype == "float16":  # the stacked projections; 260 vocabulary rows are not whole tiles
        assert len(formats) == 8 and {tuple(f) for f in formats.values()} == {("f16", 32)}
        assert all(bundle.weights()[name].dtype == np.float16 for name in formats)
    else:
        assert formats == {}
    model = LanguageModel(bundle.path)
    ids = list(np.random.default_rng(0).integers(0, 256, 40))
    ref = LlamaReference(checkpoint).logits(ids)
    for ours in (decode_logits(model, ids), prefill_logits(model, ids)):
        kl, agree = kl_stats(ref, ours)
        assert_accurate(kl, agree, TINY)
        scale = np.abs(ref).max()
        assert np.abs(ours - ref).max() <= 0.01 * scale


def test_prompt_longer_than_the_context_is_a_clear_error(tmp_path):
    from tiny_llama import write_tiny_llama

    checkpoint = write_tiny_llama(tmp_path / "tiny", seed=4)
    model = LanguageModel(make_bundle(checkpoint, tmp_path / "bundle", context=16, chunk=8))
    with pytest.raises(IronError, match="a prompt of 20 tokens and 4 new tokens do not fit the bundle's "
                       "context of 16 positions"):
        model.generate(list(range(20)), 4)
    out, _ = model.generate(list(range(10)), 6)  # 10 + 6 - 1 positions fit
    assert len(out) <= 6


def test_run_cli_prints_json(smollm2_bundle):
    result = subprocess.run([sys.executable, "-m", "iron.lm.run", str(smollm2_bundle),
                             "--prompt", "The capital of France is", "--max-new-tokens", "6",
                             "--json"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert "Paris" in report["text"] and report["prompt_tokens"] == 5
    for key in ("time_to_first_token_s", "prefill_tokens_per_s", "decode_tokens_per_s"):
        assert report[key] > 0


def run_cli(*args, stdin=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "iron.lm.run", *map(str, args)],
                          capture_output=True, text=True, input=stdin, timeout=timeout)


def test_run_cli_json_says_why_it_stopped(smollm2_bundle):
    short = json.loads(run_cli(smollm2_bundle, "-p", "The capital of France is", "-n", "3",
                               "--json").stdout)
    assert short["finish_reason"] == "length" and len(short["tokens"]) == 3
    stopped = json.loads(run_cli(smollm2_bundle, "-p", "The capital of France is", "-n", "20",
                                 "--stop", ".", "--json").stdout)
    assert stopped["finish_reason"] == "stop" and stopped["text"] == " Paris"


def test_run_cli_reads_the_prompt_from_a_file_or_stdin_and_refuses_before_echoing(
        smollm2_bundle, tmp_path):
    piped = json.loads(run_cli(smollm2_bundle, "-n", "2", "--json",
                               stdin="The capital of France is").stdout)
    assert piped["text"].startswith(" Paris") and piped["prompt_tokens"] == 5
    (tmp_path / "p.txt").write_text("The capital of France is")
    filed = json.loads(run_cli(smollm2_bundle, "-f", tmp_path / "p.txt", "-n", "2",
                               "--json").stdout)
    assert filed["tokens"] == piped["tokens"]
    long = "word " * 5000
    refused = run_cli(smollm2_bundle, "-c", "1024", "-n", "4", stdin=long)
    assert refused.returncode == 2 and refused.stdout == ""  # the prompt is not echoed
    assert refused.stderr.count("\n") == 1 and "do not fit the bundle's context of 1024" \
        in refused.stderr
    too_big = run_cli(smollm2_bundle, "-c", "100000", "-p", "Hi")
    assert too_big.returncode == 2 and "--ctx-size 100000: the bundle" in too_big.stderr


def test_run_cli_system_message_uses_the_chat_template(smollm2_bundle):
    plain = json.loads(run_cli(smollm2_bundle, "-p", "Hi", "-n", "1", "--json").stdout)
    system = json.loads(run_cli(smollm2_bundle, "-p", "Hi", "-n", "1", "-s", "Be brief.",
                                "--json").stdout)
    assert plain["prompt_tokens"] == 1 and system["prompt_tokens"] > 10


def test_iron_run_answers_from_q4_1_and_f16_gguf_files_sharing_weights_across_contexts(
        smollm2, tmp_path):
    """`iron run FILE.gguf` on the embedded Q4_1 file and an F16 file written from it with the
    gguf package: each is converted and built on first use (compiled kernels from the shared
    cache) and answers " Paris"; `-c 512` builds a second bundle that holds the same weights
    file (one inode), not a copy."""
    import os
    from pathlib import Path

    import importlib.util

    spec = importlib.util.spec_from_file_location(  # the benchmarks' GGUF writer, by path
        "llamacpp_bench", Path(__file__).resolve().parents[2] / "benchmarks" / "llamacpp.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    write_gguf = bench.write_gguf
    from iron.lm.gguf_import import GGUF_MEMBER

    q4_1 = smollm2.parent.parent / "downloads" / Path(GGUF_MEMBER).name
    f16 = write_gguf(q4_1, tmp_path / "smollm2-f16.gguf", "F16")
    iron = Path(sys.executable).with_name("iron")
    env = {**os.environ, "IRON_BUILD_DIR": str(tmp_path / "build"),
           "IRON_CACHE_DIR": str(smollm2.parent.parent / "ops")}

    def iron_run(model, *flags):
        result = subprocess.run([iron, "run", model, "-p", "The capital of France is", "-n",
                                 "8", *flags], capture_output=True, text=True, env=env,
                                timeout=1200)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("The capital of France is Paris"), result.stdout
        return result

    first = iron_run(q4_1)
    assert "building " in first.stderr and "Traceback" not in first.stderr
    again = iron_run(q4_1)
    assert "building" not in again.stderr and "checkpoint:" not in again.stderr  # reused
    iron_run(q4_1, "-c", "512")
    iron_run(f16)
    bundles = {p.parent.name: p.stat() for p in
               (tmp_path / "build" / "llama").glob("*/weights.safetensors")}
    assert len(bundles) == 3, bundles
    q4, q4_512 = (next(st for name, st in bundles.items() if "Q4_1" in name and
                       name.endswith("ctx512") == small) for small in (False, True))
    assert (q4.st_dev, q4.st_ino) == (q4_512.st_dev, q4_512.st_ino)
    f16_weights = next(st for name, st in bundles.items() if "f16" in name)
    assert f16_weights.st_size > 2 * q4.st_size  # the file's halves, not the Q4_1 blocks


#: Positions teacher-forced against llama.cpp on the F16 file, and the log-probabilities it
#: reports per position (its top ones; the rest of the mass is one more bin).
F16_POSITIONS, F16_TOP = 40, 200


def test_f16_file_runs_its_own_halves_within_the_gate_of_llama_cpp(smollm2, tmp_path):
    """An F16 file (SmolLM2's weights written as F16 by the gguf package): the native bundle
    binds every matrix as the file's float16 halves (format f16, converted in the kernels), not
    bf16 copies, and its next-token distributions over 40 teacher-forced positions are within
    the SmolLM2 gate of llama.cpp's own on the same file (its library in the test extra's
    xllamacpp wheel). llama.cpp reports its top 200 log-probabilities per position; the KL is
    taken over those tokens and one bin for the rest, a lower bound of the full KL that a
    wrong kernel still breaks by orders of magnitude (halves paired with the wrong values of
    x)."""
    pytest.importorskip("xllamacpp")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from llamacpp import LlamaCpp, write_gguf

    from apps.llama.family import FAMILY
    from iron.lm import gguf_import
    from iron.pipeline.bundle import Bundle

    src = write_gguf(gguf_import.default_gguf(smollm2.parent.parent / "downloads"),
                     tmp_path / "smollm2-f16.gguf", "F16")
    checkpoint = gguf_import.convert_gguf(src, tmp_path / "ckpt", FAMILY)
    bundle = Bundle.open(make_bundle(checkpoint, tmp_path / "bundle", context=128))
    formats = bundle.meta["weight_formats"]
    assert formats and {tuple(f) for f in formats.values()} == {("f16", 32)}
    weights = bundle.weights()
    assert all(weights[name].dtype == np.float16 for name in formats)
    model = LanguageModel(bundle.path)
    ids = token_ids(model, TEXTS[0])[:F16_POSITIONS]
    ours = log_softmax(decode_logits(model, ids))
    kl, agree = [], []
    with LlamaCpp(src, n_threads=2, n_ctx=128, warmup=False) as llm:
        for n in range(1, len(ids) + 1):
            r = llm._server.handle_completions(llm._request(
                ids[:n], 1, logprobs=F16_TOP, n_probs=F16_TOP, post_sampling_probs=False))
            top = r["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
            top_ids = np.array([t["id"] for t in top])
            p = np.exp(np.array([t["logprob"] for t in top]))
            q = np.exp(ours[n - 1, top_ids])
            p, q = np.append(p, max(1 - p.sum(), 1e-12)), np.append(q, max(1 - q.sum(), 1e-12))
            kl.append(float((p * np.log(p / q)).sum()))
            agree.append(top_ids[0] == ours[n - 1].argmax())
    assert_accurate(np.array(kl), float(np.mean(agree)), SMOLLM2)


def test_native_bundle_runs_the_files_blocks(tmp_path):
    """A GGUF with Q4_1 projections and a Q8_0 embedding: the default bundle binds the
    projections' blocks (not bf16 copies) and matches the float32 reference of the same weights.
    The embedding's 260 rows are not whole 16-row tiles of the quantized layout, so it stays
    bf16 (the Q8_0 embedding and lm head run in the SmolLM2 tests)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from llama_reference import LlamaReference
    from tiny_llama import _write_tiny_gguf

    from apps.llama.family import FAMILY
    from iron.lm import gguf_import
    from iron.pipeline.bundle import Bundle

    _write_tiny_gguf(tmp_path / "tiny.gguf", seed=7, quantize=True)
    checkpoint = gguf_import.convert_gguf(tmp_path / "tiny.gguf", tmp_path / "ckpt", FAMILY)
    bundle = Bundle.open(make_bundle(checkpoint, tmp_path / "bundle", chunk=8))
    meta = bundle.meta
    assert meta["weights"] == "native"
    assert {tuple(f) for f in meta["weight_formats"].values()} == {("q4_1", 32)}
    weights = bundle.weights()
    assert weights["model.layers.0.mlp.gate_up_proj.weight"].dtype == np.uint8
    assert weights["model.embed_tokens.weight"].shape == (260, 64)
    decode_ops = {(type(op).__name__, op.weight_format)
                  for op in bundle.program("decode").ops if hasattr(op, "weight_format")}
    assert decode_ops == {("Embedding", "bf16"), ("GEMV", "q4_1")}
    model = LanguageModel(bundle.path)
    ids = list(np.random.default_rng(1).integers(0, 256, 40))
    ref = LlamaReference.from_gguf(tmp_path / "tiny.gguf").logits(ids)
    for ours in (decode_logits(model, ids), prefill_logits(model, ids)):
        kl, agree = kl_stats(ref, ours)
        assert_accurate(kl, agree, TINY)


@pytest.fixture(scope="module")
def smollm2_bf16_bundle(smollm2, tmp_path_factory):
    """The embedded checkpoint with every matrix in bf16 (its activations stay unrounded)."""
    return make_bundle(smollm2, tmp_path_factory.mktemp("bf16") / "cpu", weights="bf16",
                       context=2048)


def test_chat_answer_is_paris_where_the_logits_tied_in_bf16(smollm2_bf16_bundle):
    """After the chat prompt "What is the capital of France?" (with SmolLM2's default system
    message) the float32 model puts "The" (id 504) 0.08 above "L" (id 60); the bf16-weights
    bundle, 0.07 above. Rounded to bf16 both logits were 25.375, and greedy took the lower id:
    "L'Étoile, la Marseillaise, ...". With float32 logits the answer names Paris. (On the
    file's own Q4_1 blocks "L" leads by 0.09 in float32, as in llama.cpp on the same file.)"""
    result = run_cli(smollm2_bf16_bundle, "--chat", "-p", "What is the capital of France?",
                     "--temperature", "0", "-n", "12", timeout=600)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("The capital of France is Paris"), result.stdout


#: Greedy tokens of the chat answer compared with llama.cpp's, and the most the two engines may
#: disagree (in nats) about the gap between their two tokens where they first part: llama.cpp's
#: preference for its token plus iron's for its own. Where llama.cpp puts " fem" 0.60 above
#: " Cit" (the answer's 14th token) the float32 model puts it 0.40 above, and rounding the
#: residual stream to bf16 alone moves that gap by 0.28 (transformers' model with hooks): a
#: step this close is decided by the activations' rounding, not by the weights.
CHAT_TOKENS, NEAR_TIE = 24, 0.75


def test_chat_answer_is_llama_cpps_on_the_same_file_up_to_a_near_tie(smollm2, smollm2_bundle,
                                                                       smollm2_model):
    """``iron run --chat -p "What is the capital of France?" --temperature 0`` on the default
    (native Q4_1 / Q8_0) bundle gives llama.cpp's greedy answer on the same GGUF file: the same
    prompt tokens (llama.cpp's own chat completion, its template read from the file and its
    default system message, writes the text its greedy tokens after iron's prompt decode to),
    and the same tokens up to the first position where the two engines' preferences between
    their two tokens add up to at most NEAR_TIE.

    Measured: the first 22 tokens agree ("L'Étoile, la Marseillaise, la femme, la femme au
    martyre"); at the 23rd llama.cpp prefers "," by 0.20 nats, iron "." by 0.03. "L" before
    "The" is the file's answer,
    not iron's: llama.cpp's logprobs are -1.85 and -2.01; transformers' float32 model on the
    file's dequantized weights puts "The" 0.08 above "L", and with every Linear's input rounded
    to int8 in blocks of 32 with an fp16 scale, as llama.cpp's Q8_1 / Q8_0 products round it,
    "L" 0.155 above "The" (llama.cpp: 0.157)."""
    pytest.importorskip("xllamacpp")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from llamacpp import LlamaCpp

    from iron.lm import gguf_import

    question = "What is the capital of France?"
    result = run_cli(smollm2_bundle, "--chat", "-p", question, "--temperature", "0",
                     "-n", str(CHAT_TOKENS), "--json", timeout=600)
    assert result.returncode == 0, result.stderr
    ours = json.loads(result.stdout)
    prompt, tokens = ours["prompt_ids"], ours["tokens"]
    src = gguf_import.default_gguf(smollm2.parent.parent / "downloads")
    with LlamaCpp(src, n_threads=2, n_ctx=256, warmup=False) as llm:
        steps = llm._server.handle_completions(llm._request(
            prompt, CHAT_TOKENS, logprobs=5, n_probs=5))["choices"][0]["logprobs"]["content"]
        chat = llm._server.handle_chat_completions({
            "messages": [{"role": "user", "content": question}], "max_tokens": CHAT_TOKENS,
            "temperature": 0.0, "top_k": 1})
    theirs = [step["id"] for step in steps]
    text = smollm2_model.tokenizer().decode(theirs)
    assert chat["usage"]["prompt_tokens"] == len(prompt)
    assert chat["choices"][0]["message"]["content"] == text, (text, chat)
    same = next((i for i, (a, b) in enumerate(zip(tokens, theirs)) if a != b), len(tokens))
    print(f"iron and llama.cpp agree on {same} of {CHAT_TOKENS} tokens: {text!r}")
    if same == len(tokens):
        assert same == CHAT_TOKENS, f"iron stopped after {same} tokens; llama.cpp: {text!r}"
        return
    top = {t["id"]: t["logprob"] for t in steps[same]["top_logprobs"]}
    assert tokens[same] in top, f"token {same}: iron's {tokens[same]} not in llama.cpp's {top}"
    smollm2_model.reset()
    for t in prompt + tokens[:same]:
        logits = smollm2_model.decode(t).astype(np.float32)
    apart = (top[theirs[same]] - top[tokens[same]]) + (logits[tokens[same]] - logits[theirs[same]])
    assert apart <= NEAR_TIE, (f"token {same}: iron {tokens[same]}, llama.cpp {theirs[same]} "
                               f"(their logprobs {top}), {apart:.3f} nats apart; llama.cpp's "
                               f"answer {text!r}")


def test_smollm2_native_greedy_text_matches_bf16_up_to_near_ties(
        smollm2_model, smollm2_reference, smollm2_bf16_bundle):
    """The default (native Q4_1 / Q8_0) bundle against a bf16 bundle of the same checkpoint:
    greedy continuations agree, or part only where the float32 model itself is near a tie."""
    from iron.pipeline.bundle import Bundle

    assert Bundle.open(smollm2_model.bundle.path).meta["weights"] == "native"
    bf16 = LanguageModel(smollm2_bf16_bundle)
    for text in TEXTS:
        prompt = token_ids(smollm2_model, text)[:24]
        ours, _ = smollm2_model.generate(prompt, 16)
        theirs, _ = bf16.generate(prompt, 16)
        same = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), len(ours))
        if same < len(ours):
            row = smollm2_reference.logits(prompt + ours[:same])[-1]
            gap = abs(row[ours[same]] - row[theirs[same]])
            assert gap < 0.5, (f"token {same}: native {ours[same]}, bf16 {theirs[same]}, "
                               f"float32 logit gap {gap:.3f}")


def test_uint4_bundle_quantizes_an_hf_checkpoint_at_bundle_time(tmp_path):
    """weights=uint4 on a bf16 HF checkpoint: every projection becomes uint4 (group 128 where
    it divides the row, else 32), the embedding stays bf16, and the next-token distributions
    stay close to the bf16 bundle's."""
    from tiny_llama import write_tiny_llama

    from iron.pipeline.bundle import Bundle

    checkpoint = write_tiny_llama(tmp_path / "tiny", seed=8)
    bf16 = LanguageModel(make_bundle(checkpoint, tmp_path / "bf16", chunk=8, weights="bf16"))
    path = make_bundle(checkpoint, tmp_path / "uint4", chunk=8, weights="uint4")
    formats = Bundle.open(path).meta["weight_formats"]
    assert formats["model.layers.0.mlp.down_proj.weight"] == ["uint4", 128]  # K = 128
    assert formats["model.layers.0.mlp.gate_up_proj.weight"] == ["uint4", 32]  # K = 64
    assert "model.embed_tokens.weight" not in formats and "lm_head.weight" not in formats
    ids = list(np.random.default_rng(2).integers(0, 256, 24))
    kl, agree = kl_stats(decode_logits(bf16, ids), decode_logits(LanguageModel(path), ids))
    print(f"tiny uint4 vs bf16: KL mean {kl.mean():.4f} max {kl.max():.4f} top-1 {agree:.3f}")
    assert kl.mean() <= 0.05 and agree >= 0.8


def test_iron_command_runs_a_bundle_folder_as_it_is_and_lists_it(smollm2_bundle, tmp_path):
    """`iron run BUNDLE` needs no build; `-c N` above its context needs the selection it was
    built from (a bundle written outside doit does not record one: one line says so); `iron
    list` shows it with its size."""
    import os
    from pathlib import Path

    iron = Path(sys.executable).with_name("iron")
    ran = subprocess.run([iron, "run", smollm2_bundle, "-p", "The capital of France is", "-n",
                          "2", "--json"], capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0 and ran.stderr == "", ran.stderr
    assert json.loads(ran.stdout)["text"].startswith(" Paris")
    bigger = subprocess.run([iron, "run", smollm2_bundle, "-c", "100000", "-p", "Hi"],
                            capture_output=True, text=True, timeout=300)
    assert bigger.returncode == 2 and bigger.stderr.count("\n") == 1
    assert "does not say what it was built from" in bigger.stderr
    build = tmp_path / "build"
    (build / "llama").mkdir(parents=True)
    os.symlink(smollm2_bundle, build / "llama" / "cpu")
    listed = subprocess.run([iron, "list"], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "IRON_BUILD_DIR": str(build)})
    line = listed.stdout.splitlines()[0]
    assert line.startswith(f"{build}/llama/cpu ") and "llama on cpu: smollm2-135m-instruct" \
        in line and " MB " in line


def test_doit_generate_on_a_built_bundle_prints_the_text_and_few_other_lines(smollm2,
                                                                              tmp_path):
    """`doit generate prompt=...` on a built bundle: the prompt and answer, and at most five
    other lines (stdout and stderr together); the same tokens as `iron.lm.run`'s default."""
    import os
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "IRON_BUILD_DIR": str(tmp_path / "build"),
           "IRON_CACHE_DIR": str(smollm2.parent.parent / "ops")}
    args = [sys.executable, "-m", "doit", "generate", f"checkpoint={smollm2}",
            "prompt=The capital of France is", "max_new_tokens=8"]
    first = subprocess.run(args, cwd=root, env=env, capture_output=True, text=True,
                           timeout=1200)
    assert first.returncode == 0, first.stdout + first.stderr
    again = subprocess.run(args, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr
    bundle = next((tmp_path / "build" / "llama").iterdir())
    text = json.loads(run_cli(bundle, "-p", "The capital of France is", "-n", "8",
                              "--json").stdout)["text"]
    shown = "The capital of France is" + text
    assert shown in again.stdout
    others = (again.stdout.replace(shown, "", 1) + again.stderr).strip("\n").splitlines()
    assert len(others) <= 5, others
