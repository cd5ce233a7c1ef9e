#!/usr/bin/env python3
"""Does the fast lane catch what it claims to? Apply known-bad edits, one at a time, to a copy
of this checkout and run the fast-lane tests that guard each; every mutant must fail them.

    .venv/bin/python scripts/mutate.py            # every mutant (a few minutes on 2 cores)
    .venv/bin/python scripts/mutate.py silu gemv  # some of them, by name

Each mutant is an exact text replacement; one that no longer applies (the code moved) is an
error naming it, so the list is kept true as the code changes. Prints a line per mutant and
exits 1 when any survived.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ONE_PERCENT = "1.01f"


@dataclass(frozen=True)
class Mutant:
    name: str
    edits: tuple[tuple[str, str, str], ...]  # (file, exact old text, new text)
    tests: tuple[str, ...]  # pytest node ids or -k expressions' files, run with -m "not slow"
    select: str = ""  # a -k expression, to run only the guarding cases


def scaled(expr: str) -> str:
    return f"({ONE_PERCENT} * ({expr}))"


MUTANTS = (
    Mutant("silu", (
        ("iron/kernels/cpu/iron_cpu.h",
         "return _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e));",
         "return _mm256_mul_ps(_mm256_set1_ps(1.01f), "
         "_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)));"),
        ("iron/kernels/cpu/iron_cpu.h",
         "return _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e));",
         "return _mm512_mul_ps(_mm512_set1_ps(1.01f), "
         "_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e)));"),
        ("iron/kernels/cpu/silu.c", "return x / (1.0f + expf(-x));",
         f"return {scaled('x / (1.0f + expf(-x))')};"),
    ), ("tests/targets/test_kernels.py",), "SiLU"),
    Mutant("swiglu", (
        ("iron/kernels/cpu/swiglu.c",
         "iron_store8_bf16(o + i, _mm256_mul_ps(iron_silu8(g), u));",
         "iron_store8_bf16(o + i, _mm256_mul_ps(_mm256_set1_ps(1.01f), "
         "_mm256_mul_ps(iron_silu8(g), u)));"),
        ("iron/kernels/cpu/swiglu.c",
         "iron_store16_bf16(o + i, _mm512_mul_ps(iron_silu16(g), u));",
         "iron_store16_bf16(o + i, _mm512_mul_ps(_mm512_set1_ps(1.01f), "
         "_mm512_mul_ps(iron_silu16(g), u)));"),
    ), ("tests/targets/test_kernels.py",), "SwiGLU"),
    Mutant("rmsnorm", (
        ("iron/kernels/cpu/rmsnorm.c", "float inv = 1.0f / sqrtf(",
         f"float inv = {ONE_PERCENT} / sqrtf("),
    ), ("tests/targets/test_kernels.py",), "RMSNorm"),
    Mutant("rope", (
        ("iron/kernels/cpu/rope.c", "c[i] = cosf(a);", f"c[i] = {scaled('cosf(a)')};"),
    ), ("tests/targets/test_kernels.py",), "RoPE"),
    Mutant("gemv", (
        ("iron/kernels/cpu/gemv.c", "xp[k + i] = iron_bf16_to_f32(x[k + 2 * i]);",
         f"xp[k + i] = {scaled('iron_bf16_to_f32(x[k + 2 * i])')};"),
        ("iron/kernels/cpu/gemv.c", "xp[k + 8 + i] = iron_bf16_to_f32(x[k + 2 * i + 1]);",
         f"xp[k + 8 + i] = {scaled('iron_bf16_to_f32(x[k + 2 * i + 1])')};"),
        ("iron/kernels/cpu/gemv.c", "for (long k = K16; k < IRON_K; k++) xp[k] = "
         "iron_bf16_to_f32(x[k]);", "for (long k = K16; k < IRON_K; k++) xp[k] = "
         f"{scaled('iron_bf16_to_f32(x[k])')};"),
    ), ("tests/targets/test_kernels.py",), "GEMV"),
    # AIE2's SiLU may be 3% off per element (its lookup-table exp): the bias check catches it
    Mutant("npu1-silu", (
        ("iron/kernels/npu/eltwise.cc",
         "aie::store_v(c + i, aie::mul(x, sigmoid(x)).template to_vector<bfloat16>());",
         "aie::store_v(c + i, aie::mul(aie::mul(x, 1.01f).template to_vector<float>(), "
         "sigmoid(x)).template to_vector<bfloat16>());"),
    ), ("tests/targets/test_npu.py",), "SiLU and npu1"),
    Mutant("gate-up-swapped", (
        ("iron/lm/gguf_import.py", '"ffn_gate": "mlp.gate_proj",', '"ffn_gate": "mlp.up_proj",'),
        ("iron/lm/gguf_import.py", '"ffn_up": "mlp.up_proj",', '"ffn_up": "mlp.gate_proj",'),
    ), ("tests/lm/test_checkpoint.py",)),
    Mutant("top-k-removed", (
        ("iron/lm/generate.py", "            order = order[: self.top_k]\n",
         "            pass\n"),
    ), ("tests/lm/test_sampling.py",)),
    Mutant("top-p-removed", (
        ("iron/lm/generate.py",
         "            keep = int(np.searchsorted(np.cumsum(p), self.top_p)) + 1\n",
         "            keep = len(p)\n"),
    ), ("tests/lm/test_sampling.py",)),
    Mutant("default-top-p", (
        ("iron/lm/serve/request.py", '"top_p": 0.95', '"top_p": 0.9'),
    ), ("tests/lm/test_sampling.py",)),
    Mutant("default-queue", (
        ("iron/lm/serve/limits.py", "queue: int = 16", "queue: int = 32"),
    ), ("tests/lm/test_sampling.py",)),
)


def copy_checkout(dest: Path) -> None:
    """The tracked files of this checkout (and the embedded checkpoint's download, which the
    tests would otherwise fetch again) at ``dest``."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, target)
    downloads = REPO / "build" / "downloads"
    if downloads.is_dir():
        (dest / "build").mkdir(exist_ok=True)
        (dest / "build" / "downloads").symlink_to(downloads)


def apply(mutant: Mutant, root: Path) -> None:
    for file, old, new in mutant.edits:
        path = root / file
        text = path.read_text()
        if text.count(old) != 1:
            raise SystemExit(f"mutant {mutant.name}: {file} holds {text.count(old)} copies of "
                             f"{old!r}, not 1: the code moved; update scripts/mutate.py")
        path.write_text(text.replace(old, new))


def survives(mutant: Mutant, root: Path) -> tuple[bool, str]:
    """Whether the guarding tests pass on the mutated copy (they must not), and their last
    line with the first failed assertion's."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-m", "not slow", "-p", "no:cacheprovider",
           *mutant.tests, *(["-k", mutant.select] if mutant.select else [])]
    env = {**os.environ, "PYTHONPATH": str(root), "IRON_CACHE_DIR": str(root / "build" / "ops")}
    env.pop("IRON_BUILD_DIR", None)
    done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=1800)
    lines = done.stdout.strip().splitlines() or ["(no output)"]
    why = next((line[1:].strip() for line in lines if line.startswith("E ")), "")
    return done.returncode == 0, f"{lines[-1]}: {why[:160]}" if why else lines[-1]


def main(argv: list[str]) -> int:
    chosen = [m for m in MUTANTS if not argv or m.name in argv]
    unknown = set(argv) - {m.name for m in MUTANTS}
    if unknown:
        raise SystemExit(f"unknown mutants {sorted(unknown)}; known: "
                         f"{', '.join(m.name for m in MUTANTS)}")
    alive = []
    for mutant in chosen:
        with tempfile.TemporaryDirectory(prefix=f"iron-mutant-{mutant.name}-") as tmp:
            root = Path(tmp)
            copy_checkout(root)
            apply(mutant, root)
            start = time.monotonic()
            survived, last = survives(mutant, root)
        verdict = "SURVIVED" if survived else "caught"
        print(f"{mutant.name:18s} {verdict:8s} {time.monotonic() - start:5.0f} s  {last}",
              flush=True)
        if survived:
            alive.append(mutant.name)
    if alive:
        print(f"{len(alive)} of {len(chosen)} mutants survived the fast lane: {alive}")
        return 1
    print(f"all {len(chosen)} mutants caught by the fast lane")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
