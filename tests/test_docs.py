"""Every path of this repository that the README, a page of docs/ or a docstring names exists:
tests move between folders, modules are split, and a reader should never follow a dead name."""

import ast
import io
import re
import tokenize
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: a path into one of the repository's own top folders, as prose writes it (in backticks or not)
PATH = re.compile(r"(?<![\w./-])((?:iron|tests|apps|benchmarks|docs|scripts|examples|profiles|"
                  r"\.ci)/[\w./-]*[\w/])")
#: upstream IRON's own folders (amd/IRON), which the docs compare iron with: not paths here
UPSTREAM = ("iron/applications/", "iron/common/")


def named_paths(text: str):
    for number, line in enumerate(text.splitlines(), 1):
        for match in PATH.finditer(line):
            path = match.group(1).rstrip(".")
            if not any(c in path for c in "*<>{}") and not any(
                    path.startswith(u) for u in UPSTREAM):
                yield number, path


def prose(file: Path) -> str:
    """The docstrings and comments of a Python file, each on its own line number (the rest
    blank): in tests, code names the files a test writes, which are not the repository's."""
    text = file.read_text()
    lines = [""] * (text.count("\n") + 1)
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value,
                                                                           str):
            first = body[0].lineno - 1
            for i, line in enumerate(body[0].value.value.splitlines()):
                lines[first + i] = line
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            lines[token.start[0] - 1] += " " + token.string
    return "\n".join(lines)


def dead_names(files, read=lambda file: file.read_text()) -> list[str]:
    dead = []
    for file in files:
        for number, path in named_paths(read(file)):
            # a profile's host class is written as a prefix: profiles/llama/cpu-<class>.json
            found = (REPO / path).exists() or any((REPO / path).parent.glob(
                Path(path).name + "*"))
            if not found:
                dead.append(f"{file.relative_to(REPO)}:{number}: {path}")
    return dead


def test_every_path_the_docs_name_exists():
    dead = dead_names([REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))])
    assert not dead, "named but missing:\n" + "\n".join(dead)


def test_every_path_a_docstring_or_comment_names_exists():
    sources = [p for p in (REPO / "iron").rglob("*") if p.suffix in (".py", ".c", ".h", ".cc")]
    sources += [*(REPO / "apps").rglob("*.py"), *(REPO / "benchmarks").glob("*.py"),
                REPO / "dodo.py"]
    dead = dead_names(sources)
    assert not dead, "named but missing:\n" + "\n".join(dead)


def test_every_path_a_tests_or_scripts_docstring_or_comment_names_exists():
    """Tests moved into folders that mirror the packages; their docstrings and comments, and
    the scripts', must name where things are now."""
    sources = [*(REPO / "tests").rglob("*.py"), *(REPO / "scripts").glob("*.py")]
    dead = dead_names(sources, prose)
    assert not dead, "named but missing:\n" + "\n".join(dead)
