"""The application protocol: ``iron.pipeline.app.Application`` states it, with defaults for the
optional members, and ``load_app`` refuses an ``App`` that does not derive from it."""

import sys
import types

import pytest
from tunetools import FakeApp, FakeBench

import iron
from iron.pipeline.app import Application, load_app
from iron.tuning.candidates import instances
from iron.tuning.tuner import TuneOptions, tune


class Minimal(Application):
    name = "minimal"

    def __init__(self, checkpoint=None):
        self.checkpoint = checkpoint

    def programs(self, device, profile):
        return FakeApp().programs(device, profile)

    def weights(self):
        return iter(())


def test_the_optional_members_have_their_stated_defaults():
    app, dev = Minimal(), iron.device("cpu")
    assert list(app.tuned_programs(dev, iron.Profile())) == ["decode", "prefill"]
    assert app.phases() == {} and app.weights_key() is None
    assert (app.files(), app.meta(), app.sources()) == ({}, {}, [])
    with pytest.raises(iron.IronError, match="application 'minimal' has no run command"):
        app.run_command("bundle")


def test_an_app_that_does_not_derive_from_the_protocol_is_refused_naming_it(monkeypatch):
    class App:  # every member an application needs, but not the protocol's class
        name = "plain"
        programs = Minimal.programs
        weights = Minimal.weights

    package = types.ModuleType("apps.plain")
    package.App = App
    monkeypatch.setitem(sys.modules, "apps.plain", package)
    with pytest.raises(iron.IronError, match="apps.plain.App is .* does not derive from "
                       "iron.pipeline.app.Application"):
        load_app("plain")
    package.App = type("App", (Minimal,), {"name": "plain"})
    assert load_app("plain").name == "plain"


def test_the_tuner_tunes_what_tuned_programs_lists(tmp_path):
    """Chain's prefill program has instances of its own (two rows); an application that derives
    prefill's tunables from decode's lists only decode, and prefill's instances are not tuned."""

    class DecodeTuned(FakeApp):
        def tuned_programs(self, device, profile):
            return {"decode": self.programs(device, profile)["decode"]}

    dev = iron.device("cpu")
    decode = {i.op for i in instances(DecodeTuned().tuned_programs(dev, iron.Profile()))}
    every = {i.op for i in instances(DecodeTuned().programs(dev, iron.Profile()))}
    assert decode < every
    result = tune(DecodeTuned(), "cpu", TuneOptions(profile_path=tmp_path / "p.json",
                                                    log_path=tmp_path / "t.jsonl"),
                  benchmark=FakeBench(), events=lambda event: None)
    assert {o.instance.op for o in result.outcomes} <= decode
    assert result.outcomes
