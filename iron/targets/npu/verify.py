"""Check npu designs' generic MLIR against mlir-aie's op definitions.

    python -m iron.targets.npu.verify FILE...   # design.generic.mlir, or step files (a
                                                # bundle's kernels/*.json; host steps skipped)
    python -m iron.targets.npu.verify BUNDLE    # an npu bundle: every designed step's module
                                                # and every folded configuration's (``fold``)

Each file is parsed by xDSL with the transcription of mlir-aie's ODS in ``ods`` (``aie`` and
``aiex``) and xDSL's own ``builtin``, ``func``, ``arith`` and ``scf``, then verified: an
unknown op, a missing or misspelled property, a property of the wrong kind (a device given as
a string, an ``i64`` where ODS says ``AIEI32Attr``, a dense array where it says
``I64ArrayAttr``), a value outside its enum or confinement, wrong operand counts or types, a
missing terminator, or a ``func.call`` whose callee is not declared in the device, are each
an error.  Then every ``aie.device`` is checked against what mlir-aie's verifiers and passes
require before they run (``preconditions``: tile coordinates and kinds from the target
model, links, descriptors and memory per tile as the object FIFO lowering allocates them,
every issued token waited on), each problem ending with the rule's name in brackets.  The
text is checked as written: xDSL takes op names with dots, a type and an op of the same name,
and properties (``<{...}>``), so no rewrite precedes the check.  The custom form
(``design.mlir``) is not checked: its parsers are mlir-aie's C++ (``custom<...>`` directives).

Exit status 0 when every file verifies; otherwise 1, and the first problem on stderr as
``FILE:LINE: message``.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path


@functools.lru_cache(maxsize=1)
def context():
    from xdsl.context import Context
    from xdsl.dialects import arith, builtin, func, memref, scf

    from .ods import AIE, AIEX

    ctx = Context()
    for dialect in (builtin.Builtin, func.Func, arith.Arith, scf.Scf, memref.MemRef, AIE, AIEX):
        ctx.load_dialect(dialect)
    return ctx


class Problem(Exception):
    """The first thing wrong with a module: where and what."""


def _line_of(text: str, op, module) -> int:
    """The line of ``op``: the k-th occurrence of its name in the text, k its rank among
    ops of that name in the parsed module (xDSL keeps no source locations)."""
    rank = 0
    for other in module.walk():
        if other is op:
            break
        rank += other.name == op.name
    start = -1
    for _ in range(rank + 1):
        start = text.find(f'"{op.name}"', start + 1)
        if start < 0:
            return 0
    return text.count("\n", 0, start) + 1


def check_text(text: str, name: str = "<text>") -> None:
    """Raise ``Problem`` naming the first problem of ``text`` (a generic-form module)."""
    from xdsl.parser import Parser
    from xdsl.utils.exceptions import ParseError, VerifyException

    from .preconditions import RULES, devices

    try:
        module = Parser(context(), text, name).parse_module()
    except ParseError as e:
        line = text.count("\n", 0, e.span.start) + 1
        raise Problem(f"{name}:{line}: {e.msg}") from None
    for op in module.walk():
        try:
            op.verify(verify_nested_ops=False)
        except (VerifyException, ValueError) as e:
            message = str(e).splitlines()[0]
            raise Problem(f"{name}:{_line_of(text, op, module)}: '{op.name}': {message}"
                          ) from None
    try:
        found = list(devices(module))
    except ValueError as e:
        raise Problem(f"{name}: {e}") from None
    for device in found:
        for rule in RULES:
            for v in rule(device):
                raise Problem(f"{name}:{_line_of(text, v.op, module)}: '{v.op.name}': "
                              f"{v.message} [{rule.__name__}]")


def module_text(path: Path) -> str | None:
    """A generic-form module from a ``.mlir`` file or from a step file's ``mlir_generic``;
    None for a step placed on the host (it has no design)."""
    if path.suffix == ".json":
        doc = json.loads(path.read_text())
        if doc.get("placement") == "host":
            return None
        if "mlir_generic" not in doc:
            raise Problem(f"{path}: not an npu step file (no 'mlir_generic')")
        return doc["mlir_generic"]
    return path.read_text()


def bundle_modules(path: Path):
    """(label, generic module) of every designed step of an npu bundle, each once, then of
    every folded configuration of each of its programs, as its executables fold them."""
    from ...errors import IronError
    from ...pipeline.bundle import read_manifest
    from .fold import render
    from .foldfiles import bundle_folds

    try:
        manifest = read_manifest(path)
        seen: set[str] = set()
        for doc in manifest["programs"].values():
            for k in doc["kernels"]:
                if k not in seen:
                    seen.add(k)
                    text = module_text(path / k)
                    if text is not None:
                        yield str(path / k), text
        for program, fold in bundle_folds(path):
            yield f"{path} program {program} {fold.name}", render(fold, generic=True)
    except IronError as e:
        raise Problem(str(e)) from None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print("usage: python -m iron.targets.npu.verify FILE...", file=sys.stderr)
        return 2
    skipped = checked = 0
    for name in argv:
        try:
            if Path(name).is_dir():
                for label, text in bundle_modules(Path(name)):
                    check_text(text, label)
                    checked += 1
                continue
            text = module_text(Path(name))
            if text is None:
                skipped += 1
                continue
            check_text(text, name)
            checked += 1
        except Problem as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        except (OSError, ValueError) as e:
            print(f"error: {name}: {e}", file=sys.stderr)
            return 1
    print(f"{checked} module(s) verify against {_upstream()}"
          + (f" ({skipped} host-placed step(s) have none)" if skipped else ""))
    return 0


def _upstream() -> str:
    from .ods import UPSTREAM

    return UPSTREAM


if __name__ == "__main__":
    sys.exit(main())
