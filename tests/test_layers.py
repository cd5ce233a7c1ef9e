"""iron's layering, checked on the source: every import (inside functions too) goes to the
importing module's own layer or below (the order is ``LAYERS`` in scripts/import_cycles.py),
and no module-level imports form a cycle."""

import importlib.util
import sys
from pathlib import Path

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
