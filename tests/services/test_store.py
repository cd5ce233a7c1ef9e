"""The artifact store and the cpu target's keys: content addressing, atomic builds,
damaged entries, concurrent builders, compile failures."""

import shutil
import subprocess
import sys

import pytest

import iron
from iron.operator import Operator
from iron.operators import AXPY, SiLU
from iron.resolution import resolve
from iron.store import Store
from iron.targets import cpu

OP = AXPY(size=2048, scalar_factor=1.5, tile_size=1024, num_aie_columns=2, num_channels=1)


def key_in_subprocess(op):
    code = ("from iron.operators import AXPY; from iron.targets import cpu; "
            f"print(cpu.recipe_for(AXPY(**{op.config()!r})).key)")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_same_instance_same_key_and_bytes_across_processes(tmp_path):
    assert key_in_subprocess(OP) == cpu.recipe_for(OP).key
    a = cpu.compile_op(OP, Store(tmp_path / "a"))
    b = cpu.compile_op(OP, Store(tmp_path / "b"))
    assert a.key == b.key
    assert a.manifest["outputs"] == b.manifest["outputs"]  # gcc output is reproducible


def test_every_field_is_in_the_key():
    keys = {cpu.recipe_for(OP).key}
    for change in ({"tile_size": 512}, {"num_aie_columns": 1}, {"scalar_factor": 2.0},
                   {"size": 4096}):
        keys.add(cpu.recipe_for(AXPY(**{**OP.config(), **change})).key)
    assert len(keys) == 5


def test_kernel_source_edit_changes_only_that_operators_keys(tmp_path, monkeypatch):
    silu = resolve(SiLU(size=1536), "cpu")
    before = {op: cpu.recipe_for(op).key for op in (OP, silu)}
    sources = tmp_path / "cpu"
    shutil.copytree(cpu.SOURCE_DIR, sources)
    monkeypatch.setattr(cpu, "SOURCE_DIR", sources)
    monkeypatch.setattr(Operator, "kernel_root", tmp_path)
    assert {op: cpu.recipe_for(op).key for op in (OP, silu)} == before
    (sources / "silu.c").write_text((sources / "silu.c").read_text() + "\n/* edit */\n")
    assert cpu.recipe_for(OP).key == before[OP]
    assert cpu.recipe_for(silu).key != before[silu]
    (sources / "iron_cpu.h").write_text((sources / "iron_cpu.h").read_text() + "\n")
    assert cpu.recipe_for(OP).key != before[OP]  # a shared header is part of every key


@pytest.mark.parametrize("damage", ["corrupt library", "missing manifest", "bad manifest"])
def test_damaged_entry_is_rebuilt_not_loaded(tmp_path, damage):
    store = Store(tmp_path)
    entry = cpu.compile_op(OP, store)
    library, manifest = entry.file(cpu.LIBRARY), entry.path / "manifest.json"
    if damage == "corrupt library":
        library.write_bytes(library.read_bytes()[:100])
    elif damage == "missing manifest":
        manifest.unlink()
    else:
        manifest.write_text("{")
    assert store.lookup(entry.key) is None
    rebuilt = cpu.compile_op(OP, store)
    assert rebuilt.key == entry.key and store.lookup(entry.key) is not None
    assert [p.name for p in tmp_path.iterdir()] == [entry.key]


BUILD = """
import sys
from iron.store import Store
from iron.operators import AXPY
from iron.targets import cpu
entry = cpu.compile_op(AXPY(size=4096, scalar_factor=3.0, tile_size=512, num_aie_columns=1,
                            num_channels=1), Store(sys.argv[1]))
print(entry.key)
"""


def test_two_processes_building_one_key_both_succeed(tmp_path):
    procs = [subprocess.Popen([sys.executable, "-c", BUILD, str(tmp_path)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), results
    keys = {out.strip() for out, _ in results}
    assert len(keys) == 1
    assert [p.name for p in tmp_path.iterdir()] == list(keys)
    assert Store(tmp_path).lookup(keys.pop()) is not None


def test_compile_failure_shows_the_compiler_and_leaves_nothing(tmp_path, monkeypatch):
    sources = tmp_path / "src" / "cpu"
    shutil.copytree(cpu.SOURCE_DIR, sources)
    (sources / "silu.c").write_text('#include "iron_cpu.h"\nvoid iron_kernel(void) { oops; }\n')
    monkeypatch.setattr(cpu, "SOURCE_DIR", sources)
    monkeypatch.setattr(Operator, "kernel_root", sources.parent)
    store = Store(tmp_path / "cache")
    with pytest.raises(iron.CompileError) as e:
        cpu.compile_op(resolve(SiLU(size=64), "cpu"), store)
    message = str(e.value)
    assert "compiling SiLU" in message and "'size': 64" in message and "oops" in message
    assert list((tmp_path / "cache").iterdir()) == []


def test_only_integer_macros_reach_the_compiler():
    op = AXPY(size=16, scalar_factor=1.5, tile_size=16, num_aie_columns=1, num_channels=1)
    macros = dict(cpu.recipe_for(op).macros)
    assert macros["IRON_SCALAR_FACTOR_BITS"] == 0x3FC00000
    assert all(type(v) is int for v in macros.values())
