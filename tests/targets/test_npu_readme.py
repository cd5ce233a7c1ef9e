"""The README's modelled npu decode token is what ``python -m iron.targets.npu.report`` computes
for the bundles ``doit device=npu1 weights=bf16`` and ``doit device=npu2`` build: the designs
of the committed profiles, priced by today's model. A change to a design, a profile or the
model that moves a figure fails here until the README says so."""

from pathlib import Path

import pytest

import iron
from iron.pipeline.app import app_profile, load_app
from iron.targets import npu
from iron.targets.npu.report import program_report

pytestmark = pytest.mark.slow  # records the whole decoder for two devices

REPO = Path(__file__).resolve().parents[2]
#: README rows: (device, weights, label of the row's form) -> the report's figures of that form
ROWS = {"npu1, one dispatch per step (no folds)": ("npu1", "bf16", "unfolded"),
        "npu2, one dispatch per step": ("npu2", None, "unfolded"),
        "npu2, folded": ("npu2", None, "folded"),
        "npu2, folded + packed": ("npu2", None, "packed")}


def readme_rows() -> dict[str, list[str]]:
    text = (REPO / "README.md").read_text()
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| npu") and cells[0] in ROWS:
            rows[cells[0]] = cells[1:]
    return rows


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds >= 1e-3 else f"{seconds * 1e3:.2f} ms"


def test_the_readme_npu_table_is_the_report_of_the_built_designs(smollm2):
    reports = {}
    for dev, weights in {(d, w) for d, w, _ in ROWS.values()}:
        app = load_app("llama", smollm2, **({"weights": weights} if weights else {}))
        programs = app.programs(iron.device(dev), app_profile("llama", dev))
        token = [programs["decode"], programs["head"]]
        designs = {}  # one design per distinct instance, as a bundle holds one step file each
        for op in (op for p in token for op in p.ops):
            designs.setdefault(op, npu.design_of(op, dev))
        reports[dev] = program_report("decode + head", token,
                                      [[designs[op] for op in p.ops] for p in token])
    rows = readme_rows()
    assert set(rows) == set(ROWS), f"README rows {sorted(rows)}, expected {sorted(ROWS)}"
    for label, (dev, _, form) in ROWS.items():
        r = reports[dev]
        split = getattr(r, form)
        dispatches = r.dispatches if form == "unfolded" else r.folded_dispatches
        loads = r.packed_loads if form == "packed" else r.loads
        want = [str(dispatches), str(loads), ms(split.kernel), ms(split.data_movement),
                ms(split.dispatch), ms(split.reconfiguration), ms(split.total)]
        assert rows[label] == want, f"README row {label!r}: {rows[label]}, the report: {want}"
