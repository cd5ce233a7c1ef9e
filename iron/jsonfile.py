"""JSON from files users hand iron, refused in one line when nested beyond ``MAX_DEPTH``.

Python's ``json`` parser recurses once per nested array or object, so a file of 100,000 ``[``
ends in a ``RecursionError`` traceback wherever it is read (a safetensors header, config.json,
tokenizer_config.json, generation_config.json, a profile, a bundle manifest).  The nesting is
measured first, without recursion: strings are blanked (a bracket inside one does not count)
and the running count of brackets is summed (by numpy when there are many: it is imported
only then, so that a no-op ``doit`` reading its small records does not load it).  Real files
nest a few levels (a safetensors header 3, a profile 3, a model config 4), far below the
limit::

    data = loads(text)                        # ValueError subclass if nested beyond the limit
    data = read_json(path, "a model config")  # read_bounded + loads
"""

from __future__ import annotations

import itertools
import json
import os
import re
from typing import Any

from .util import MAX_USER_FILE, read_bounded

#: The deepest nesting of arrays and objects iron parses; ``json`` would recurse this deep.
MAX_DEPTH = 64

# a JSON string (escapes included), matched possessively: no backtracking over its characters
_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}
_FEW = 1 << 16  # brackets summed in Python up to here


class JSONDepthError(ValueError):
    """A JSON text nested beyond the limit: a ``ValueError``, so every reader that reports
    malformed JSON in one line reports this the same way."""


def depth(text: str | bytes) -> int:
    """How deeply ``text``'s arrays and objects nest (for valid JSON; for anything else a
    number no smaller than what ``json`` would recurse through before it fails)."""
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    brackets = _STRING.sub(b'""', raw).translate(None, _NOT_BRACKETS)
    if not brackets:
        return 0
    if len(brackets) <= _FEW:
        return max(itertools.accumulate(_STEP[c] for c in brackets))
    import numpy as np

    codes = np.frombuffer(brackets, np.uint8)
    steps = np.where((codes == ord("[")) | (codes == ord("{")), 1, -1).astype(np.int8)
    return int(np.cumsum(steps, dtype=np.int64).max())


def check_depth(text: str | bytes, limit: int = MAX_DEPTH) -> None:
    """``JSONDepthError`` if ``text`` nests deeper than ``limit``."""
    found = depth(text)
    if found > limit:
        raise JSONDepthError(f"arrays and objects nest {found} levels deep; iron reads JSON "
                             f"nested at most {limit} levels")


def loads(text: str | bytes, limit: int = MAX_DEPTH, **options: Any) -> Any:
    """``json.loads(text, **options)`` once the nesting is checked against ``limit``."""
    check_depth(text, limit)
    return json.loads(text, **options)


def read_json(path: str | os.PathLike, what: str, size: int = MAX_USER_FILE,
              **options: Any) -> Any:
    """A JSON file read with ``read_bounded`` (a regular file of at most ``size`` bytes; an
    ``OSError`` otherwise) and parsed with ``loads`` (a ``ValueError`` if malformed or nested
    too deeply)."""
    return loads(read_bounded(path, what, size), **options)
