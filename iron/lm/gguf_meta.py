"""A Llama GGUF file's metadata, checked against a table before anything is built from it.

Each key iron reads has a kind (a positive integer, a positive finite float, a string, a bool,
a token id, an array of strings, integers or floats) and every value present is checked
against it, the way ``iron.lm.checkpoint`` checks ``config.json``: a string, NaN or array
``embedding_length`` or a ``head_count`` of 0 is one line naming the key, the value and the
rule.  The sizes a file claims are then checked against what it holds, before any table of
that size is made: ``block_count`` against the ``blk.N`` tensors present (2^32-1 layers is
refused before an expected-tensor table exists), the vocabulary against the embedding's rows,
every token id against the vocabulary, token types against llama.cpp's ``llama_token_type``
(0..6), and every merge against the tokens it names.  Sizes are those llama.cpp's loader reads
(``uint32`` hyper-parameters, ``int32`` token types).
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable

from gguf.constants import GGUFValueType as V

from iron.errors import CheckpointError
from iron.lm.gguf_file import GGUFFile, GGUFValue

_INTS = frozenset({V.UINT8, V.INT8, V.UINT16, V.INT16, V.UINT32, V.INT32, V.UINT64, V.INT64})
_FLOATS = frozenset({V.FLOAT32, V.FLOAT64})
_UINT32_MAX = (1 << 32) - 1

# kind: (element types, is an array, check of a scalar value, the rule in words)
_KINDS: dict[str, tuple[frozenset, bool, Callable[[Any], bool], str]] = {
    "count": (_INTS, False, lambda v: 0 < v <= _UINT32_MAX,
              f"must be an integer in 1..{_UINT32_MAX}"),
    "float": (_FLOATS | _INTS, False, lambda v: math.isfinite(v) and v > 0,
              "must be a positive finite number"),
    "string": (frozenset({V.STRING}), False, lambda v: True, "must be a string"),
    "bool": (frozenset({V.BOOL}), False, lambda v: True, "must be a bool"),
    "token id": (_INTS, False, lambda v: 0 <= v <= _UINT32_MAX,
                 "must be a token id (an integer from 0 to the vocabulary size - 1)"),
    "strings": (frozenset({V.STRING}), True, lambda v: True, "must be an array of strings"),
    "integers": (_INTS, True, lambda v: True, "must be an array of integers"),
    "floats": (_FLOATS, True, lambda v: True, "must be an array of floats"),
}

_T = "tokenizer.ggml."
#: every key iron reads of a model's own (under its ``general.architecture``) and its kind;
#: keys not listed are not read, so not checked
ARCH_KEYS: dict[str, str] = {
    "block_count": "count",
    "context_length": "count",
    "embedding_length": "count",
    "feed_forward_length": "count",
    "attention.head_count": "count",
    "attention.head_count_kv": "count",
    "attention.key_length": "count",
    "rope.dimension_count": "count",
    "vocab_size": "count",
    "attention.layer_norm_rms_epsilon": "float",
    "rope.freq_base": "float",
    "rope.scaling.type": "string",
    "rope.scaling.factor": "float",
    "rope.scale_linear": "float",
    "rope.scaling.attn_factor": "float",
}
#: every other key iron reads and its kind
GENERAL_KEYS: dict[str, str] = {
    "general.architecture": "string",
    _T + "model": "string",
    _T + "pre": "string",
    _T + "tokens": "strings",
    _T + "token_type": "integers",
    _T + "scores": "floats",
    _T + "merges": "strings",
    _T + "bos_token_id": "token id",
    _T + "eos_token_id": "token id",
    _T + "unknown_token_id": "token id",
    _T + "padding_token_id": "token id",
    _T + "seperator_token_id": "token id",  # llama.cpp's spelling
    _T + "eot_token_id": "token id",
    _T + "eom_token_id": "token id",
    _T + "add_bos_token": "bool",
    _T + "add_eos_token": "bool",
    "tokenizer.chat_template": "string",
}

#: llama.cpp's ``llama_token_type``: UNDEFINED 0, NORMAL 1, UNKNOWN 2, CONTROL 3,
#: USER_DEFINED 4, UNUSED 5, BYTE 6
TOKEN_TYPES = range(0, 7)

_MISSING = object()


def keys(arch: str) -> dict[str, str]:
    """Every key iron reads of a model of architecture ``arch`` (``llama.block_count``, ...)
    and its kind."""
    return {**GENERAL_KEYS, **{f"{arch}.{key}": kind for key, kind in ARCH_KEYS.items()}}


def check_metadata(f: GGUFFile, arch: str) -> None:
    """Check every key of ``keys(arch)`` the file holds against its kind (arrays: the element
    type only; their sizes are checked against the file by the functions below)."""
    for key, kind in keys(arch).items():
        field = f.fields.get(key)
        if field is None:
            continue
        types, is_array, ok, rule = _KINDS[kind]
        if field.type not in types or field.is_array != is_array:
            raise CheckpointError(f"{f.source}: GGUF metadata {key!r} has type "
                                  f"{field.type_name()}; it {rule}")
        if not is_array:
            value = field.contents()
            if not ok(value):
                raise CheckpointError(f"{f.source}: GGUF metadata {key!r} = {value!r} {rule}")


def value(f: GGUFFile, key: str, default: Any = _MISSING) -> Any:
    """The value of ``key`` (checked by ``check_metadata``), or ``default`` when absent; a
    missing key without a default is an error naming it."""
    field = f.fields.get(key)
    if field is not None:
        return field.contents()
    if default is _MISSING:
        raise CheckpointError(f"{f.source}: GGUF metadata key {key!r} is missing; the file is "
                              "not a complete llama.cpp model")
    return default


def check_layers(f: GGUFFile, block_count: int, arch: str) -> None:
    """``block_count`` must be the number of ``blk.N`` layers whose tensors the file holds,
    checked before anything of that size is built."""
    found = {int(m.group(1)) for t in f.tensors if (m := re.match(r"blk\.(\d+)\.", t.name))}
    if block_count != len(found) or found != set(range(block_count)):
        held = f"blk.0 .. blk.{max(found)}" if found else "none"
        raise CheckpointError(f"{f.source}: {arch}.block_count = {block_count}, but the file "
                              f"holds tensors for {len(found)} layers ({held}); the count must "
                              "be the number of layers stored")


def check_vocabulary(f: GGUFFile, hidden: int, arch: str) -> int:
    """The vocabulary size, checked against the embedding (``token_embd.weight``, which the
    file's size bounds), the token types, scores and special token ids; then every merge
    against the tokens.  The token strings are decoded only once their count fits."""
    tokens = _array(f, _T + "tokens")
    embed = next((t for t in f.tensors if t.name == "token_embd.weight"), None)
    if embed is None:
        raise CheckpointError(f"{f.source}: has no token_embd.weight tensor; a Llama GGUF "
                              "file stores its token embedding")
    rows = embed.dims[1] if len(embed.dims) == 2 else None
    if embed.dims[:1] != (hidden,) or rows != tokens.count:
        raise CheckpointError(
            f"{f.source}: tokenizer.ggml.tokens holds {tokens.count} tokens, but "
            f"token_embd.weight has dims {list(embed.dims)}; it must be [{hidden}, "
            f"{tokens.count}] (embedding_length, one row per token)")
    n = tokens.count
    declared = value(f, f"{arch}.vocab_size", n)
    if declared != n:
        raise CheckpointError(f"{f.source}: {arch}.vocab_size = {declared} differs from the "
                              f"{n} tokens of tokenizer.ggml.tokens")
    for key in (_T + "token_type", _T + "scores"):
        field = f.fields.get(key)
        if field is not None and field.count != n:
            raise CheckpointError(f"{f.source}: {key} has {field.count} entries for {n} "
                                  "tokens; it needs one per token")
    if _T + "token_type" in f.fields:
        types = value(f, _T + "token_type")
        bad = next((i for i, t in enumerate(types) if t not in TOKEN_TYPES), None)
        if bad is not None:
            raise CheckpointError(f"{f.source}: {_T}token_type[{bad}] = {types[bad]} is not a "
                                  "llama.cpp token type (0..6)")
    for key, kind in GENERAL_KEYS.items():
        if kind == "token id" and key in f.fields and value(f, key) >= n:
            raise CheckpointError(f"{f.source}: {key} = {value(f, key)} is not a token id of "
                                  f"this vocabulary (0..{n - 1})")
    _check_merges(f, value(f, _T + "tokens"))
    return n


def _array(f: GGUFFile, key: str) -> GGUFValue:
    field = f.fields.get(key)
    if field is None:
        raise CheckpointError(f"{f.source}: GGUF metadata key {key!r} is missing; the file is "
                              "not a complete llama.cpp model")
    return field


def _check_merges(f: GGUFFile, tokens: list[str]) -> None:
    """Each BPE merge is two tokens split at its first space after the first character (as
    llama.cpp's vocabulary loader splits it), and both and their join are tokens: a merge
    naming anything else could never apply, and ``tokenizers`` refuses it."""
    if _T + "merges" not in f.fields:
        return
    vocab = set(tokens)
    for i, merge in enumerate(value(f, _T + "merges")):
        cut = merge.find(" ", 1)
        if cut < 0:
            raise CheckpointError(f"{f.source}: {_T}merges[{i}] = {merge[:80]!r} is not two "
                                  "tokens separated by a space")
        first, second = merge[:cut], merge[cut + 1:]
        for part in (first, second, first + second):
            if part not in vocab:
                raise CheckpointError(f"{f.source}: {_T}merges[{i}] = {merge[:80]!r} names "
                                      f"{part[:80]!r}, which is not a token of the vocabulary")
