"""The bounded GGUF reader and the Llama metadata table: hostile files end in one line.

Each case takes the tiny Llama GGUF apart (``gguf_craft``), changes one thing an attacker or a
broken writer could, and converts it: the conversion must fail with a ``CheckpointError`` of
one line naming the rule, before anything the size of the claim is allocated.  The command-line
runs check the same from outside: exit status, no traceback, within a time and memory cap.
"""

from __future__ import annotations

import math
import re
import resource
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from gguf.constants import GGUFValueType as V

from apps.llama.family import FAMILY
from gguf_craft import Parts
from iron.errors import CheckpointError
from iron.lm import gguf_import
from iron.lm.gguf_file import GGUFFile
from tiny_llama import _write_tiny_gguf

REPO = Path(__file__).resolve().parents[2]
T = "tokenizer.ggml."


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    _write_tiny_gguf(path, seed=5, quantize=True)
    return path


def _data_start(parts: Parts) -> int:
    return len(parts.encode()) - len(parts.data)


def _wrap_offset(parts: Parts) -> None:
    """The first tensor's offset chosen so that data start + offset wraps to 0 in 64 bits:
    a reader adding them in uint64 would read the file's header as the tensor."""
    parts.tensors[0]["offset"] = (1 << 64) - _data_start(parts)


def _overlap(parts: Parts) -> None:
    a, b = parts.tensors[0], parts.tensors[1]
    b["offset"] = a["offset"]


def _set(key: str, t: V, value, is_array: bool = False):
    def change(parts: Parts) -> None:
        parts.kv[key] = (t, is_array, value)
    return change


def _huge_array(parts: Parts) -> None:
    parts.raw[T + "token_type"] = struct.pack("<IIQ", V.ARRAY, V.INT32, 1 << 40) + bytes(64)


def _big_vocabulary(parts: Parts) -> None:  # the 10-million-token file, scaled down
    parts.kv[T + "tokens"] = (V.STRING, True, [f"t{i}" for i in range(200_000)])


def _not_utf8(parts: Parts) -> None:
    tokens = list(parts.kv[T + "tokens"][2])
    tokens[5] = b"\xff\xfe"
    parts.kv[T + "tokens"] = (V.STRING, True, tokens)


HOSTILE = {  # case -> (change, what the one line says)
    "array count 2^40": (_huge_array, r"'tokenizer.ggml.token_type' says it holds "
                         r"1099511627776 int32 elements, which need at least 4398046511104 "
                         r"bytes, but \d+ bytes are left"),
    "vocabulary larger than the embedding": (
        _big_vocabulary, r"tokenizer.ggml.tokens holds 200000 tokens, but token_embd.weight "
        r"has dims \[64, 260\]; it must be \[64, 200000\]"),
    "string embedding_length": (_set("llama.embedding_length", V.STRING, "64"),
                                r"'llama.embedding_length' has type string; it must be an "
                                r"integer in 1..4294967295"),
    "NaN embedding_length": (_set("llama.embedding_length", V.FLOAT32, math.nan),
                             r"'llama.embedding_length' has type float32; it must be an integer"),
    "array embedding_length": (_set("llama.embedding_length", V.UINT32, [64], True),
                               r"'llama.embedding_length' has type array of uint32; it must be"),
    "head_count 0": (_set("llama.attention.head_count", V.UINT32, 0),
                     r"'llama.attention.head_count' = 0 must be an integer in 1..4294967295"),
    "block_count 2^32-1": (_set("llama.block_count", V.UINT32, (1 << 32) - 1),
                           r"llama.block_count = 4294967295, but the file holds tensors for 2 "
                           r"layers \(blk.0 .. blk.1\)"),
    "eos_token_id past the vocabulary": (_set(T + "eos_token_id", V.UINT32, 10**6),
                                         r"tokenizer.ggml.eos_token_id = 1000000 is not a token "
                                         r"id of this vocabulary \(0..259\)"),
    "merge naming a missing token": (_set(T + "merges", V.STRING, ["a zz"], True),
                                     r"tokenizer.ggml.merges\[0\] = 'a zz' names 'zz', which is "
                                     r"not a token of the vocabulary"),
    "token not UTF-8": (_not_utf8, r"'tokenizer.ggml.tokens'\[5\] is not UTF-8 text"),
    "unknown_token_id -1": (_set(T + "unknown_token_id", V.INT32, -1),
                            r"'tokenizer.ggml.unknown_token_id' = -1 must be a token id"),
    "token_type as strings": (_set(T + "token_type", V.STRING, ["1"] * 260, True),
                              r"'tokenizer.ggml.token_type' has type array of string; it must "
                              r"be an array of integers"),
    "token_type out of range": (_set(T + "token_type", V.INT32, [9] * 260, True),
                                r"tokenizer.ggml.token_type\[0\] = 9 is not a llama.cpp token "
                                r"type \(0..6\)"),
    "tensor offset wrapping into the header": (
        _wrap_offset, r"tensor '[\w.]+': bytes 18446744073709\d+\.\.\d+ of the data section "
        r"lie outside it"),
    "overlapping tensors": (_overlap, r"tensors '[\w.]+' \(data bytes 0\.\.\d+\) and '[\w.]+' "
                            r"\(from 0\) overlap"),
    "misaligned tensor": (lambda p: p.tensors[1].update(offset=p.tensors[1]["offset"] + 4),
                          r"data offset \d+ is not a multiple of the alignment 32"),
}


def _hostile(tiny_gguf: Path, tmp_path: Path, case: str) -> Path:
    parts = Parts.read(tiny_gguf)
    HOSTILE[case][0](parts)
    return parts.write(tmp_path / "hostile.gguf")


def _one_line_error(path: Path, out: Path) -> str:
    with pytest.raises(CheckpointError) as e:
        gguf_import.convert_gguf(path, out, FAMILY)
    message = str(e.value)
    assert "\n" not in message, message
    assert not out.exists()
    return message


# refused here only under a memory cap: without its check, the table it claims takes the machine
CAPPED_ONLY = {"block_count 2^32-1"}


@pytest.mark.parametrize("case", [c for c in HOSTILE if c not in CAPPED_ONLY])
def test_hostile_gguf_is_refused_in_one_line(tiny_gguf, tmp_path, case):
    message = _one_line_error(_hostile(tiny_gguf, tmp_path, case), tmp_path / "ckpt")
    assert message.startswith(str(tmp_path / "hostile.gguf") + ": ")
    assert re.search(HOSTILE[case][1], message), message


def test_the_craft_helper_writes_back_a_file_that_converts(tiny_gguf, tmp_path):
    """The hostile cases differ from a valid file only by their change."""
    path = Parts.read(tiny_gguf).write(tmp_path / "same.gguf")
    assert path.read_bytes() == tiny_gguf.read_bytes()
    gguf_import.convert_gguf(path, tmp_path / "ckpt", FAMILY)


@pytest.mark.parametrize("keep, words", [
    (7, r"truncated: the version at byte 4 needs 4 bytes, the file ends 3 bytes later"),
    (300, r"the header counts 21 tensors, which need at least 504 bytes \(24 each\), but only "
          r"276 bytes follow: the file is truncated"),
    ("in the tokens", r"truncated: (the length of )?'tokenizer.ggml.tokens'\[\d+\] at byte \d+ "
                      r"needs \d+ bytes, the file ends \d+ bytes later \(at byte \d+\); a GGUF "
                      r"file must hold every entry its header counts"),
    (-100, r"bytes \d+\.\.\d+ of the data section lie outside it: it has \d+ bytes .* or the file "
           r"is truncated")])
def test_truncated_gguf_says_what_it_lacks(tiny_gguf, tmp_path, keep, words):
    data = tiny_gguf.read_bytes()
    if keep == "in the tokens":  # room for every length field, not for every string
        tokens = GGUFFile.open(tiny_gguf).fields[T + "tokens"]
        keep = tokens.offset + 8 * tokens.count + 100
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[:keep])
    assert re.search(words, _one_line_error(path, tmp_path / "ckpt"))


def test_reader_agrees_with_the_gguf_package(tmp_path):
    """Every value and tensor the bounded reader returns is what gguf's GGUFReader returns."""
    from gguf import GGUFReader

    path = tmp_path / "mixed.gguf"
    _write_tiny_gguf(path, seed=3, quantize=True, types={"q_proj.weight": "BF16",
                                                         "up_proj.weight": "F16"})
    ours, theirs = GGUFFile.open(path), GGUFReader(path)
    assert list(ours.fields) == [k for k in theirs.fields if not k.startswith("GGUF.")]
    for key, field in ours.fields.items():
        assert field.contents() == theirs.fields[key].contents(), key
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for a, b in zip(ours.tensors, theirs.tensors):
        assert a.tensor_type == b.tensor_type and a.data.dtype == b.data.dtype
        assert np.array_equal(a.data, b.data), a.name


@pytest.mark.parametrize("name", ["llama-bpe", "llama-spm", "phi-3", "qwen2"])
def test_real_vocabularies_meet_every_metadata_rule(name):
    """No false refusal: llama.cpp's own vocabulary files of the Llama family pass the table,
    the token types and ids, and every merge (the embedding check needs tensors they lack)."""
    import llama_vocab
    from iron.lm import gguf_meta

    try:
        folder = llama_vocab.vocab_dir(REPO / "build")
    except llama_vocab.Unavailable as e:
        pytest.skip(str(e))
    f = GGUFFile.open(folder / f"ggml-vocab-{name}.gguf")
    gguf_meta.check_metadata(f, "llama")
    tokens = gguf_meta.value(f, T + "tokens")
    assert set(gguf_meta.value(f, T + "token_type")) <= set(gguf_meta.TOKEN_TYPES)
    for key, kind in gguf_meta.GENERAL_KEYS.items():
        if kind == "token id" and key in f.fields:
            assert gguf_meta.value(f, key) < len(tokens), key
    gguf_meta._check_merges(f, tokens)


# ---- from outside: the command line, capped --------------------------------------------------

def _convert_capped(path: Path, out: Path, timeout: float = 60):
    """``python -m iron.lm.gguf_import`` on ``path`` with 2 GiB of address space."""
    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "iron.lm.gguf_import", "--gguf", str(path), "--out", str(out)],
        capture_output=True, text=True, cwd=REPO, timeout=timeout, preexec_fn=cap)
    return result, time.monotonic() - start


FAST_CLI = ("array count 2^40", "block_count 2^32-1", "tensor offset wrapping into the header")


@pytest.mark.parametrize("case", [c if c in FAST_CLI else pytest.param(c, marks=pytest.mark.slow)
                                  for c in HOSTILE])
def test_hostile_gguf_on_the_command_line(tiny_gguf, tmp_path, case):
    """Every hostile case from outside (three in the fast lane): status 1, one line, no
    traceback, within 60 s and 2 GiB."""
    result, _ = _convert_capped(_hostile(tiny_gguf, tmp_path, case), tmp_path / "ckpt")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert re.search(HOSTILE[case][1], lines[0]), lines[0]


@pytest.mark.slow
def test_ten_million_token_vocabulary_is_refused_within_the_caps(tiny_gguf, tmp_path):
    """The issue's file: 10 million tokens beside a 260-row embedding, refused in one line in
    under 60 s and 2 GiB (the gguf package took 6.3 GB)."""
    parts = Parts.read(tiny_gguf)
    n = 10_000_000
    parts.raw[T + "tokens"] = (struct.pack("<IIQ", V.ARRAY, V.STRING, n)
                               + (struct.pack("<Q", 12) + b"token-xxxxxx") * n)
    path = parts.write(tmp_path / "vocab.gguf")
    result, seconds = _convert_capped(path, tmp_path / "ckpt")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and seconds < 60, (seconds, result.stderr)
    assert f"tokenizer.ggml.tokens holds {n} tokens, but token_embd.weight" in result.stderr
