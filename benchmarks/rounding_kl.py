"""Why iron is farther from float32 than llama.cpp on the same F16 file: the rounding of each
engine emulated in transformers' float32 model of the file, each distribution's KL divergence
from float32 (whole vocabulary, teacher-forced over random tokens) beside iron's and
llama.cpp's own.

iron runs the file's F16 matrices as stored (converted exactly to float32) but rounds every
step's output to bf16 (the GEMMs' outputs, norms, attention, the residual stream, the K/V
cache) and stores F32 biases and norm weights as bf16. llama.cpp's CPU backend keeps
activations float32 but converts a matmul's input to f16 when the weights are F16
(``vec_dot_type = GGML_TYPE_F16`` in ggml-cpu.c's type traits) and caches K and V as f16
(``cache_type_k = GGML_TYPE_F16`` in common.h). bf16 keeps 8 significant bits, f16 11: each
rounding is 8x coarser, so KL, quadratic in the error, grows about 64x. The rows swap the
formats to show it::

    python benchmarks/rounding_kl.py [--arch qwen2|qwen3|llama] [--tokens 24]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests" / "helpers")]


def rounded(x, dtype):
    import torch

    return x.to(dtype).to(torch.float32)


def iron_hooks(model, dtype) -> list:
    """Round as iron does: every step's output (a Linear's before its bias, which is added in
    float32; k and v again as the cache stores them), each norm's, the attention's and the
    SwiGLU's (the inputs of o_proj and down_proj) and each layer's residual stream."""
    import torch

    hooks = []
    for name, mod in model.named_modules():
        kind = type(mod).__name__
        if isinstance(mod, torch.nn.Linear) and not name.endswith("lm_head"):
            def linear(mod, inp, out, cache=name.endswith(("k_proj", "v_proj"))):
                bias = 0 if mod.bias is None else mod.bias
                y = rounded(out - bias, dtype) + bias
                return rounded(y, dtype) if cache else y
            hooks.append(mod.register_forward_hook(linear))
        if name.endswith(("o_proj", "down_proj")):
            hooks.append(mod.register_forward_pre_hook(lambda m, i: (rounded(i[0], dtype),)))
        if kind.endswith("RMSNorm"):
            hooks.append(mod.register_forward_hook(lambda m, i, o: rounded(o, dtype)))
        if kind.endswith("DecoderLayer"):
            hooks.append(mod.register_forward_hook(
                lambda m, i, o: rounded(o, dtype) if torch.is_tensor(o)
                else (rounded(o[0], dtype), *o[1:])))
    return hooks


def llama_cpp_hooks(model, dtype) -> list:
    """Round as llama.cpp's CPU backend does on an F16 file: every matmul's input, and k and v
    (its cache)."""
    import torch

    hooks = []
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear):
            hooks.append(mod.register_forward_pre_hook(lambda m, i: (rounded(i[0], dtype),)))
            if name.endswith(("k_proj", "v_proj")):
                hooks.append(mod.register_forward_hook(lambda m, i, o: rounded(o, dtype)))
    return hooks


def round_vectors(model, dtype) -> None:
    """Biases and norm weights stored as iron stores them."""
    import torch

    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.copy_(rounded(p, dtype))


def main() -> None:
    import torch

    import make_gguf
    from llama_cpp_probs import greedy_distributions
    from llama_reference import LlamaReference
    from llamacpp import LlamaCpp
    from quant_kl import log_softmax

    import iron
    from apps.llama.family import FAMILY
    from iron.lm import gguf_import
    from iron.lm.generate import LanguageModel
    from iron.pipeline.app import load_app
    from iron.pipeline.bundle import write_bundle

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="qwen2", choices=make_gguf.ARCHS)
    parser.add_argument("--tokens", type=int, default=24)
    args = parser.parse_args()
    shape = make_gguf.Shape(hidden=256, layers=2, heads=4, kv_heads=2, ffn=512, context=256,
                            rope_base=1e6, head_dim=128 if args.arch == "qwen3" else None)
    ids = [int(t) for t in np.random.default_rng(5).integers(300, 40000, args.tokens)]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        src = make_gguf.write(tmp / "m.gguf", shape, "F16", seed=2, std=0.1, arch=args.arch)
        app = load_app("llama", gguf_import.convert_gguf(src, tmp / "ckpt", FAMILY),
                       chunk=8, context=max(64, args.tokens))
        model = LanguageModel(write_bundle(app, iron.device("cpu"),
                                           iron.Profile(device="cpu"), tmp / "bundle"))
        model.reset()
        rows = {"iron": np.stack([model.decode(t).astype(np.float32) for t in ids])}
        with LlamaCpp(src, n_ctx=max(64, args.tokens), warmup=False) as llama_cpp:
            n_vocab = len(model.tokenizer().get_vocab())
            rows["llama.cpp"] = np.concatenate([greedy_distributions(
                llama_cpp, ids[:n], 1, n_vocab)[1] for n in range(1, len(ids) + 1)])
        ref = LlamaReference.from_gguf(src)
        weights = {k: v.clone() for k, v in ref.model.state_dict().items()}
        f32 = ref.logits(ids)
        emulations = [
            ("iron's rounding emulated (bf16)", torch.bfloat16, iron_hooks, True),
            ("  the same in f16 (vectors bf16)", torch.float16, iron_hooks, True),
            ("  only the vectors in bf16", None, None, True),
            ("llama.cpp's rounding emulated (f16)", torch.float16, llama_cpp_hooks, False),
            ("  the same in bf16", torch.bfloat16, llama_cpp_hooks, False)]
        for label, dtype, hooks_of, vectors in emulations:
            ref.model.load_state_dict(weights)
            if vectors:
                round_vectors(ref.model, torch.bfloat16)
            hooks = hooks_of(ref.model, dtype) if hooks_of else []
            rows[label] = ref.logits(ids)
            for h in hooks:
                h.remove()
    p = log_softmax(f32)
    print(f"{args.arch}, hidden 256, 2 layers, F16, {len(ids)} positions: KL(float32 || x)")
    for label, logits in rows.items():
        kl = (np.exp(p) * (p - log_softmax(logits))).sum(-1)
        print(f"  {label:38s} mean {kl.mean():.7f}  max {kl.max():.7f}")


if __name__ == "__main__":
    main()
