"""Deeply nested JSON: every reader of a user's JSON file refuses it in one line.

A file of 100,000 nested arrays made Python's ``json`` raise ``RecursionError`` (a traceback)
in six readers; each is handed such a file here and must raise its own error type, one line,
naming the file and the nesting.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from iron.errors import BundleError, CheckpointError, IronError, ProfileError
from iron.jsonfile import MAX_DEPTH, JSONDepthError, depth, loads

DEEP = "[" * 100_000 + "]" * 100_000
SAYS = f"nest 100000 levels deep; iron reads JSON nested at most {MAX_DEPTH} levels"


@pytest.mark.parametrize("text, levels", [
    ('{"a": [1, {"b": 2}], "c": []}', 3),
    ('{"a": "[[[[{{{{", "b": "\\"[[[["}', 1),  # brackets and escaped quotes inside strings
    ('["\\\\", ["x"]]', 2),  # an escaped backslash ends before the closing quote
    ('"just a string"', 0),
    ("[" + ", ".join(["[]"] * 1000) + "]", 2),
    ("[" + ", ".join(["[]"] * 50_000) + "]", 2),  # summed by numpy
])
def test_depth_counts_brackets_outside_strings(text, levels):
    assert depth(text) == levels == depth(text.encode())
    json.loads(text)


def test_the_limit_is_inclusive():
    assert loads("[" * MAX_DEPTH + "]" * MAX_DEPTH) is not None
    with pytest.raises(JSONDepthError, match=f"nest {MAX_DEPTH + 1} levels deep"):
        loads("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1))


def _safetensors(tmp_path: Path) -> None:
    from iron.tensorfile import read_safetensors_header

    raw = DEEP.encode()
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)
    read_safetensors_header(path)


def _config(tmp_path: Path) -> None:
    from apps.llama.config import LlamaConfig

    (tmp_path / "config.json").write_text(DEEP)
    LlamaConfig.from_json(tmp_path)


def _shard_index(tmp_path: Path) -> None:
    from apps.llama.family import open_checkpoint
    from tiny_llama import write_tiny_llama

    ckpt = write_tiny_llama(tmp_path / "tiny")
    (ckpt / "model.safetensors.index.json").write_text(DEEP)
    open_checkpoint(ckpt)


def _tokenizer_config(tmp_path: Path) -> None:
    from iron.lm.chat import ChatTemplate

    (tmp_path / "tokenizer_config.json").write_text(DEEP)
    ChatTemplate.from_dir(tmp_path)


def _generation_config(tmp_path: Path) -> None:
    from iron.lm.serve import sampling_defaults

    (tmp_path / "generation_config.json").write_text(DEEP)
    sampling_defaults(tmp_path)


def _profile(tmp_path: Path) -> None:
    from iron.profile import Profile

    (tmp_path / "cpu.json").write_text(DEEP)
    Profile.load(tmp_path / "cpu.json")


def _manifest(tmp_path: Path) -> None:
    from iron.pipeline.bundle import read_manifest

    (tmp_path / "manifest.json").write_text(DEEP)
    read_manifest(tmp_path)


def _remote_archive(tmp_path: Path) -> None:
    """An artifact archive from the shared remote cache: data from elsewhere."""
    import io
    import zipfile

    from iron.store import MANIFEST, unpack

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(MANIFEST, DEEP)
    unpack("0" * 64, buffer.getvalue())


@pytest.mark.parametrize("read, error, file", [
    (_safetensors, CheckpointError, "model.safetensors"),
    (_config, CheckpointError, "config.json"),
    (_shard_index, CheckpointError, "model.safetensors.index.json"),
    (_tokenizer_config, IronError, "tokenizer_config.json"),
    (_generation_config, IronError, "generation_config.json"),
    (_profile, ProfileError, "cpu.json"),
    (_manifest, BundleError, "manifest.json"),
    (_remote_archive, ValueError, ""),  # BadObject: the remote tier logs it and rebuilds
], ids=lambda v: getattr(v, "__name__", "").strip("_") or None)
def test_every_reader_refuses_deep_nesting_in_one_line(tmp_path, read, error, file):
    with pytest.raises(error) as e:
        read(tmp_path)
    message = str(e.value)
    assert SAYS in message and "\n" not in message, message
    assert file in message.split(":")[0], message


def test_a_deep_cache_entry_manifest_is_a_miss_not_a_traceback(tmp_path):
    from iron.store import MANIFEST, Store

    store = Store(tmp_path / "cache")
    (store.path("k" * 64)).mkdir(parents=True)
    (store.path("k" * 64) / MANIFEST).write_text(DEEP)
    assert store.lookup("k" * 64) is None


def test_iron_list_reports_a_deep_bundle_manifest_as_damaged(tmp_path, monkeypatch, capsys):
    from iron.cli import main

    (tmp_path / "app" / "cpu").mkdir(parents=True)
    (tmp_path / "app" / "cpu" / "manifest.json").write_text(DEEP)
    monkeypatch.setenv("IRON_BUILD_DIR", str(tmp_path))
    assert main(["list"]) == 0
    assert "damaged manifest" in capsys.readouterr().out
