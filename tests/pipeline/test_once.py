"""The build records the application's programs once, and a warm ``iron run`` checks its bundle
once: counted in-process on the real functions (each still does its work)."""

import collections
from pathlib import Path

import pytest
from buildtools import doit_bundle

from iron.pipeline import bundle as bundles


def test_a_cold_build_records_each_program_once(build_here, monkeypatch):
    """The bundle is written from the plan recorded when the tasks were set up; recording
    again in the bundle task (as before) made this 2."""
    from apps.demo.app import App

    recorded = collections.Counter()
    programs = App.programs

    def counting(self, device, profile):
        result = programs(self, device, profile)
        recorded.update(list(result))  # one count per program name
        return result

    monkeypatch.setattr(App, "programs", counting)
    assert doit_bundle({"app": "demo"}) == 0
    assert (build_here / "demo" / "cpu" / "manifest.json").is_file()
    assert recorded and set(recorded.values()) == {1}, recorded
    assert bundles.Bundle.open(build_here / "demo" / "cpu").manifest["programs"].keys() == \
        recorded.keys()
    recorded.clear()
    assert doit_bundle({"app": "demo"}) == 0  # a no-op: the record is current
    assert not recorded


class Checks:
    """Counts of the bundle checks: manifest reads and the hashing of each file."""

    def __init__(self, monkeypatch):
        self.reads, self.hashed = 0, collections.Counter()
        read, sha256 = bundles.read_manifest, bundles.sha256_file

        def counting_read(path):
            self.reads += 1
            return read(path)

        def counting_hash(path):
            self.hashed[Path(path).name] += 1
            return sha256(path)

        monkeypatch.setattr(bundles, "read_manifest", counting_read)
        monkeypatch.setattr(bundles, "sha256_file", counting_hash)


@pytest.mark.slow  # builds a bundle of the tiny checkpoint through doit, then runs it twice
def test_a_warm_iron_run_reads_its_manifest_once_and_hashes_each_kernel_once(
        build_here, tmp_path, monkeypatch):
    from tiny_llama import write_tiny_llama

    from iron import cli

    checkpoint = write_tiny_llama(tmp_path / "tiny")
    assert cli.main(["run", str(checkpoint), "-p", "hi", "-n", "1"]) == 0  # cold: builds
    built = [p.parent for p in build_here.glob("llama/*/manifest.json")]
    assert len(built) == 1
    kernels = {Path(k).name for k in bundles.read_manifest(built[0])["files"]
               if k.startswith("kernels/")}
    checks = Checks(monkeypatch)
    for model in (checkpoint, built[0]):  # through the doit graph, and the bundle itself
        checks.reads, checks.hashed = 0, collections.Counter()
        assert cli.main(["run", str(model), "-p", "hi", "-n", "1"]) == 0
        assert checks.reads == 1, (model, checks.reads)
        assert kernels <= set(checks.hashed), kernels - set(checks.hashed)
        assert set(checks.hashed.values()) == {1}, (model, checks.hashed.most_common(3))
