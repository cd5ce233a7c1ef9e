"""The remote artifact cache, against a real S3 API (moto's server on 127.0.0.1, started and
stopped here) and a file:// directory: two clones share compiles, tampering is caught,
concurrent writers leave one object, read-only clients never write, the trust rule holds."""

import io
import json
import os
import socket
import subprocess
import sys
import threading
import zipfile

import pytest

pytest.importorskip("fsspec")
pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")

from conftest import copy_project  # noqa: E402
from test_build import doit, executed, run_bundle  # noqa: E402

from iron.operators import AXPY  # noqa: E402
from iron.remote_cache import RemoteCache, RemoteCacheError, from_env, signature  # noqa: E402
from iron.store import Store  # noqa: E402
from iron.targets import cpu  # noqa: E402

SECRET = "k" * 40
OP = AXPY(size=1024, scalar_factor=0.75, tile_size=512, num_aie_columns=1, num_channels=1)
AWS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
       "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture(scope="module")
def s3():
    """moto's S3 server on a free loopback port, with a bucket; the environment to reach it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = {**AWS, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        import s3fs

        s3fs.S3FileSystem().mkdir("iron-cache")
        yield env
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()


_PREFIXES = iter(range(10 ** 6))


@pytest.fixture(params=["s3", "file"])
def remote_url(request, tmp_path):
    """A fresh, empty remote location of each kind."""
    if request.param == "s3":
        request.getfixturevalue("s3")
        return f"s3://iron-cache/run{os.getpid()}-{next(_PREFIXES)}"
    return f"file://{tmp_path / 'remote'}"


def remote_objects(url):
    import fsspec

    fs, root = fsspec.core.url_to_fs(url)
    return sorted(p.rsplit("/", 1)[1] for p in fs.find(root)) if fs.exists(root) else []


def counting_compiler(tmp_path):
    """A ``cc`` that logs every compile (a command with ``-o``) to a file, then runs cc."""
    log = tmp_path / "compiles.log"
    wrapper = tmp_path / "bin" / "cc"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\ncase " $* " in *" -o "*) echo "$@" >> {log};; esac\n'
                       'exec /usr/bin/env cc "$@"\n')
    wrapper.chmod(0o755)
    return wrapper, log


def compiles(log):
    return len(log.read_text().splitlines()) if log.exists() else 0


# ---- two clones --------------------------------------------------------------------------------


def test_second_clone_compiles_nothing_and_gets_identical_libraries(tmp_path, remote_url):
    """Clone A builds the demo and uploads every library; clone B, with its own empty build
    folder, downloads them all: the compiler runs zero times and the bundles' bytes match."""
    cc, log = counting_compiler(tmp_path)
    env = {**os.environ, "CC": str(cc), "IRON_REMOTE_CACHE": remote_url,
           "IRON_REMOTE_CACHE_KEY": SECRET}
    a, b = copy_project(tmp_path / "a"), copy_project(tmp_path / "b")

    first = doit(a, env=env)
    built = compiles(log)
    assert built == 6 and len(executed(first)) == 5  # 5 operator instances + the runtime
    assert f"remote cache {remote_url} (rw): 0 hits (downloaded), 6 misses, 6 uploads" \
        in first.stdout
    assert len(remote_objects(remote_url)) == 6

    second = doit(b, "-n", "2", env=env)
    assert compiles(log) == built, "the second clone ran the compiler"
    assert "(rw): 6 hits (downloaded), 0 misses, 0 uploads" in second.stdout
    libraries = sorted(p.name for p in (a / "build/demo/cpu/kernels").iterdir())
    assert len(libraries) == 6
    for name in libraries:
        assert (a / "build/demo/cpu/kernels" / name).read_bytes() == \
            (b / "build/demo/cpu/kernels" / name).read_bytes(), name
    ran = run_bundle(b / "build/demo/cpu", {**env, "PYTHONPATH": str(b)})
    assert ran.returncode == 0 and "max |out - reference| = 0" in ran.stdout, ran.stderr

    noop = doit(b, env=env)  # nothing to do: nothing looked up
    assert "(rw): 0 hits (downloaded), 0 misses, 0 uploads" in noop.stdout


# ---- trust: tampering ----------------------------------------------------------------------


def rewrite(url, key, edit):
    """Overwrite the remote object of ``key`` (as an attacker with write access would)."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(url)
    path = f"{root}/{key}.zip"
    members = {}
    with zipfile.ZipFile(io.BytesIO(fs.cat_file(path))) as z:
        for name in z.namelist():
            members[name] = z.read(name)
    edit(members)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    fs.pipe_file(path, buffer.getvalue())
    return buffer.getvalue()


def flip_library(members):
    library = bytearray(members[cpu.LIBRARY])
    library[len(library) // 2] ^= 0xFF
    members[cpu.LIBRARY] = bytes(library)


def matching_manifest(members):
    """A patched library with its hash updated in the manifest: only the signature can tell."""
    import hashlib

    flip_library(members)
    manifest = json.loads(members["manifest.json"])
    manifest["outputs"][cpu.LIBRARY] = hashlib.sha256(members[cpu.LIBRARY]).hexdigest()
    members["manifest.json"] = json.dumps(manifest, indent=1, sort_keys=True).encode()


def resigned_with_another_key(members):
    matching_manifest(members)
    members["signature"] = signature(b"x" * 40, members["manifest.json"]).encode()


@pytest.mark.parametrize("tamper, reason", [
    (flip_library, "kernel.so does not match its hash in the manifest"),
    (matching_manifest, "the signature does not verify"),
    (resigned_with_another_key, "the signature does not verify"),
])
def test_tampered_object_is_rejected_with_one_warning_and_rebuilt(tmp_path, remote_url, tamper,
                                                                 reason):
    out = io.StringIO()
    writer = Store(tmp_path / "a", RemoteCache(remote_url, "rw", SECRET))
    good = cpu.compile_op(OP, writer)
    tampered = rewrite(remote_url, good.key, tamper)

    remote = RemoteCache(remote_url, "rw", SECRET, out=out)
    reader = Store(tmp_path / "b", remote)
    entry = cpu.compile_op(OP, reader)
    warnings = out.getvalue().splitlines()
    assert len(warnings) == 1 and reason in warnings[0] and "building it here" in warnings[0]
    assert remote.take_counts() == {"rejected": 1, "already_there": 1}
    # rebuilt here: the real library, not the tampered one; the remote object is left alone
    assert entry.file(cpu.LIBRARY).read_bytes() == good.file(cpu.LIBRARY).read_bytes()
    import fsspec

    fs, root = fsspec.core.url_to_fs(remote_url)
    assert fs.cat_file(f"{root}/{good.key}.zip") == tampered


def test_object_for_another_key_is_rejected(tmp_path, remote_url):
    out = io.StringIO()
    writer = Store(tmp_path / "a", RemoteCache(remote_url, "rw", SECRET))
    entry = cpu.compile_op(OP, writer)
    other = AXPY(**{**OP.config(), "tile_size": 256})
    other_key = cpu.recipe_for(other).key
    import fsspec

    fs, root = fsspec.core.url_to_fs(remote_url)
    fs.pipe_file(f"{root}/{other_key}.zip", fs.cat_file(f"{root}/{entry.key}.zip"))
    reader = Store(tmp_path / "b", RemoteCache(remote_url, "ro", SECRET, out=out))
    rebuilt = cpu.compile_op(other, reader)
    assert f"manifest is for key {entry.key}, not {other_key}" in out.getvalue()
    assert rebuilt.key == other_key and reader.lookup(other_key) is not None


# ---- write-once, concurrent writers ------------------------------------------------------------


def test_put_once_never_overwrites_and_one_of_many_racing_writers_wins(remote_url):
    remote = RemoteCache(remote_url, "rw", SECRET)
    path = remote.object_path("f" * 32)
    assert remote.put_once(path, b"first")
    assert not remote.put_once(path, b"second")
    assert remote._filesystem()[0].cat_file(path) == b"first"

    race = remote.object_path("e" * 32)
    start = threading.Barrier(6)
    won = []

    def writer(n):
        start.wait()
        if remote.put_once(race, f"writer {n}".encode() * 1000):
            won.append(n)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1
    assert remote._filesystem()[0].cat_file(race) == f"writer {won[0]}".encode() * 1000


WRITER = """
import json, sys, time
from iron.store import Store
from iron.operators import AXPY
from iron.remote_cache import RemoteCache
from iron.targets import cpu
remote = RemoteCache(sys.argv[2], "rw", sys.argv[3])
op = AXPY(size=2048, scalar_factor=0.25, tile_size=256, num_aie_columns=1, num_channels=1)
cpu.recipe_for(op)  # the compiler's identity, before the start line
time.sleep(max(0.0, float(sys.argv[4]) - time.time()))
entry = cpu.compile_op(op, Store(sys.argv[1], remote))
print(json.dumps({"key": entry.key, "counts": remote.take_counts()}))
"""


def test_two_processes_building_one_key_leave_one_valid_object(tmp_path, remote_url):
    import time

    start = time.time() + 3  # both processes imported and waiting by then
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path / f"local{n}"),
                               remote_url, SECRET, str(start)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for n in range(2)]
    results = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), results
    done = [json.loads(out) for out, _ in results]
    assert done[0]["key"] == done[1]["key"]
    assert sum(d["counts"].get("uploads", 0) for d in done) == 1, done
    assert remote_objects(remote_url) == [f"{done[0]['key']}.zip"]
    fresh = RemoteCache(remote_url, "ro", SECRET)
    assert fresh.fetch(Store(tmp_path / "check"), done[0]["key"]) is not None


# ---- read-only and the trust rule --------------------------------------------------------------


def test_read_only_client_downloads_but_never_writes(tmp_path, remote_url):
    reader = RemoteCache(remote_url, "ro", SECRET)
    built = cpu.compile_op(OP, Store(tmp_path / "a", reader))  # a miss: built here only
    assert reader.take_counts() == {"misses": 1}
    assert remote_objects(remote_url) == []

    cpu.compile_op(OP, Store(tmp_path / "b", RemoteCache(remote_url, "rw", SECRET)))
    got = cpu.compile_op(OP, Store(tmp_path / "c", reader))
    assert reader.take_counts() == {"hits": 1}
    assert got.file(cpu.LIBRARY).read_bytes() == built.file(cpu.LIBRARY).read_bytes()


def test_without_a_key_a_local_directory_is_read_and_checked_against_hashes(tmp_path):
    url = f"file://{tmp_path / 'remote'}"
    cpu.compile_op(OP, Store(tmp_path / "a", RemoteCache(url, "rw", SECRET)))
    keyless = RemoteCache(url)
    assert keyless.mode == "ro"
    assert cpu.compile_op(OP, Store(tmp_path / "b", keyless)) is not None
    assert keyless.take_counts() == {"hits": 1}
    rewrite(url, cpu.recipe_for(OP).key, flip_library)
    out = io.StringIO()
    keyless.out = out
    cpu.compile_op(OP, Store(tmp_path / "c", keyless))
    assert "does not match its hash" in out.getvalue()


@pytest.mark.parametrize("url, mode, secret, message", [
    ("s3://bucket/prefix", None, None, "without IRON_REMOTE_CACHE_KEY only a local directory"),
    ("file:///tmp/x", "rw", None, "uploads are signed, so writing needs IRON_REMOTE_CACHE_KEY"),
    ("file:///tmp/x", "readwrite", SECRET, "IRON_REMOTE_CACHE_MODE='readwrite': must be rw"),
    ("file:///tmp/x", "rw", "short", "IRON_REMOTE_CACHE_KEY is 5 characters"),
    ("nosuchscheme://x/y", "ro", SECRET, "fsspec cannot open it"),
])
def test_configurations_the_rule_refuses(url, mode, secret, message):
    with pytest.raises(RemoteCacheError, match=message):
        RemoteCache(url, mode, secret)


def test_doit_refuses_an_unsigned_s3_cache_with_one_line(tmp_path):
    project = copy_project(tmp_path / "p")
    env = {**os.environ, "IRON_REMOTE_CACHE": "s3://bucket/prefix"}
    env.pop("IRON_REMOTE_CACHE_KEY", None)
    result = doit(project, env=env, check=False)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]  # one line
    assert result.stderr.startswith(
        "error: IRON_REMOTE_CACHE=s3://bucket/prefix: without IRON_REMOTE_CACHE_KEY")
    assert not (project / "build" / "ops").exists()


def test_environment_is_read_once_into_the_default_store(monkeypatch, tmp_path):
    monkeypatch.setenv("IRON_REMOTE_CACHE", f"file://{tmp_path}")
    monkeypatch.setenv("IRON_REMOTE_CACHE_KEY", SECRET)
    monkeypatch.delenv("IRON_REMOTE_CACHE_MODE", raising=False)
    from_env.cache_clear()
    try:
        remote = Store().remote
        assert remote is not None and remote.mode == "rw" and remote is Store().remote
        assert Store(tmp_path / "explicit").remote is None
    finally:
        from_env.cache_clear()


def test_an_unreachable_remote_costs_one_warning_and_the_build_goes_on(tmp_path, monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there
    for k, v in {**AWS, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}.items():
        monkeypatch.setenv(k, v)
    out = io.StringIO()
    remote = RemoteCache(f"s3://iron-cache/down{port}", "rw", SECRET, out=out,
                         config_kwargs={"retries": {"max_attempts": 1}})
    store = Store(tmp_path / "local", remote)
    first = cpu.compile_op(OP, store)
    other = cpu.compile_op(AXPY(**{**OP.config(), "tile_size": 256}), store)
    assert store.lookup(first.key) is not None and store.lookup(other.key) is not None
    warnings = out.getvalue().splitlines()
    assert len(warnings) == 1, warnings
    assert "reading failed" in warnings[0] and "going on without the remote cache" in warnings[0]
    assert remote.take_counts() == {}
