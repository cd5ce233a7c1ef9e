"""SmolLM2 on an NPU, emulated: the npu2 bundle of the embedded checkpoint, built with the
committed npu2 profile as ``doit device=npu2`` builds it, completes a prompt with the answer
the model gives on the cpu."""

import subprocess
import sys

import iron
from iron.pipeline.app import app_profile, load_app
from iron.pipeline.bundle import write_bundle
import pytest

pytestmark = pytest.mark.slow  # end to end: bundles, servers, doit runs


def test_emulated_smollm2_on_npu2_answers_paris(smollm2, tmp_path):
    profile = app_profile("llama", "npu2")  # profiles/llama/npu2.json, the cost model's choices
    assert len(profile) > 0
    bundle = write_bundle(load_app("llama", smollm2), iron.device("npu2"), profile,
                          tmp_path / "npu2")
    run = [sys.executable, "-m", "iron.lm.run", str(bundle), "--prompt",
           "The capital of France is", "--max-new-tokens", "4", "--json"]
    emulated = subprocess.run(run + ["--emulate"], capture_output=True, text=True, timeout=600)
    assert emulated.returncode == 0, emulated.stderr
    assert '"text": " Paris.' in emulated.stdout, emulated.stdout
    refused = subprocess.run(run, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.startswith(f"error: {bundle}: running on npu2 itself needs")
