"""iron's layering, checked on the source: every import (inside functions too) goes to the
importing module's own layer or below (the order is ``LAYERS`` in scripts/import_cycles.py),
and no imports, inside functions too, form a cycle."""

import ast
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("import_cycles",
                                              ROOT / "scripts" / "import_cycles.py")
check = importlib.util.module_from_spec(spec)
sys.modules["import_cycles"] = check
spec.loader.exec_module(check)


def test_every_import_stays_in_its_layer_or_below_and_none_cycles():
    assert check.problems() == []


def test_operators_import_no_target():
    """Operators state what they compute; the targets' rules are chained above them."""
    paths = check.sources()
    modules = set(paths)
    for name, path in paths.items():
        if name == "iron.operator" or name.startswith("iron.operators"):
            found = check.imports(name, path, modules, everywhere=True)
            assert not [m for m in found if m.startswith("iron.targets")], (name, found)


def test_an_upward_import_inside_a_function_is_reported(tmp_path):
    """What Operator.resolve once did: a function-level import of the targets."""
    source = tmp_path / "fake.py"
    source.write_text("import numpy\n\n\ndef resolve():\n"
                      "    from iron.targets import target_for\n    return target_for\n")
    paths = {"iron.operators.fake": source,
             "iron.targets": ROOT / "iron" / "targets" / "__init__.py"}
    (line,) = check.violations(paths)
    assert line == (f"{source}:5: iron.operators.fake (operator model) imports iron.targets "
                    "(targets), a higher layer")


def test_a_module_in_no_layer_is_reported(tmp_path):
    source = tmp_path / "stray.py"
    source.write_text("")
    (line,) = check.violations({"stray": source})
    assert "module stray is in no layer of LAYERS" in line


def test_a_module_level_cycle_is_reported():
    assert check.cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]


def write_modules(folder, sources: dict[str, str]) -> dict[str, Path]:
    """Modules ``name -> source`` written under ``folder``; their paths by module name."""
    paths = {}
    for name, text in sources.items():
        path = folder / name.replace(".", "/") / "__init__.py" if text.startswith("#package") \
            else folder / (name.replace(".", "/") + ".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        paths[name] = path
    return paths


def test_a_cycle_closed_by_an_import_inside_a_function_is_reported(tmp_path):
    """What the cpu calibration once did: calibration -> target at module level, target ->
    cost inside a method, cost -> calibration at module level."""
    paths = write_modules(tmp_path, {
        "t.calibration": "from t.target import TARGET\n",
        "t.target": "TARGET = 1\n\n\ndef cost(op):\n    from t.cost import cost\n"
                    "    return cost(op)\n",
        "t.cost": "from t.calibration import calibration\n",
    })
    assert check.cycles(check.graph(paths)) == [["t.calibration", "t.cost", "t.target"]]


def test_a_packages_lazy_export_of_its_own_submodule_is_no_cycle(tmp_path):
    """A package's ``__getattr__`` importing its submodule, which reads a name the package
    defines (PEP 562), is a lazy export; the same import in any other function is a cycle."""
    lazy = ("#package\nBATCH = 8\n\n\ndef __getattr__(name):\n    from . import app\n"
            "    return getattr(app, name)\n")
    app = "from . import BATCH\n"
    paths = write_modules(tmp_path, {"p": lazy, "p.app": app})
    assert check.cycles(check.graph(paths)) == []
    eager = lazy.replace("def __getattr__(name)", "def load(name)")
    paths = write_modules(tmp_path / "q", {"p": eager, "p.app": app})
    assert check.cycles(check.graph(paths)) == [["p", "p.app"]]


def test_an_import_for_annotations_only_closes_no_cycle(tmp_path):
    """A rule module names its caller's types under ``if TYPE_CHECKING`` (never run); the
    same import inside a function runs, and is a cycle."""
    rules = ("from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
             "    from r.pre import Device\n")
    paths = write_modules(tmp_path, {"r.rules": rules, "r.pre": "from r.rules import RULE\n"})
    assert check.cycles(check.graph(paths)) == []
    paths = write_modules(tmp_path / "s", {
        "r.rules": "def rule(d):\n    from r.pre import Device\n    return Device\n",
        "r.pre": "from r.rules import rule\n"})
    assert check.cycles(check.graph(paths)) == [["r.pre", "r.rules"]]


def code_words(path: Path) -> set[str]:
    """The identifiers and string constants of a module's code: docstrings, which may tell of
    a model a figure was measured on, left out."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(getattr(node, "body", None), list) and node.body
                  and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    words = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and id(node) not in docstrings:
            words.add(node.value)
        elif isinstance(node, ast.Name):
            words.add(node.id)
        elif isinstance(node, ast.Attribute):
            words.add(node.attr)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            words.update(a.name for a in node.names)
            words.add(getattr(node, "module", None) or "")
    return words


@pytest.mark.parametrize("where", ["iron/tuning", "iron/pipeline/app.py"])
def test_generic_layers_name_no_family_and_no_language_model_module(where):
    """The tuner and the application protocol serve any application: their code names no
    model family (llama, qwen) and no ``iron.lm`` module."""
    root = ROOT / where
    for path in sorted(root.rglob("*.py")) if root.is_dir() else [root]:
        found = [w for w in code_words(path) if any(
            bad in w.lower() for bad in ("llama", "qwen", "iron.lm", "..lm"))]
        assert not found, (str(path.relative_to(ROOT)), found)
