"""``iron``: the command the package installs, with llama.cpp's and ollama's habits.

    iron run [MODEL] -p "The capital of France is" -n 8   # complete a prompt
    iron chat [MODEL] [-s SYSTEM]                        # a conversation (or -p: one answer)
    iron serve [MODEL] --slots 4                         # the OpenAI-compatible server
    iron tune [--device npu2 ...]                        # tune the Llama application
    iron list                                            # bundles and checkpoints, sizes

MODEL is a bundle folder (``build/llama/cpu``), a Hugging Face checkpoint folder or a ``.gguf``
file; without one, the embedded SmolLM2-135M-Instruct.  A MODEL that is not built yet is built
through the same doit graph ``doit`` runs (the same state file and artifact cache, one progress
line) and reused afterwards.  ``-c N`` chooses the context: a bundle for N positions is built
once, sharing its weights file with the model's other bundles; on a bundle that already holds
N positions or more, the run is only held to N.  ``python -m iron.lm.run`` / ``iron.lm.serve``
take a bundle folder and do the same as ``run`` / ``serve`` without building.
"""

from __future__ import annotations

import argparse
import signal
import sys
from contextlib import redirect_stdout
from pathlib import Path

from typing import TYPE_CHECKING

from .errors import IronError
from .jsonfile import loads

if TYPE_CHECKING:  # the bundle module loads only when a model is resolved
    from .pipeline.bundle import Bundle

APP = "llama"


class BuildFailed(IronError):
    """The build of MODEL failed; doit has said why (so ``main`` adds nothing)."""


MODEL_HELP = ("a bundle folder, a Hugging Face checkpoint folder or a .gguf file (default: "
              "the embedded SmolLM2-135M-Instruct)")
TRUST = ("A bundle is native code: its kernels are shared libraries loaded into this process. "
         "Trust a bundle as you would a wheel, and run only those you built or got from someone "
         "you trust. With IRON_REMOTE_CACHE_KEY set, bundles are signed with it when built, and "
         "one that is not signed with it, or was changed after signing, is refused before any "
         "of its code is loaded.")


def build_options(p: argparse.ArgumentParser, context: bool = True, model: bool = True) -> None:
    """What selects the bundle MODEL runs as: doit's variables, as flags."""
    if model:
        p.add_argument("model", nargs="?", default=None, metavar="MODEL", help=MODEL_HELP)
    if context:
        p.add_argument("-c", "--ctx-size", type=int, default=None, metavar="N",
                       help="context positions (default: the checkpoint's own, or what fits "
                            "memory); a bundle for N is built once, sharing the weights")
    p.add_argument("--device", default=None, help="cpu (default), npu1 or npu2")
    p.add_argument("--weights", default=None, help="native (default: the checkpoint's own "
                   "formats), bf16 or uint4")
    p.add_argument("--batch", default=None, help="most sequences one batched decode step runs")
    p.add_argument("--march", default=None, help="-march level of the cpu kernels")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="print every build task and compile line")


def selection(args: argparse.Namespace) -> tuple[dict[str, str], Bundle | None]:
    """The doit variables MODEL and the flags select, and the bundle to run as it is when no
    build is needed (a bundle folder that already holds what was asked), opened and checked
    once."""
    given = {name: str(value) for name, value in (
        ("device", args.device), ("weights", args.weights), ("batch", args.batch),
        ("march", args.march)) if value is not None}
    context = getattr(args, "ctx_size", None)
    model = Path(args.model).expanduser() if args.model else None
    if model is None:
        variables = {}
    elif (model / "manifest.json").is_file():
        if not given:
            from .pipeline.bundle import Bundle

            bundle = Bundle.open(model)
            if context is None or context <= bundle_positions(bundle):
                return {}, bundle  # the run is held to -c N, if given, at run time
        variables = rebuild_variables(model)
    elif model.is_dir() and (model / "config.json").is_file():
        variables = {"checkpoint": str(model.resolve())}
    elif model.is_file() and model.suffix.lower() == ".gguf":
        variables = {"checkpoint": str(model.resolve())}
    elif not model.exists():
        raise IronError(f"{model}: no such file or folder; MODEL is a bundle folder, a "
                        "checkpoint folder (config.json) or a .gguf file")
    else:
        raise IronError(f"{model}: not a bundle (manifest.json), a checkpoint folder "
                        "(config.json) nor a .gguf file")
    variables.update(given)
    if context is not None:
        variables["context"] = str(context)
    variables["app"] = variables.get("app", APP)
    return variables, None


def bundle_positions(bundle: Bundle) -> int:
    return int(bundle.meta.get("context", 0))


def rebuild_variables(bundle: Path) -> dict[str, str]:
    """The doit variables a bundle was built from (its manifest keeps them), to build its
    sibling with one of them changed."""
    from .pipeline.bundle import read_manifest

    build = read_manifest(bundle).get("build")
    if not isinstance(build, dict) or not isinstance(build.get("variables"), dict):
        raise IronError(f"{bundle}: its manifest does not say what it was built from (built "
                        "before iron recorded it); give the checkpoint as MODEL instead")
    variables = {str(k): str(v) for k, v in build["variables"].items()}
    for name in ("app", "device", "checkpoint", "march"):
        if isinstance(build.get(name), str):
            variables[name] = build[name]
    return variables


def ensure_bundle(variables: dict[str, str], verbose: bool = False) -> Bundle:
    """The bundle of ``variables``, built through the doit graph when it is missing or out of
    date (doit's output goes to stderr: standard output is the model's), opened: the bundle
    the ``bundle`` task's up-to-date check already checked is not read or hashed again."""
    from doit.cmd_base import ModuleTaskLoader
    from doit.doit_cmd import DoitMain

    from .pipeline.bundle import Bundle
    from .pipeline.buildrun import BuildRun
    from .pipeline.tasks import dodo_namespace

    if verbose:
        variables = {**variables, "verbose": "1"}
    run = BuildRun(report_current=verbose)  # an up-to-date bundle is used without a word
    try:
        with redirect_stdout(sys.stderr):
            namespace = dodo_namespace(variables, run)
            namespace["DOIT_CONFIG"] = {**namespace["DOIT_CONFIG"], "outfile": sys.stderr}
            code = DoitMain(ModuleTaskLoader(namespace)).run(["bundle"])
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if code != 0:
        raise BuildFailed(f"the build of {run.bundle_dir} failed (exit status {code})")
    if run.checked is not None and not run.bundle_written:
        run.checked.require_host()
        return run.checked
    return Bundle.open(namespace["graph"].bundle_dir)


def resolve(args: argparse.Namespace) -> Bundle:
    variables, bundle = selection(args)
    if bundle is not None:
        return bundle
    return ensure_bundle(variables, args.verbose)


# ---- subcommands ------------------------------------------------------------------------------

def cmd_run(args, parse, chat: bool = False) -> int:
    from .lm import run

    bundle = resolve(args)
    args.bundle = str(bundle.path)
    args.chat = args.chat or chat
    if args.ctx_size is not None and args.ctx_size > bundle_positions(bundle):
        args.ctx_size = None  # built for it
    return run.run(args, parse, bundle)


def cmd_serve(args, rest: list[str]) -> int:
    from .lm import serve

    return serve.main([str(resolve(args).path), *rest])


def cmd_tune(rest: list[str]) -> int:
    from .tuning.__main__ import main

    if not rest or rest[0].startswith("-"):
        rest = [APP, *rest]
    return main(rest, prog="iron tune")


def cmd_list() -> int:
    """Bundles and checkpoints under the build folder, with their sizes on disk (a weights
    file several bundles share counted once, where it is first listed)."""
    from .paths import build_dir

    root = build_dir()
    seen: set[tuple[int, int]] = set()

    def size(folder: Path) -> int:
        total = 0
        for p in folder.rglob("*"):
            try:
                st = p.lstat()
            except OSError:
                continue
            if p.is_file() and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
        return total

    rows = []
    for manifest in sorted(root.glob("*/*/manifest.json")):
        folder = manifest.parent
        try:
            doc = loads(manifest.read_text())
            if not isinstance(doc, dict) or "programs" not in doc:
                continue  # an artifact cache entry, not a bundle
            meta = doc.get("meta", {})
            what = (f"{doc.get('app')} on {doc.get('device')}: {meta.get('model_name', '')}, "
                    f"context {meta.get('context', '?')}, weights {meta.get('weights', '?')}")
        except (OSError, ValueError, AttributeError):
            what = "damaged manifest"
        rows.append((str(folder), size(folder), what))
    for folder in sorted((root / "checkpoints").glob("*")):
        if folder.is_dir():
            source = ""
            try:
                source = loads((folder / "iron-manifest.json").read_text())["source"]["file"]
            except (OSError, ValueError, KeyError, TypeError):
                pass
            rows.append((str(folder), size(folder),
                         f"checkpoint{f' from {source}' if source else ''}"))
    if not rows:
        print(f"nothing built under {root} yet: `iron run` or `doit` builds the default model")
        return 0
    width = max(len(r[0]) for r in rows)
    for path, nbytes, what in rows:
        print(f"{path:<{width}}  {nbytes / 1e6:8.1f} MB  {what}")
    print(f"{'total':<{width}}  {sum(r[1] for r in rows) / 1e6:8.1f} MB  (a file shared by "
          "hard links counted once)")
    return 0


def parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    from .lm.run import add_flags

    top = argparse.ArgumentParser(prog="iron", description=__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = top.add_subparsers(dest="command", metavar="COMMAND")
    parsers = {}
    for name, help in (("run", "generate text from a prompt (-p, -f or standard input)"),
                       ("chat", "a conversation in the checkpoint's chat template")):
        p = sub.add_parser(name, help=help, description=help, epilog=TRUST)
        build_options(p, context=False)
        add_flags(p)
        parsers[name] = p
    serve = sub.add_parser("serve", help="the OpenAI-compatible server (other flags: "
                           "python -m iron.lm.serve --help)", add_help=False,
                           usage="iron serve [MODEL] [options] [server options]",
                           description=f"MODEL (first, if given): {MODEL_HELP}", epilog=TRUST)
    build_options(serve, model=False)
    parsers["serve"] = serve
    sub.add_parser("tune", help="tune the application's operators (flags: iron tune --help)",
                   add_help=False)
    sub.add_parser("list", help="bundles and checkpoints with their sizes")
    return top, parsers


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    top, parsers = parser()
    try:
        if argv and argv[0] == "tune":
            return cmd_tune(argv[1:])
        if argv and argv[0] == "serve":
            if any(a in ("-h", "--help") for a in argv[1:]):
                parsers["serve"].print_help()
                from .lm import serve

                return serve.main(["--help"])
            model = argv[1] if len(argv) > 1 and not argv[1].startswith("-") else None
            args, rest = parsers["serve"].parse_known_args(argv[2 if model else 1:])
            args.model = model
            return cmd_serve(args, rest)
        args = top.parse_args(argv)
        if args.command is None:
            top.print_help()
            return 2
        if args.command == "list":
            return cmd_list()
        return cmd_run(args, parsers[args.command], chat=args.command == "chat")
    except BuildFailed:
        return 2  # doit said why, in one line
    except IronError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
