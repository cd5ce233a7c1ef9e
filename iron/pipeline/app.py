"""Applications: what the build graph, the bundler and the tuner need to know about a model.

An application is a package ``apps.<name>`` whose ``App(checkpoint=None, **options)`` class
derives from ``Application`` below, which states the whole protocol: the members every
application defines, and the optional ones with their defaults, so that no caller probes for a
member with ``hasattr``.

The package's module-level ``VARIABLES`` (name -> ``iron.pipeline.variables.Variable``)
declares the options ``App`` takes, with their defaults and checks: ``doit NAME=VALUE``
accepts them, and the tuner and ``iron run`` pass them through ``open_app``.  An application
without options declares none.  Its ``RUN_OPTIONS`` (a tuple of names) are the flags of its run
command that ``doit generate NAME=VALUE`` passes on to ``run_command``.

Profiles live in ``profiles/<app>/<device>.json`` (on the cpu ``cpu-<host class>.json``, see
``profile_path``); a missing file means "defaults only".
"""

from __future__ import annotations

import importlib
from pathlib import Path
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Iterator, Mapping

from ..errors import IronError, ProfileError
from ..paths import project_root
from .variables import Variable, check_all

if TYPE_CHECKING:  # profiles bring numpy and the operators: a no-op doit loads neither
    import numpy as np

    from ..program import Program
    from ..profile import Profile

#: What an application's ``phases()`` maps each phase's name to: the programs one step of the
#: phase runs, and the tokens that step produces (0: report seconds, not tokens per second).
Phase = tuple[tuple[str, ...], int]


class Application(ABC):
    """The base of every application's ``App``: the members the pipeline and the tuner call.

    Required: ``name`` (a class attribute, the package's name), ``programs`` and ``weights``.
    The rest have defaults an application overrides when it has more to say.
    """

    name: str

    @abstractmethod
    def programs(self, device, profile: Profile) -> dict[str, Program]:
        """Its graphs, recorded and resolved on ``device`` under ``profile``."""

    @abstractmethod
    def weights(self) -> Iterator[tuple[str, np.ndarray]]:
        """Every weight the programs bind, in the layout the kernels read (this is where e.g.
        gate and up projections are stacked)."""

    def tuned_programs(self, device, profile: Profile) -> Mapping[str, Program]:
        """The programs whose tunables the tuner chooses: all of ``programs`` unless some
        derive theirs from others (a batched program may copy a one-row program's settings,
        so that both compute a row the same way); then only the rest."""
        return self.programs(device, profile)

    def phases(self) -> dict[str, Phase]:
        """The phases the tuner's whole-model A/B reports (e.g. decode: the decode and head
        programs, one token per step); none by default, so it reports per program."""
        return {}

    def weights_key(self) -> dict[str, Any] | None:
        """What the weights depend on, for bundles to share one weights file when it is the
        same; None (the default): never shared, the weights are written for each bundle."""
        return None

    def weights_sources(self) -> list[Path]:
        """The source files of the code that computes ``weights()`` (conversion, stacking,
        derived tables): a shared weights file is reused only while they are as they were, and
        the bundle is rewritten when one changes.  None by default."""
        return []

    def files(self) -> dict[str, Path]:
        """Files the bundle carries as they are (``tokenizer.json``); none by default."""
        return {}

    def meta(self) -> dict[str, Any]:
        """JSON data the runtime needs (model config, special tokens, ...)."""
        return {}

    def sources(self) -> list[Path]:
        """The files the bundle depends on (the checkpoint's); none by default."""
        return []

    def run_command(self, bundle: Path, prompt: str | None = None,
                    options: dict[str, str] | None = None) -> list[str]:
        """The command ``doit generate`` runs on ``bundle`` (``options``: the run options
        given as doit variables, by name, as strings; see ``RUN_OPTIONS`` above).  By default
        there is none: an application that only builds bundles refuses, naming itself."""
        raise IronError(f"application {self.name!r} has no run command: it builds bundles, "
                        "but `doit generate` cannot run them")


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
    cls = app_module(name).App
    if not (isinstance(cls, type) and issubclass(cls, Application)):
        raise IronError(f"apps.{name}.App is {cls!r}, which does not derive from "
                        "iron.pipeline.app.Application: subclass it, it states the protocol")
    return cls(checkpoint, **options)


def app_variables(name: str) -> dict[str, Variable]:
    """The build variables application ``name`` declares (``VARIABLES`` in its package)."""
    return dict(getattr(app_module(name), "VARIABLES", {}))


def app_run_options(name: str) -> tuple[str, ...]:
    """The run options application ``name`` declares (``RUN_OPTIONS`` in its package)."""
    return tuple(getattr(app_module(name), "RUN_OPTIONS", ()))


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
    (``profiles/<app>/cpu-avx2-2t.json``, see ``iron.host.class_name``): a setting
    tuned for one instruction set or team size is not the setting for another."""
    if device == "cpu":
        from ..host import class_name

        device = f"cpu-{host_class or class_name()}"
    return profiles_dir() / app / f"{device}.json"


def app_profile(app: str, device: str, host_class: str | None = None) -> Profile:
    """The committed profile of ``app`` on ``device`` (on the cpu, this host class's, or
    ``host_class``'s); an empty one, every tunable from ``resolve()``, if there is none.  A cpu
    profile whose recorded class is not this host's is refused: it was copied under the wrong
    name."""
    from ..profile import Profile  # not at import: a no-op doit reads only profile_path

    path = profile_path(app, device, host_class)
    if not path.exists():
        return Profile(device=device)
    profile = Profile.load(path)
    recorded = (profile.host or {}).get("class")
    wanted = path.stem.partition("-")[2]
    if device == "cpu" and recorded is not None and recorded != wanted:
        raise ProfileError(f"{path}: tuned on host class {recorded!r}, but the file is the "
                           f"profile of class {wanted!r}; rename it to cpu-{recorded}.json")
    return profile
