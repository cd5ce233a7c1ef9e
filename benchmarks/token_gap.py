"""Which rounding decides between two near-tied tokens: the logit gap of token A over token B
after a chat prompt, in transformers' float32 model of a GGUF file's dequantized weights (the
test extra), with each ``nn.Linear``'s input rounded to int8 blocks as llama.cpp rounds it (32
values, fp16 scale: its Q8_0 / Q8_1 activations) or as iron's quantized kernels do (16 values,
float32 scale), in every product, in the head alone, in the layers alone and per projection
kind; and llama.cpp's own log-probabilities of A and B on the same file and prompt.

    python benchmarks/token_gap.py [--gguf FILE] [-p "What is the capital of France?"]
                                   [--after ID ...] [--tokens 504 60]

The prompt is the checkpoint's chat template (``--checkpoint``, the embedded one by default)
with its default system message, as ``iron run --chat`` renders it; ``--after`` appends answer
tokens already generated. A positive gap means A is ranked first.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "helpers"))

from activation_scale import round_blocks  # noqa: E402

#: (label, which Linear layers by module name, values per block, fp16 scale)
ROUNDINGS = [("float32, nothing rounded", lambda n: False, 32, False),
             ("every product, llama.cpp's blocks", lambda n: True, 32, True),
             ("every product, iron's blocks", lambda n: True, 16, False),
             ("the head only, llama.cpp's", lambda n: n == "lm_head", 32, True),
             ("the layers only, llama.cpp's", lambda n: n != "lm_head", 32, True)] + [
    (f"{kind} only, llama.cpp's", lambda n, k=kind: n.endswith(k), 32, True)
    for kind in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")]


def main() -> None:
    import torch

    from iron.lm.chat import ChatTemplate
    from llama_reference import LlamaReference
    from llamacpp import LlamaCpp, fetch_smollm2_gguf
    from tokenizers import Tokenizer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path, default=None, help="default: the embedded Q4_1")
    parser.add_argument("--checkpoint", default="build/checkpoints/smollm2-135m-instruct")
    parser.add_argument("-p", "--prompt", default="What is the capital of France?")
    parser.add_argument("--after", type=int, nargs="*", default=[])
    parser.add_argument("--tokens", type=int, nargs=2, default=[504, 60])
    args = parser.parse_args()
    gguf = args.gguf or fetch_smollm2_gguf()
    tokenizer = Tokenizer.from_file(str(Path(args.checkpoint) / "tokenizer.json"))
    ids = ChatTemplate.from_dir(args.checkpoint).tokenize(
        [{"role": "user", "content": args.prompt}], tokenizer) + args.after
    a, b = args.tokens
    names = " / ".join(repr(tokenizer.decode([t])) for t in (a, b))
    print(f"{gguf.name}: gap of {names} after {len(ids)} tokens\n| rounding | gap |\n|---|---|")
    ref = LlamaReference.from_gguf(gguf)
    linears = {n: m for n, m in ref.model.named_modules() if isinstance(m, torch.nn.Linear)}
    for label, chosen, block, fp16 in ROUNDINGS:
        hooks = [m.register_forward_pre_hook(lambda _, inputs, b=block, h=fp16: (round_blocks(
            inputs[0], b, h),)) for n, m in linears.items() if chosen(n)]
        try:
            row = ref.logits(ids)[-1]
        finally:
            for hook in hooks:
                hook.remove()
        print(f"| {label} | {row[a] - row[b]:+.4f} |", flush=True)
    with LlamaCpp(gguf, n_threads=2, n_ctx=len(ids) + 8, warmup=False) as llm:
        step = llm._server.handle_completions(llm._request(ids, 1, logprobs=20, n_probs=20))
        top = {t["id"]: t["logprob"] for t in
               step["choices"][0]["logprobs"]["content"][0]["top_logprobs"]}
    if a in top and b in top:
        print(f"| llama.cpp {llm.version} on the file | {top[a] - top[b]:+.4f} |")
    else:
        print(f"llama.cpp's top 20 lack {a} or {b}: {top}")


if __name__ == "__main__":
    main()
