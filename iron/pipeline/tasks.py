"""The doit task graph behind ``dodo.py``: checkpoint, compile, bundle, generate, tune, gc
(the task that runs the bundle is ``generate``: doit reserves ``run`` for its own command).

At set-up the command-line variables are checked against ``VARIABLES`` (an unknown name or a
bad value is a one-line error naming it).  The application's programs are recorded under the
device's profile and every operator instance resolved; each distinct instance becomes one
``compile:<name>`` subtask whose name carries the operator, its shape and a short artifact key.
Because the key hashes the resolved tunables, a profile edit creates new compile tasks only
for the instances whose tunables moved, and reverting the edit brings back tasks doit already
knows to be done.  ``bundle`` depends on every compile target, the checkpoint's files and the
profile, and is out of date whenever the bundle on disk no longer checks out (a kernel deleted
or edited, weights changed).

Recording is the slow part of loading, so its result (task names, recipes, the bundle's
configuration) is kept in ``build/.programs/``, keyed by everything it depends on: the
variables, the profile's bytes, the host's usable cores and -march level, the sizes and times of
iron's and the application's sources and of the checkpoint's files.  A no-op ``doit`` reads that
record and imports neither numpy nor the application.

Variables: ``app`` (llama), ``device`` (``$IRON_DEVICE`` or cpu), ``checkpoint`` (the
application's default), ``context``, ``weights`` (``native``: the checkpoint's own formats,
``bf16`` or ``uint4``), ``group`` (uint4's group size), ``batch`` (most sequences one batched
decode step runs), ``march`` (``$IRON_MARCH`` or native), ``threads`` (at most the usable
cores), ``prompt`` and the other options of ``generate`` (``GENERATE_OPTIONS``: the flags of
``python -m iron.lm.run``, e.g. ``top_k=40 stop=. chat=1``, which it validates), the tuner's
``only``, ``budget``, ``prune`` (``0``: measure every candidate), ``fresh``,
``max_load``, ``scheduler``, and gc's ``days``.
The default bundle is ``build/<app>/<device>/``; another checkpoint, context, weights, batch or
-march level gets its own folder beside it, ``build/<app>/<device>-<what differs>/``.

With a remote cache (``IRON_REMOTE_CACHE``), each action that touched the store returns its
share of the remote tier's counts as a doit value; ``Reporter`` adds them up (with ``-n N`` too,
since doit sends values back from its worker processes) and prints one line at the end.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterator

from doit.exceptions import InvalidDodoFile, TaskFailed
from doit.reporter import ConsoleReporter

from ..targets.cpu import host
from ..devices import DEVICE_NAMES, device as get_device
from ..errors import IronError
from ..paths import PACKAGE_DIR, build_dir, project_root
from ..remote_cache import from_env as remote_cache_from_env
from ..util import atomic_write_bytes, read_bounded

RECORD_VERSION = 2


class Reporter(ConsoleReporter):
    """doit's console reporter, with iron's own errors on one line instead of a traceback, and
    the remote cache's hits, misses and uploads of the run at the end."""

    def __init__(self, outstream, options):
        super().__init__(outstream, options)
        self.remote_counts: Counter[str] = Counter()

    def add_success(self, task):
        super().add_success(task)
        self.remote_counts.update(task.values.get("remote_cache", {}))

    def complete_run(self):
        super().complete_run()
        remote = remote_cache_from_env()
        if remote is not None:
            self.write(remote.summary(self.remote_counts) + "\n")

    def _write_failure(self, result, write_exception=True):
        fail = result["exception"]
        if isinstance(fail, TaskFailed) and not fail.traceback:
            self.write(f"error: {result['task'].name}: {fail.message}\n")
        else:
            super()._write_failure(result, write_exception)


class BuildError(InvalidDodoFile):
    """An iron error while setting up tasks: doit prints ``ERROR: <message>``, one line."""


try:
    build_dir().mkdir(parents=True, exist_ok=True)  # doit opens its state file before any task
except OSError as e:
    raise BuildError(f"cannot create the build folder {build_dir()} ({e.strerror}); make it "
                     "writable or point $IRON_BUILD_DIR elsewhere") from None
DOIT_CONFIG = {
    "reporter": Reporter,
    "backend": "sqlite3",
    "dep_file": str(build_dir() / ".doit.db"),
    "default_tasks": ["bundle"],
    "verbosity": 2,
}


#: doit variables ``generate`` passes on to the application's run command (as its flags)
GENERATE_OPTIONS = ("max_new_tokens", "temperature", "top_k", "top_p", "seed", "stop",
                    "repetition_penalty", "frequency_penalty", "presence_penalty", "chat",
                    "system")


def _positive(limit: int) -> Callable[[str, str], int]:
    def check(name: str, text: str) -> int:
        if not re.fullmatch(r"[0-9]{1,9}", text.strip()) or not 1 <= int(text) <= limit:
            raise IronError(f"doit variable {name}={text!r}: must be an integer from 1 to "
                            f"{limit}")
        return int(text)
    return check


def _count(name: str, text: str) -> int:
    if not re.fullmatch(r"[0-9]{1,6}", text.strip()):
        raise IronError(f"doit variable {name}={text!r}: must be a whole number, 0 or more")
    return int(text)


def _number(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (value >= 0 and value < 1e9):
        raise IronError(f"doit variable {name}={text!r}: must be a non-negative number")
    return value


def _choice(*allowed: str) -> Callable[[str, str], str]:
    def check(name: str, text: str) -> str:
        if text not in allowed:
            raise IronError(f"doit variable {name}={text!r}: must be one of {', '.join(allowed)}")
        return text
    return check


def _identifier(name: str, text: str) -> str:
    if not re.fullmatch(r"[a-z_][a-z0-9_]{0,40}", text):
        raise IronError(f"doit variable {name}={text!r}: must be a package name under apps/")
    return text


def _text(name: str, text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise IronError(f"doit variable {name}: byte {text[e.start]!r} at position {e.start} "
                        "is not UTF-8 text") from None
    return text


def _march(name: str, text: str) -> str:
    return host.check_march(text, f"doit variable {name}")


def _operators(name: str, text: str) -> str:
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9]*(,[A-Za-z][A-Za-z0-9]*)*", text):
        raise IronError(f"doit variable {name}={text!r}: must be operator names, "
                        "comma-separated")
    return text


#: Every variable ``doit NAME=VALUE`` takes, and the check of its value.
VARIABLES: dict[str, Callable[[str, str], Any]] = {
    "app": _identifier, "device": _choice(*DEVICE_NAMES), "checkpoint": _text,
    "context": _positive(1 << 20), "weights": _choice("native", "bf16", "uint4"),
    "group": _choice("32", "128"), "march": _march, "threads": _positive(4096),
    "prompt": _text, "only": _operators, "budget": _number, "fresh": _choice("0", "1"),
    "max_load": _number, "days": _number, "batch": _positive(64), "scheduler": _text,
    "prune": _count,
    **{name: _text for name in GENERATE_OPTIONS},
}


def check_variables(variables: dict[str, str]) -> dict[str, Any]:
    """The command line's variables, each checked; an unknown name is an error naming it."""
    import difflib

    checked = {}
    for name, text in variables.items():
        if name not in VARIABLES:
            close = difflib.get_close_matches(name, VARIABLES, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise IronError(f"unknown doit variable {name!r}{hint}; the variables are "
                            f"{', '.join(VARIABLES)}")
        checked[name] = VARIABLES[name](name, str(text))
    return checked


def task_name(op, key: str) -> str:
    """``GEMV-M576-K576-batches1-3f2a9c1d``: readable in ``doit list``, unique by key."""
    params = "-".join(f"{n}{_short(getattr(op, n))}" for n in op.params())
    return f"{type(op).__name__}-{params}-{key[:8]}"


def _short(value: Any) -> str:
    if isinstance(value, str):
        return value
    return format(value, "g") if isinstance(value, float) else str(int(value))


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.]+", "-", text).strip("-")[:40] or "x"


def _code_stamp() -> list:
    """Size and time of every source that can change what is recorded (iron, the apps)."""
    roots = [PACKAGE_DIR]
    root = project_root()
    if root and (root / "apps").is_dir():
        roots.append(root / "apps")
    stamp = []
    for top in roots:
        for folder, dirs, files in os.walk(top):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                if name.endswith((".py", ".c", ".h")):
                    st = os.stat(os.path.join(folder, name))
                    stamp.append([os.path.join(folder, name), st.st_size, st.st_mtime_ns])
    return stamp


def _file_stamp(paths) -> dict[str, list[int]]:
    stamp = {}
    for p in paths:
        st = os.stat(p)
        stamp[str(p)] = [st.st_size, st.st_mtime_ns]
    return stamp


class BuildGraph:
    """The tasks of one (application, device, checkpoint, context, -march) selection."""

    def __init__(self, get_var: Callable[[str, Any], Any],
                 variables: dict[str, str] | None = None):
        try:
            self.vars = check_variables(dict(variables or {}))
            if "march" in self.vars:
                os.environ["IRON_MARCH"] = self.vars["march"]
            if "threads" in self.vars:
                os.environ["IRON_THREADS"] = str(self.vars["threads"])
            self.level = host.march()
            self.app_name = self.vars.get("app", "llama")
            self.device = get_device(self.vars.get("device"))
        except IronError as e:
            raise BuildError(str(e)) from None
        self.checkpoint = self.vars.get("checkpoint")
        self.context = self.vars.get("context")
        self.weights = self.vars.get("weights")
        self.group = self.vars.get("group")
        self.batch = self.vars.get("batch")
        self.prompt = self.vars.get("prompt")
        self.tune_options = {k: self.vars.get(k) for k in ("only", "budget", "fresh",
                                                            "max_load", "scheduler", "prune")}
        from ..cache import default_store

        self.store = default_store()
        self.bundle_dir = build_dir() / self.app_name / self.bundle_name()
        from .app import profile_path

        self.profile_file = profile_path(self.app_name, self.device.name)
        self._app = None
        self._record = None

    def bundle_name(self) -> str:
        """``cpu`` for the default selection; otherwise what differs, so bundles of different
        checkpoints, contexts or -march levels do not overwrite one another."""
        parts = [self.device.name]
        if self.checkpoint:
            path = Path(self.checkpoint).resolve()
            digest = hashlib.sha256(str(path).encode()).hexdigest()[:6]
            parts.append(f"{_slug(path.name)}-{digest}")
        if self.context:
            parts.append(f"ctx{self.context}")
        if self.weights not in (None, "native"):
            parts.append(self.weights + (f"-g{self.group}" if self.group else ""))
        if self.batch:
            parts.append(f"batch{self.batch}")
        if self.level != host.DEFAULT_MARCH:
            parts.append(_slug(self.level))
        return "-".join(parts)

    # the application is opened lazily: only when the record of its programs is stale
    @property
    def app(self):
        if self._app is None:
            from .app import load_app

            self._app = load_app(self.app_name, self.checkpoint,
                                 **app_options(self.context, self.weights, self.group,
                                               self.batch))
        return self._app

    def profile(self):
        from .app import app_profile

        return app_profile(self.app_name, self.device.name)

    # ---- the record of the recorded programs ----------------------------------------------

    def _fingerprint(self) -> str:
        try:  # bounded: a profile linked to /dev/zero must not hang or fill memory here
            profile = read_bounded(self.profile_file, "a profile")
        except FileNotFoundError:
            profile = b""
        except OSError as e:
            raise IronError(f"{self.profile_file}: cannot read the profile ({e.strerror})") \
                from None
        key = {"version": RECORD_VERSION, "vars": {k: v for k, v in self.vars.items()
                                                     if k in ("app", "device", "checkpoint",
                                                              "context", "weights", "group",
                                                              "batch")},
               "march": self.level, "columns": self.device.columns,
               "checkpoint": str(Path(self.checkpoint).resolve()) if self.checkpoint else None,
               "profile": hashlib.sha256(profile).hexdigest(), "code": _code_stamp(),
               "compiler": host.compiler_stamp(), "cache": str(self.store.root)}
        return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]

    @property
    def record(self) -> dict[str, Any]:
        """What the tasks need from the recorded programs, from ``build/.programs/`` when it is
        still current, else recorded now (and kept)."""
        if self._record is None:
            try:
                self._record = self._load_record()
            except IronError as e:
                raise BuildError(str(e)) from None
            for line in self._record["warnings"]:
                print(line, file=sys.stderr)  # on every run: the bundle keeps the defaults
        return self._record

    def _load_record(self) -> dict[str, Any]:
        path = build_dir() / ".programs" / f"{self._fingerprint()}.json"
        try:
            record = json.loads(path.read_bytes())
            if _file_stamp(record["inputs"]) == record["inputs"]:
                return record
        except (OSError, ValueError, KeyError, TypeError):
            pass
        record = self._make_record()
        atomic_write_bytes(path, json.dumps(record).encode())
        return record

    def _make_record(self) -> dict[str, Any]:
        from ..targets import target_for

        target = target_for(self.device)
        app = self.app
        profile, warnings = self.profile(), io.StringIO()
        profile.warnings_to = warnings
        programs = app.programs(self.device, profile).values()
        distinct = dict.fromkeys(op for program in programs for op in program.ops)
        instances = {}
        for op in distinct:
            recipe = target.recipe(op)
            instances[task_name(op, recipe.key)] = {
                "key": recipe.key, "description": recipe.description,
                "sources": [str(p) for p in recipe.sources],
                "doc": f"{op.describe(tunables=True)} -> artifact {recipe.key}"
                       f"{where(target.placement(op))}"}
        runtime = target.recipe(None)
        sources = [str(p) for p in app.sources()]
        mark = "\0prompt\0"
        return {"instances": instances, "runtime": runtime.key,
                "runtime_sources": [str(p) for p in runtime.sources],
                "warnings": warnings.getvalue().splitlines(),
                "meta": app.meta(), "sources": sources,
                "inputs": _file_stamp(sources),
                "generate": {"default": app.run_command(self.bundle_dir, None),
                             "prompt": app.run_command(self.bundle_dir, mark), "mark": mark}}

    # ---- tasks ----------------------------------------------------------------------------

    def task_checkpoint(self) -> dict:
        return {"actions": [(self._ensure_checkpoint, [])], "uptodate": [False],
                "verbosity": 1,
                "doc": "fetch and convert the application's default checkpoint if needed"}

    def _ensure_checkpoint(self):
        try:
            self.record  # current: nothing to fetch; stale: opening the app fetches it
        except BuildError as e:
            return TaskFailed(str(e))

    def task_compile(self) -> Iterator[dict]:
        from ..store import MANIFEST as ENTRY_MANIFEST

        yield {"basename": "compile", "name": None,
               "doc": "compile every operator instance of the application (one subtask each)"}
        instances = sorted(self.record["instances"].items())
        for i, (name, inst) in enumerate(instances, 1):
            yield {"name": name,
                   "actions": [(compile_action, [self.device.name, inst["description"],
                                                 inst["sources"], inst["key"],
                                                 f"{i}/{len(instances)}"])],
                   "file_dep": inst["sources"],
                   "targets": [str(self.store.path(inst["key"]) / ENTRY_MANIFEST)],
                   "uptodate": [config_changed(inst["description"])],
                   "doc": inst["doc"]}

    def task_bundle(self) -> dict:
        from ..store import MANIFEST as ENTRY_MANIFEST
        from .bundle import MANIFEST

        record = self.record
        deps = [str(self.store.path(i["key"]) / ENTRY_MANIFEST)
                for i in record["instances"].values()]
        deps += record["sources"]
        if self.profile_file.exists():
            deps.append(str(self.profile_file))
        deps += record["runtime_sources"]
        return {"actions": [(write_bundle_action, [self.app_name, self.checkpoint,
                                                   self.context, self.weights, self.group,
                                                   self.batch, self.device.name,
                                                   str(self.bundle_dir)])],
                "file_dep": sorted(set(deps)),
                "task_dep": ["compile"],
                "targets": [str(self.bundle_dir / MANIFEST)],
                "uptodate": [config_changed({"app": self.app_name, "device": self.device.name,
                                             "meta": record["meta"],
                                             "runtime": record["runtime"],
                                             "march": self.level,
                                             "columns": self.device.columns}),
                             (bundle_intact, [str(self.bundle_dir)])],
                "doc": f"the runnable {self.app_name} bundle for {self.device} in "
                       f"{self.bundle_dir}"}

    def task_generate(self) -> dict:
        options = {k: self.vars.get(k) for k in GENERATE_OPTIONS if k in self.vars}
        gen = self.record["generate"]
        if options:  # flags beyond the prompt: the application builds its command
            command = self.app.run_command(self.bundle_dir, self.prompt, options)
        elif self.prompt is None:
            command = gen["default"]
        else:
            command = [self.prompt if a == gen["mark"] else a for a in gen["prompt"]]
        return {"actions": [command], "task_dep": ["bundle"], "uptodate": [False],
                "verbosity": 2, "doc": "build the bundle if needed, then run it"}

    def task_tune(self) -> dict:
        argv = [sys.executable, "-m", "iron.lm.tune", self.app_name, "--device",
                self.device.name]
        if self.checkpoint:
            argv += ["--checkpoint", str(self.checkpoint)]
        if self.weights:
            argv += ["--weights", self.weights]
        for option in ("only", "budget", "prune", "max_load", "scheduler"):
            if self.tune_options[option] is not None:
                argv += [f"--{option.replace('_', '-')}", str(self.tune_options[option])]
        if self.tune_options["fresh"] == "1":
            argv.append("--fresh")
        return {"actions": [argv], "task_dep": ["checkpoint"], "uptodate": [False],
                "verbosity": 2,
                "doc": f"time every legal setting and rewrite {self.profile_file} "
                       "(a later `doit` rebuilds what moved)"}

    def task_gc(self) -> dict:
        return {"actions": [(self._gc, [])], "uptodate": [False], "verbosity": 2,
                "doc": "remove cache entries nothing references (in a shared $IRON_CACHE_DIR, "
                       "only those unused for `days`, default 7) and abandoned temp folders"}

    def _gc(self) -> None:
        from ..store import SHARED_KEEP_DAYS, collect_temp
        from .bundle import MANIFEST

        keep = {i["key"] for i in self.record["instances"].values()}
        keep.add(self.record["runtime"])
        for manifest in build_dir().glob(f"*/*/{MANIFEST}"):
            keep.update(p.stem for p in (manifest.parent / "kernels").glob("*.so"))
        shared = "IRON_CACHE_DIR" in os.environ
        days = self.vars.get("days", SHARED_KEEP_DAYS if shared else None)
        removed, temp = self.store.collect(keep, days)
        leftovers = collect_temp(p for p in build_dir().glob("*/.tmp-*") if p.is_dir())
        # a bundle set aside by a build killed between its two renames is put back, not removed
        for old in build_dir().glob("*/.old-*"):
            if old.with_name(old.name[len(".old-"):]).exists():
                leftovers += collect_temp([old])
        age = "" if days is None else f" unused for {days:g} days"
        print(f"gc: removed {len(removed)} cache entries{age} and {temp + len(leftovers)} "
              f"abandoned temporary folders; kept {len(keep & set(self.store.keys()))} in use")


def where(placement: str) -> str:
    return " (host placement: no npu design)" if placement == "host" else ""


def compile_action(device_name: str, description: dict, sources: list, key: str, counter: str):
    """doit action: compile one instance into the store (a no-op when it is already there)."""
    from ..devices import device
    from ..cache import default_store
    from ..targets import target_for

    try:
        target = target_for(device(device_name))
        store = default_store()
        entry = target.compile(target.recipe_from(description, sources), store)
    except IronError as e:
        return TaskFailed(str(e))
    if entry.key != key:
        return TaskFailed(f"the recipe of {description.get('operator')} hashes to {entry.key}, "
                          f"its task expects {key}: iron's sources changed during the build")
    print(f"[{counter}] {description.get('operator') or description.get('kernel')} -> "
          f"{entry.path}")
    return remote_values(store)


def app_options(context, weights, group, batch=None) -> dict[str, Any]:
    """The application's options from the doit variables that were given."""
    options: dict[str, Any] = {"context": int(context)} if context else {}
    if batch:
        options["batch"] = int(batch)
    if weights:
        options["weights"] = weights
    if group:
        options["group"] = int(group)
    return options


def write_bundle_action(app_name, checkpoint, context, weights, group, batch, device_name,
                        out):
    """doit action: write the bundle (opens the application: it needs the weights)."""
    from ..devices import device
    from ..cache import default_store
    from .app import app_profile, load_app
    from .bundle import write_bundle

    try:
        store = default_store()
        app = load_app(app_name, checkpoint, **app_options(context, weights, group, batch))
        dev = device(device_name)
        profile = app_profile(app_name, dev.name)
        profile.warnings_to = io.StringIO()  # said when the tasks were set up
        write_bundle(app, dev, profile, Path(out), store)
    except IronError as e:
        return TaskFailed(str(e))
    print(f"bundle written to {out}")
    return remote_values(store)


def bundle_intact(out: str) -> bool:
    """doit uptodate check: the bundle on disk still checks out (see ``bundle.check``)."""
    from .bundle import check

    return check(Path(out))


def remote_values(store) -> dict:
    """The doit values of an action: what it did with the remote cache, if there is one."""
    return {"remote_cache": store.remote.take_counts()} if store.remote is not None else {}


def config_changed(config: dict):
    from doit.tools import config_changed as changed

    return changed(config)
