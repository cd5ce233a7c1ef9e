"""Applications: what the build graph, the bundler and the tuner need to know about a model.

An application is a package ``apps.<name>`` whose ``App(checkpoint=None, **options)`` class
provides:

- ``name``: the application's name (its package's);
- ``programs(device, profile) -> dict[str, Program]``: its graphs, recorded and resolved;
- ``weights() -> Iterator[(name, array)]``: every weight the programs bind, in the layout the
  kernels read (this is where e.g. gate and up projections are stacked);
- ``files() -> dict[str, Path]``: files the bundle carries as they are (``tokenizer.json``);
- ``meta() -> dict``: JSON data the runtime needs (model config, special tokens, ...);
- ``sources() -> list[Path]``: the files the bundle depends on (the checkpoint's);
- ``run_command(bundle, prompt, options) -> list[str]``: the command ``doit generate`` runs
  (``options``: the generation doit variables given, by name, as strings);
- optionally ``tuned_programs(device, profile)``: the programs whose tunables the tuner
  chooses, when some of ``programs`` derive theirs from others.

The package's module-level ``VARIABLES`` (name -> ``iron.pipeline.variables.Variable``)
declares the options ``App`` takes, with their defaults and checks: ``doit NAME=VALUE``
accepts them, and the tuner and ``iron run`` pass them through ``open_app``.  An application
without options declares none.

Profiles live in ``profiles/<app>/<device>.json`` (on the cpu ``cpu-<host class>.json``, see
``profile_path``); a missing file means "defaults only".
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import IronError, ProfileError
from ..paths import project_root
from .variables import Variable, check_all

if TYPE_CHECKING:  # profiles bring numpy and the operators: a no-op doit loads neither
    from ..profile import Profile


def app_module(name: str):
    try:
        return importlib.import_module(f"apps.{name}")
    except ModuleNotFoundError as e:
        if e.name not in ("apps", f"apps.{name}"):
            raise
        raise IronError(f"unknown application {name!r}: no package apps/{name}") from None


def load_app(name: str, checkpoint: str | Path | None = None, **options: Any):
    """The application ``apps.<name>``, opened on ``checkpoint`` (its default when None), with
    ``options`` already checked (see ``open_app``)."""
    return app_module(name).App(checkpoint, **options)


def app_variables(name: str) -> dict[str, Variable]:
    """The build variables application ``name`` declares (``VARIABLES`` in its package)."""
    return dict(getattr(app_module(name), "VARIABLES", {}))


def open_app(name: str, checkpoint: str | Path | None = None,
             variables: dict[str, str] | None = None):
    """The application opened with ``variables`` (name -> text, as on a command line), each
    checked against what it declares: an unknown name or a bad value is one ``IronError``."""
    declared = app_variables(name)
    options = check_all(dict(variables or {}), declared, f"variable of application {name!r}")
    return load_app(name, checkpoint, **options)


def profiles_dir() -> Path:
    root = project_root()
    return (root if root else Path.cwd()) / "profiles"


def profile_path(app: str, device: str, host_class: str | None = None) -> Path:
    """``profiles/<app>/<device>.json``; on the cpu one file per host class
    (``profiles/<app>/cpu-avx2-2t.json``, see ``iron.targets.cpu.host.class_name``): a setting
    tuned for one instruction set or team size is not the setting for another."""
    if device == "cpu":
        from ..targets.cpu.host import class_name

        device = f"cpu-{host_class or class_name()}"
    return profiles_dir() / app / f"{device}.json"


def app_profile(app: str, device: str) -> Profile:
    """The committed profile of ``app`` on ``device`` (on the cpu, this host class's); an empty
    one, every tunable from ``resolve()``, if there is none.  A cpu profile whose recorded
    class is not this host's is refused: it was copied under the wrong name."""
    from ..profile import Profile  # not at import: a no-op doit reads only profile_path

    path = profile_path(app, device)
    if not path.exists():
        return Profile(device=device)
    profile = Profile.load(path)
    recorded = (profile.host or {}).get("class")
    wanted = path.stem.partition("-")[2]
    if device == "cpu" and recorded is not None and recorded != wanted:
        raise ProfileError(f"{path}: tuned on host class {recorded!r}, but the file is the "
                           f"profile of class {wanted!r}; rename it to cpu-{recorded}.json")
    return profile
