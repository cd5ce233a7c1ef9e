"""One run of the build graph: what its tasks, its reporter, its Ctrl-C handler and the
command that started it (``doit``, ``iron run``) share (``BuildRun``), and how doit's progress
is told (``Reporter``).

Output is quiet: one line says what was built (``verbose=1`` or ``doit -v 2`` shows every task
and compile line); Ctrl-C ends with one line, the previous bundle and every finished compile
kept.  With a remote cache (``IRON_REMOTE_CACHE``), each action that touched the store returns
its share of the remote tier's counts as a doit value; ``Reporter`` adds them up (with ``-n N``
too, since doit sends values back from its worker processes) and prints one line at the end.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from doit.exceptions import TaskFailed
from doit.reporter import ConsoleReporter

from ..remote_cache import from_env as remote_cache_from_env


@dataclass
class BuildRun:
    """One run of the build graph: what its tasks, its reporter, its Ctrl-C handler and the
    command that started it (``doit``, ``iron run``) share, instead of module globals."""

    #: ``verbose=1`` given: every task line and every compile line, as doit prints them
    verbose: bool = False
    #: whether a run that built nothing says so (``iron run`` uses a current bundle silently)
    report_current: bool = True
    #: the bundle folder of the selection (the progress line names it)
    bundle_dir: str = ""
    #: set once Ctrl-C was pressed: the run ends with the one line already printed
    interrupted: bool = False
    #: the bundle as the ``bundle`` task's up-to-date check opened and checked it, so that
    #: ``iron run`` loads what was checked without reading or hashing it again
    checked: Any = None
    #: whether the ``bundle`` task wrote the bundle in this run (then ``checked`` is stale)
    bundle_written: bool = False

    def on_interrupt(self, signum, frame):
        """Ctrl-C during a build: one line, then doit stops; its state file keeps every task
        that finished, and an unfinished bundle or cache entry is a temporary folder the next
        run replaces (the previous bundle stays in place)."""
        if not self.interrupted:
            self.interrupted = True
            print("\ninterrupted: the previous bundle and every finished compile are kept; the "
                  "same command resumes", file=sys.stderr, flush=True)
        raise SystemExit(130)

    def bundle_intact(self, out: str) -> bool:
        """doit uptodate check: the bundle on disk still checks out (see ``bundle.check``);
        the checked bundle is kept for the command that runs it."""
        from .bundle import check

        self.checked = check(Path(out))
        return self.checked is not None

    def run_command(self, argv: list[str], env: dict[str, str] | None = None):
        """doit action: run ``argv`` (the bundle, the tuner) in the foreground, with ``env``
        added to its environment. Ctrl-C goes to it alone, so it ends its own way (statistics
        so far, the profile untouched) and doit ends with one line, not a traceback."""
        import signal
        import subprocess

        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            code = subprocess.run(argv, env={**os.environ, **env} if env else None).returncode
        finally:
            signal.signal(signal.SIGINT, previous)
        if code in (130, -signal.SIGINT):
            self.interrupted = True  # the program said so itself
            raise SystemExit(130)
        if code != 0:
            return TaskFailed(f"{Path(argv[2] if argv[1:2] == ['-m'] else argv[0]).name} "
                              f"exited with status {code}")
        return None


class Reporter(ConsoleReporter):
    """doit's console reporter, quiet unless ``verbose=1`` (or ``doit -v 2``): instead of a
    line per task, one line says what was built, before the answer of ``generate`` (or at the
    end).  iron's own errors are one line instead of a traceback, and the remote cache's hits,
    misses and uploads of the run are added up into one line at the end.  doit makes the
    reporter from its class: ``for_run`` binds a subclass to one ``BuildRun``."""

    run: BuildRun

    @classmethod
    def for_run(cls, run: BuildRun) -> type[Reporter]:
        return type(cls.__name__, (cls,), {"run": run})

    def __init__(self, outstream, options):
        super().__init__(outstream, options)
        self.remote_counts: Counter[str] = Counter()
        self.verbose = self.run.verbose or options.get("verbosity") == 2
        self.compiled, self.instances = 0, 0
        self.bundle: str | None = None
        self.bundle_written = self.said = self.started = self.failed = False

    def execute_task(self, task):
        if self.verbose:
            return super().execute_task(task)
        if task.name in ("generate", "tune", "gc"):
            self.summary()
        elif task.name.startswith("compile:") or task.name == "bundle":
            if not self.started:
                self.started = True
                self.write(f"building {self.run.bundle_dir} (once: later runs reuse it) "
                           "...\n")
                self.outstream.flush()

    def skip_uptodate(self, task):
        if self.verbose:
            return super().skip_uptodate(task)
        self.count(task, ran=False)

    def skip_ignore(self, task):
        if self.verbose:
            super().skip_ignore(task)

    def add_success(self, task):
        super().add_success(task)
        self.remote_counts.update(task.values.get("remote_cache", {}))
        self.count(task, ran=True)

    def count(self, task, ran: bool) -> None:
        if task.name.startswith("compile:"):
            self.instances += 1
            self.compiled += ran and not task.values.get("cached")
        elif task.name == "bundle":
            self.bundle = str(Path(task.targets[0]).parent)
            self.bundle_written = ran
            self.run.bundle_written |= ran

    def add_failure(self, task, fail):
        self.failed = True
        super().add_failure(task, fail)

    def summary(self) -> None:
        """One line: what this run compiled and whether it wrote the bundle."""
        if self.said or self.verbose or self.bundle is None or self.failed:
            return
        self.said = True
        if self.bundle_written:
            what = (f"compiled {self.compiled} of {self.instances} instances (the rest cached)"
                    if self.compiled < self.instances else
                    f"compiled {self.instances} instances")
            if not self.compiled:
                what = f"every one of its {self.instances} instances was cached"
            self.write(f"built {self.bundle}: {what}; -v 2 or verbose=1 lists every task\n")
        elif self.run.report_current:
            self.write(f"{self.bundle} is up to date ({self.instances} instances)\n")
        self.outstream.flush()

    def complete_run(self):
        if self.run.interrupted:
            return
        # an iron error was said in one line already: no dump of the task's captured output
        self.failures = [f for f in self.failures if not (
            isinstance(f["exception"], TaskFailed) and not f["exception"].traceback)]
        super().complete_run()
        self.summary()
        remote = remote_cache_from_env()
        if remote is not None:
            self.write(remote.summary(self.remote_counts) + "\n")

    def _write_failure(self, result, write_exception=True):
        fail = result["exception"]
        if isinstance(fail, TaskFailed) and not fail.traceback:
            self.write(f"error: {result['task'].name}: {fail.message}\n")
        else:
            super()._write_failure(result, write_exception)
