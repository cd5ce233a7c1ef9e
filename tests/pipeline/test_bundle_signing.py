"""Bundles are native code: built with ``IRON_REMOTE_CACHE_KEY`` set they are signed with it,
and with the key set ``iron run`` refuses, before loading any of their code, a bundle whose
kernel was replaced and whose hashes were recomputed, or one that is not signed."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import iron
from iron.pipeline import bundle as bundles
from iron.pipeline.app import load_app

pytestmark = pytest.mark.slow  # builds a bundle and runs the command

KEY = "0123456789abcdef" * 4
#: a shared library whose constructor leaves a file behind: proof that it was loaded
CONSTRUCTOR = """
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void planted(void) {
    FILE *f = fopen(getenv("PLANTED_MARK"), "w");
    if (f) fclose(f);
}
"""


def run(bundle: Path, key: str | None, mark: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "IRON_REMOTE_CACHE_KEY"}
    env["PLANTED_MARK"] = str(mark)
    if key is not None:
        env["IRON_REMOTE_CACHE_KEY"] = key
    return subprocess.run([sys.executable, "-m", "iron.lm.run", str(bundle), "-p", "Hi", "-n",
                           "1"], capture_output=True, text=True, env=env, timeout=300)


def reseal(bundle: Path, change) -> None:
    """Edit the manifest and recompute its hashes, as someone who can write the folder can."""
    manifest = json.loads((bundle / "manifest.json").read_text())
    change(manifest)
    for name in manifest["files"]:
        if name != bundles.WEIGHTS:
            manifest["files"][name] = bundles.sha256_file(bundle / name)
    manifest["digest"] = bundles.manifest_digest(manifest)
    (bundle / "manifest.json").write_text(json.dumps(manifest))


@pytest.fixture(scope="module")
def signed(smollm2, tmp_path_factory) -> Path:
    app = load_app("llama", smollm2, context=256)
    return bundles.write_bundle(app, iron.device("cpu"), iron.Profile(device="cpu"),
                                tmp_path_factory.mktemp("signed") / "cpu", key=KEY.encode())


def test_a_signed_bundle_runs_with_its_key(signed, tmp_path):
    manifest = json.loads((signed / "manifest.json").read_text())
    assert manifest["signature"] == bundles.sign(KEY.encode(), manifest["digest"])
    done = run(signed, KEY, tmp_path / "mark")
    assert done.returncode == 0, done.stderr


def test_a_replaced_kernel_with_recomputed_hashes_is_refused_before_it_loads(signed, tmp_path):
    bundle = tmp_path / "bundle"  # a copy, its weights a hard link
    shutil.copytree(signed, bundle, ignore=shutil.ignore_patterns(bundles.WEIGHTS))
    os.link(signed / bundles.WEIGHTS, bundle / bundles.WEIGHTS)
    runtime = bundle / json.loads((bundle / "manifest.json").read_text())["runtime"]
    source = tmp_path / "planted.c"
    source.write_text(CONSTRUCTOR)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(runtime), str(source)], check=True)
    reseal(bundle, lambda manifest: None)
    mark = tmp_path / "mark"
    done = run(bundle, KEY, mark)
    assert done.returncode == 2 and not mark.exists(), done.stderr
    assert done.stderr.strip().splitlines() == [
        f"error: {bundle}: its signature does not verify with IRON_REMOTE_CACHE_KEY: it was "
        "changed after it was signed, or signed with another key; rebuild it"]
    reseal(bundle, lambda manifest: manifest.pop("signature"))
    done = run(bundle, KEY, mark)
    assert done.returncode == 2 and not mark.exists(), done.stderr
    assert "not signed, and IRON_REMOTE_CACHE_KEY is set" in done.stderr
    done = run(bundle, "another key of enough characters, 40 chars", mark)
    assert done.returncode == 2 and not mark.exists(), done.stderr


def test_the_help_and_the_docs_say_a_bundle_is_native_code():
    help_text = subprocess.run([sys.executable, "-m", "iron.cli", "run", "--help"],
                               capture_output=True, text=True, timeout=60).stdout
    assert "A bundle is native code" in help_text and "IRON_REMOTE_CACHE_KEY" in help_text
    usage = (Path(__file__).resolve().parents[2] / "docs" / "usage.md").read_text()
    assert "**A bundle is native code.**" in usage
