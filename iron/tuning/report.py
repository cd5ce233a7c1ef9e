"""What a tuning run says at the end: where the profile went and the table of what moved."""

from __future__ import annotations

from typing import Mapping


def setting_text(setting: Mapping[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in setting.items())


def changes_text(old: Mapping[str, int], new: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {old.get(k)} -> {v}" for k, v in new.items() if old.get(k) != v)


def report_lines(result) -> list[str]:
    """The closing summary: where the profile went, the table of what moved, and last the
    whole-model A/B lines (when the programs were run)."""
    lines: list[str] = []
    state = "complete" if result.complete else "stopped by the budget; re-run to continue"
    done = "ranked by the cost model" if result.source == "model" else "measured"
    where = (f"wrote {result.path} ({len(result.profile)} entries)" if result.written else
             f"did NOT write {result.path}: the whole-model A/B found the model slower")
    lines.append(f"\n{where} in {result.seconds:.0f} s, {result.measured_now} candidates "
                 f"{done} this run; tuning {state}")
    if result.source == "model":
        lines.append("source: model. Nothing was run: every time above, and every gain below, "
                     "is the target's cost model's estimate; the log's records say "
                     "\"source\": \"model\"")
    elif result.pruned:
        lines.append(f"pruned by the cost model: {result.pruned} candidates per instance and "
                     f"the setting in use, {sum(o.total for o in result.outcomes)} of "
                     f"{result.legal} legal settings; --full measures them all"
                     + (f" ({result.unpriced} instances without an estimate were measured in "
                        "full)" if result.unpriced else ""))
    if result.plots:
        lines.append(f"charts: {result.plots}")
    held = sum(o.gain is not None and o.chosen == o.instance.current for o in result.outcomes)
    if held:
        lines.append(f"{held} instances kept their setting: " + (
            "the model predicts the sweep's fastest less than the gain a move needs"
            if result.source == "model" else "the sweep's fastest did not beat it "
            "head-to-head"))
    if not result.moved:
        lines.append("nothing moved against the previous profile")
    else:
        model = result.source == "model"
        rows = [(m.instance, changes_text(m.old, m.new),
                 f"{m.old_time * 1e6:.1f} -> {m.new_time * 1e6:.1f} us" if m.old_time else
                 f"? -> {m.new_time * 1e6:.1f} us",
                 (f"{m.gain:.3f}x" + (f" ({m.program})" if m.program else " (kernel alone)")
                  if not model else f"{m.gain:.2f}x") if m.gain
                 else "the old setting was rejected")
                for m in result.moved]
        head = ("instance", "old -> new", "time (modelled)" if model else "time (sweep, alone)",
                "modelled gain" if model else "gain (head-to-head)")
        widths = [max(len(r[c]) for r in [head, *rows]) for c in range(4)]
        lines.append(f"{len(rows)} instances moved:")
        for r in [head, *rows]:
            lines.append("  " + "  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip())
    if result.verdict is not None:
        lines.extend(result.verdict.lines)
    elif result.source == "measured":
        lines.append("whole model: not measured (no runner for the application's programs: "
                     "the benchmark ran elsewhere or in-program head-to-heads were off)")
    return lines
