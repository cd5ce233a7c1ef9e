"""The doit task graph behind ``dodo.py``: checkpoint, compile, bundle, generate, tune, gc
(the task that runs the bundle is ``generate``: doit reserves ``run`` for its own command).

At load time the application is opened, its programs are recorded under the device's profile
and every operator instance is resolved; each distinct instance becomes one ``compile:<name>``
subtask whose name carries the operator, its shape and a short artifact key.  Because the key
hashes the resolved tunables, a profile edit creates new compile tasks only for the instances
whose tunables moved; the others keep their name and stay up to date, and reverting the edit
brings back tasks doit already knows to be done.  ``bundle`` depends on every compile target,
the checkpoint's files and the profile.

Command-line variables: ``app`` (llama), ``device`` (``$IRON_DEVICE`` or cpu), ``checkpoint``
(the application's default), ``context``, ``prompt``, and the tuner's ``only``, ``budget``,
``prune`` (``0``: measure every candidate), ``fresh``.
"""

from __future__ import annotations

import functools
import shutil
import sys
from typing import Any, Callable, Iterator

from ..devices import device as get_device
from ..paths import build_dir
from ..profile import Profile
from ..store import MANIFEST as ENTRY_MANIFEST, Store
from ..targets import Recipe, Target, target_for
from .app import app_profile, load_app, profile_path
from .bundle import MANIFEST, write_bundle

build_dir().mkdir(parents=True, exist_ok=True)  # doit opens its state file before any task
DOIT_CONFIG = {
    "backend": "sqlite3",
    "dep_file": str(build_dir() / ".doit.db"),
    "default_tasks": ["bundle"],
    "verbosity": 2,
}


def task_name(op, key: str) -> str:
    """``GEMV-M576-K576-batches1-3f2a9c1d``: readable in ``doit list``, unique by key."""
    params = "-".join(f"{n}{_short(getattr(op, n))}" for n in op.params())
    return f"{type(op).__name__}-{params}-{key[:8]}"


def _short(value: Any) -> str:
    return format(value, "g") if isinstance(value, float) else str(int(value))


class BuildGraph:
    """The tasks of one (application, device, checkpoint) selection."""

    def __init__(self, get_var: Callable[[str, Any], Any]):
        self.app_name = get_var("app", "llama")
        self.device = get_device(get_var("device", None))
        self.checkpoint = get_var("checkpoint", None)
        self.context = get_var("context", None)
        self.prompt = get_var("prompt", None)
        self.tune_options = {k: get_var(k, None) for k in ("only", "budget", "prune", "fresh")}
        self.target = target_for(self.device)
        self.store = Store()
        self.bundle_dir = build_dir() / self.app_name / self.device.name
        self.profile_file = profile_path(self.app_name, self.device.name)
        self._app = None

    # the application is opened lazily: after `checkpoint` ran, when doit asks for compile tasks
    @property
    def app(self):
        if self._app is None:
            options = {"context": int(self.context)} if self.context else {}
            self._app = load_app(self.app_name, self.checkpoint, **options)
        return self._app

    def profile(self) -> Profile:
        return app_profile(self.app_name, self.device.name)

    @functools.cached_property
    def instances(self) -> dict[str, tuple[Any, Any]]:
        """Distinct resolved instances by task name: (operator, recipe); recorded once per
        doit run, though the compile, bundle and gc tasks all read it."""
        programs = self.app.programs(self.device, self.profile()).values()
        distinct = dict.fromkeys(op for program in programs for op in program.ops)
        found = {}
        for op in distinct:
            recipe = self.target.recipe(op)
            found[task_name(op, recipe.key)] = (op, recipe)
        return found

    # ---- tasks ----------------------------------------------------------------------------

    def task_checkpoint(self) -> dict:
        return {"actions": [(self._ensure_checkpoint, [])], "uptodate": [False],
                "verbosity": 1,
                "doc": "fetch and convert the application's default checkpoint if needed"}

    def _ensure_checkpoint(self) -> None:
        self.app  # opening the application fetches and converts its default checkpoint

    def task_compile(self) -> Iterator[dict]:
        yield {"basename": "compile", "name": None,
               "doc": "compile every operator instance of the application (one subtask each)"}
        for name, (op, recipe) in sorted(self.instances.items()):
            yield {"name": name, "actions": [(compile_action, [self.target, recipe, self.store])],
                   "file_dep": [str(p) for p in recipe.sources],
                   "targets": [str(self.store.path(recipe.key) / ENTRY_MANIFEST)],
                   "uptodate": [config_changed(recipe.description)],
                   "doc": f"{op.describe(tunables=True)} -> artifact {recipe.key}"}

    def task_bundle(self) -> dict:
        deps = [str(self.store.path(recipe.key) / ENTRY_MANIFEST)
                for _, recipe in self.instances.values()]
        deps += [str(p) for p in self.app.sources()]
        if self.profile_file.exists():
            deps.append(str(self.profile_file))
        runtime = self.target.recipe(None)
        return {"actions": [(self._write_bundle, [])],
                "file_dep": sorted(set(deps) | {str(p) for p in runtime.sources}),
                "task_dep": ["compile"],
                "targets": [str(self.bundle_dir / MANIFEST)],
                "uptodate": [config_changed({"app": self.app_name, "device": self.device.name,
                                             "meta": self.app.meta(), "runtime": runtime.key})],
                "doc": f"the runnable {self.app_name} bundle for {self.device} in "
                       f"{self.bundle_dir}"}

    def _write_bundle(self) -> None:
        write_bundle(self.app, self.device, self.profile(), self.bundle_dir, self.store)
        print(f"bundle written to {self.bundle_dir}")

    def task_generate(self) -> dict:
        command = self.app.run_command(self.bundle_dir, self.prompt)
        return {"actions": [command], "task_dep": ["bundle"], "uptodate": [False],
                "verbosity": 2, "doc": "build the bundle if needed, then run it"}

    def task_tune(self) -> dict:
        argv = [sys.executable, "-m", "iron.lm.tune", self.app_name, "--device",
                self.device.name]
        if self.checkpoint:
            argv += ["--checkpoint", str(self.checkpoint)]
        for option in ("only", "budget", "prune"):
            if self.tune_options[option]:
                argv += [f"--{option}", str(self.tune_options[option])]
        if self.tune_options["fresh"]:
            argv.append("--fresh")
        return {"actions": [argv], "task_dep": ["checkpoint"], "uptodate": [False],
                "verbosity": 2,
                "doc": f"time every legal setting and rewrite {self.profile_file} "
                       "(a later `doit` rebuilds what moved)"}

    def task_gc(self) -> dict:
        return {"actions": [(self._gc, [])], "uptodate": [False], "verbosity": 2,
                "doc": "remove cache entries and build leftovers that nothing references"}

    def _gc(self) -> None:
        keep = {recipe.key for _, recipe in self.instances.values()}
        keep.add(self.target.key(None))
        for manifest in build_dir().glob(f"*/*/{MANIFEST}"):
            keep.update(p.stem for p in (manifest.parent / "kernels").glob("*"))
        removed = [key for key in self.store.keys() if key not in keep]
        for key in removed:
            self.store.remove(key)
        leftovers = [p for p in self.store.root.glob(".*") if p.is_dir()]
        leftovers += [p for p in build_dir().glob("*/.tmp-*")]
        leftovers += [p for p in build_dir().glob("*/.old-*")]
        for p in leftovers:
            shutil.rmtree(p, ignore_errors=True)
        print(f"gc: removed {len(removed)} cache entries and {len(leftovers)} leftovers; "
              f"kept {len(keep & set(self.store.keys()))}")


def compile_action(target: Target, recipe: Recipe, store: Store) -> None:
    """doit action: compile one instance into the store (a no-op when it is already there)."""
    entry = target.compile(recipe, store)
    print(f"{recipe.operator} -> {entry.path}")


def config_changed(config: dict):
    from doit.tools import config_changed as changed

    return changed(config)
