"""Robustness on other hosts and against bad input: each test is one probe that once failed
(a profile tuned on 2 cores on a 1-core host, a flipped weight byte, a manifest pointing
outside its bundle, gc beside a running build, a 10k-entry profile, a misspelt doit variable,
...). The doit tests run the real doit CLI on the demo application in a copy of the project."""

import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import iron
from iron.resolution import resolve
from iron import host
from iron.errors import BundleError, CheckpointError, IronError, ProfileError
from iron.pipeline import bundle as bundles
from iron.profile import Profile

from buildtools import ROOT, doit, executed, run_bundle, set_profile  # noqa: F401

pytestmark = pytest.mark.slow  # end to end: bundles, servers, doit runs

TASKSET = shutil.which("taskset")


def rewrite_manifest(path: Path, change) -> None:
    """Edit a bundle's manifest and re-sign it, as someone meaning harm could."""
    manifest = json.loads((path / "manifest.json").read_text())
    change(manifest)
    manifest["digest"] = bundles.manifest_digest(manifest)
    (path / "manifest.json").write_text(json.dumps(manifest))


@pytest.fixture(scope="module")
def demo_bundle(tmp_path_factory):
    """The demo application's bundle, built once by the real doit in a project copy."""
    base = tmp_path_factory.mktemp("demo")
    copy = base / "project"
    copy.mkdir()
    for name in ("iron", "apps"):
        shutil.copytree(ROOT / name, copy / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("dodo.py", "pyproject.toml"):
        shutil.copy2(ROOT / name, copy / name)
    doit(copy)
    return copy / "build" / "demo" / "cpu"


@pytest.fixture
def bundle_copy(demo_bundle, tmp_path):
    out = tmp_path / "bundle"
    shutil.copytree(demo_bundle, out)
    return out


# ---- the host: cores from affinity, -march level, ISA features -----------------------------

@pytest.mark.skipif(TASKSET is None, reason="needs taskset (util-linux)")
def test_cpu_columns_are_the_usable_cores_not_the_machines():
    code = "import iron; print(iron.device('cpu').columns)"
    one = subprocess.run([TASKSET, "-c", "0", sys.executable, "-c", code], capture_output=True,
                         text=True, check=True, cwd=ROOT)
    assert one.stdout.strip() == "1"
    env = {**os.environ, "IRON_THREADS": "1"}
    capped = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, env=env, cwd=ROOT)
    assert capped.stdout.strip() == "1"
    assert iron.device("cpu").columns == len(os.sched_getaffinity(0))


def test_march_level_features_come_from_the_compiler():
    from iron.targets.cpu import compiler

    cc = compiler()[0]
    v3 = host.required_features(cc, "x86-64-v3")
    assert {"avx2", "fma", "f16c", "bmi2"} <= set(v3)
    assert not any(f.startswith("avx512") for f in v3)
    v4 = host.required_features(cc, "x86-64-v4")
    assert {"avx512f", "avx512bw", "avx512vl"} <= set(v4) and set(v3) <= set(v4)
    # native: exactly what this host has, so a bundle built here opens here
    assert host.missing_features(host.required_features(cc, "native")) == []
    with pytest.raises(IronError, match="march='no such level'"):
        host.check_march("no such level")


def test_march_is_in_the_artifact_key(monkeypatch):
    from iron.operators import AXPY
    from iron.targets import cpu

    op = resolve(AXPY(size=2048, scalar_factor=1.5), "cpu")
    native = cpu.recipe_for(op)
    monkeypatch.setenv("IRON_MARCH", "x86-64-v3")
    v3 = cpu.recipe_for(op)
    assert v3.key != native.key and v3.description["march"] == "x86-64-v3"
    assert "-march=x86-64-v3" in v3.description["flags"] and v3.description["host"] is None


def test_missing_isa_feature_is_a_one_line_error(bundle_copy):
    manifest = json.loads((bundle_copy / "manifest.json").read_text())
    assert manifest["march"] == "native" and "avx2" in manifest["isa"]
    iron.pipeline.bundle.Bundle.open(bundle_copy)  # this host has them all
    without = host.features() - {"avx2"}
    with pytest.raises(BundleError) as e:
        bundles.Bundle.open(bundle_copy, flags=without)
    assert "needs CPU feature avx2" in str(e.value) and "\n" not in str(e.value)


# ---- bundles: verified weights, kernels, manifest ------------------------------------------

def test_flipped_weight_byte_is_a_one_line_error(bundle_copy):
    weights = bundle_copy / "weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[-100] ^= 0x01  # a byte of tensor data
    weights.write_bytes(bytes(data))
    with pytest.raises(BundleError, match="weights.safetensors does not match its manifest"):
        bundles.Bundle.open(bundle_copy).weights()
    result = run_bundle(bundle_copy)
    assert result.returncode != 0
    assert result.stderr.strip().count("\n") == 0 and "does not match" in result.stderr


def test_weights_hash_costs_a_small_fraction_of_the_load(demo_bundle):
    from iron.tensorfile import read_safetensors

    path = demo_bundle / "weights.safetensors"
    for _ in range(2):  # the same file, cached; best of five each, side by side
        plain = min(_timed(lambda: read_safetensors(path)) for _ in range(5))
        hashed = min(_timed(lambda: read_safetensors(path, digest=[])) for _ in range(5))
    assert hashed < plain * 1.5 + 0.002, (plain, hashed)


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def test_kernel_path_outside_the_bundle_is_refused(bundle_copy):
    rewrite_manifest(bundle_copy, lambda m: m["programs"]["block"]["kernels"].__setitem__(
        0, "../../../etc/passwd"))
    with pytest.raises(BundleError) as e:
        bundles.Bundle.open(bundle_copy)
    assert "'../../../etc/passwd' is not a kernel of this bundle" in str(e.value)
    assert "\n" not in str(e.value)


def test_kernel_list_one_short_is_refused(bundle_copy):
    rewrite_manifest(bundle_copy, lambda m: m["programs"]["block"]["kernels"].pop())
    with pytest.raises(BundleError, match="has 5 steps but 4 kernels"):
        bundles.Bundle.open(bundle_copy)


def test_kernel_listed_but_not_in_files_is_refused(bundle_copy):
    def change(m):
        m["runtime"] = "kernels/" + "0" * 32 + ".so"
    rewrite_manifest(bundle_copy, change)
    with pytest.raises(BundleError, match="runtime = 'kernels/0+.so' is not among"):
        bundles.Bundle.open(bundle_copy)


def test_manifest_missing_a_key_or_edited_is_refused(bundle_copy):
    manifest = json.loads((bundle_copy / "manifest.json").read_text())
    manifest["meta"]["dim"] = 7  # edited without re-signing
    (bundle_copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="does not match its digest"):
        bundles.Bundle.open(bundle_copy)
    rewrite_manifest(bundle_copy, lambda m: m.pop("runtime"))
    with pytest.raises(BundleError, match="field 'runtime' is missing"):
        bundles.Bundle.open(bundle_copy)


def test_step_tensor_index_out_of_range_is_refused(bundle_copy):
    rewrite_manifest(bundle_copy, lambda m: m["programs"]["block"]["steps"][0][
        "inputs"].__setitem__(0, 999))
    with pytest.raises(BundleError, match="tensor index 999"):
        bundles.Bundle.open(bundle_copy).program("block")


def test_context_beyond_the_kv_cache_is_refused(tmp_path):
    from conftest import make_bundle
    from iron.lm.generate import LanguageModel
    from tiny_llama import write_tiny_llama

    checkpoint = write_tiny_llama(tmp_path / "tiny", seed=4)
    out = make_bundle(checkpoint, tmp_path / "bundle", context=16, chunk=8)
    rewrite_manifest(out, lambda m: m["meta"].__setitem__("context", 64))
    with pytest.raises(BundleError, match="meta.context = 64 but the KV cache holds .16."):
        LanguageModel(out)


# ---- doit: variables, errors, rebuilds, names, speed ----------------------------------------

def test_unknown_or_bad_doit_variables_are_one_line_errors(project):
    for args, message in ((["devce=npu2"], "unknown doit variable 'devce'"),
                          (["promt=hi"], "unknown doit variable 'promt'"),
                          (["hidden=abc"], "hidden='abc': must be an integer"),
                          (["threads=-5"], "threads='-5': must be an integer"),
                          (["device=npu7"], "device='npu7': must be one of cpu, npu1, npu2"),
                          (["march=a b"], "march='a b': not a -march level"),
                          (["checkpoint="], "checkpoint='': must name a file or folder")):
        result = doit(project, *args, check=False)
        assert result.returncode != 0, args
        assert message in result.stderr, result.stderr
        assert "Traceback" not in result.stderr + result.stdout
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_bad_variable_for_iron_run_is_one_iron_error_line(tmp_path, monkeypatch, capsys):
    """``iron run`` builds through the doit graph: a variable the graph refuses is an
    ``IronError`` (``BuildError`` is one, and doit's ``InvalidDodoFile`` for ``doit``), said in
    one line with status 2, not a traceback."""
    from iron import cli
    from iron.pipeline.tasks import BuildError

    monkeypatch.setenv("IRON_BUILD_DIR", str(tmp_path / "build"))
    with pytest.raises(BuildError) as refused:
        cli.ensure_bundle({"app": "demo", "hidden": "0"})
    assert isinstance(refused.value, IronError)
    assert cli.main(["run", "--batch", "0", "-p", "hi"]) == 2
    said = capsys.readouterr().err
    assert said == "error: variable batch='0': must be an integer from 1 to 64\n", said


def test_iron_errors_in_tasks_are_one_line(project):
    (project / "profiles" / "demo" / f"cpu-{host.class_name()}.json").write_text(
        '{"device": "cpu", "entries": [\n  {"operator": "GEMV", "M": 512, "M": 512, '
        '"tile_size_input": 4}\n]}\n')
    result = doit(project, check=False)
    assert result.returncode != 0
    assert "key 'M' appears twice" in result.stderr + result.stdout
    assert "Traceback" not in result.stderr + result.stdout


def test_a_profile_value_past_its_kernels_range_stops_doit_in_one_line(project):
    """prefetch: 2**70 once reached gcc as a literal it truncated to 0; it is refused before
    any compile, naming the entry, the value and the range the kernel states."""
    profile = project / "profiles" / "demo" / f"cpu-{host.class_name()}.json"
    profile.parent.mkdir(parents=True, exist_ok=True)
    profile.write_text('{"device": "cpu", "entries": [\n'
                       f'  {{"operator": "GEMV", "prefetch": {2**70}}}\n]}}\n')
    result = doit(project, check=False)
    said = result.stdout + result.stderr
    assert result.returncode != 0 and "Traceback" not in said
    errors = [line for line in said.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"prefetch={2**70} (from profile entry" in errors[0], said
    assert "breaks the rule 1 <= prefetch <= 65536 (the range qmatmul.h states" in errors[0]
    assert "compile:" not in result.stdout, result.stdout


def test_damaged_bundle_is_rebuilt(project):
    doit(project)
    out = project / "build" / "demo" / "cpu"
    kernel = sorted((out / "kernels").glob("*.so"))[0]
    kernel.unlink()
    assert executed(doit(project), "bundle") == ["bundle"]
    kernel.write_bytes(kernel.read_bytes() + b"\0")
    assert executed(doit(project), "bundle") == ["bundle"]
    weights = out / "weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    assert executed(doit(project), "bundle") == ["bundle"]
    assert executed(doit(project), "bundle") == []
    assert run_bundle(out).returncode == 0


def test_march_bundle_has_its_own_folder_and_manifest_record(project):
    result = doit(project, "march=x86-64-v3")
    assert "[1/5]" in result.stdout  # compile tasks count
    out = project / "build" / "demo" / "cpu-x86-64-v3"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["march"] == "x86-64-v3" and "avx2" in manifest["isa"]
    assert not any(f.startswith("avx512") for f in manifest["isa"])
    assert not (project / "build" / "demo" / "cpu").exists()
    assert run_bundle(out).returncode == 0


def test_bundle_names_keep_checkpoints_and_contexts_apart(monkeypatch):
    from iron.pipeline.tasks import BuildGraph

    def name(**variables):
        return BuildGraph(variables).bundle_dir.name

    assert name() == "cpu"
    assert name(context="4096") == "cpu-ctx4096"
    a, b = name(checkpoint="/x/model-a"), name(checkpoint="/y/model-a")
    assert a.startswith("cpu-model-a-") and b.startswith("cpu-model-a-") and a != b
    assert name(checkpoint="/x/m", context="512", march="x86-64-v3").endswith(
        "-ctx512-x86-64-v3")


@pytest.mark.skipif(TASKSET is None, reason="needs taskset (util-linux)")
def test_profile_from_a_two_core_host_builds_on_one_core(project):
    """On one core the 1-thread class's profile is read, never the 2-core one; an entry of it
    that breaks a rule here (written by hand) falls back to the defaults with one warning."""
    entries = [
        {"operator": "GEMV", "M": 512, "K": 256, "tile_size_output": 64, "num_aie_columns": 2},
        {"operator": "GEMV", "M": 256, "K": 512, "num_aie_columns": 2}]
    set_profile(project, [{"operator": "GEMV", "M": 512, "K": 256, "tile_size_output": 16}])
    one_core = project / "profiles" / "demo" / f"cpu-{host.class_name(1)}.json"
    one_core.write_text('{"device": "cpu", "entries": [\n  '
                        + ",\n  ".join(json.dumps(e) for e in entries) + "\n]}\n")
    env = {**os.environ, "PYTHONPATH": str(project)}
    result = subprocess.run([TASKSET, "-c", "0", sys.executable, "-m", "doit", "app=demo"],
                            cwd=project, capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1, result.stderr
    assert "2 profile entries do not fit this host" in warnings[0]
    assert "num_aie_columns <= 1" in warnings[0] and f"{one_core.name} lines 2, 3" in warnings[0]
    bundle = project / "build" / "demo" / "cpu"
    manifest = json.loads((bundle / "manifest.json").read_text())
    columns = {s["fields"]["num_aie_columns"] for s in manifest["programs"]["block"]["steps"]}
    assert columns == {1}
    assert subprocess.run([TASKSET, "-c", "0", sys.executable, "-m", "apps.demo", str(bundle)],
                          cwd=project, env=env, timeout=120).returncode == 0


def test_noop_doit_is_fast(project):
    doit(project)
    doit(project)
    env = {**os.environ, "PYTHONPATH": str(project)}
    times = []  # CPU seconds of the doit process: wall time on a shared machine is noise
    for _ in range(3):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        result = subprocess.run([sys.executable, "-m", "doit", "app=demo"], cwd=project,
                                env=env, capture_output=True, text=True, check=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        times.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        assert executed(result) == [] and executed(result, "bundle") == []
    assert min(times) <= 0.5, times
    imports = subprocess.run([sys.executable, "-X", "importtime", "-m", "doit", "app=demo"],
                             cwd=project, env=env, capture_output=True, text=True, check=True)
    loaded = {line.split("|")[-1].strip() for line in imports.stderr.splitlines()}
    # the application's package declares its variables; its code (apps.demo.app) stays out
    assert "doit" in loaded and "numpy" not in loaded and "apps.demo.app" not in loaded


# ---- gc beside running builds and other checkouts -------------------------------------------

def test_gc_spares_a_temp_folder_a_build_holds(project, tmp_path):
    from iron.store import locked_temp_folder

    cache = tmp_path / "shared-cache"
    env = {"IRON_CACHE_DIR": str(cache)}
    doit_env(project, env)
    old = time.time() - 3600
    with locked_temp_folder(cache, ".tmp-inuse-") as held:
        os.utime(held, (old, old))  # old, but held: a long compile in another checkout
        abandoned = cache / ".tmp-abandoned-x"
        abandoned.mkdir()
        os.utime(abandoned, (old, old))
        doit_env(project, env, "gc")
        assert held.is_dir() and not abandoned.exists()


def test_gc_keeps_other_checkouts_entries_in_a_shared_cache(project, tmp_path):
    cache = tmp_path / "shared-cache"
    env = {"IRON_CACHE_DIR": str(cache)}
    other = tmp_path / "other"
    shutil.copytree(project, other)
    doit_env(project, env)
    theirs = set(os.listdir(cache))
    set_profile(other, [{"operator": "GEMV", "M": 512, "K": 256, "tile_size_output": 32}])
    doit_env(other, env)
    result = doit_env(other, env, "gc")
    assert "unused for 7 days" in result.stdout
    assert theirs <= set(os.listdir(cache))  # the first checkout's entries survive
    doit_env(other, env, "gc", "days=0")
    assert not theirs <= set(os.listdir(cache))  # told otherwise, they go


def doit_env(project, env, *args):
    environment = {**os.environ, "PYTHONPATH": str(project), **env}
    result = subprocess.run([sys.executable, "-m", "doit", *args, "app=demo"], cwd=project,
                            capture_output=True, text=True, env=environment, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def test_unwritable_cache_is_a_one_line_error(tmp_path):
    from iron.operators import AXPY
    from iron.store import Store
    from iron.targets import cpu

    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    op = resolve(AXPY(size=2048, scalar_factor=1.5), "cpu")
    with pytest.raises(IronError, match="cannot create a build folder in .*file/cache"):
        cpu.compile_op(op, Store(blocker / "cache"))


# ---- profiles: fast, strict ----------------------------------------------------------------

def _profile_text(n: int) -> str:
    lines = [json.dumps({"operator": "GEMV", "M": 64 * (i + 1), "K": 576, "batches": 1,
                         "tile_size_input": 4, "tile_size_output": 32, "num_aie_columns": 2})
             for i in range(n)]
    return '{"device": "cpu", "entries": [\n  ' + ",\n  ".join(lines) + "\n]}\n"


def test_ten_thousand_entry_profile_loads_in_under_a_second():
    text = _profile_text(10_000)
    start = time.perf_counter()
    profile = Profile.loads(text, "big.json")
    elapsed = time.perf_counter() - start
    assert len(profile) == 10_000 and elapsed < 1.0, elapsed
    from iron.operators import GEMV

    op = GEMV(M=64 * 5000, K=576, batches=1)
    start = time.perf_counter()
    assert profile.lookup(op)["tile_size_output"][0] == 32
    assert time.perf_counter() - start < 0.01


def test_profile_duplicate_keys_and_nan_are_errors():
    head = '{"device": "cpu", "entries": [\n'
    with pytest.raises(ProfileError, match="x.json line 2: key 'M' appears twice"):
        Profile.loads(head + '  {"operator": "GEMV", "M": 1, "M": 2, "tile_size_input": 4}\n]}',
                      "x.json")
    with pytest.raises(ProfileError, match="x.json line 2 .*NaN and Infinity are not JSON"):
        Profile.loads(head + '  {"operator": "GEMV", "M": NaN, "tile_size_input": 4}\n]}',
                      "x.json")
    with pytest.raises(ProfileError, match="key 'device' appears twice"):
        Profile.loads('{"device": "cpu", "device": "npu1", "entries": []}', "x.json")
    # a ':' inside a string is not a key: no false alarm
    ok = Profile.loads('{"device": "cpu", "host": {"cpu": "a: b"}, "entries": []}', "x.json")
    assert ok.host == {"cpu": "a: b"}


def test_profile_records_the_host_it_was_tuned_on():
    profile = Profile(device="cpu", host=host.summary())
    again = Profile.loads(profile.dumps())
    assert again.host["cores"] == host.usable_cores() and again.host["march"] == host.march()


# ---- files users hand iron: bounded, regular, read before the weights -----------------------

def run_capped(args, cwd=None, env=None, umask=None, timeout=120):
    """Run a command with its memory capped at 3 GiB and a time limit, so that a read without
    bound fails quickly instead of taking the machine's memory, and a hang is a failure."""
    def limits():
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
        if umask is not None:
            os.umask(umask)

    try:
        return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout, preexec_fn=limits)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{args[-2:]} did not finish in {timeout} s: it waits on a FIFO or reads "
                    "without end")


HOSTILE = {  # what the file is -> what the one-line error says
    "/dev/zero": "it is a character device, not a regular file",
    "FIFO": "it is a FIFO, not a regular file",
    "100 GiB": f"it is {100 << 30} bytes, over the 64 MiB limit for {{what}}",
}


def make_hostile(path: Path, kind: str) -> None:
    path.unlink(missing_ok=True)
    if kind == "/dev/zero":
        path.symlink_to("/dev/zero")
    elif kind == "FIFO":
        os.mkfifo(path)
    else:
        with open(path, "wb") as f:
            f.truncate(100 << 30)  # sparse: no disk used, but 100 GiB to a reader


OPEN = """
import sys
from iron.errors import IronError
what, path = sys.argv[1], sys.argv[2]
try:
    if what == "profile":
        from iron.profile import Profile
        Profile.load(path)
    elif what == "checkpoint":
        from apps.llama.family import open_checkpoint
        open_checkpoint(path)
    else:
        from iron.lm.chat import ChatTemplate
        ChatTemplate.from_dir(path)
except IronError as e:
    print(e)
    sys.exit(3)
"""


@pytest.mark.parametrize("kind", HOSTILE)
def test_profile_that_is_a_device_a_fifo_or_huge_is_refused_unread(tmp_path, kind):
    path = tmp_path / "cpu.json"
    make_hostile(path, kind)
    result = run_capped([sys.executable, "-c", OPEN, "profile", str(path)], cwd=ROOT)
    assert result.returncode == 3, result.stderr[-2000:]
    reason = HOSTILE[kind].format(what="a profile")
    assert result.stdout == f"{path}: cannot read the profile ({reason})\n"


@pytest.mark.parametrize("kind", HOSTILE)
def test_doit_refuses_a_profile_that_is_a_device_a_fifo_or_huge_in_one_line(project, kind):
    """The build's fingerprint of the profile reads it too: bounded there as well."""
    profile = project / "profiles" / "demo" / f"cpu-{host.class_name()}.json"
    make_hostile(profile, kind)
    env = {**os.environ, "PYTHONPATH": str(project)}
    result = run_capped([sys.executable, "-m", "doit", "app=demo"], cwd=project, env=env)
    assert result.returncode != 0
    assert "Traceback" not in result.stdout + result.stderr
    reason = HOSTILE[kind].format(what="a profile")
    said = [line for line in (result.stdout + result.stderr).splitlines() if "profile" in line]
    assert said == [f"error: checkpoint: {profile}: cannot read the profile ({reason})"], said


@pytest.mark.parametrize("name, what, kind", [  # a link to /dev/zero leads outside: refused
    ("config.json", "a model config", "FIFO"), ("config.json", "a model config", "100 GiB"),
    ("tokenizer.json", "a tokenizer", "100 GiB")])  # (a FIFO is no file: "missing")
def test_checkpoint_file_that_is_a_fifo_or_huge_is_refused_unread(tmp_path, name, what, kind):
    from tiny_llama import write_tiny_llama

    ckpt = write_tiny_llama(tmp_path / "tiny", seed=1)
    make_hostile(ckpt / name, kind)
    result = run_capped([sys.executable, "-c", OPEN, "checkpoint", str(ckpt)], cwd=ROOT)
    assert result.returncode == 3, result.stderr[-2000:]
    assert f"{ckpt / name}: cannot read" in result.stdout
    assert f"({HOSTILE[kind].format(what=what)})" in result.stdout
    assert result.stdout.count("\n") == 1


@pytest.mark.parametrize("name, what", [("tokenizer_config.json", "a tokenizer config"),
                                        ("chat_template.jinja", "a chat template")])
def test_huge_chat_template_files_are_refused_unread(tmp_path, name, what):
    make_hostile(tmp_path / name, "100 GiB")
    result = run_capped([sys.executable, "-c", OPEN, "chat", str(tmp_path)], cwd=ROOT)
    assert result.returncode == 3, result.stderr[-2000:]
    reason = HOSTILE["100 GiB"].format(what=what)
    assert result.stdout == f"{tmp_path / name}: cannot read it ({reason})\n"


def test_unparsable_bundle_tokenizer_fails_in_one_line_before_the_weights_load(tmp_path,
                                                                               monkeypatch):
    """A bundle whose tokenizer.json is damaged but whose hashes agree (re-signed): refused
    when the model is opened, before its weights are read, not by a traceback afterwards."""
    from conftest import make_bundle
    from iron.lm.generate import LanguageModel
    from iron.util import sha256_file
    from tiny_llama import write_tiny_llama

    checkpoint = write_tiny_llama(tmp_path / "tiny", seed=4)
    out = make_bundle(checkpoint, tmp_path / "bundle", context=16, chunk=8)
    (out / "tokenizer.json").write_text('{"model": {"type": "nonsense"}}')
    rewrite_manifest(out, lambda m: m["files"].__setitem__("tokenizer.json",
                                                           sha256_file(out / "tokenizer.json")))
    bundles.Bundle.open(out)  # the hashes agree

    def weights(self):
        raise AssertionError("the weights were read before the tokenizer was checked")

    with monkeypatch.context() as m:
        m.setattr(bundles.Bundle, "weights", weights)
        with pytest.raises(BundleError, match=r"tokenizer.json: not a tokenizer the tokenizers"):
            LanguageModel(out)
    result = subprocess.run([sys.executable, "-m", "iron.lm.run", str(out), "--prompt", "hi"],
                            capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "tokenizer.json: not a tokenizer the tokenizers library can load" in result.stderr


# ---- files iron writes follow the umask ------------------------------------------------------

@pytest.mark.parametrize("mask, file_mode", [(0o022, 0o644), (0o027, 0o640)],
                         ids=["022", "027"])
def test_saved_profile_follows_the_umask(tmp_path, mask, file_mode):
    from iron.operators import AXPY

    old = os.umask(mask)
    try:
        path = Profile(device="cpu").add(AXPY, tile_size=64).save(tmp_path / "cpu.json")
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == file_mode


def test_bundle_and_cache_follow_the_umask(project):
    """With umask 022, as git and pip would make them: folders 0755 and files 0644 in the
    bundle; the cache's entries are folders others can read too."""
    env = {**os.environ, "PYTHONPATH": str(project)}
    result = run_capped([sys.executable, "-m", "doit", "app=demo"], cwd=project, env=env,
                        umask=0o022, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    bundle = project / "build" / "demo" / "cpu"
    modes = {p.relative_to(bundle): p.stat().st_mode & 0o777
             for p in [bundle, *bundle.rglob("*")]}
    assert {p: m for p, m in modes.items() if (bundle / p).is_dir()} == \
        {Path("."): 0o755, Path("kernels"): 0o755}
    files = {p: m for p, m in modes.items() if (bundle / p).is_file()}
    assert len(files) > 5 and set(files.values()) == {0o644}, files
    entries = [p for p in (project / "build" / "ops").iterdir() if not p.name.startswith(".")]
    assert entries and {p.stat().st_mode & 0o777 for p in entries} == {0o755}
    manifests = {(p / "manifest.json").stat().st_mode & 0o777 for p in entries}
    assert manifests == {0o644}


# ---- checkpoints ---------------------------------------------------------------------------

def test_checkpoint_file_linking_outside_is_refused(tmp_path):
    from apps.llama.family import open_checkpoint
    from tiny_llama import write_tiny_llama

    ckpt = write_tiny_llama(tmp_path / "tiny", seed=1)
    outside = tmp_path / "elsewhere.json"
    shutil.move(ckpt / "tokenizer.json", outside)
    (ckpt / "tokenizer.json").symlink_to(outside)
    with pytest.raises(CheckpointError, match="outside the checkpoint directory"):
        open_checkpoint(ckpt)


def test_checkpoint_tokenizer_is_parsed_at_open(tmp_path):
    from apps.llama.family import open_checkpoint
    from tiny_llama import write_tiny_llama

    ckpt = write_tiny_llama(tmp_path / "tiny", seed=1)
    (ckpt / "tokenizer.json").write_text('{"model": {"type": "nonsense"}}')
    with pytest.raises(CheckpointError, match="tokenizer.json: not a tokenizer"):
        open_checkpoint(ckpt)


def test_absurd_layer_count_is_refused_before_allocating(tmp_path):
    from apps.llama.family import open_checkpoint
    from tiny_llama import write_tiny_llama

    ckpt = write_tiny_llama(tmp_path / "tiny", seed=1)
    config = json.loads((ckpt / "config.json").read_text())
    config["num_hidden_layers"] = 10 ** 6
    (ckpt / "config.json").write_text(json.dumps(config))
    start = time.perf_counter()
    with pytest.raises(CheckpointError, match="num_hidden_layers = 1000000 needs at least"):
        open_checkpoint(ckpt)
    assert time.perf_counter() - start < 2.0


# ---- the run CLI ---------------------------------------------------------------------------

def test_non_utf8_prompt_and_bad_threads_are_one_line_errors(tmp_path, capsys):
    from iron.lm.run import main

    assert main([str(tmp_path), "--prompt", "ab\udcffc"]) == 2
    assert "--prompt: byte 0xff at character 2 is not UTF-8 text" in capsys.readouterr().err
    assert main([str(tmp_path), "--threads", "0"]) == 2
    assert "--threads 0: must be a positive integer" in capsys.readouterr().err


# ---- the tuner on a shared machine ---------------------------------------------------------

def test_quiet_gate_sees_a_busy_process_and_refuses():
    from iron.tuning.quiet import others_busy, wait_quiet

    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        assert others_busy(0.5) >= 0.5  # one spinning process is (close to) a whole core
        with pytest.raises(IronError, match="the machine stayed busy .* tune on a quiet"):
            wait_quiet(limit=0.5, patience=2.0, events=lambda event: None)
    finally:
        spinner.kill()
        spinner.wait()


def test_damaged_log_record_is_skipped_not_a_crash(tmp_path):
    from iron.tuning.log import TuneLog

    log_path = tmp_path / "tune.jsonl"
    good = {"key": "a", "status": "ok", "method": "m", "median": 1e-5, "spread": 0.1,
            "runs": 5, "load": 0.0}
    bad = dict(good, key="b", median="fast")
    nan = '{"key": "c", "status": "ok", "method": "m", "median": NaN}'
    log_path.write_text("\n".join([json.dumps(good), json.dumps(bad), nan,
                                   json.dumps({"key": "d", "status": "compared", "against": "a",
                                               "gain": "big", "low": 1, "high": 1,
                                               "rounds": 1, "method": "m"})]) + "\n")
    with TuneLog(log_path, "m") as log:
        assert log.get("a").median == 1e-5 and log.get("b") is None and log.get("c") is None
        assert log.comparison("d", "a") is None and log.skipped == 3


def test_head_to_head_under_load_or_implausible_is_measured_again(tmp_path):
    from tunetools import FakeApp, FakeBench, fake_time
    from iron.tuning.log import Comparison
    from iron.tuning.events import PrintSink
    from iron.tuning.tuner import TuneOptions, tune

    class Bench(FakeBench):
        """Honest gains, recorded under ``load``; the first one ``first_gain`` if given."""

        def __init__(self, load, first_gain=None):
            super().__init__()
            self.load, self.first_gain = load, first_gain

        def compare(self, instance, new, old):
            self.compared.append((new, old))
            gain = min(max(fake_time(old) / fake_time(new), 0.5), 2.0)  # plausible
            if self.first_gain is not None and len(self.compared) == 1:
                gain = self.first_gain
            return Comparison(self.key(new), self.key(old), gain, gain, gain, 1, self.method,
                              load=self.load)

    def tune_once(bench, name):
        out = tmp_path / f"{name}.txt"
        tune(FakeApp(), "cpu", TuneOptions(profile_path=tmp_path / f"{name}.json",
                                           log_path=tmp_path / "tune.jsonl"),
             benchmark=bench, events=PrintSink(open(out, "w")))
        return out.read_text()

    busy = Bench(load=1.8, first_gain=1496.0)
    text = tune_once(busy, "busy")
    assert "an implausible head-to-head gain of 1.5e+03x: measured again" in text
    assert len(busy.compared) >= 2
    # from the same defaults again: the logged head-to-heads ran under load, so none is reused
    quiet = Bench(load=0.0)
    text = tune_once(quiet, "quiet")
    assert "ran beside 1.80 busy cores: measured again" in text
    assert len(quiet.compared) == len(busy.compared) - 1  # the implausible one was extra
    # and from the same defaults a third time: quiet head-to-heads are reused
    third = Bench(load=0.0)
    tune_once(third, "third")
    assert third.compared == []


def test_a_busy_machine_stops_the_tune_instead_of_rejecting_candidates(tmp_path):
    from tunetools import FakeApp, FakeBench
    from iron.tuning.quiet import BusyError
    from iron.tuning.tuner import TuneOptions, tune

    class Busy(FakeBench):
        def measure(self, instance, op, best):
            raise BusyError("the machine stayed busy for 300 s")

    with pytest.raises(BusyError):
        tune(FakeApp(), "cpu", TuneOptions(profile_path=tmp_path / "p.json",
                                           log_path=tmp_path / "tune.jsonl"),
             benchmark=Busy(), events=lambda event: None)
    assert not (tmp_path / "p.json").exists()  # nothing written from a busy machine


def test_kernels_wait_passively_and_threads_cap_the_team():
    """libgomp reports its settings when it loads (OMP_DISPLAY_ENV): the first kernel brings
    passive waiting unless the environment chose a policy, and --threads' limit."""
    code = ("import dataclasses, iron\nfrom iron.operators import AXPY\n"
            "from iron.targets import cpu\ncpu.set_thread_limit(1)\n"
            "two = dataclasses.replace(iron.device('cpu'), columns=2)  # a team, on any host\n"
            "op = iron.resolve(AXPY(size=1 << 20, scalar_factor=1.5, num_aie_columns=2), two)\n"
            "entry = cpu.compile_op(op)\n"
            "cpu.load_library(str(entry.file(cpu.LIBRARY)))\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_THREAD_LIMIT")}
    env["OMP_DISPLAY_ENV"] = "true"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=env, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "OMP_WAIT_POLICY = 'PASSIVE'" in result.stderr, result.stderr
    assert "OMP_THREAD_LIMIT = '1'" in result.stderr, result.stderr
    chosen = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={**env, "OMP_WAIT_POLICY": "active"}, cwd=ROOT, timeout=300)
    assert "OMP_WAIT_POLICY = 'ACTIVE'" in chosen.stderr, chosen.stderr


def test_importing_the_task_graph_creates_no_folder(tmp_path):
    """The build folder is made when a dodo namespace is, not when the module is imported."""
    build = tmp_path / "build"
    done = subprocess.run([sys.executable, "-c", "import iron.pipeline.tasks"], cwd=ROOT,
                          env={**os.environ, "IRON_BUILD_DIR": str(build)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert not build.exists()


def test_threads_and_march_variables_are_held_by_the_graph_not_the_environment():
    from iron.pipeline.tasks import BuildGraph

    before = dict(os.environ)
    one = BuildGraph({"threads": "1", "march": "x86-64-v3"})
    assert one.device.columns == 1 and one.level == "x86-64-v3"
    assert dict(os.environ) == before  # the next graph in this process is not changed by it
    if len(os.sched_getaffinity(0)) > 1:  # its kernels are compiled for one thread: own folder
        assert one.bundle_dir.name == "cpu-x86-64-v3-1t"
        assert one.profile_file.name == f"cpu-{host.class_name(1, 'x86-64-v3')}.json"
        assert BuildGraph({}).bundle_dir.name == "cpu"
    with pytest.raises(IronError, match="threads='0': must be an integer from 1"):
        BuildGraph({"threads": "0"})


@pytest.mark.parametrize("option", ["--budget", "--max-load"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN"])
def test_tuner_number_options_refuse_nan_and_inf(option, value, monkeypatch, capsys):
    """nan compares false with every bound, so `--budget nan` once passed `budget <= 0` and
    tuned with no budget at all."""
    import iron.tuning.__main__ as tuning

    def tune(*args, **kwargs):
        raise AssertionError(f"{option} {value} was accepted: a tune started")

    monkeypatch.setattr(tuning, "tune", tune)
    with pytest.raises(SystemExit) as e:
        tuning.main(["demo", f"{option}={value}"])
    assert e.value.code == 2
    assert f"argument {option}: {value!r} is not a finite number" in capsys.readouterr().err
