"""The values each tunable's macro may take, as the cpu kernel sources state them.

A kernel states a macro's range once, in the source that uses it, on a line
``range IRON_<FIELD> LOW HIGH`` inside a comment; ``iron_cpu.h`` states the range of every
macro no kernel narrows (``range IRON_* ...``: an int).  ``range_rules`` turns them into rules
the resolver checks with the operator's own, so a profile's ``prefetch: 2**70`` is refused
with its entry, its value and the range before anything is compiled, instead of reaching gcc
as a literal it truncates to 0.
"""

from __future__ import annotations

import functools
import re
from typing import Iterator

from ...errors import CompileError
from ...operator import Operator, Rule, rule
from .build import SOURCE_DIR

_RANGE = re.compile(r"^[\s/*]*range (IRON_\*|IRON_[A-Z0-9_]+) (-?\d+) (-?\d+)\b", re.M)
ANY = "IRON_*"


@functools.cache
def stated_ranges() -> dict[str, tuple[int, int, str]]:
    """Macro -> (lowest, highest, the source stating it), read from the kernel sources; a
    macro stated twice is an error (its range has one home)."""
    ranges: dict[str, tuple[int, int, str]] = {}
    for path in sorted(SOURCE_DIR.glob("*.[ch]")):
        for macro, low, high in _RANGE.findall(path.read_text(encoding="utf-8")):
            if macro in ranges:
                raise CompileError(f"{path.name}: states the range of {macro} that "
                                   f"{ranges[macro][2]} already states; keep one")
            ranges[macro] = (int(low), int(high), path.name)
    if ANY not in ranges:
        raise CompileError(f"no kernel source in {SOURCE_DIR} states 'range {ANY} LOW HIGH'")
    return ranges


def range_rules(op: Operator) -> Iterator[Rule]:
    """One rule per set tunable: its value within its macro's stated range."""
    ranges = stated_ranges()
    for name in op.tunables():
        value = getattr(op, name)
        if value is None:
            continue
        macro = f"IRON_{name.upper()}"
        low, high, source = ranges.get(macro, ranges[ANY])
        yield rule(low <= value <= high, name,
                   f"{low} <= {name} <= {high} (the range {source} states for {macro})")
