"""The build pipeline and the tuner name no model family and no language-model module in their
code: what they need of an application (variables, run options, the run command, the tuned
programs) the application declares."""

import ast
from pathlib import Path

import pytest

IRON = Path(__file__).resolve().parents[2] / "iron"
GENERIC = sorted([*(IRON / "pipeline").glob("*.py"), *(IRON / "tuning").glob("*.py")])
#: What code in the pipeline must not name (comments and docstrings may explain them).
FAMILY = "llama"
LM_PACKAGE = "iron.lm"


def docstrings(tree: ast.AST) -> set[int]:
    """The ids of the string constants that are docstrings (of the module, classes, functions)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                found.add(id(body[0].value))
    return found


def named(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every name, attribute, imported module and string constant in the code
    of ``path`` (relative imports made absolute), docstrings and comments left out."""
    tree = ast.parse(path.read_text(), str(path))
    skip = docstrings(tree)
    package = f"iron.{path.parent.name}"
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            out.append((node.lineno, node.id))
        elif isinstance(node, ast.Attribute):
            out.append((node.lineno, node.attr))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] \
                if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            out.append((node.lineno, module))
            out += [(node.lineno, f"{module}.{a.name}") for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) not in skip:
                out.append((node.lineno, node.value))
    return out


def offences(path: Path) -> list[str]:
    return [f"{path.parent.name}/{path.name}:{line}: {text!r}" for line, text in named(path)
            if FAMILY in text.lower() or text == LM_PACKAGE or LM_PACKAGE + "." in text]


@pytest.mark.parametrize("path", GENERIC, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_pipeline_and_tuner_code_name_no_family_and_no_lm_module(path):
    assert offences(path) == []


def test_the_check_sees_strings_relative_imports_and_names(tmp_path):
    """The check itself: each way code could name them is caught; a docstring is not."""
    sample = tmp_path / "sample.py"
    sample.write_text('"""Builds llama bundles (a docstring may say so)."""\n'
                      "from ..lm import run\n"
                      'argv = ["-m", "iron.lm.tune"]\n'
                      "APP = llama_default\n"
                      "def f():\n    \"\"\"iron.lm explained.\"\"\"\n    return x.llama\n")
    assert sorted(int(o.split(":")[1]) for o in offences(sample)) == [2, 2, 3, 4, 7]
