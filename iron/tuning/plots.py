"""One chart per tuned instance: each candidate's time with its spread, the chosen one marked.

Drawn from the tuning log after a run (matplotlib, the optional ``plots`` extra; without it the
report says so and nothing else changes).  Bars are the sweep's medians (the kernel alone), the
whiskers the interquartile range of its runs; the setting written is filled, the setting in use
before the run outlined.  A cost model's estimates are labelled as such: nothing ran.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable, Sequence

from ..operator import Operator
from .log import TuneLog


def _file_name(n: int, text: str) -> str:
    return f"{n:02d}-" + re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-")[:80] + ".png"


def draw(outcomes: Sequence, log_path: Path, method: str, key: Callable[[Operator], str],
         folder: Path, source: str = "measured") -> str:
    """Write the charts into ``folder``; what to tell the user (where they went, or why not)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "not drawn: matplotlib is not installed (pip install -e \".[plots]\")"
    log = TuneLog(log_path, method)
    log.close()
    folder.mkdir(parents=True, exist_ok=True)
    drawn = 0
    for n, o in enumerate(outcomes, 1):
        rows = []
        for op in candidates_of(o):
            record = log.get(key(op))
            if record is not None and record.ok:
                rows.append((op, record.median, record.spread or 0.0))
        if len(rows) < 2:
            continue
        rows.sort(key=lambda r: r[1])
        names = list(rows[0][0].tunable_values())
        labels = [", ".join(str(v) for v in op.tunable_values().values()) for op, _, _ in rows]
        times = [t * 1e6 for _, t, _ in rows]
        spreads = [t * s * 1e6 / 2 for _, t, s in rows]
        fig, ax = plt.subplots(figsize=(8, 0.25 * len(rows) + 1.5))
        colors = ["tab:green" if op == o.chosen else "lightgray" for op, _, _ in rows]
        edges = ["black" if op == o.instance.current else "none" for op, _, _ in rows]
        ax.barh(range(len(rows)), times, xerr=None if source == "model" else spreads,
                color=colors, edgecolor=edges, linewidth=1.2)
        ax.set_yticks(range(len(rows)), labels, fontsize=7)
        ax.set_ylabel(", ".join(names), fontsize=8)
        ax.set_xscale("log")  # a stalled candidate can be 1000x the others
        ax.invert_yaxis()
        what = "modelled time (cost model, nothing ran)" if source == "model" else \
            "time of the kernel alone, median and interquartile range (us)"
        ax.set_xlabel(what)
        gain = (f"; chosen {o.gain:.3f}x head-to-head" + (f" in {o.program}" if o.program else "")
                if o.gain and o.chosen != o.instance.current else "")
        ax.set_title(f"{o.instance.describe()} x{o.instance.uses}\n"
                     f"green: written, outlined: in use before{gain}", fontsize=8)
        fig.tight_layout()
        fig.savefig(folder / _file_name(n, o.instance.describe()), dpi=90)
        plt.close(fig)
        drawn += 1
    return f"{drawn} charts in {folder}"


def candidates_of(o) -> list[Operator]:
    """The instance's candidates as the tuner ordered them, and the setting in use."""
    return list(dict.fromkeys([*o.tried, o.instance.current]))
