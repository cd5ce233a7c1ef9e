"""Applications: what the build graph, the bundler and the tuner need to know about a model.

An application is a package ``apps.<name>`` whose ``App(checkpoint=None, **options)`` class
provides:

- ``name``: the application's name (``llama``);
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

Profiles live in ``profiles/<app>/<device>.json`` (on the cpu ``cpu-<host class>.json``, see
``profile_path``); a missing file means "defaults only".
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from ..errors import IronError, ProfileError
from ..paths import project_root


def load_app(name: str, checkpoint: str | Path | None = None, **options: Any):
    """The application ``apps.<name>``, opened on ``checkpoint`` (its default when None)."""
    try:
        module = importlib.import_module(f"apps.{name}")
    except ModuleNotFoundError as e:
        if e.name not in ("apps", f"apps.{name}"):
            raise
        raise IronError(f"unknown application {name!r}: no package apps/{name}") from None
    return module.App(checkpoint, **options)


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


def app_profile(app: str, device: str):
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
