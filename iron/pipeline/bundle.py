"""Model bundles: everything needed to run an application on one device, in one folder.

``build/<app>/<device>/`` holds ``manifest.json`` (the recorded programs, which artifact each
step uses and where it runs, the application's metadata and the hash of every file),
``kernels/`` (the compiled instances and the executor, one artifact file each: on the cpu
shared libraries, on an NPU each step's design or host placement and the core kernels' host
build), ``weights.safetensors`` (in the layout the kernels read), the application's files
(``tokenizer.json``, ``config.json``) and ``profile.json`` (the profile it was built with).
It runs from any folder, without a compiler.

A bundle is written into a temporary folder beside its destination and swapped into place, so
an interrupted build leaves the previous bundle intact.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file

from ..errors import BundleError, IronError
from ..profile import Profile
from ..program import Program
from ..store import Store
from ..targets import target_for
from ..tensorfile import read_safetensors
from ..util import atomic_write_bytes, sha256_file

FORMAT = 1
MANIFEST = "manifest.json"
WEIGHTS = "weights.safetensors"


def write_bundle(app, device, profile: Profile, out: Path, store: Store | None = None) -> Path:
    """Compile ``app``'s programs for ``device`` under ``profile`` and write the bundle ``out``."""
    target = target_for(device)  # building needs no runtime: an npu bundle runs emulated
    out = Path(out)
    recover(out)
    programs: dict[str, Program] = app.programs(device, profile)
    ops = [op for p in programs.values() for op in p.ops]
    entries = target.compile_all([*ops, None], store)
    artifacts = {e.key: target.artifact(e) for e in entries}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{out.name}-", dir=out.parent))
    try:
        (tmp / "kernels").mkdir()
        for key, artifact in artifacts.items():
            shutil.copy2(artifact, tmp / "kernels" / f"{key}{artifact.suffix}")
        names = iter(f"kernels/{e.key}{artifacts[e.key].suffix}" for e in entries)
        manifest_programs = {}
        for name, program in programs.items():
            doc = program.to_json()
            doc["kernels"] = [next(names) for _ in program.steps]
            doc["placements"] = [target.placement(op) for op in program.ops]
            manifest_programs[name] = doc
        runtime = next(names)
        save_file(dict(app.weights()), str(tmp / WEIGHTS))
        for name, src in app.files().items():
            shutil.copy2(src, tmp / name)
        (tmp / "profile.json").write_text(profile.dumps())
        files = {str(p.relative_to(tmp)): sha256_file(p)
                 for p in sorted(tmp.rglob("*")) if p.is_file()}
        manifest = {"format": FORMAT, "app": app.name, "device": device.name,
                    "programs": manifest_programs, "runtime": runtime, "meta": app.meta(),
                    "files": files}
        atomic_write_bytes(tmp / MANIFEST, json.dumps(manifest, indent=1).encode())
        swap_into_place(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def swap_into_place(new: Path, out: Path) -> None:
    old = out.with_name(f".old-{out.name}")
    shutil.rmtree(old, ignore_errors=True)
    if out.exists():
        os.rename(out, old)
    os.rename(new, out)
    shutil.rmtree(old, ignore_errors=True)


def recover(out: Path) -> None:
    """Put back a bundle left aside by a build killed between its two renames."""
    old = out.with_name(f".old-{out.name}")
    if not out.exists() and (old / MANIFEST).exists():
        os.rename(old, out)


@dataclass
class Bundle:
    """An opened bundle: its manifest, with paths resolved inside its folder."""

    path: Path
    manifest: dict[str, Any]

    @classmethod
    def open(cls, path: str | os.PathLike, verify: bool = False) -> Bundle:
        """Open a bundle; ``verify`` re-hashes every file (the weights included)."""
        path = Path(path)
        recover(path)
        try:
            manifest = json.loads((path / MANIFEST).read_text())
        except FileNotFoundError:
            raise BundleError(f"{path}: not a bundle (no {MANIFEST}); build one with `doit`")
        except ValueError as e:
            raise BundleError(f"{path / MANIFEST}: damaged manifest ({e})") from None
        if manifest.get("format") != FORMAT:
            raise BundleError(f"{path}: bundle format {manifest.get('format')!r}, this iron "
                              f"reads format {FORMAT}; rebuild it")
        bundle = cls(path, manifest)
        for name, digest in manifest["files"].items():
            file = path / name
            if not file.is_file():
                raise BundleError(f"{path}: {name} is missing")
            if (verify or name.startswith("kernels/")) and sha256_file(file) != digest:
                raise BundleError(f"{path}: {name} does not match its manifest hash")
        return bundle

    @property
    def meta(self) -> dict[str, Any]:
        return self.manifest["meta"]

    def program(self, name: str) -> Program:
        return Program.from_json(self.manifest["programs"][name])

    def weights(self) -> dict[str, np.ndarray]:
        """The bundle's weights, read into huge pages: programs stream them on every call."""
        return read_safetensors(self.path / WEIGHTS)

    def target(self, emulate: bool = False):
        """The target that runs this bundle, refusing before any work what this machine
        cannot do: an npu bundle runs in the emulator (``emulate``) or on an NPU through XRT."""
        from ..devices import device

        dev = device(self.manifest["device"])
        target = target_for(dev)
        if emulate:
            return target.emulated()
        target.require_available(dev)
        return target

    def check_runnable(self, emulate: bool = False) -> None:
        try:
            self.target(emulate)
        except IronError as e:
            raise BundleError(f"{self.path}: {e}") from None

    def executable(self, name: str, weights: dict[str, np.ndarray] | None = None,
                   emulate: bool = False):
        """The program ``name`` loaded from the bundle's own files (no compiler needed);
        ``emulate`` runs an npu bundle in the emulator."""
        program = self.program(name)
        doc = self.manifest["programs"][name]
        exe = self.target(emulate).executable(
            program, [self.path / k for k in doc["kernels"]], self.path / self.manifest["runtime"])
        exe.bind_weights(self.weights() if weights is None else weights)
        return exe

    def file(self, name: str) -> Path:
        return self.path / name
