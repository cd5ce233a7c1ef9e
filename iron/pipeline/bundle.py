"""Model bundles: everything needed to run an application on one device, in one folder.

``build/<app>/<device>/`` holds ``manifest.json`` (the recorded programs, which artifact each
step uses and where it runs, the application's metadata and the hash of every file),
``kernels/`` (the compiled instances and the executor, one artifact file each: on the cpu
shared libraries, on an NPU each step's design or host placement and the core kernels' host
build), ``weights.safetensors`` (in the layout the kernels read), the application's files
(``tokenizer.json``, ``config.json``) and ``profile.json`` (the profile it was built with).
It runs from any folder, without a compiler.

Nothing in a bundle is trusted because it is there.  Opening one checks the manifest against a
table of its fields and against its own digest, confines every kernel path to ``kernels/`` and
to the files the manifest lists, checks each program's kernel count against its steps, checks
the hash of every kernel and small file, and refuses a host that lacks a CPU feature the
kernels' ``-march`` level needs (the manifest lists them).  The weights are hashed (xxh3-128)
as they are read, which costs a few percent of the read; a mismatch anywhere is a one-line
``BundleError``.

Nothing in a bundle is trusted because it is there, but a bundle is native code: its
kernels are shared libraries that the process loads, and whoever can write the folder can
replace one and recompute every hash above. Trust a bundle as you would a wheel: run those you
built or got from someone you trust. With ``IRON_REMOTE_CACHE_KEY`` set (the remote cache's
signing key, ``iron.remote_cache``), a bundle is signed when it is written (``signature``: the
HMAC-SHA256 of the manifest's digest, which covers every file's hash) and opening one verifies
the signature before any other file is read: a bundle without one, or whose files or manifest
were changed after signing, is refused in one line, before any of its code is loaded. Without
the key nothing is signed or verified.

A bundle is written into a temporary folder beside its destination and swapped into place, so
an interrupted build leaves the previous bundle intact.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy, programs and profiles load only where a bundle is written or run
    import numpy as np

    from ..profile import Profile
    from ..program import Program

from .. import host
from ..errors import BundleError, IronError
from ..jsonfile import loads
from ..remote_cache import signing_key
from ..util import atomic_write_bytes, read_bounded, sha256_file, sources_digest, umask
from ..store import Store, locked_temp_folder

FORMAT = 2
#: The module that lays out quantized weights for the kernels (read, not imported: it needs numpy)
QUANT_SOURCE = Path(__file__).resolve().parent.parent / "quant.py"
MANIFEST = "manifest.json"
WEIGHTS = "weights.safetensors"
KERNEL_PATH = re.compile(r"kernels/[0-9a-f]{32}\.[a-z]{1,8}")
#: The manifest's fields and their JSON types: checked on every open, before anything is used.
FIELDS = {"format": int, "app": str, "device": str, "programs": dict, "runtime": str,
          "meta": dict, "files": dict, "march": str, "isa": list, "cpu": str, "weights": dict,
          "digest": str}
WEIGHT_FIELDS = {"xxh3_128": str, "size": int}
STAMP = ".weights-mtime"  # the weights' mtime as written


def write_bundle(app, device, profile: Profile, out: Path, store: Store | None = None,
                 build: dict[str, Any] | None = None, key: bytes | None = None) -> Path:
    """Compile ``app``'s programs for ``device`` under ``profile`` and write the bundle ``out``
    (``plan_bundle`` then ``write_planned``, which say the rest)."""
    plan, _ = plan_bundle(app, device, profile)
    return write_planned(plan, app, out, store, build, key)


def plan_bundle(app, device, profile: Profile) -> tuple[dict[str, Any], dict]:
    """What the bundle of ``app`` for ``device`` under ``profile`` holds, as JSON data, and the
    recipe of each distinct operator instance (by instance).  The plan holds the programs,
    recorded and resolved, each step with its artifact's key and placement; the recipe of
    every artifact (the executor's too); the application's metadata; the profile; and what a
    host needs to run the kernels.  Recording is the slow part of a build: the build keeps the
    plan and writes the bundle from it, without recording again."""
    from ..targets import target_for

    target = target_for(device)
    programs: dict[str, Program] = app.programs(device, profile)
    recipes = {}
    docs = {}
    for name, program in programs.items():
        for op in program.ops:
            if op not in recipes:
                recipes[op] = target.recipe(op)
        doc = program.to_json()
        doc["kernels"] = [recipes[op].key for op in program.ops]
        doc["placements"] = [target.placement(op) for op in program.ops]
        docs[name] = doc
    runtime = target.recipe(None)
    plan = {"app": app.name, "device": device.name, "programs": docs, "runtime": runtime.key,
            "recipes": {r.key: r.to_json() for r in [*recipes.values(), runtime]},
            "meta": app.meta(), "profile": profile.dumps(),
            "requirements": target.requirements()}
    return plan, recipes


def write_planned(plan: dict[str, Any], app, out: Path, store: Store | None = None,
                  build: dict[str, Any] | None = None, key: bytes | None = None) -> Path:
    """Write the bundle ``plan`` (see ``plan_bundle``) describes into ``out``: its artifacts
    (compiled where the store lacks them), ``app``'s weights and files, the manifest.
    ``build`` (the selection it was built from: application, checkpoint, variables) is kept in
    the manifest so that a bundle can be rebuilt with one variable changed. The bundle is
    signed with ``key``, by default ``IRON_REMOTE_CACHE_KEY`` when it is set."""
    secret = key or signing_key()
    from safetensors.numpy import save_file

    from ..devices import device
    from ..targets import target_for
    from ..targets.base import Recipe

    # building needs no runtime: an npu bundle runs emulated
    target = target_for(device(plan["device"]))
    out = Path(out)
    recover(out)
    entries = target.compile_recipes(
        (Recipe.from_json(r) for r in plan["recipes"].values()), store)
    artifacts = {k: target.artifact(e) for k, e in entries.items()}
    kernel = {k: f"kernels/{k}{artifact.suffix}" for k, artifact in artifacts.items()}
    out.parent.mkdir(parents=True, exist_ok=True)
    with locked_temp_folder(out.parent, f".tmp-{out.name}-") as tmp:
        (tmp / "kernels").mkdir()
        for k, artifact in artifacts.items():
            shutil.copyfile(artifact, tmp / kernel[k])
        programs = {name: {**doc, "kernels": [kernel[k] for k in doc["kernels"]]}
                    for name, doc in plan["programs"].items()}
        weights = tmp / WEIGHTS

        def write_weights() -> None:
            save_file(dict(app.weights()), str(weights))
            os.chmod(weights, 0o666 & ~umask())  # safetensors writes it 0600

        digest = shared_weights(app, weights, write_weights)
        for name, src in app.files().items():
            shutil.copyfile(src, tmp / name)  # as the umask allows, not as src is
        (tmp / "profile.json").write_text(plan["profile"])
        files = {str(p.relative_to(tmp)): sha256_file(p)
                 for p in sorted(tmp.rglob("*")) if p.is_file()}
        manifest = {"format": FORMAT, "app": plan["app"], "device": plan["device"],
                    "programs": programs, "runtime": kernel[plan["runtime"]],
                    "meta": plan["meta"], "files": files, **plan["requirements"],
                    "weights": {"xxh3_128": digest, "size": weights.stat().st_size}}
        if build:
            manifest["build"] = build
        manifest["digest"] = manifest_digest(manifest)
        if secret is not None:
            manifest["signature"] = sign(secret, manifest["digest"])
        atomic_write_bytes(tmp / MANIFEST, json.dumps(manifest, indent=1).encode())
        # outside the manifest (which stays reproducible): lets `doit` skip re-hashing
        (tmp / STAMP).write_text(json.dumps(weights.stat().st_mtime_ns))
        swap_into_place(tmp, out)
    return out


#: Folder (under the build folder) of the weights files bundles share: bundles whose weights
#: are the same (they differ only in context, batch, device or -march) hold hard links to one
#: file here instead of a copy each.
WEIGHTS_POOL = "weights"


def shared_weights(app, dest: Path, write) -> str:
    """Put the application's weights at ``dest`` and return their xxh3: a hard link to the pool's
    file when one was written for the same ``app.weights_key()`` (what the weights depend on),
    the same ``iron/quant.py`` (the layout of quantized weights) and the same
    ``app.weights_sources()`` (the code that computes them: without it, a fixed conversion
    would keep serving the old weights), and is still as written (size and time), else
    ``write()`` then link the new file into the pool.  Without a key, or where hard links
    cannot be made (another file system), the file is written and not shared."""
    from ..paths import build_dir

    depends = app.weights_key()
    if depends is None:  # (``Application``'s default)
        write()
        return xxh3_file(dest)
    # the bytes of quantized weights are iron.quant's tiled layout: a change there is new weights
    code = sources_digest([QUANT_SOURCE, *app.weights_sources()])
    key = hashlib.sha256(json.dumps([app.name, depends, code], sort_keys=True).encode()
                         ).hexdigest()[:32]
    pool = build_dir() / WEIGHTS_POOL
    shared, index = pool / f"{key}.safetensors", pool / f"{key}.json"
    try:
        record = json.loads(index.read_text())
        st = shared.stat()
        if [st.st_size, st.st_mtime_ns] == [record["size"], record["mtime_ns"]]:
            os.link(shared, dest)
            return record["xxh3_128"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    write()
    digest = xxh3_file(dest)
    try:
        pool.mkdir(parents=True, exist_ok=True)
        tmp = pool / f".{key}.{os.getpid()}.tmp"
        tmp.unlink(missing_ok=True)
        os.link(dest, tmp)
        os.replace(tmp, shared)
        st = dest.stat()
        atomic_write_bytes(index, json.dumps({"xxh3_128": digest, "size": st.st_size,
                                              "mtime_ns": st.st_mtime_ns}).encode())
    except OSError:
        pass  # not shared: the bundle holds its own copy
    return digest


def collect_weights() -> int:
    """Remove the pool's weights files no bundle links to any more; how many were removed."""
    from ..paths import build_dir

    removed = 0
    for shared in (build_dir() / WEIGHTS_POOL).glob("*.safetensors"):
        try:
            if shared.stat().st_nlink == 1:
                shared.unlink()
                shared.with_suffix(".json").unlink(missing_ok=True)
                removed += 1
        except OSError:
            pass
    return removed


def manifest_digest(manifest: dict[str, Any]) -> str:
    """sha256 of the manifest's canonical JSON without its ``digest`` and ``signature``."""
    body = {k: v for k, v in manifest.items() if k not in ("digest", "signature")}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def sign(key: bytes, digest: str) -> str:
    """A manifest's signature: the HMAC-SHA256 of its digest."""
    return hmac.new(key, f"iron-bundle:{digest}".encode(), hashlib.sha256).hexdigest()


def check_signature(path: Path, manifest: dict[str, Any], key: bytes | None) -> None:
    """Refuse a bundle whose manifest is not signed with ``key`` (when there is one)."""
    if key is None:
        return
    signature = manifest.get("signature")
    if signature is None:
        raise BundleError(f"{path}: not signed, and IRON_REMOTE_CACHE_KEY is set: a bundle is "
                          "native code, so only bundles signed with the key are run; rebuild "
                          "it with the key set")
    if not (isinstance(signature, str) and re.fullmatch(r"[0-9a-f]{64}", signature)
            and hmac.compare_digest(signature, sign(key, manifest["digest"]))):
        raise BundleError(f"{path}: its signature does not verify with IRON_REMOTE_CACHE_KEY: "
                          "it was changed after it was signed, or signed with another key; "
                          "rebuild it")


def xxh3_file(path: Path) -> str:
    import xxhash

    with open(path, "rb") as f:
        return hashlib.file_digest(f, xxhash.xxh3_128).hexdigest()


def swap_into_place(new: Path, out: Path) -> None:
    """Replace ``out`` by ``new`` (two renames; ``recover`` undoes a kill between them)."""
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
    """An opened, checked bundle: its manifest, with paths resolved inside its folder."""

    path: Path
    manifest: dict[str, Any]

    @classmethod
    def open(cls, path: str | os.PathLike, verify: bool = False, flags=None,
             key: bytes | None = None) -> Bundle:
        """Open and check a bundle (see the module docstring); ``verify`` also re-hashes the
        weights now rather than as they are read; ``flags`` stand in for this host's CPU
        features; the signature is checked with ``key``, by default
        ``IRON_REMOTE_CACHE_KEY`` when it is set."""
        path = Path(path)
        recover(path)
        bundle = cls.checked(path, key)
        bundle.require_host(flags)
        if verify and xxh3_file(path / WEIGHTS) != bundle.manifest["weights"]["xxh3_128"]:
            raise BundleError(f"{path}: {WEIGHTS} does not match its manifest hash")
        return bundle

    @classmethod
    def checked(cls, path: Path, key: bytes | None = None) -> Bundle:
        """The bundle at ``path`` with its manifest, signature and files checked (the weights
        aside: they are hashed as they are read): the manifest read once, each file hashed
        once."""
        manifest = read_manifest(path)
        check_signature(path, manifest, key or signing_key())
        for name, digest in manifest["files"].items():
            file = path / name
            if not file.is_file():
                raise BundleError(f"{path}: {name} is missing")
            if name != WEIGHTS and sha256_file(file) != digest:
                raise BundleError(f"{path}: {name} does not match its manifest hash")
        return cls(path, manifest)

    def require_host(self, flags=None) -> None:
        """Refuse a host that lacks a CPU feature the kernels' -march level needs (``flags``
        stand in for this host's features)."""
        manifest = self.manifest
        missing = host.missing_features(manifest["isa"], flags)
        if missing:
            raise BundleError(
                f"{self.path}: built with -march={manifest['march']} on {manifest['cpu']}, it "
                f"needs CPU feature{'s' if len(missing) > 1 else ''} {', '.join(missing)}, "
                f"which this host ({host.model()}) lacks; rebuild it here, or build with "
                "march=x86-64-v3 for a bundle most x86-64 hosts run")

    @property
    def meta(self) -> dict[str, Any]:
        return self.manifest["meta"]

    def program(self, name: str) -> Program:
        try:
            doc = self.manifest["programs"][name]
        except KeyError:
            raise BundleError(f"{self.path / MANIFEST}: no program {name!r} (it has "
                              f"{', '.join(self.manifest['programs'])})") from None
        from ..program import Program

        try:
            return Program.from_json(doc)
        except (KeyError, TypeError, ValueError, IndexError, IronError) as e:
            raise BundleError(f"{self.path / MANIFEST}: program {name!r} is malformed "
                              f"({type(e).__name__}: {e})") from None

    def weights(self) -> dict[str, np.ndarray]:
        """The bundle's weights, read into huge pages (programs stream them on every call) and
        hashed as they are read."""
        from ..tensorfile import read_safetensors

        digest: list[str] = []
        weights = read_safetensors(self.path / WEIGHTS, digest=digest)
        if digest[0] != self.manifest["weights"]["xxh3_128"]:
            raise BundleError(f"{self.path}: {WEIGHTS} does not match its manifest hash (xxh3 "
                              f"{digest[0]}, manifest {self.manifest['weights']['xxh3_128']}); "
                              "the file is damaged or was changed: rebuild the bundle")
        return weights

    def target(self, emulate: bool = False):
        """The target that runs this bundle, refusing before any work what this machine
        cannot do: an npu bundle runs in the emulator (``emulate``) or on an NPU through XRT."""
        from ..devices import device
        from ..targets import target_for

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
                   program: Program | None = None, emulate: bool = False):
        """The program ``name`` loaded from the bundle's own files (no compiler needed);
        ``program``, when given, is that program with its tensors resized (the same steps);
        ``emulate`` runs an npu bundle in the emulator."""
        doc = self.manifest["programs"][name]
        program = self.program(name) if program is None else program
        if len(program.steps) != len(doc["kernels"]):
            raise BundleError(f"{self.path}: program {name!r} has {len(doc['kernels'])} "
                              f"kernels, the program given {len(program.steps)} steps")
        exe = self.target(emulate).executable(
            program, [self.path / k for k in doc["kernels"]], self.path / self.manifest["runtime"])
        exe.bind_weights(self.weights() if weights is None else weights)
        return exe

    def file(self, name: str) -> Path:
        return self.path / name


def check(path: Path) -> Bundle | None:
    """The bundle at ``path`` if it checks out as ``Bundle.checked`` would have it, the weights
    included (by size and time when those are as written, else by their hash), else None; the
    caller may run it without checking it again (after ``Bundle.require_host``)."""
    try:
        bundle = Bundle.checked(path)
        st, weights = (path / WEIGHTS).stat(), bundle.manifest["weights"]
        if st.st_size != weights["size"]:
            return None
        try:
            if json.loads((path / STAMP).read_text()) == st.st_mtime_ns:
                return bundle
        except (OSError, ValueError):
            pass
        return bundle if xxh3_file(path / WEIGHTS) == weights["xxh3_128"] else None
    except (BundleError, OSError):
        return None


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest of bundle ``path``, checked against ``FIELDS``, its digest and the rules
    for kernel paths and counts; any problem is a ``BundleError`` naming the field."""
    where = path / MANIFEST
    try:
        manifest = loads(read_bounded(where, "a bundle manifest"))
    except FileNotFoundError:
        raise BundleError(f"{path}: not a bundle (no {MANIFEST}); build one with `doit`") from None
    except (ValueError, OSError) as e:
        raise BundleError(f"{where}: damaged manifest ({e})") from None
    if not isinstance(manifest, dict):
        raise BundleError(f"{where}: damaged manifest (not a JSON object)")
    if manifest.get("format") != FORMAT:
        raise BundleError(f"{path}: bundle format {manifest.get('format')!r}, this iron reads "
                          f"format {FORMAT}; rebuild it")
    for field, kind in FIELDS.items():
        if field not in manifest:
            raise BundleError(f"{where}: field {field!r} is missing; rebuild the bundle")
        if type(manifest[field]) is not kind:
            raise BundleError(f"{where}: field {field!r} = {manifest[field]!r:.60} must be a "
                              f"{kind.__name__}")
    if manifest["digest"] != manifest_digest(manifest):
        raise BundleError(f"{where}: the manifest does not match its digest; it was edited or "
                          "damaged: rebuild the bundle")
    files = manifest["files"]
    for field, kind in WEIGHT_FIELDS.items():
        if type(manifest["weights"].get(field)) is not kind:
            raise BundleError(f"{where}: weights.{field} must be a {kind.__name__}")
    if WEIGHTS not in files:
        raise BundleError(f"{where}: files does not list {WEIGHTS}")
    for name in files:
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise BundleError(f"{where}: files lists {name!r}, a path outside the bundle")

    def kernel(value: Any, what: str) -> None:
        if not (isinstance(value, str) and KERNEL_PATH.fullmatch(value)):
            raise BundleError(f"{where}: {what} = {value!r:.80} is not a kernel of this bundle "
                              "(kernels/<key>.so)")
        if value not in files:
            raise BundleError(f"{where}: {what} = {value!r} is not among the bundle's files")

    kernel(manifest["runtime"], "runtime")
    for name, doc in manifest["programs"].items():
        if not (isinstance(doc, dict) and isinstance(doc.get("kernels"), list)
                and isinstance(doc.get("steps"), list)):
            raise BundleError(f"{where}: program {name!r} needs 'steps' and 'kernels' lists")
        if len(doc["kernels"]) != len(doc["steps"]):
            raise BundleError(f"{where}: program {name!r} has {len(doc['steps'])} steps but "
                              f"{len(doc['kernels'])} kernels; the counts must agree")
        for i, k in enumerate(doc["kernels"]):
            kernel(k, f"programs.{name}.kernels[{i}]")
    return manifest
