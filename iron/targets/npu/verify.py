"""Check npu designs' MLIR against mlir-aie's op definitions and its lowering's preconditions.

    python -m iron.targets.npu.verify FILE...   # design.generic.mlir or design.mlir, or step
                                                # files (a bundle's kernels/*.json, with
                                                # their context buckets' designs; host
                                                # steps skipped)
    python -m iron.targets.npu.verify BUNDLE    # an npu bundle: every designed step's module
                                                # (context buckets' too) and every folded
                                                # configuration's (``fold``; each context
                                                # bucket's too)

Each module is parsed by xDSL with the transcription of mlir-aie's ODS in ``ods`` (``aie``
and ``aiex``) and xDSL's own ``builtin``, ``func``, ``arith``, ``scf`` and ``memref``, then
verified: an unknown op, a missing or misspelled property, a property of the wrong kind (a
device given as a string, an ``i64`` where ODS says ``AIEI32Attr``, a dense array where it
says ``I64ArrayAttr``), a value outside its enum or confinement, wrong operand counts or
types, a missing terminator, or a ``func.call`` whose callee is not declared in the device,
are each an error.  Then every ``aie.device`` is checked against what mlir-aie's verifiers
and passes require before they run (``preconditions``: tile coordinates and kinds from the
target model, links, descriptors and memory per tile as the object FIFO lowering allocates
them, every issued token waited on, each FIFO's buffer rotation whole in every loop the
static lowering leaves repeating: ``rotation``), each problem ending with the rule's name in
brackets.
The generic text is checked as written: xDSL takes op names with dots, a type and an op of
the same name, and properties (``<{...}>``), so no rewrite precedes the check.

The custom form (``design.mlir``, what aiecc reads) is read with the assembly formats of
mlir-aie's ops (``custom``); where a step file or a bundle has both forms, the custom one
must read as the same module as the generic one, op by op ("[custom_form]" otherwise).

Exit status 0 when every file verifies; otherwise 1, and the first problem on stderr as
``FILE:LINE: message``.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
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


def is_generic(text: str) -> bool:
    return text.lstrip().startswith('"builtin.module"')


def _line_of(text: str, op, module) -> int:
    """The line of ``op``: the k-th occurrence of its name in the text, k its rank among
    ops of that name in the parsed module (xDSL keeps no source locations); the name is
    quoted in generic form and followed by a space or a parenthesis in custom form."""
    rank = 0
    for other in module.walk():
        if other is op:
            break
        rank += other.name == op.name
    pattern = (re.escape(f'"{op.name}"') if is_generic(text)
               else rf"(?<![\w.]){re.escape(op.name)}[ (]")
    found = list(itertools.islice(re.finditer(pattern, text), rank + 1))
    if len(found) <= rank:
        return 0
    return text.count("\n", 0, found[rank].start()) + 1


def _written_line(text: str, op, module) -> int:
    """The line of ``op``, or of the nearest op before it that is written out (an implicit
    terminator is not)."""
    ops = list(module.walk())
    for other in reversed(ops[:ops.index(op) + 1]):
        line = _line_of(text, other, module)
        if line:
            return line
    return 0


def parse(text: str, name: str):
    """The module of ``text``, generic or custom form (``custom``), or ``Problem``."""
    from xdsl.parser import Parser
    from xdsl.utils.exceptions import ParseError

    from . import custom

    try:
        return Parser(context() if is_generic(text) else custom.context(), text,
                      name).parse_module()
    except ParseError as e:
        line = text.count("\n", 0, e.span.start) + 1
        raise Problem(f"{name}:{line}: {e.msg}") from None


def violations(text: str, rules) -> list[str]:
    """The messages of ``rules`` (functions over a parsed ``aie.device``, as
    ``preconditions.RULES``' are) on a module, for checking rules not yet in that table."""
    from .preconditions import devices

    module = parse(text, "<text>")
    return [v.message for d in devices(module) for rule in rules for v in rule(d)]


def check_text(text: str, name: str = "<text>", custom_text: str | None = None) -> None:
    """Raise ``Problem`` naming the first problem of ``text`` (a module in generic or custom
    form); with ``custom_text``, also unless that custom form reads as the same module."""
    from xdsl.utils.exceptions import VerifyException

    from .custom import difference
    from .preconditions import RULES, devices

    module = parse(text, name)
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
    if custom_text is not None:
        label = f"{name} (custom form)"
        ours = parse(custom_text, label)
        found = difference(ours, module)
        if found:
            op, message = found
            raise Problem(f"{label}:{_written_line(custom_text, op, ours)}: '{op.name}' "
                          f"{message} [custom_form]")


def module_texts(path: Path) -> list[tuple[str, str, str | None]]:
    """(label, generic form, custom form or None) of the modules in a ``.mlir`` file (either
    form) or a step file: its ``mlir_generic`` and ``mlir``, then each context bucket's
    (``buckets``); none for a step placed on the host (it has no design)."""
    if path.suffix != ".json":
        return [(str(path), path.read_text(), None)]
    doc = json.loads(path.read_text())
    if doc.get("placement") == "host":
        return []
    if "mlir_generic" not in doc:
        raise Problem(f"{path}: not an npu step file (no 'mlir_generic')")
    return [(str(path), doc["mlir_generic"], doc.get("mlir")),
            *((f"{path} bucket {b['positions']}", b["mlir_generic"], b.get("mlir"))
              for b in doc.get("buckets", ()))]


def bundle_modules(path: Path):
    """(label, generic module, custom module) of every designed step of an npu bundle, each
    once, then of every folded configuration of each of its programs, as its executables
    fold them, then of every fold a context bucket changes, at that bucket."""
    from ...errors import IronError
    from ...pipeline.bundle import read_manifest
    from .fold import render
    from .foldfiles import bucket_folds, bundle_folds

    try:
        manifest = read_manifest(path)
        seen: set[str] = set()
        for doc in manifest["programs"].values():
            for k in doc["kernels"]:
                if k not in seen:
                    seen.add(k)
                    yield from module_texts(path / k)
        for program, fold in bundle_folds(path):
            yield (f"{path} program {program} {fold.name}", render(fold, generic=True),
                   render(fold))
        for program, fold, whole in bucket_folds(path):
            yield (f"{path} program {program} {fold.name}", render(fold, generic=True),
                   render(fold))
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
                for label, text, custom_text in bundle_modules(Path(name)):
                    check_text(text, label, custom_text)
                    checked += 1
                continue
            texts = module_texts(Path(name))
            skipped += not texts
            for label, text, custom_text in texts:
                check_text(text, label, custom_text)
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
