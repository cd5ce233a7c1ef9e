"""The doit task graph behind ``dodo.py``: checkpoint, compile, bundle, generate, tune, gc
(the task that runs the bundle is ``generate``: doit reserves ``run`` for its own command).

At set-up the command-line variables are checked against ``VARIABLES`` and the variables the
chosen application declares (``apps/<app>/__init__.py``'s ``VARIABLES``, see ``app.py``): an
unknown name or a bad value is a one-line error naming it.  The application's programs are
recorded under the device's profile and every operator instance resolved; each distinct
instance becomes one ``compile:<name>`` subtask whose name carries the operator, its shape and
a short artifact key.  Because the key hashes the resolved tunables, a profile edit creates new
compile tasks only for the instances whose tunables moved, and reverting the edit brings back
tasks doit already knows to be done.  ``bundle`` depends on every compile target, the
checkpoint's files and the profile, and is out of date whenever the bundle on disk no longer
checks out (a kernel deleted or edited, weights changed).

Recording is the slow part of loading and happens once: its result (task names, recipes, the
bundle's configuration) is kept in ``build/.programs/``, with the bundle's plan (every program
step by step, see ``bundle.plan_bundle``) in a file beside it that the ``bundle`` task writes
the bundle from.  The record is keyed by everything it depends on: the variables, the
profile's bytes, the host's usable cores and -march level, the sizes and times of iron's and
the application's sources and of the checkpoint's files.  A no-op ``doit`` reads that record
and imports neither numpy nor the application's code (only its declared variables).
Each selection keeps its own doit state file (``build/.doit/``), so building one bundle leaves
another's tasks current.

The pipeline's variables: ``app`` (``apps.DEFAULT_APP`` unless given), ``device``
(``$IRON_DEVICE`` or cpu), ``checkpoint`` (the application's default; a folder or a file),
``march`` (``$IRON_MARCH`` or native), ``threads`` (at most the usable cores), ``verbose``,
``prompt`` and the other options of ``generate`` (the application's ``RUN_OPTIONS``: flags of
its run command, which it validates), the tuner's ``only``, ``budget``, ``prune``
(``0``: measure every candidate), ``fresh``, ``max_load``, ``scheduler``, and gc's ``days``;
``doit list`` shows each with its default.  The default bundle is ``build/<app>/<device>/``;
another checkpoint, application variable or -march level gets its own folder beside it,
``build/<app>/<device>-<what differs>/``, tagged as the application's variables say.

What one run's tasks, its reporter, its Ctrl-C handler and ``iron run`` share is a
``BuildRun`` (``buildrun.py``, with the quiet ``Reporter``); ``march`` and ``threads`` are held
by the graph and passed on explicitly, never written into the environment.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator

from doit.exceptions import InvalidDodoFile, TaskFailed

from .. import host
from ..devices import DEVICE_NAMES, Device, device as get_device
from ..errors import IronError
from ..jsonfile import loads
from ..paths import PACKAGE_DIR, build_dir, project_root
from ..util import atomic_write_bytes, read_bounded
from . import variables as v
from .buildrun import BuildRun, Reporter
from .variables import Variable

RECORD_VERSION = 4


class BuildError(IronError, InvalidDodoFile):
    """An iron error while setting up tasks: doit prints ``ERROR: <message>``, one line (it
    stops a dodo file with its ``InvalidDodoFile``), and ``iron run`` says it as any other."""


DOIT_CONFIG = {
    "backend": "sqlite3",
    "default_tasks": ["bundle"],
}


def _march(name: str, text: str) -> str:
    return host.check_march(text, f"doit variable {name}")


#: The pipeline's own variables; an application adds the ones it declares (see ``app.py``).
VARIABLES: dict[str, Variable] = {
    "app": Variable(None, v.identifier, "the application, a package apps/<app>",
                    shown="apps.DEFAULT_APP"),
    "device": Variable(None, v.choice(*DEVICE_NAMES), "the device built for",
                       shown="$IRON_DEVICE or cpu"),
    "checkpoint": Variable(None, v.path, "a checkpoint folder or a .gguf file",
                           shown="the application's"),
    "march": Variable(None, _march, "-march level of the cpu kernels",
                      shown="$IRON_MARCH or native"),
    "threads": Variable(None, v.positive(4096), "most threads per kernel",
                        shown="the usable cores"),
    "verbose": Variable(0, v.choice("0", "1", as_int=True), "1: every task and compile line"),
    "prompt": Variable(None, v.text, "generate's prompt", shown="the bundle's"),
    "only": Variable(None, v.operators, "tune: only these operators"),
    "budget": Variable(None, v.number, "tune: seconds"),
    "prune": Variable(None, v.count, "tune: candidates measured per instance (0: all)",
                      shown="8"),
    "fresh": Variable(0, v.choice("0", "1"), "tune: 1 measures everything again"),
    "max_load": Variable(None, v.number, "tune: others' load allowed while timing",
                         shown="the tuner's"),
    "scheduler": Variable(None, v.text, "tune: a Dask scheduler tcp://HOST:PORT"),
    "days": Variable(None, v.number, "gc: keep entries used within this many days",
                     shown="7 in a shared cache"),
}

#: Variables each task reads (shown with their defaults by ``doit list`` / ``doit help``).
_BUILD = ("app", "device", "checkpoint", "march", "threads")
_TASK_VARIABLES = {"bundle": _BUILD, "generate": (*_BUILD, "prompt"),
                   "tune": ("app", "device", "checkpoint", "only", "budget", "prune", "fresh",
                            "max_load", "scheduler"),
                   "gc": ("days",)}


def default_app() -> str:
    """The application built when none is named (``apps.DEFAULT_APP``), found at run time as
    ``app.load_app`` finds an application by name."""
    import importlib

    return importlib.import_module("apps").DEFAULT_APP


def declared_variables(app_name: str) -> dict[str, Variable]:
    """The pipeline's variables, those application ``app_name`` declares and its run options
    (flags of its run command, which the command checks)."""
    from .app import app_run_options, app_variables

    declared = app_variables(app_name)
    for name in app_run_options(app_name):
        declared.setdefault(name, Variable(None, v.text, "a flag of the application's run "
                                           "command", run_option=True))
    clash = sorted(set(declared) & set(VARIABLES))
    if clash:
        raise IronError(f"application {app_name!r} declares variable {clash[0]!r}, which the "
                        "pipeline already has; rename it")
    return {**VARIABLES, **declared}


def check_variables(variables: dict[str, str]) -> tuple[dict[str, Any], dict[str, Variable]]:
    """The command line's variables, each checked (an unknown name is an error naming it), and
    every variable declared for the chosen application."""
    app = v.identifier("app", str(variables.get("app") or default_app()))
    declared = declared_variables(app)
    return v.check_all(variables, declared, "doit variable"), declared


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

    def __init__(self, variables: dict[str, str] | None = None, run: BuildRun | None = None):
        """``variables``: the command line's NAME=VALUE pairs; ``run``: what this run's tasks
        share with its reporter and its command (a new one by default).  ``march`` and
        ``threads`` are held here and passed on explicitly, never through the environment."""
        try:
            self.vars, self.declared = check_variables(dict(variables or {}))
            self.level = self.vars.get("march") or host.march()
            self.app_name = self.vars.get("app") or default_app()
            self.device = with_threads(get_device(self.vars.get("device")),
                                       self.vars.get("threads"))
        except IronError as e:
            raise BuildError(str(e)) from None
        self.run = run or BuildRun()
        self.run.verbose = bool(self.vars.get("verbose"))
        self.checkpoint = self.vars.get("checkpoint")
        #: the application's variables given on the command line, checked
        self.options = {k: val for k, val in self.vars.items()
                        if k not in VARIABLES and not self.declared[k].run_option}
        #: the run options given (flags of the application's run command), as text
        self.run_options = {k: val for k, val in self.vars.items()
                            if self.declared[k].run_option}
        self.prompt = self.vars.get("prompt")
        self.tune_options = {k: self.vars.get(k) for k in ("only", "budget", "fresh",
                                                            "max_load", "scheduler", "prune")}
        from ..cache import default_store

        self.store = default_store()
        self.bundle_dir = build_dir() / self.app_name / self.bundle_name()
        self.run.bundle_dir = str(self.bundle_dir)
        from .app import profile_path

        self.profile_file = profile_path(self.app_name, self.device.name, self.host_class())
        self._app = None
        self._record = None

    def bundle_name(self) -> str:
        """``cpu`` for the default selection; otherwise what differs (the checkpoint, each
        application variable not at its default, as the application tags it, the -march
        level, fewer threads than the cores: ``-1t``), so bundles of different selections do
        not overwrite one another (a bundle's thread count is compiled into its kernels)."""
        parts = [self.device.name]
        if self.checkpoint:
            path = Path(self.checkpoint).resolve()
            digest = hashlib.sha256(str(path).encode()).hexdigest()[:6]
            parts.append(f"{_slug(path.stem if path.is_file() else path.name)}-{digest}")
        for name, value in self.options.items():
            declared = self.declared[name]
            if declared.tag is not None and value != declared.default:
                parts.append(_slug(declared.tag.format(value)))
        if self.level != host.DEFAULT_MARCH:
            parts.append(_slug(self.level))
        if self.device.kind == "cpu" and self.device.columns < host.affinity_cores():
            parts.append(f"{self.device.columns}t")
        return "-".join(parts)

    def variables_doc(self, task: str) -> str:
        """``; variables: name=default ...`` of what ``task`` reads (the application's too)."""
        names = list(_TASK_VARIABLES[task])
        if task in ("bundle", "generate"):
            names += [n for n, d in self.declared.items()
                      if n not in VARIABLES and not d.run_option]
        line = "; variables: " + v.defaults_line({n: self.declared[n] for n in names},
                                                 {**self.vars, "app": self.app_name})
        run_options = [n for n, d in self.declared.items() if d.run_option]
        if task == "generate" and run_options:
            line += (f", and the run command's flags {', '.join(run_options)} (its "
                     "defaults)")
        return line

    def command_env(self) -> dict[str, str] | None:
        """What a command this build runs (the bundle, the tuner) is told of its -march level
        and threads: its own environment (the tuner reads the host class from it)."""
        if self.device.kind != "cpu":
            return None
        return {"IRON_MARCH": self.level, "IRON_THREADS": str(self.device.columns)}

    def host_class(self) -> str | None:
        """The cpu's host class at this build's -march level and threads (it names the
        profile file), None on another device."""
        if self.device.kind != "cpu":
            return None
        return host.class_name(self.device.columns, self.level)

    # the application is opened lazily: only when the record of its programs is stale
    @property
    def app(self):
        if self._app is None:
            from .app import load_app

            self._app = load_app(self.app_name, self.checkpoint, **self.options)
        return self._app

    def profile(self):
        from .app import app_profile

        return app_profile(self.app_name, self.device.name, self.host_class())

    # ---- the record of the recorded programs ----------------------------------------------

    def _fingerprint(self) -> str:
        try:  # bounded: a profile linked to /dev/zero must not hang or fill memory here
            profile = read_bounded(self.profile_file, "a profile")
        except FileNotFoundError:
            profile = b""
        except OSError as e:
            raise IronError(f"{self.profile_file}: cannot read the profile ({e.strerror})") \
                from None
        source = Path(self.checkpoint).resolve() if self.checkpoint else None
        stat = source.stat() if source is not None and source.is_file() else None
        key = {"version": RECORD_VERSION, "app": self.app_name, "device": self.device.name,
               "options": self.options, "march": self.level, "columns": self.device.columns,
               "checkpoint": str(source) if source else None,
               "checkpoint_file": [stat.st_size, stat.st_mtime_ns] if stat else None,
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
        """The record is small (a no-op ``doit`` and a warm ``iron run`` read it); the plan
        of the bundle (every program, step by step) is a file beside it that only the
        ``bundle`` task reads."""
        path = build_dir() / ".programs" / f"{self._fingerprint()}.json"
        try:
            record = loads(path.read_bytes())
            if _file_stamp(record["inputs"]) == record["inputs"] and \
                    Path(record["plan"]).is_file():
                return record
        except (OSError, ValueError, KeyError, TypeError):
            pass
        record, plan = self._make_record()
        plan_path = path.with_suffix(".plan.json")
        atomic_write_bytes(plan_path, json.dumps(plan).encode())
        record["plan"] = str(plan_path)
        atomic_write_bytes(path, json.dumps(record).encode())
        return record

    def _make_record(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Record the application's programs, once: the compile tasks' recipes and the plan
        the bundle is written from (``bundle.plan_bundle``)."""
        from ..targets import target_for
        from .bundle import plan_bundle

        target = target_for(self.device)
        app = self.app
        profile, warnings = self.profile(), io.StringIO()
        profile.warnings_to = warnings
        with host.march_level(self.level):
            plan, recipes = plan_bundle(app, self.device, profile)
        instances = {}
        for op, recipe in recipes.items():
            instances[task_name(op, recipe.key)] = {
                "key": recipe.key, "recipe": recipe.to_json(),
                "doc": f"{op.describe(tunables=True)} -> artifact {recipe.key}"
                       f"{where(target.placement(op))}"}
        runtime = plan["recipes"][plan["runtime"]]
        sources = [str(p) for p in app.sources()]
        mark = "\0prompt\0"
        record = {"instances": instances, "runtime": plan["runtime"],
                  "runtime_sources": runtime["sources"],
                  "warnings": warnings.getvalue().splitlines(),
                  "meta": plan["meta"], "sources": sources,
                  "weights_sources": [str(p) for p in app.weights_sources()],
                  "inputs": _file_stamp(sources),
                  "generate": {"default": app.run_command(self.bundle_dir, None),
                               "prompt": app.run_command(self.bundle_dir, mark), "mark": mark}}
        return record, plan

    # ---- tasks ----------------------------------------------------------------------------

    def task_checkpoint(self) -> dict:
        return {"actions": [(self._ensure_checkpoint, [])], "uptodate": [False],
                "verbosity": 1,
                "doc": "fetch and convert the checkpoint if needed (a .gguf file is converted "
                       "once)"}

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
            recipe = inst["recipe"]
            yield {"name": name,
                   "actions": [(compile_action, [self.device.name, recipe, inst["key"],
                                                 f"{i}/{len(instances)}"])],
                   "file_dep": recipe["sources"],
                   "targets": [str(self.store.path(inst["key"]) / ENTRY_MANIFEST)],
                   "uptodate": [config_changed(recipe["description"])],
                   "verbosity": 2 if self.run.verbose else 1,
                   "doc": inst["doc"]}

    def task_bundle(self) -> dict:
        from ..store import MANIFEST as ENTRY_MANIFEST
        from .bundle import MANIFEST, QUANT_SOURCE

        record = self.record
        deps = [str(self.store.path(i["key"]) / ENTRY_MANIFEST)
                for i in record["instances"].values()]
        deps += record["sources"]
        deps.append(str(QUANT_SOURCE))  # it lays out the bundle's quantized weights
        deps += record["weights_sources"]  # the code that computes them
        if self.profile_file.exists():
            deps.append(str(self.profile_file))
        deps += record["runtime_sources"]
        build = {"app": self.app_name, "device": self.device.name,
                 "checkpoint": str(Path(self.checkpoint).resolve()) if self.checkpoint else None,
                 "variables": {k: str(val) for k, val in self.options.items()},
                 "march": self.vars.get("march")}
        return {"actions": [(write_bundle_action, [self.app_name, self.checkpoint,
                                                   self.options, record["plan"],
                                                   str(self.bundle_dir), build])],
                "file_dep": sorted(set(deps)),
                "task_dep": ["compile"],
                "targets": [str(self.bundle_dir / MANIFEST)],
                "uptodate": [config_changed({"app": self.app_name, "device": self.device.name,
                                             "meta": record["meta"],
                                             "runtime": record["runtime"],
                                             "march": self.level, "build": build,
                                             "columns": self.device.columns}),
                             (self.run.bundle_intact, [str(self.bundle_dir)])],
                "verbosity": 2 if self.run.verbose else 1,
                "doc": f"the runnable {self.app_name} bundle for {self.device} in "
                       f"{self.bundle_dir}{self.variables_doc('bundle')}"}

    def task_generate(self) -> dict:
        gen = self.record["generate"]
        if self.run_options:  # flags beyond the prompt: the application builds its command
            command = self.app.run_command(self.bundle_dir, self.prompt, self.run_options)
        elif self.prompt is None:
            command = gen["default"]
        else:
            command = [a.replace(gen["mark"], self.prompt) for a in gen["prompt"]]
        return {"actions": [(self.run.run_command, [command, self.command_env()])],
                "task_dep": ["bundle"],
                "uptodate": [False], "verbosity": 2,
                "doc": "build the bundle if needed, then run it"
                       f"{self.variables_doc('generate')}"}

    def task_tune(self) -> dict:
        argv = [sys.executable, "-m", "iron.tuning", self.app_name, "--device",
                self.device.name]
        if self.checkpoint:
            argv.append(f"--checkpoint={self.checkpoint}")  # one word: never an option
        for name, value in self.options.items():  # that bundle's instances are tuned
            argv.append(f"--var={name}={value}")
        for option in ("only", "budget", "prune", "max_load", "scheduler"):
            if self.tune_options[option] is not None:
                argv.append(f"--{option.replace('_', '-')}={self.tune_options[option]}")
        if self.tune_options["fresh"] == "1":
            argv.append("--fresh")
        return {"actions": [(self.run.run_command, [argv, self.command_env()])],
                "task_dep": ["checkpoint"],
                "uptodate": [False], "verbosity": 2,
                "doc": f"time every legal setting and rewrite {self.profile_file} "
                       f"(a later `doit` rebuilds what moved){self.variables_doc('tune')}"}

    def task_gc(self) -> dict:
        return {"actions": [(self._gc, [])], "uptodate": [False], "verbosity": 2,
                "doc": "remove cache entries and shared weights nothing references (in a "
                       "shared $IRON_CACHE_DIR, only those unused for `days`) and abandoned "
                       f"temp folders{self.variables_doc('gc')}"}

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
        from .bundle import collect_weights

        weights = collect_weights()
        age = "" if days is None else f" unused for {days:g} days"
        print(f"gc: removed {len(removed)} cache entries{age}, {weights} weights files no bundle "
              f"uses and {temp + len(leftovers)} abandoned temporary folders; kept "
              f"{len(keep & set(self.store.keys()))} in use")


def where(placement: str) -> str:
    return " (host placement: no npu design)" if placement == "host" else ""


def compile_action(device_name: str, recipe: dict, key: str, counter: str):
    """doit action: compile one instance (``recipe``, as ``Recipe.to_json`` wrote it, whose
    key was ``key`` when recorded) into the store; a no-op when it is already there."""
    from ..devices import device
    from ..cache import default_store
    from ..targets import target_for
    from ..targets.base import Recipe

    try:
        target = target_for(device(device_name))
        store = default_store()
        cached = store.lookup(key) is not None  # compiled for another selection, or remotely
        entry = target.compile(Recipe.from_json(recipe), store)
    except IronError as e:
        return TaskFailed(str(e))
    what = recipe["description"].get("operator") or recipe["name"]
    if entry.key != key:
        return TaskFailed(f"the recipe of {what} hashes to {entry.key}, its task expects {key}: "
                          "iron's sources changed during the build")
    print(f"[{counter}] {what} -> {entry.path}{' (cached)' if cached else ''}")
    return {**remote_values(store), "cached": cached}


def write_bundle_action(app_name, checkpoint, options, plan_path, out, build):
    """doit action: write the bundle from the plan recorded with the programs (it opens the
    application for its weights and files, and records nothing again)."""
    from ..cache import default_store
    from .app import load_app
    from .bundle import write_planned

    try:
        plan = loads(read_bounded(Path(plan_path), "a build plan"))
    except (OSError, ValueError) as e:
        return TaskFailed(f"{plan_path}: cannot read the recorded plan ({e}); run the build "
                          "again")
    try:
        store = default_store()
        app = load_app(app_name, checkpoint, **options)
        write_planned(plan, app, Path(out), store, build)
    except IronError as e:
        return TaskFailed(str(e))
    print(f"bundle written to {out}")
    return remote_values(store)


def remote_values(store) -> dict:
    """The doit values of an action: what it did with the remote cache, if there is one."""
    return {"remote_cache": store.remote.take_counts()} if store.remote is not None else {}


def config_changed(config: dict):
    from doit.tools import config_changed as changed

    return changed(config)


def with_threads(dev: Device, threads: int | None) -> Device:
    """``dev`` with at most ``threads`` columns on the cpu (a column is a worker thread); an
    NPU's columns are the hardware's."""
    if threads is None or dev.kind != "cpu":
        return dev
    return replace(dev, columns=min(dev.columns, threads))


def dodo_namespace(variables: dict[str, str], run: BuildRun | None = None) -> dict[str, Any]:
    """What a dodo file holds for the selection ``variables`` (NAME=VALUE pairs): doit's
    configuration and the task creators, bound to ``run`` (a new ``BuildRun`` by default).
    ``dodo.py`` is this namespace; ``iron run`` loads it with doit's API, so both build
    through the same graph and the same state file."""
    import signal

    from doit import create_after

    graph = BuildGraph(variables, run)
    # one state file per selection: building one bundle does not make another's tasks stale
    states = build_dir() / ".doit"
    try:  # doit opens its state file before any task runs
        states.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BuildError(f"cannot create the build folder {build_dir()} ({e.strerror}); make "
                         "it writable or point $IRON_BUILD_DIR elsewhere") from None
    signal.signal(signal.SIGINT, graph.run.on_interrupt)
    config = {**DOIT_CONFIG, "reporter": Reporter.for_run(graph.run),
              "dep_file": str(states / f"{graph.app_name}-{graph.bundle_dir.name}.db")}

    def task_checkpoint():
        return graph.task_checkpoint()

    @create_after(executed="checkpoint")
    def task_compile():
        yield from graph.task_compile()

    @create_after(executed="checkpoint")
    def task_bundle():
        return graph.task_bundle()

    @create_after(executed="checkpoint")
    def task_generate():
        return graph.task_generate()

    def task_tune():
        return graph.task_tune()

    @create_after(executed="checkpoint")
    def task_gc():
        return graph.task_gc()

    return {"DOIT_CONFIG": config, "graph": graph, "task_checkpoint": task_checkpoint,
            "task_compile": task_compile, "task_bundle": task_bundle,
            "task_generate": task_generate, "task_tune": task_tune, "task_gc": task_gc}
