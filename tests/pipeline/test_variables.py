"""doit variables reach the commands they configure as values, never as options.

``doit generate prompt=-hello`` (or ``prompt=--help``, ``stop=--json``) once passed the value
as a word of its own, which the run command's parser took for an option; an empty
``checkpoint=`` named the current directory and built it as a model.  The commands are parsed
here by the real parser of ``iron.lm.run``."""

from __future__ import annotations

import sys

import pytest

from iron.errors import IronError
from iron.lm.run import parser
from iron.pipeline.tasks import VARIABLES, BuildGraph
from iron.pipeline.variables import check_all
from tiny_llama import write_tiny_llama


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("tiny") / "ckpt")


def command(tiny, tmp_path, monkeypatch, task="generate", **variables) -> list[str]:
    """The command ``doit <task> VARIABLES`` runs, as the build graph makes it."""
    monkeypatch.setenv("IRON_BUILD_DIR", str(tmp_path / "build"))
    graph = BuildGraph({"app": "llama", "checkpoint": str(tiny), **variables})
    (action, (argv, env)), = getattr(graph, f"task_{task}")()["actions"]
    return argv


def parsed(argv: list[str]):
    assert argv[:3] == [sys.executable, "-m", "iron.lm.run"]
    return parser().parse_args(argv[3:])


@pytest.mark.parametrize("prompt", ["-hello", "--help", "--json", "-n 5", "--prompt"])
def test_a_prompt_that_looks_like_an_option_is_the_prompt(tiny, tmp_path, monkeypatch, prompt):
    """``doit generate prompt=...`` alone fills the command recorded once per build."""
    args = parsed(command(tiny, tmp_path, monkeypatch, prompt=prompt))
    assert args.prompt == prompt and not args.json


def test_option_values_that_look_like_options_stay_values(tiny, tmp_path, monkeypatch):
    """With other options the application builds the command afresh."""
    args = parsed(command(tiny, tmp_path, monkeypatch, prompt="-x", stop="--json", seed="7"))
    assert args.stop == ["--json"] and not args.json and args.prompt == "-x" and args.seed == 7


def test_tune_variables_stay_values(tiny, tmp_path, monkeypatch):
    argv = command(tiny, tmp_path, monkeypatch, task="tune", only="GEMV", budget="5")
    assert argv[3:] == ["llama", "--device", "cpu", f"--checkpoint={tiny}", "--only=GEMV",
                        "--budget=5.0"]


def test_tune_runs_the_generic_tuner_with_every_application_variable(tiny, tmp_path,
                                                                    monkeypatch):
    """The tune task names no language-model module: ``python -m iron.tuning``, each
    application variable given passed on as ``--var NAME=VALUE`` (the tuner opens the
    application through ``open_app``, which checks them)."""
    argv = command(tiny, tmp_path, monkeypatch, task="tune", weights="bf16", context="64")
    assert argv[:3] == [sys.executable, "-m", "iron.tuning"]
    assert argv[3:] == ["llama", "--device", "cpu", f"--checkpoint={tiny}",
                        "--var=weights=bf16", "--var=context=64"]


def test_the_tuner_refuses_an_unknown_application_variable_in_one_line(tmp_path, capsys):
    from iron.tuning.__main__ import main

    # (were the variable not checked: a short cost-model tune, written to a scratch file)
    assert main(["llama", "--var", "contxt=64", "--no-plots", "--device", "npu2",
                 "--budget", "1", "--out", str(tmp_path / "profile.json")]) == 2
    said = capsys.readouterr().err
    assert said.startswith("error: unknown variable of application 'llama' 'contxt' (did you "
                           "mean 'context'?)") and said.count("\n") == 1, said


@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_checkpoint_variable_is_a_one_line_error(value):
    with pytest.raises(IronError) as e:
        check_all({"checkpoint": value}, VARIABLES, "doit variable")
    assert str(e.value) == (f"variable checkpoint={value!r}: must name a file or folder; leave "
                            "the variable out for the default")
