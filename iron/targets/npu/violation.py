"""One broken precondition of a parsed module, what every rule of ``preconditions`` yields (the
static FIFO rotation rule, in ``rotation``, among them): here, below both."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # xdsl is the npu extra's: a cpu-only install imports the rotation rule too
    from xdsl.ir import Operation


@dataclass(frozen=True)
class Violation:
    """One broken precondition: the op at fault and a one-line message naming the value."""

    op: Operation
    message: str
