"""The remote artifact cache, against a real S3 API (moto's server on 127.0.0.1, started and
stopped here) and a file:// directory: two clones share compiles, tampering and flipped bytes
anywhere in an object are caught before anything is unpacked and cost one warning and a local
compile, concurrent writers leave one object, read-only clients never write, the trust rule
holds."""

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
from buildtools import demo_error, doit, executed, run_bundle  # noqa: E402

from iron.operators import AXPY  # noqa: E402
from iron import remote_cache  # noqa: E402
from iron.cache import default_store  # noqa: E402
from iron.remote_cache import RemoteCache, RemoteCacheError, from_env, seal  # noqa: E402
from iron.store import Store  # noqa: E402
from iron.targets import cpu  # noqa: E402

pytestmark = pytest.mark.slow  # end to end: bundles, servers, doit runs

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
    assert ran.returncode == 0 and demo_error(ran.stdout) == 0, ran.stderr

    noop = doit(b, env=env)  # nothing to do: nothing looked up
    assert "(rw): 0 hits (downloaded), 0 misses, 0 uploads" in noop.stdout


def test_a_build_beside_a_cache_of_flipped_objects_succeeds_compiling_them(tmp_path):
    """Clone A uploads the demo's 6 objects; each gets a byte flipped in another part (as
    stored, or signed after the flip).  Clone B's build rejects all 6 in one line each, compiles
    them, and its bundle runs."""
    cc, log = counting_compiler(tmp_path)
    url = f"file://{tmp_path / 'remote'}"
    env = {**os.environ, "CC": str(cc), "IRON_REMOTE_CACHE": url,
           "IRON_REMOTE_CACHE_KEY": SECRET}
    a, b = copy_project(tmp_path / "a"), copy_project(tmp_path / "b")
    doit(a, env=env)
    fs, path = object_store(url)
    keys = [name.removesuffix(remote_cache.SUFFIX) for name in remote_objects(url)]
    assert len(keys) == 6 and compiles(log) == 6
    for n, key in enumerate(keys):
        data = fs.cat_file(path(key))
        classes = list(byte_classes(data).values())
        bad = bytearray(data)
        bad[classes[n % len(classes)]] ^= 0x10
        if n % 2:  # signed after the flip: only a flip inside the body is still a body
            bad = bytearray(data)
            bad[classes[1 + n % 4]] ^= 0x10
            bad = seal(key, body_of(bytes(bad)), SECRET.encode())
        fs.pipe_file(path(key), bytes(bad))

    second = doit(b, env={**env, "IRON_REMOTE_CACHE_MODE": "ro"})
    assert f"remote cache {url} (ro): 0 hits (downloaded), 0 misses, 0 uploads, 6 rejected" \
        in second.stdout, second.stdout + second.stderr
    rejected = [line for line in (second.stdout + second.stderr).splitlines()
                if line.startswith("warning: remote cache: rejected")]
    assert len(rejected) == 6 and "Traceback" not in second.stdout + second.stderr
    assert compiles(log) == 12  # every rejected object compiled here
    ran = run_bundle(b / "build/demo/cpu", {**env, "PYTHONPATH": str(b)})
    assert ran.returncode == 0 and demo_error(ran.stdout) == 0, ran.stderr


# ---- trust: tampering ----------------------------------------------------------------------


def object_store(url):
    """(filesystem, path of a key's object) of a remote location, as an attacker sees it."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(url)
    return fs, lambda key: f"{root}/{key}{remote_cache.SUFFIX}"


def body_of(data):
    """The body (the store's zip) of stored bytes, whether or not they verify."""
    return data[len(remote_cache.HEADER):-remote_cache.TRAILER_BYTES]


def zip_members(body):
    with zipfile.ZipFile(io.BytesIO(body)) as z:
        return {name: z.read(name) for name in z.namelist()}


def zipped(members):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buffer.getvalue()


def rewrite(url, key, tamper):
    """Overwrite the remote object of ``key`` with ``tamper(key, stored bytes)`` (as someone
    with write access to the location could); the new bytes."""
    fs, path = object_store(url)
    data = tamper(key, fs.cat_file(path(key)))
    fs.pipe_file(path(key), data)
    return data


def flipped_library_body(data):
    members = zip_members(body_of(data))
    library = bytearray(members[cpu.LIBRARY])
    library[len(library) // 2] ^= 0xFF
    members[cpu.LIBRARY] = bytes(library)
    return zipped(members)


def flip_library(key, data):
    """A patched library; the trailer left as it was."""
    trailer = data[len(data) - remote_cache.TRAILER_BYTES:]
    return remote_cache.HEADER + flipped_library_body(data) + trailer


def matching_hash(key, data):
    """A patched library with the object's hash recomputed: only the signature can tell."""
    import hashlib

    before = remote_cache.HEADER + flipped_library_body(data) + data[-131:-65]  # old signature
    return before + hashlib.sha256(key.encode() + b"\n" + before).hexdigest().encode() + b"\n"


def resigned_with_another_key(key, data):
    return seal(key, flipped_library_body(data), b"x" * 40)


def signed_bad_library(key, data):
    """A patched library signed with the team's key (a writer whose disk flipped a bit): the
    object verifies, the entry does not."""
    return seal(key, flipped_library_body(data), SECRET.encode())


def signed_garbage(key, data):
    """A signed body that is no archive at all."""
    return seal(key, b"PK\x03\x04" + bytes(200), SECRET.encode())


@pytest.mark.parametrize("tamper, reason", [
    (flip_library, "its bytes do not match its hash"),
    (matching_hash, "the signature does not verify"),
    (resigned_with_another_key, "the signature does not verify"),
    (signed_bad_library, "kernel.so does not match its hash in the manifest"),
    (signed_garbage, "it does not unpack: zipfile.BadZipFile"),
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
    fs, path = object_store(remote_url)
    assert fs.cat_file(path(good.key)) == tampered


def byte_classes(data):
    """One position in each part of a stored object: its header line, the zip's local header,
    compressed data, central directory and end record inside the body, the trailer's signature
    and hash, and the trailer's last byte."""
    body_at = len(remote_cache.HEADER)
    with zipfile.ZipFile(io.BytesIO(body_of(data))) as z:
        info = max(z.infolist(), key=lambda i: i.compress_size)  # the library
        data_at = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
        directory = z.start_dir
    body_end = len(data) - remote_cache.TRAILER_BYTES
    return {"header": 5, "zip local header": body_at + info.header_offset + 30,  # its name
            "compressed body": body_at + data_at + info.compress_size // 2,
            "central directory": body_at + directory + 16,  # the first member's CRC-32
            "end record": body_end - 6,  # where the central directory starts
            "trailer signature": body_end + 10, "trailer hash": len(data) - 10,
            "trailer end": len(data) - 1}


def test_every_flipped_byte_is_rejected_before_anything_is_unpacked(tmp_path):
    """Every byte of a stored object, flipped, fails the check over the bytes as stored (with
    the key, and without it on a local directory), before zipfile or zlib see anything."""
    url = f"file://{tmp_path / 'remote'}"
    entry = cpu.compile_op(OP, Store(tmp_path / "a", RemoteCache(url, "rw", SECRET)))
    fs, path = object_store(url)
    data = fs.cat_file(path(entry.key))
    assert remote_cache.unseal(entry.key, data, SECRET.encode()) == body_of(data)
    assert len(byte_classes(data)) == 8  # every part is in the object
    for secret in (SECRET.encode(), None):
        for i in range(len(data)):
            for bit in (0x01, 0x80):
                bad = bytearray(data)
                bad[i] ^= bit
                with pytest.raises(remote_cache.Rejected):
                    remote_cache.unseal(entry.key, bytes(bad), secret)
    for cut in (1, remote_cache.TRAILER_BYTES, len(data) - 1):
        with pytest.raises(remote_cache.Rejected):
            remote_cache.unseal(entry.key, data[:-cut], SECRET.encode())
    with pytest.raises(remote_cache.Rejected, match="do not match its hash for key"):
        remote_cache.unseal("0" * 32, data, SECRET.encode())  # another key's name


@pytest.mark.parametrize("signed", [False, True], ids=["as stored", "signed after the flip"])
def test_a_byte_flipped_anywhere_costs_one_warning_and_a_local_compile(tmp_path, signed):
    """A flip in each part of an object, through the store: as stored (the tier's check
    rejects it), or signed after the flip (a writer's bad disk: the body fails to decompress or
    to match its manifest, and the store rejects it).  Never an exception, always the real
    library."""
    url = f"file://{tmp_path / 'remote'}"
    good = cpu.compile_op(OP, Store(tmp_path / "a", RemoteCache(url, "rw", SECRET)))
    fs, path = object_store(url)
    data = fs.cat_file(path(good.key))
    classes = byte_classes(data)
    if signed:  # only the body's parts: a signature covers exactly the body it is made over
        classes = {k: v for k, v in classes.items()
                   if len(remote_cache.HEADER) <= v < len(data) - remote_cache.TRAILER_BYTES}
    for n, (where, i) in enumerate(classes.items()):
        bad = bytearray(data)
        bad[i] ^= 0x5A
        if signed:
            bad = seal(good.key, body_of(bytes(bad)), SECRET.encode())
        fs.pipe_file(path(good.key), bytes(bad))
        out = io.StringIO()
        remote = RemoteCache(url, "ro", SECRET, out=out)
        entry = cpu.compile_op(OP, Store(tmp_path / f"reader{n}", remote))
        warnings = out.getvalue().splitlines()
        assert len(warnings) == 1 and "rejected" in warnings[0], (where, warnings)
        assert remote.take_counts() == {"rejected": 1}, where
        assert entry.file(cpu.LIBRARY).read_bytes() == good.file(cpu.LIBRARY).read_bytes()


def test_object_for_another_key_is_rejected(tmp_path, remote_url):
    """Copied under another key's name, an object fails its signature (the key is signed);
    signed anew for that key by a writer, its manifest still names the key it was built for."""
    writer = Store(tmp_path / "a", RemoteCache(remote_url, "rw", SECRET))
    entry = cpu.compile_op(OP, writer)
    other = AXPY(**{**OP.config(), "tile_size": 256})
    other_key = cpu.recipe_for(other).key
    fs, path = object_store(remote_url)
    stored = fs.cat_file(path(entry.key))
    for data, reason in ((stored, f"do not match its hash for key {other_key}"),
                         (seal(other_key, body_of(stored), SECRET.encode()),
                          f"its manifest is for key {entry.key}, not {other_key}")):
        fs.pipe_file(path(other_key), data)
        out = io.StringIO()
        reader = Store(tmp_path / f"b{len(reason)}", RemoteCache(remote_url, "ro", SECRET,
                                                                 out=out))
        rebuilt = cpu.compile_op(other, reader)
        assert reason in out.getvalue() and len(out.getvalue().splitlines()) == 1
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
    assert remote_objects(remote_url) == [f"{done[0]['key']}{remote_cache.SUFFIX}"]
    fresh = RemoteCache(remote_url, "ro", SECRET)
    assert Store(tmp_path / "check", fresh)._fetch(done[0]["key"]) is not None


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
    assert "do not match its hash" in out.getvalue()


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
        remote = default_store().remote
        assert remote is not None and remote.mode == "rw" and remote is default_store().remote
        assert Store(tmp_path / "explicit").remote is None and Store().remote is None
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
