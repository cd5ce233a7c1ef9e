"""What a tuning run prints at the end: where the profile went and the table of what moved."""

from __future__ import annotations

from typing import Mapping, TextIO

def setting_text(setting: Mapping[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in setting.items())


def changes_text(old: Mapping[str, int], new: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {old.get(k)} -> {v}" for k, v in new.items() if old.get(k) != v)


def report(result, out: TextIO) -> None:
    """The closing summary: where the profile went and the table of what moved."""
    state = "complete" if result.complete else "stopped by the budget; re-run to continue"
    done = "ranked by the cost model" if result.source == "model" else "measured"
    print(f"\nwrote {result.path} ({len(result.profile)} entries) in {result.seconds:.0f} s, "
          f"{result.measured_now} candidates {done} this run; tuning {state}", file=out)
    if result.source == "model":
        print("source: model. Nothing was run: every time above is the target's cost model's "
              "estimate, and the log's records say \"source\": \"model\"", file=out)
    elif result.pruned:
        print(f"pruned by the cost model: {result.pruned} candidates per instance and the setting "
              f"in use, {sum(o.total for o in result.outcomes)} of {result.legal} legal "
              "settings; --full measures them all", file=out)
    held = sum(o.gain is not None and o.chosen == o.instance.current for o in result.outcomes)
    if held:
        print(f"{held} instances kept their setting: the sweep's fastest did not beat it "
              "head-to-head", file=out)
    if not result.moved:
        print("nothing moved against the previous profile", file=out)
        return
    rows = [(m.instance, changes_text(m.old, m.new),
             f"{m.old_time * 1e6:.1f} -> {m.new_time * 1e6:.1f} us" if m.old_time else
             f"? -> {m.new_time * 1e6:.1f} us",
             (f"{m.gain:.2f}x" + (" (model)" if result.source == "model" else ""))
             if m.gain else "the old setting was rejected")
            for m in result.moved]
    head = ("instance", "old -> new", "time (sweep)", "gain (head-to-head)")
    widths = [max(len(r[c]) for r in [head, *rows]) for c in range(4)]
    print(f"{len(rows)} instances moved:", file=out)
    for r in [head, *rows]:
        print("  " + "  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip(), file=out)
