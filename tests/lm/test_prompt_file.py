"""The prompt file and standard input are read with a bound: ``-f /dev/zero`` (which once took
7.5 GB and ended in a MemoryError) is refused unread, an endless pipe is cut at the limit.
The prompt is read before the bundle is opened, so no bundle is needed here."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from iron.util import MAX_USER_FILE

REPO = Path(__file__).resolve().parents[2]


def run_capped(*args, stdin=None):
    """``python -m iron.lm.run`` with 1 GiB of address space and 60 s."""
    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    return subprocess.run([sys.executable, "-m", "iron.lm.run", *map(str, args)], stdin=stdin,
                          capture_output=True, text=True, cwd=REPO, timeout=60, preexec_fn=cap)


def one_line_error(result) -> str:
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.parametrize("kind, reason", [
    ("/dev/zero", "it is a character device, not a regular file"),
    ("FIFO", "it is a FIFO, not a regular file"),
    ("huge", f"it is {100 << 30} bytes, over the {MAX_USER_FILE >> 20} MiB limit for a prompt"),
])
def test_prompt_file_that_never_ends_is_refused_unread(tmp_path, kind, reason):
    path = tmp_path / "prompt.txt"
    if kind == "/dev/zero":
        path = Path("/dev/zero")
    elif kind == "FIFO":
        os.mkfifo(path)  # no writer: an unbounded open would wait for ever
    else:
        with open(path, "wb") as f:
            f.truncate(100 << 30)
    line = one_line_error(run_capped(tmp_path / "no-bundle", "-f", path))
    assert line == f"error: --file {path}: cannot read the prompt ({reason})", line


@pytest.mark.parametrize("flag", [["-f", "-"], []], ids=["-f -", "piped"])
def test_endless_standard_input_is_cut_at_the_limit(tmp_path, flag):
    with open("/dev/zero", "rb") as zero:
        line = one_line_error(run_capped(tmp_path / "no-bundle", *flag, stdin=zero))
    assert line == (f"error: standard input: the prompt is over the {MAX_USER_FILE >> 20} MiB "
                    "limit for a prompt"), line
