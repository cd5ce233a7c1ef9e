"""Check iron's layering: every import, at module level or inside a function, goes to the
importing module's own layer or one below it; and no imports, inside functions too, form a
cycle.

    python scripts/import_cycles.py      # exit 1 and print each violation and cycle

``LAYERS`` below is the one statement of the layer order (``docs/architecture.md`` explains
it; ``tests/test_layers.py`` runs this check).  A module is in the layer of the longest
prefix that names it; a module no prefix names is a violation too, so a new module is placed
on purpose.  Imports under ``if TYPE_CHECKING:`` count: an annotation naming a higher layer
is the same dependency.  A function-level import closes a cycle as surely as a module-level
one (it runs later, but the two modules still need each other).  Two kinds of import close no
cycle: a package's lazy export (PEP 562), its module-level ``__getattr__`` importing one of
its own submodules, which may then read the names the package defines; and an import under
``if TYPE_CHECKING``, which never runs (it names a type for an annotation).
``importlib.import_module`` with a computed name is not seen (iron uses it only for lazy
exports of a package's own members).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("iron", "apps")

#: Bottom to top: (layer, module prefixes).  A module may import from its own layer and below.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("services", ("iron.errors", "iron.host", "iron.tensor", "iron.paths", "iron.util",
                  "iron.jsonfile",
                  "iron.memory", "iron.store", "iron.remote_cache", "iron.cache", "iron.tensorfile",
                  "iron.quant")),
    ("operator model", ("iron.recording", "iron.devices", "iron.operator", "iron.operators",
                        "iron.profile")),
    ("programs", ("iron.program", "iron.memplan")),
    ("targets", ("iron.targets",)),
    ("resolution", ("iron.resolution",)),
    ("graphs", ("iron.graph",)),
    ("pipeline", ("iron.pipeline",)),
    ("bundle tools", ("iron.targets.npu.verify", "iron.targets.npu.report",
                      "iron.targets.npu.foldfiles")),  # command-line tools reading bundles
    ("tuning", ("iron.tuning",)),
    ("language models", ("iron.lm",)),
    ("package", ("iron",)),  # iron/__init__.py: lazy exports of the layers below
    ("applications", ("apps",)),
)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> int | None:
    """The index in ``LAYERS`` of ``module``'s layer (longest matching prefix), or None."""
    best, length = None, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > length:
                best, length = index, len(prefix)
    return best


def _targets(node: ast.AST, package: str, modules: set[str]) -> list[str]:
    """The modules an import statement depends on: ``from a import b`` depends on ``a.b``
    when that is a module, else on ``a`` (a name ``a/__init__.py`` defines)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            up = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join(up + ([base] if base else []))
        return [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                for a in node.names]
    return []


def _type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None) if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _run_nodes(tree: ast.AST):
    """Every node of ``tree`` but those under ``if TYPE_CHECKING:`` (never run)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if _type_checking(node):
            stack.extend(node.orelse)
        else:
            stack.extend(ast.iter_child_nodes(node))


def imports(name: str, path: Path, modules: set[str], everywhere: bool,
            annotations: bool = True) -> dict[str, int]:
    """The modules of ``modules`` that module ``name`` (its source at ``path``) imports, each
    with the line of its first import: every import if ``everywhere`` (those under ``if
    TYPE_CHECKING`` only with ``annotations``), else those run at module level (``if
    TYPE_CHECKING`` and function bodies excluded)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    nodes = ((ast.walk(tree) if annotations else _run_nodes(tree)) if everywhere
             else iter(tree.body))
    found: dict[str, int] = {}
    for node in sorted(nodes, key=lambda n: getattr(n, "lineno", 0)):
        for target in _targets(node, package, modules):
            if target in modules and target != name:
                found.setdefault(target, node.lineno)
    return found


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def sources() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def violations(paths: dict[str, Path] | None = None) -> list[str]:
    """One line per import that goes up a layer, and per module no layer names."""
    paths = paths or sources()
    modules = set(paths)
    out = []
    for module, path in sorted(paths.items()):
        own = layer_of(module)
        if own is None:
            out.append(f"{_shown(path)}: module {module} is in no layer of "
                       "LAYERS (scripts/import_cycles.py): add it where it belongs")
            continue
        for target, line in sorted(imports(module, path, modules, everywhere=True).items()):
            other = layer_of(target)
            if other is not None and other > own:
                out.append(f"{_shown(path)}:{line}: {module} ({LAYERS[own][0]}) "
                           f"imports {target} ({LAYERS[other][0]}), a higher layer")
    return out


def lazy_exports(name: str, path: Path, modules: set[str]) -> set[str]:
    """The submodules of package ``name`` its module-level ``__getattr__`` imports (PEP 562)."""
    if path.name != "__init__.py":
        return set()
    found: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
            for inner in ast.walk(node):
                found.update(t for t in _targets(inner, name, modules)
                             if t.startswith(name + "."))
    return found


def graph(paths: dict[str, Path] | None = None) -> dict[str, set[str]]:
    """Import edges of the imports that run, anywhere in a module (function bodies included),
    but for a package's lazy exports of its own submodules."""
    paths = paths or sources()
    modules = set(paths)
    return {m: set(imports(m, p, modules, everywhere=True, annotations=False))
            - lazy_exports(m, p, modules) for m, p in paths.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def problems() -> list[str]:
    """Every layer violation and import cycle, one line each."""
    edges = graph()
    found = violations()
    for comp in cycles(edges):
        found.append("import cycle: " + "; ".join(
            f"{m} -> {', '.join(sorted(edges[m] & set(comp)))}" for m in comp))
    return found


def main() -> int:
    found = problems()
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
