"""Qwen2 (q, k and v biases) and Qwen3 (per-head q/k RMSNorm, an explicit head_dim) as members
of the Llama family: their Hugging Face configs, their GGUF files (``benchmarks/make_gguf.py
--arch``), the decoder graph over their weights against transformers' own Qwen2ForCausalLM /
Qwen3ForCausalLM in float32 and llama.cpp on the same F16 file, through ``iron run``."""

import sys
from pathlib import Path

import numpy as np
import pytest

import iron
from buildtools import iron_run_json
from apps.llama.config import LlamaConfig
from iron.errors import CheckpointError
from made_gguf import FILES, STD
from test_llama import Gate, assert_accurate, kl_stats

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import make_gguf  # noqa: E402

#: the Qwen files' shapes (``made_gguf.FILES``), whose Qwen3 head_dim is not hidden / heads
SHAPES = {arch: FILES[arch][0]["shape"] for arch in ("qwen2", "qwen3")}
#: iron (the files' F16 matrices run as stored, bf16 activations) against transformers'
#: float32 on these F16 files reached KL mean 0.00020, p90 0.00028, max 0.00042 (Qwen2, its
#: biases of std 0.5 sharpening the attention) and 0.00015, 0.00022, 0.00025 (Qwen3) over 24
#: positions (2026-12-05); the gate is 2x Qwen2's mean and 3x its tails. Dropping Qwen2's bias
#: or Qwen3's q/k norm gives a KL mean of 1.17 and 0.81. Top-1 is judged by ``TIE`` instead.
QWEN = Gate(mean=0.0004, p90=0.0009, max=0.0013, top1=0.0)
#: The most a greedy token may fall below the reference's likeliest, in logits: rounding moves
#: these logits by a few hundredths, so a near tie (every top-1 disagreement measured was a gap
#: of 0.047 or less, llama.cpp agreeing with transformers) may go either way.
TIE = 0.06
PROMPT = "Hello, y'all! How are you 😁 ?我想在apple工作1314151天～"


def hf_config(arch: str) -> dict:
    """transformers' own config.json of a small model of ``arch``."""
    transformers = pytest.importorskip("transformers")
    cls = {"qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config}[arch]
    return cls(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, vocab_size=1000).to_dict()


def test_transformers_qwen_configs_are_llama_family_variants():
    qwen2 = LlamaConfig.from_dict(hf_config("qwen2"))
    assert (qwen2.model_type, qwen2.qkv_bias, qwen2.qk_norm, qwen2.head_dim) == (
        "qwen2", True, False, 64)
    qwen3 = LlamaConfig.from_dict(hf_config("qwen3"))
    assert (qwen3.model_type, qwen3.qkv_bias, qwen3.qk_norm, qwen3.head_dim) == (
        "qwen3", False, True, 128)  # Qwen3Config's head_dim default, not hidden / heads
    assert qwen3.max_position_embeddings == 32768 and qwen3.rms_norm_eps == 1e-6
    for config in (qwen2, qwen3):
        again = config.to_json_dict()
        assert again["architectures"] == [f"{config.model_type.capitalize()}ForCausalLM"]
        assert LlamaConfig.from_dict(again) == config


@pytest.mark.parametrize("arch,change,message", [
    ("qwen2", {"use_sliding_window": True}, "'use_sliding_window' = True is not supported"),
    ("qwen3", {"attention_bias": True}, "'attention_bias' = True is not supported"),
    ("qwen3", {"architectures": ["Qwen2ForCausalLM"]}, r"must be \['Qwen3ForCausalLM'\]"),
    ("qwen3", {"model_type": "qwen3_moe"}, "only 'llama', 'qwen2', 'qwen3'"),
])
def test_a_qwen_config_iron_cannot_run_is_refused_in_one_line(arch, change, message):
    with pytest.raises(CheckpointError, match=message):
        LlamaConfig.from_dict({**hf_config(arch), **change}, source="config.json")


@pytest.fixture(scope="module", params=["qwen2", "qwen3"])
def qwen(request, tmp_path_factory):
    """(arch, GGUF file, converted checkpoint) of a small random Qwen model with SmolLM2's
    vocabulary."""
    from apps.llama.family import FAMILY
    from iron.lm import gguf_import

    arch = request.param
    tmp = tmp_path_factory.mktemp(arch)
    src = make_gguf.write(tmp / f"{arch}.gguf", SHAPES[arch], "F16", seed=2, std=STD,
                          arch=arch)
    return arch, src, gguf_import.convert_gguf(src, tmp / "ckpt", FAMILY)


@pytest.mark.slow  # two GGUF files written and converted
def test_a_qwen_gguf_converts_with_its_biases_norms_and_rows_unpermuted(qwen):
    """Qwen files run llama.cpp's NEOX RoPE: their q and k rows are stored in Hugging Face
    order and must come out as they went in, with the biases and q/k norm weights; the folder
    written is one transformers reads as the same model."""
    from gguf import GGUFReader

    from apps.llama.family import open_checkpoint

    arch, src, checkpoint = qwen
    ckpt = open_checkpoint(checkpoint)
    assert ckpt.config.model_type == arch
    assert ckpt.config.head_dim == SHAPES[arch].head_size
    stored = {t.name: np.asarray(t.data, np.float32) for t in GGUFReader(src).tensors}
    pairs = {"blk.1.attn_q.weight": "model.layers.1.self_attn.q_proj.weight",
             "blk.1.attn_k.weight": "model.layers.1.self_attn.k_proj.weight"}
    if arch == "qwen2":
        pairs.update({f"blk.1.attn_{x}.bias": f"model.layers.1.self_attn.{x}_proj.bias"
                      for x in "qkv"})
    else:
        pairs.update({f"blk.1.attn_{x}_norm.weight": f"model.layers.1.self_attn.{x}_norm.weight"
                      for x in "qk"})
    for gguf_name, name in pairs.items():
        got = np.asarray(ckpt.tensor(name), np.float32)
        want = stored[gguf_name].astype(iron.bfloat16).astype(np.float32)
        assert got.shape == want.shape and np.array_equal(got, want), name

    # the converted folder is a Hugging Face checkpoint of the architecture: transformers loads
    # it as it loads the GGUF (up to the folder's bf16), so iron reads what transformers writes
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from llama_reference import LlamaReference

    ids = [int(t) for t in np.random.default_rng(5).integers(300, 40000, 6)]
    folder = LlamaReference(checkpoint)
    assert type(folder.model).__name__ == f"{arch.capitalize()}ForCausalLM"
    kl, agree = kl_stats(LlamaReference.from_gguf(src).logits(ids), folder.logits(ids))
    assert_accurate(kl, agree, QWEN)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_iron_run_on_a_qwen_f16_gguf_tokenizes_and_predicts_as_the_reference(
        tmp_path, arch, made_f16):
    """`iron run` on a Qwen-shaped F16 file with Qwen2's vocabulary (llama.cpp's
    ``ggml-vocab-qwen2.gguf``): its prompt ids are llama.cpp's; at every prompt position its
    next-token distribution is within the ``QWEN`` KL gate of transformers' float32 model of
    the same file, and its greedy token is the reference's up to a near tie (``TIE``).
    test_gguf_kl.py compares the same file's distributions with llama.cpp's."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("xllamacpp")
    from llama_reference import LlamaReference

    import llamacpp
    from iron.lm.generate import LanguageModel

    src = made_f16(arch)
    ran = iron_run_json(src, PROMPT, tmp_path / "build", REPO / "build" / "ops")
    ids = ran["prompt_ids"]
    with llamacpp.LlamaCpp(src, n_ctx=256, warmup=False) as llama_cpp:
        assert ids == llama_cpp.tokenize(PROMPT, add_special=True, parse_special=True)

    bundle, = (tmp_path / "build" / "llama").glob("cpu-*")
    model = LanguageModel(bundle)
    model.reset()
    ours = np.stack([model.decode(t).astype(np.float32) for t in ids])
    ref = LlamaReference.from_gguf(src).logits(ids)
    kl, agree = kl_stats(ref, ours)
    assert_accurate(kl, agree, QWEN)
    greedy = ours.argmax(-1)
    assert ran["tokens"][0] == int(greedy[-1])
    gaps = ref.max(-1) - ref[np.arange(len(ids)), greedy]
    assert gaps.max() <= TIE, f"iron's greedy token is {gaps.max():.3f} below the reference's"


def npu_decoder(model_type: str):
    """A one-row decode program on npu2 of a small decoder of ``model_type``, with random
    weights (norm weights around 1)."""
    from apps.llama.model import Decoder
    from tiny_llama import TINY_CONFIG, random_weights

    variant = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
               "qwen3": "Qwen3ForCausalLM"}[model_type]
    config = LlamaConfig.from_dict({**TINY_CONFIG, "architectures": [variant],
                                    "model_type": model_type, "head_dim": 32,
                                    "num_attention_heads": 2, "num_key_value_heads": 1})
    graph = Decoder(config, rows=1, ctx=32, device="npu2")
    program = graph.record_like([np.zeros(1, np.int32), np.zeros(1, np.int32)])
    return program, random_weights(program)


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_the_npu_places_a_qwen_decoders_steps_as_llamas_and_emulates_them(arch):
    """On npu2 every step of a Qwen decoder is placed as the same step of Llama's (the
    variants' QKVRoPE designed as Llama's is), and the emulated program, folds and all,
    computes what its operators' reference maths compute over three tokens (the KV cache
    carried across calls)."""
    from iron.targets import target_for
    from iron.targets.npu import design_of
    from iron.targets.npu.runner import Emulated

    program, weights = npu_decoder(arch)
    llama, _ = npu_decoder("llama")
    placed = [design_of(op, "npu2") is not None for op in program.ops]
    assert [type(op).__name__ for op in program.ops] == [
        type(op).__name__ for op in llama.ops]
    assert placed == [design_of(op, "npu2") is not None for op in llama.ops]
    assert sum(placed) > len(placed) // 2
    target = target_for(program.device).emulated()
    entries = target.compile_all([*program.ops, None])
    lib = target.artifact(entries.pop())
    emulated = Emulated(program, [target.artifact(e) for e in entries], lib, fold=True)
    emulated.bind_weights(weights)
    state: dict = {}
    for p in range(3):
        xs = [np.array([7 + p], np.int32), np.array([p], np.int32)]
        got = emulated.run(xs)[0].astype(np.float32)
        want = program.reference(xs, weights, state)[0].astype(np.float32)
        # the emulated steps round as the device kernels do (float32 accumulation, one bf16
        # rounding per output); the reference rounds each step's output once
        assert np.abs(got - want).max() <= 0.05 * np.abs(want).max()
