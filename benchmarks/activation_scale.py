"""What the scale block of x costs in accuracy: the quantized kernels round the input of every
matrix product to int8 codes with one scale per 16 values (``iron.quant.activation_values``);
AMX-INT8 could only run at its width with a scale per 64 values or coarser. This measures the
rounding alone, block by block, on the embedded model in float32 with Hugging Face
``transformers`` (the test extra): every ``nn.Linear``'s input (q/k/v, o, gate/up, down, the
lm head) rounded per block of B values, against the same model unrounded, teacher-forced over
the three accuracy texts. Printed per B: KL(unrounded || rounded) mean, p90 and max over
positions, and top-1 agreement.

    python benchmarks/activation_scale.py [--checkpoint build/checkpoints/smollm2-135m-instruct]
                                          [--blocks 16 32 64 row]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "helpers"))


def round_blocks(x, block: int | None, fp16_scale: bool = False):
    """``x`` with every ``block`` consecutive values of its last axis (the whole row when
    None) rounded as the kernels round them: codes round(x * (127 / max |x|)), half to even,
    times max |x| / 127; a block whose 127 / max |x| overflows float32 becomes zeros. With
    ``fp16_scale`` the scale max |x| / 127 is rounded to float16, as llama.cpp's x86
    ``quantize_row_q8_0`` / ``q8_1`` store it (ggml-cpu/arch/x86/quants.c)."""
    import torch

    shape = x.shape
    if block and shape[-1] % block:
        raise SystemExit(f"--blocks {block}: does not divide a layer's input of {shape[-1]} values")
    blocks = x.reshape(*shape[:-1], -1, block or shape[-1])
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    inv = 127.0 / amax
    inv = torch.where(torch.isfinite(inv), inv, torch.zeros_like(inv))  # max |x| 0 or tiny
    scale = amax / 127.0
    if fp16_scale:
        scale = scale.to(torch.float16).to(x.dtype)
    return (torch.round(blocks * inv) * scale).reshape(shape)


def main() -> None:
    import torch
    from tokenizers import Tokenizer

    from iron.lm.texts import TEXTS
    from llama_reference import LlamaReference

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default="build/checkpoints/smollm2-135m-instruct")
    parser.add_argument("--blocks", nargs="+", default=["16", "32", "64", "row"])
    args = parser.parse_args()
    ref = LlamaReference(args.checkpoint)
    tok = Tokenizer.from_file(str(Path(args.checkpoint) / "tokenizer.json"))
    texts = [tok.encode(t, add_special_tokens=False).ids for t in TEXTS]

    def log_probs() -> np.ndarray:
        rows = [ref.logits(ids).astype(np.float64) for ids in texts]
        x = np.concatenate(rows)
        x -= x.max(axis=-1, keepdims=True)
        return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))

    base = log_probs()
    linears = [m for m in ref.model.modules() if isinstance(m, torch.nn.Linear)]
    print(f"{args.checkpoint}: {len(linears)} linear layers, {len(base)} positions")
    print("| x's scale per | KL mean | KL p90 | KL max | top-1 |\n|---|---|---|---|---|")
    for name in args.blocks:
        block = None if name == "row" else int(name)
        hooks = [m.register_forward_pre_hook(lambda _, inputs, b=block: (round_blocks(
            inputs[0], b),)) for m in linears]
        try:
            lp = log_probs()
        finally:
            for h in hooks:
                h.remove()
        kl = (np.exp(base) * (base - lp)).sum(axis=-1)
        agree = float((base.argmax(-1) == lp.argmax(-1)).mean())
        label = "row" if block is None else f"{block} values"
        print(f"| {label} | {kl.mean():.5f} | {np.percentile(kl, 90):.5f} | {kl.max():.4f} | "
              f"{agree:.1%} |", flush=True)


if __name__ == "__main__":
    main()
