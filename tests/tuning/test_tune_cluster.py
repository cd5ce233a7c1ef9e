"""Tuning on a Dask cluster: a LocalCluster of 2 worker processes x 1 thread, each offering the
device ``cpu=1``.  With a deterministic stand-in benchmark the cluster's profile is the serial
run's, byte for byte, also when a worker dies mid-sweep or the run resumes a partial log; a
small real tune goes through `doit tune scheduler=...`.  A scheduler and a worker started as
the `dask` commands, then killed mid-tune, stop the tune in one line, leaving a log of what
finished and no profile."""

import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from iron.host import class_name

distributed = pytest.importorskip("distributed")

from conftest import copy_project  # noqa: E402
from buildtools import doit  # noqa: E402
from tunetools import FakeApp  # noqa: E402
from tune_standin import StandInBench  # noqa: E402

from iron.tuning.cluster import Cluster, ClusterError  # noqa: E402
from iron.tuning.events import PrintSink  # noqa: E402
from iron.tuning.tuner import TuneOptions, tune  # noqa: E402

pytestmark = pytest.mark.slow  # end to end: bundles, servers, doit runs

TESTS = Path(__file__).resolve().parents[1]  # tests/: helpers/ holds the stand-in the workers import
DASK = Path(sys.executable).with_name("dask")


@pytest.fixture(scope="module")
def cluster():
    import dask
    from distributed import Client, LocalCluster

    # a task that killed 2 workers is given up (Dask's default is 4): keeps the test short
    failures = dask.config.set({"distributed.scheduler.allowed-failures": 1})
    with failures, LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                resources={"cpu": 1}, dashboard_address=None,
                                host="127.0.0.1") as local, Client(local) as client:
        yield client


def run(tmp_path, name, bench, scheduler=None, log=None):
    out = io.StringIO()
    options = TuneOptions(scheduler=scheduler, profile_path=tmp_path / name / "cpu.json",
                          log_path=log or tmp_path / name / "tune.jsonl")
    result = tune(FakeApp(), "cpu", options, benchmark=bench, events=PrintSink(out))
    return result, out.getvalue()


def records(path):
    """The logged outcomes: key -> (status, median), whatever order they were written in."""
    found = {}
    for line in path.read_text().splitlines():
        doc = json.loads(line)
        if doc["status"] in ("ok", "rejected", "compared"):
            found[doc["key"], doc.get("against")] = (doc["status"], doc.get("median"),
                                                     doc.get("gain"))
    return found


def test_cluster_tune_writes_the_serial_profile(tmp_path, cluster):
    serial, _ = run(tmp_path, "serial", StandInBench())
    with distributed.get_task_stream(cluster) as stream:
        parallel, text = run(tmp_path, "cluster", StandInBench(), scheduler=cluster)
    assert "2 workers offer cpu" in text
    assert "warning: 2 workers offering cpu run on host 127.0.0.1" in text
    assert (tmp_path / "cluster/cpu.json").read_bytes() == (tmp_path / "serial/cpu.json") \
        .read_bytes()
    assert records(tmp_path / "cluster/tune.jsonl") == records(tmp_path / "serial/tune.jsonl")
    assert parallel.measured_now == serial.measured_now > 10 and parallel.complete
    assert [m.new for m in parallel.moved] == [m.new for m in serial.moved] != []
    # the measurements went out as tasks and were spread over both workers
    measured = [t for t in stream.data if t["key"].startswith("iron-measure-")]
    assert len(measured) == serial.measured_now
    assert len({t["worker"] for t in measured}) == 2
    assert any(t["key"].startswith("iron-compare-") for t in stream.data)


def test_a_worker_lost_mid_sweep_has_its_work_rescheduled(tmp_path, cluster):
    serial, _ = run(tmp_path, "serial", StandInBench())
    victim = next(json.loads(line)["key"] for line in
                  (tmp_path / "serial/tune.jsonl").read_text().splitlines()[5:]
                  if json.loads(line)["status"] == "ok")
    marker = tmp_path / "crashed"
    bench = StandInBench(crash_key=victim, crash_marker=str(marker))
    parallel, _ = run(tmp_path, "cluster", bench, scheduler=cluster)
    assert marker.exists()  # a worker process did die measuring the victim
    assert (tmp_path / "cluster/cpu.json").read_bytes() == (tmp_path / "serial/cpu.json") \
        .read_bytes()
    assert records(tmp_path / "cluster/tune.jsonl") == records(tmp_path / "serial/tune.jsonl")
    cluster.wait_for_workers(2, timeout=60)  # the nanny restarts it, for the next test


def test_a_candidate_that_keeps_killing_workers_is_rejected_and_the_sweep_goes_on(tmp_path,
                                                                                  cluster):
    serial, _ = run(tmp_path, "serial", StandInBench())
    victim = next(json.loads(line)["key"] for line in
                  (tmp_path / "serial/tune.jsonl").read_text().splitlines()[5:]
                  if json.loads(line)["status"] == "ok")
    parallel, _ = run(tmp_path, "cluster", StandInBench(crash_key=victim), scheduler=cluster)
    logged = records(tmp_path / "cluster/tune.jsonl")
    assert logged[victim, None][0] == "rejected"
    reason = [json.loads(line)["reason"] for line in
              (tmp_path / "cluster/tune.jsonl").read_text().splitlines()
              if json.loads(line)["key"] == victim and json.loads(line)["status"] == "rejected"]
    assert reason and reason[0].startswith("KilledWorker on the cluster"), reason
    assert parallel.complete and parallel.measured_now == serial.measured_now
    cluster.wait_for_workers(2, timeout=60)


def test_cluster_run_resumes_a_partial_log(tmp_path, cluster):
    serial, _ = run(tmp_path, "serial", StandInBench())
    lines = (tmp_path / "serial/tune.jsonl").read_text().splitlines()
    kept = lines[:len(lines) // 2]
    partial = tmp_path / "resumed" / "tune.jsonl"
    partial.parent.mkdir()
    partial.write_text("\n".join(kept) + "\n")
    already = sum(json.loads(line)["status"] in ("ok", "rejected") for line in kept)
    resumed, text = run(tmp_path, "resumed", StandInBench(), scheduler=cluster, log=partial)
    assert f"({already} already in" in text
    assert resumed.measured_now == serial.measured_now - already > 0
    assert (tmp_path / "resumed/cpu.json").read_bytes() == (tmp_path / "serial/cpu.json") \
        .read_bytes()


def test_no_worker_offering_the_device_is_a_clear_error(cluster, monkeypatch):
    import iron.tuning.cluster as module

    monkeypatch.setattr(module, "CONNECT_TIMEOUT", 0.5)
    with pytest.raises(ClusterError, match=r"no worker of the Dask scheduler at tcp://127\.0\.0"
                       r"\.1:\d+ offers the device npu2 \(2 workers\): start one .* "
                       r"--resources npu2=1"):
        Cluster(cluster, StandInBench(), "npu2", PrintSink(io.StringIO()))


def test_unreachable_scheduler_is_a_clear_error(monkeypatch):
    import socket

    import iron.tuning.cluster as module

    monkeypatch.setattr(module, "CONNECT_TIMEOUT", 1.0)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"tcp://127.0.0.1:{s.getsockname()[1]}"  # nothing listens there
    with pytest.raises(ClusterError, match=f"cannot reach the Dask scheduler at {address}"):
        Cluster(address, StandInBench(), "cpu", PrintSink(io.StringIO()))


def test_doit_tune_through_a_scheduler_measures_for_real_and_writes_log_and_profile(
        tmp_path, cluster):
    """The real benchmark on the demo app's SiLU: compiled and timed on the workers; the log
    and the profile are written by the client, in its own project."""
    project = copy_project(tmp_path / "project")
    address = cluster.scheduler.address
    tuned = doit(project, "tune", "only=SiLU", f"scheduler={address}")
    assert f"cluster {address}: 2 workers offer cpu" in tuned.stdout, tuned.stdout
    assert "tuning complete" in tuned.stdout, tuned.stdout
    profile = json.loads((project / f"profiles/demo/cpu-{class_name()}.json").read_text())
    assert [e["operator"] for e in profile["entries"]] == ["SiLU"]
    log = [json.loads(line) for line in
           (project / f"build/tune/demo-cpu-{class_name()}.jsonl").read_text().splitlines()]
    measured = [r for r in log if r["status"] == "ok"]
    assert measured and all(r["median"] > 0 and r["method"].startswith("cpu-") for r in measured)
    assert not any(r["status"] == "started" for r in log)  # only results reach the client's log
    ops = project / "build" / "ops"  # the client compiled nothing: the workers did
    assert not ops.exists() or not [p for p in ops.iterdir() if not p.name.startswith(".")]


# ---- the cluster goes away -------------------------------------------------------------------


class DaskProcesses:
    """A scheduler and one worker offering ``cpu=1``, started as the `dask` commands in their
    own process groups (a worker's nanny and its worker die together)."""

    def __init__(self, pythonpath: str, cwd: Path):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.address = f"tcp://127.0.0.1:{self.port}"
        env = {**os.environ, "PYTHONPATH": pythonpath}
        common = dict(cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                      start_new_session=True)
        self.common = common
        self.scheduler = subprocess.Popen([DASK, "scheduler", "--host", "127.0.0.1", "--port",
                                           str(self.port), "--no-dashboard"], **common)
        self.worker = self.start_worker()

    def start_worker(self):
        return subprocess.Popen([DASK, "worker", self.address, "--nthreads", "1",
                                 "--resources", "cpu=1", "--no-dashboard"], **self.common)

    def kill(self, proc) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()

    def close(self) -> None:
        for proc in (self.worker, self.scheduler):
            self.kill(proc)


@pytest.fixture
def dask_processes(tmp_path):
    procs = DaskProcesses(f"{TESTS / 'helpers'}{os.pathsep}{TESTS.parent}", tmp_path)
    try:
        yield procs
    finally:
        procs.close()


def kill_after_measurements(log, n, proc, procs):
    """Kill ``proc`` (in a thread) once ``log`` holds ``n`` measurements."""
    def watch():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if log.exists() and sum('"status": "ok"' in line or '"status": "rejected"' in line
                                    for line in log.read_text().splitlines()) >= n:
                break
            time.sleep(0.05)
        procs.kill(proc)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("lose", ["scheduler", "worker"])
def test_a_lost_scheduler_or_worker_set_stops_the_tune_in_one_line(tmp_path, dask_processes,
                                                                  monkeypatch, lose):
    """Killed mid-sweep, the scheduler (or the only worker) takes the tune down with one
    ClusterError: the log keeps the measurements that finished, exactly as the serial run made
    them, and nothing the loss caused; the profile is not written.  The same command then
    resumes on a cluster that is back."""
    import iron.tuning.cluster as module

    monkeypatch.setattr(module, "LOST_TIMEOUT", 3.0)
    serial, _ = run(tmp_path, "serial", StandInBench())
    log = tmp_path / "cut" / "tune.jsonl"
    victim = getattr(dask_processes, lose)
    watcher = kill_after_measurements(log, 4, victim, dask_processes)
    out = io.StringIO()
    start = time.monotonic()
    with pytest.raises(ClusterError) as e:
        tune(FakeApp(), "cpu", TuneOptions(  # a budget: a tune that waits forever ends instead
            scheduler=dask_processes.address, profile_path=tmp_path / "cut" / "cpu.json",
            log_path=log, budget=90), benchmark=StandInBench(delay=0.3), events=PrintSink(out))
    watcher.join()
    message = str(e.value)
    assert "\n" not in message and "the profile is unchanged" in message
    lost_result = f"the Dask cluster at {dask_processes.address} lost the result"
    if lose == "scheduler":  # noticed waiting, or fetching a result that ended just before
        assert message.startswith((f"lost the Dask scheduler at {dask_processes.address}",
                                   lost_result)), message
    else:  # noticed waiting for a worker, or fetching a result the worker held
        assert ("has offered the device cpu for 3 s (0 workers left)" in message
                or message.startswith(lost_result)), message
    assert time.monotonic() - start < 60
    assert not (tmp_path / "cut" / "cpu.json").exists()
    cut, whole = records(log), records(tmp_path / "serial" / "tune.jsonl")
    assert len(cut) >= 4 and all(whole[k] == v for k, v in cut.items()), cut
    # nothing the loss caused was logged as a result
    assert not any("on the cluster" in line for line in log.read_text().splitlines())

    if lose == "worker":  # a worker back, the same command finishes what is left
        dask_processes.worker = dask_processes.start_worker()  # the fixture stops it
        resumed, text = run(tmp_path, "cut", StandInBench(), scheduler=dask_processes.address,
                            log=log)
        assert f"({len(cut)} already in" in text
        assert (tmp_path / "cut/cpu.json").read_bytes() == \
            (tmp_path / "serial/cpu.json").read_bytes()


def test_the_tune_command_says_a_lost_scheduler_in_one_line(tmp_path):
    """`python -m iron.tuning` with the real benchmark: the scheduler killed once the tune is
    under way ends it with exit status 2 and one line on stderr, not Dask's tracebacks."""
    project = copy_project(tmp_path / "project")
    procs = DaskProcesses(str(project), project)
    try:
        env = {**os.environ, "PYTHONPATH": str(project)}
        tuner = subprocess.Popen([sys.executable, "-m", "iron.tuning", "demo", "--only", "SiLU",
                                  "--max-load", "64",  # under way at once on a busy machine
                                  "--scheduler", procs.address], cwd=project, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        seen = []
        for line in tuner.stdout:
            seen.append(line)
            if line.startswith("[1/"):  # compiling the first instance's candidates
                procs.kill(procs.scheduler)
                break
        out, err = tuner.communicate(timeout=120)
    finally:
        procs.close()
    assert any(line.startswith(f"cluster {procs.address}: 1 workers offer cpu") for line in seen)
    assert tuner.returncode == 2, "".join(seen) + out + err
    assert err.splitlines() == [err.strip()] and err.startswith(
        (f"error: lost the Dask scheduler at {procs.address}",
         f"error: the Dask cluster at {procs.address} lost the result")), err
    assert not (project / "profiles" / "demo" / "cpu.json").exists()
