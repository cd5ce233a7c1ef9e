"""Shared test helpers (moved out of tests/pipeline/test_build.py so no test imports another)."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from iron.host import class_name


ROOT = Path(__file__).resolve().parents[2]
#: the console script pip installed beside python
IRON = Path(sys.executable).with_name("iron")


def iron_run_json(model, prompt: str, build: Path, ops: Path) -> dict:
    """``iron run MODEL -p PROMPT -n 2 --temperature 0 --json`` building into its own folder
    ``build`` (compiled kernels shared through ``ops``): the answer as parsed JSON; a failed run
    fails the test with its standard error."""
    env = {**os.environ, "IRON_BUILD_DIR": str(build), "IRON_CACHE_DIR": str(ops)}
    result = subprocess.run([IRON, "run", model, "-p", prompt, "-n", "2", "--temperature", "0",
                             "--json"], capture_output=True, text=True, env=env, timeout=1800)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def doit_bundle(variables: dict[str, str]) -> int:
    """The ``bundle`` task of ``variables``' build graph, run through doit in this process."""
    from doit.cmd_base import ModuleTaskLoader
    from doit.doit_cmd import DoitMain

    from iron.pipeline.tasks import dodo_namespace

    return DoitMain(ModuleTaskLoader(dodo_namespace(variables))).run(["bundle"])


def doit(project, *args, check=True, env=None, verbose=True):
    """doit on the demo application; ``verbose``: a line per task (``executed`` reads them)."""
    environment = {**os.environ, "PYTHONPATH": str(project), **(env or {})}
    environment.pop("IRON_BUILD_DIR", None)
    environment.pop("IRON_CACHE_DIR", None)
    result = subprocess.run([sys.executable, "-m", "doit", *args, "app=demo",
                             *(["verbose=1"] if verbose else [])], cwd=project,
                            capture_output=True, text=True, env=environment, timeout=600)
    if check:
        assert result.returncode == 0, result.stdout + result.stderr
    return result


def executed(result, prefix="compile:"):
    """Tasks doit ran (lines '.  name'), as opposed to those up to date ('-- name')."""
    return sorted(line[3:] for line in result.stdout.splitlines()
                  if line.startswith(".  ") and line[3:].startswith(prefix))


def compile_tasks(result):
    return sorted(line[3:] for line in result.stdout.splitlines()
                  if line[3:].startswith("compile:"))


def set_profile(project, entries):
    lines = ",\n  ".join(json.dumps(e) for e in entries)
    (project / "profiles" / "demo" / f"cpu-{class_name()}.json").write_text(
        '{"device": "cpu", "entries": [\n  ' + lines + "\n]}\n")


def run_bundle(bundle, env=None):
    return subprocess.run([sys.executable, "-m", "apps.demo", str(bundle)], capture_output=True,
                          text=True, env=env, timeout=120)


def demo_error(stdout: str) -> float:
    """The demo's printed ``max |out - reference|``, as a number: the bundle's block against
    the reference maths on the same bundle's weights, which the cpu kernels match exactly."""
    import re

    found = re.findall(r"max \|out - reference\| = (\S+)$", stdout, re.MULTILINE)
    assert len(found) == 1, f"the demo printed no single error figure: {stdout!r}"
    return float(found[0])


def terminal_interrupt() -> None:
    """Give the child a terminal's SIGINT. A shell without job control starts background
    commands with SIGINT ignored, their children inherit that, and Python then installs no
    KeyboardInterrupt handler: as any Unix program, the child would (rightly) ignore Ctrl-C,
    and a test of its interrupt would see it run to its end."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
