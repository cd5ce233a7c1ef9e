"""The Llama application names, as ``weights_sources``, every module of its own package and of
``iron.lm`` that the code computing its weights imports (directly or not): the shared weights
pool is keyed on those files, so one left out would let a fixed conversion serve stale
weights."""

import importlib.util
import sys
from pathlib import Path

from apps.llama.app import App

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("import_cycles",
                                              ROOT / "scripts" / "import_cycles.py")
check = importlib.util.module_from_spec(spec)
sys.modules.setdefault("import_cycles", check)
spec.loader.exec_module(check)

#: Where the weights are computed: a checkpoint's loading, a GGUF file's conversion, the
#: stacking and derived tables of the kernels' weights.
ENTRY_POINTS = ("apps.llama.weights", "apps.llama.family", "iron.lm.gguf_import",
                "iron.lm.checkpoint")


def imported_closure(paths: dict[str, Path], start, keep) -> set[str]:
    """The modules ``keep`` accepts that ``start`` imports, transitively, through them."""
    modules, seen, todo = set(paths), set(), list(start)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo += [m for m in check.imports(name, paths[name], modules, everywhere=True)
                 if keep(m)]
    return seen


def test_the_weights_sources_cover_every_module_the_weights_code_imports():
    paths = check.sources()
    closure = imported_closure(paths, ENTRY_POINTS,
                               lambda m: m.startswith(("apps.llama", "iron.lm")))
    assert {"apps.llama.config", "iron.lm.gguf_rope"} <= closure  # the traversal works
    named = {p.resolve() for p in App.__new__(App).weights_sources()}
    missing = sorted(m for m in closure if paths[m].resolve() not in named)
    assert not missing, f"weights code outside App.weights_sources: {missing}"
