"""A tuning run's progress is events: the tuner decides and emits, a sink shows or keeps them;
its options are one checked object."""

import pytest
from tunetools import FakeApp, FakeBench

import iron
from iron.tuning.events import (Collect, Finished, HeadToHead, InstanceStarted, Measured,
                                Planned, PrintSink)
from iron.tuning.tuner import TuneOptions, tune


def test_decisions_arrive_as_events_and_nothing_is_printed(tmp_path, capsys):
    """Every head-to-head event says what its instance's outcome did, the report is the last
    event and carries the result, and with a collecting sink the run writes nothing."""
    events = Collect()
    result = tune(FakeApp(), "cpu", TuneOptions(profile_path=tmp_path / "p.json",
                                                log_path=tmp_path / "t.jsonl"),
                  benchmark=FakeBench(), events=events)
    assert capsys.readouterr().out == ""
    (plan,) = events.of(Planned)
    assert plan.instances == len(result.outcomes) == len(events.of(InstanceStarted))
    assert events.events[-1] == Finished(result)
    compared = events.of(HeadToHead)
    decided = [o for o in result.outcomes if o.gain is not None]
    assert compared and len(compared) == len(decided)
    for event, o in zip(compared, decided):
        assert event.moves == (o.chosen != o.instance.current)
        assert event.comparison.gain == o.gain
    assert sum(1 for e in events.of(Measured)) == result.measured_now


def test_the_print_sink_shows_each_event_as_the_command_line_does(tmp_path, capsys):
    tune(FakeApp(), "cpu", TuneOptions(profile_path=tmp_path / "p.json",
                                       log_path=tmp_path / "t.jsonl"),
         benchmark=FakeBench(), events=PrintSink())
    out = capsys.readouterr().out
    assert out.startswith("tuning fake on cpu: ") and "head-to-head" in out
    assert f"wrote {tmp_path / 'p.json'}" in out


@pytest.mark.parametrize("options, message", [
    (dict(budget=0), "TuneOptions.budget=0: the budget must be a positive number of seconds"),
    (dict(budget=float("nan")), "TuneOptions.budget=nan"),
    (dict(prune=-1), "TuneOptions.prune=-1: prune must be 0"),
    (dict(only="GEMV"), "TuneOptions.only='GEMV': give a tuple of operator names"),
])
def test_bad_options_are_refused_naming_the_field_and_the_value(options, message):
    with pytest.raises(iron.IronError, match=message.replace("(", r"\(")):
        TuneOptions(**options)


def test_a_pause_for_a_busy_machine_goes_to_the_sink(monkeypatch, capsys):
    """The quiet gate says its pause and its end as events, not on stdout; a benchmark sent
    to a cluster's workers leaves the tuner's sink behind."""
    import pickle

    from iron.tuning import quiet
    from iron.tuning.events import Paused, QuietAgain
    from iron.tuning.measure import TargetBenchmark

    loads = iter([1.5, 1.2, 0.1])
    monkeypatch.setattr(quiet, "others_busy", lambda interval=0.25: next(loads))
    monkeypatch.setattr(quiet.time, "sleep", lambda seconds: None)
    events = Collect()
    assert quiet.wait_quiet(0.25, 60, events) == 0.1
    assert events.events == [Paused(1.5, 0.25), QuietAgain(4.5)]
    assert capsys.readouterr().out == ""
    bench = TargetBenchmark(events=events)
    assert pickle.loads(pickle.dumps(bench)).events is None and bench.events is events
