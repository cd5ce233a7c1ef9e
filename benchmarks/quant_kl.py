"""How much a weight format costs in accuracy: KL divergence of each bundle's next-token
distribution from the bf16 bundle's on the same checkpoint, teacher-forced over three texts.

For every mode (``native``: the checkpoint's own blocks; ``uint4`` with group 32 and 128,
quantized here from the checkpoint's bf16 tensors) a bundle is built beside the bf16 one (the
compiled kernels are cached) and each text is decoded token by token; printed per mode: KL mean,
p90 and max over positions, top-1 agreement with bf16, and the weight bytes of the bundle.

    python benchmarks/quant_kl.py [--checkpoint DIR] [--tokens 48]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def teacher_forced(model, ids: list[int]) -> np.ndarray:
    model.reset()
    return np.stack([model.decode(t).astype(np.float32) for t in ids])


def main() -> None:
    import iron
    from iron.lm.generate import LanguageModel
    from iron.lm.texts import TEXTS
    from iron.pipeline.app import load_app
    from iron.pipeline.bundle import write_bundle

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", help="HF checkpoint directory (default: SmolLM2)")
    parser.add_argument("--tokens", type=int, default=48, help="positions per text")
    args = parser.parse_args()
    modes = [("bf16", {"weights": "bf16"}), ("native", {"weights": "native"}),
             ("uint4 g32", {"weights": "uint4", "group": 32}),
             ("uint4 g128", {"weights": "uint4", "group": 128})]
    profile = iron.Profile(device="cpu")
    with tempfile.TemporaryDirectory(dir=HERE.parent / "build") as tmp:
        models = {}
        for name, options in modes:
            app = load_app("llama", args.checkpoint, **options)
            if name == "native" and not app.formats:
                continue  # an HF checkpoint has no blocks of its own
            out = write_bundle(app, iron.device("cpu"), profile, Path(tmp) / name.replace(" ", "-"))
            models[name] = (LanguageModel(out), (out / "weights.safetensors").stat().st_size)
            groups = sorted({g for _, g in app.formats.values()})
            formats = sorted({f for f, _ in app.formats.values()}) or ["bf16"]
            print(f"built {name}: formats {formats}, groups {groups}", file=sys.stderr,
                  flush=True)
        base = models["bf16"][0]
        tok = base.tokenizer()
        ids = [tok.encode(t, add_special_tokens=False).ids[:args.tokens] for t in TEXTS]
        ref = [teacher_forced(base, i) for i in ids]
        print(f"{'weights':12s} {'KL mean':>8s} {'KL p90':>8s} {'KL max':>8s} {'top-1':>7s} "
              f"{'weight MB':>10s}")
        for name, (model, nbytes) in models.items():
            kls, agree = [], []
            for r, i in zip(ref, ids):
                ours = teacher_forced(model, i)
                p, q = log_softmax(r), log_softmax(ours)
                kls.append((np.exp(p) * (p - q)).sum(-1))
                agree.append(r.argmax(-1) == ours.argmax(-1))
            kl, agree = np.concatenate(kls), np.concatenate(agree)
            print(f"{name:12s} {kl.mean():8.4f} {np.percentile(kl, 90):8.4f} {kl.max():8.4f} "
                  f"{agree.mean():7.1%} {nbytes / 1e6:10.1f}")
        print(f"(KL(bf16 || weights) per position, {sum(map(len, ids))} positions)")


if __name__ == "__main__":
    main()
