"""An independent float32 reference: Hugging Face transformers' model of the checkpoint's
architecture (``LlamaForCausalLM``, ``Qwen2ForCausalLM``, ``Qwen3ForCausalLM``: the class its
``model_type`` names, through ``AutoModelForCausalLM``) on torch CPU.

Test-only; needs ``torch`` and ``transformers`` (tests ``pytest.importorskip`` both before
importing this module). The checkpoint is loaded from local files only, from safetensors only
(or, with ``from_gguf``, a GGUF file through transformers' own reader), with no remote code::

    ref = LlamaReference("build/checkpoints/smollm2-135m-instruct")
    ref.logits([504, 3575, 282, 4649, 314])     # (5, 49152) float32
    ref.greedy([504, 3575, 282, 4649, 314], 3)  # [7042, 30, ...]
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM


class LlamaReference:
    """A checkpoint directory loaded into transformers in float32, eager attention."""

    def __init__(self, checkpoint_dir: str | Path):
        self.model = AutoModelForCausalLM.from_pretrained(
            str(checkpoint_dir), dtype=torch.float32, attn_implementation="eager",
            local_files_only=True, use_safetensors=True, trust_remote_code=False)
        self.model.eval()

    @classmethod
    def from_gguf(cls, path: str | Path) -> "LlamaReference":
        """A GGUF file loaded by transformers' own GGUF reader (its dequantization and its
        undoing of llama.cpp's q/k permutation), not by iron's converter: the reference
        stays independent of the code under test. Needs ``accelerate`` (the test extra)."""
        path = Path(path)
        self = cls.__new__(cls)
        self.model = AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32,
            attn_implementation="eager", local_files_only=True, trust_remote_code=False)
        self.model.eval()
        self._apply_rope_freqs(path)
        return self

    def _apply_rope_freqs(self, path: Path) -> None:
        """Divide the model's RoPE frequencies by the file's ``rope_freqs`` tensor, which
        transformers' GGUF reader drops (it loads a Llama 3.2 file with unscaled RoPE). These
        divisors are how llama.cpp's converter writes transformers' own ``llama3`` rule:
        transformers' scaled frequencies are its plain ones over them (test_gguf_rope.py)."""
        from iron.lm.gguf_file import GGUFFile

        tensor = next((t for t in GGUFFile.open(path).tensors if t.name == "rope_freqs.weight"),
                      None)
        if tensor is None:
            return
        rotary = self.model.model.rotary_emb
        factors = torch.as_tensor(np.asarray(tensor.data, np.float32))
        with torch.no_grad():
            rotary.inv_freq.copy_(rotary.inv_freq / factors)
            rotary.original_inv_freq.copy_(rotary.inv_freq)

    def logits(self, token_ids: list[int] | np.ndarray) -> np.ndarray:
        """Next-token logits after each position: float32 ``(T, vocab)``."""
        ids = torch.as_tensor(np.asarray(token_ids, dtype=np.int64)).reshape(1, -1)
        with torch.no_grad():
            out = self.model(input_ids=ids, use_cache=False).logits  # (1, T, vocab)
        return out[0].float().numpy()

    def greedy(self, token_ids: list[int], n: int) -> list[int]:
        """The ``n`` tokens greedy decoding appends to ``token_ids`` (no stop on eos)."""
        ids = torch.as_tensor([list(token_ids)], dtype=torch.int64)
        with torch.no_grad():
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids),
                                      max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                      pad_token_id=0)
        return out[0, len(token_ids):].tolist()
