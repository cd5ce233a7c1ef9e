"""Wall time of the build loop on the Llama bundle: a no-op ``doit`` and a one-entry profile
edit, next to the full clean build, in one run.

    python benchmarks/build.py          # uses the project's build/ (run `doit` once first)
"""

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def timed(*args):
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "doit", *args], cwd=ROOT, capture_output=True,
                            text=True)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        sys.exit(result.stdout + result.stderr)
    ran = [line[3:] for line in result.stdout.splitlines() if line.startswith(".  ")]
    return elapsed, ran


def main():
    timed()  # make sure everything is built
    noop, ran = timed()
    compiled = [t for t in ran if t.startswith("compile:")]
    print(f"no-op doit: {noop:.2f} s wall, compile tasks run: {len(compiled)} "
          f"(tasks run: {', '.join(ran)})")
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import iron"], check=True)
    print(f"  of which starting Python and importing iron: {time.perf_counter() - start:.2f} s")


if __name__ == "__main__":
    main()
