"""What a tuning run prints at the end: where the profile went and the table of what moved."""

from __future__ import annotations

from typing import Mapping, TextIO

def setting_text(setting: Mapping[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in setting.items())


def changes_text(old: Mapping[str, int], new: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {old.get(k)} -> {v}" for k, v in new.items() if old.get(k) != v)


def report(result, out: TextIO) -> None:
    """The closing summary: where the profile went, the table of what moved, and last the
    whole-model A/B lines (when the programs were run)."""
    state = "complete" if result.complete else "stopped by the budget; re-run to continue"
    done = "ranked by the cost model" if result.source == "model" else "measured"
    where = (f"wrote {result.path} ({len(result.profile)} entries)" if result.written else
             f"did NOT write {result.path}: the whole-model A/B found the model slower")
    print(f"\n{where} in {result.seconds:.0f} s, {result.measured_now} candidates {done} this "
          f"run; tuning {state}", file=out)
    if result.source == "model":
        print("source: model. Nothing was run: every time above, and every gain below, is the "
              "target's cost model's estimate; the log's records say \"source\": \"model\"",
              file=out)
    elif result.pruned:
        print(f"pruned by the cost model: {result.pruned} candidates per instance and the setting "
              f"in use, {sum(o.total for o in result.outcomes)} of {result.legal} legal "
              "settings; --full measures them all"
              + (f" ({result.unpriced} instances without an estimate were measured in full)"
                 if result.unpriced else ""), file=out)
    if result.plots:
        print(f"charts: {result.plots}", file=out)
    held = sum(o.gain is not None and o.chosen == o.instance.current for o in result.outcomes)
    if held:
        print(f"{held} instances kept their setting: " + (
            "the model predicts the sweep's fastest less than the gain a move needs"
            if result.source == "model" else "the sweep's fastest did not beat it "
            "head-to-head"), file=out)
    if not result.moved:
        print("nothing moved against the previous profile", file=out)
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
        print(f"{len(rows)} instances moved:", file=out)
        for r in [head, *rows]:
            print("  " + "  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip(), file=out)
    if result.verdict is not None:
        for line in result.verdict.lines:
            print(line, file=out)
    elif result.source == "measured":
        print("whole model: not measured (no runner for the application's programs: the "
              "benchmark ran elsewhere or the application gives no weights)", file=out)
