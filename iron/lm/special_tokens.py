"""The BOS/EOS a tokenizer puts around a prompt, added once to ids tokenized without them.

A GGUF file's ``add_bos_token``/``add_eos_token`` (and a Hugging Face ``tokenizer.json``'s own
post-processor) say what ``encode(text)`` adds around a text. A chat prompt is tokenized from
its rendered template without them, since most templates write ``bos_token`` themselves; as
llama.cpp does (it strips the template's leading BOS text, then tokenizes with the model's
special tokens), ``frame`` adds the post-processor's BOS and EOS where the ids lack them, so a
template that writes none (Phi-3's) still gets the BOS its model expects, and one that writes it
gets it once.
"""

from __future__ import annotations

from typing import Any


def around(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The ids ``tokenizer.encode(text)`` puts before and after a text's own ids."""
    plain = tokenizer.encode("a", add_special_tokens=False).ids
    full = tokenizer.encode("a", add_special_tokens=True).ids
    for k in range(len(full) - len(plain) + 1):
        if full[k:k + len(plain)] == plain:
            return full[:k], full[k + len(plain):]
    return [], []  # a post-processor that rewrites the text's own ids adds nothing we can tell


def frame(tokenizer: Any, ids: list[int]) -> list[int]:
    """``ids`` with the tokenizer's BOS in front and EOS behind, each unless already there."""
    before, after = around(tokenizer)
    if before and ids[:len(before)] != before:
        ids = before + ids
    if after and ids[len(ids) - len(after):] != after:
        ids = ids + after
    return ids
