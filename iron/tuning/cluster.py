"""Tuning on a Dask cluster: compiles on any worker, measurements on the device's workers.

Tuning must run on the device itself, so a fleet of devices is how it scales (TVM's RPC
tracker works this way).  Each device host runs one Dask worker that advertises the device as
a resource::

    dask scheduler                                                  # once, anywhere
    dask worker tcp://HOST:8786 --nthreads 1 --resources cpu=1     # one per device

``Cluster`` gives the tuner the benchmark's three calls, run remotely:

- ``compile``: one task per candidate, on any worker (no resource asked for);
- ``measure``: one task per candidate, each holding the device resource, so a worker with
  ``cpu=1`` measures one candidate at a time and nothing else it runs asks for the device;
- ``compare``: a head-to-head is one task, so both settings are timed on one worker.

Results come back to the tuner, which alone writes the log and the profile: a crash of the
client loses only the work in flight, and a re-run resumes from the log as a local run does.
A worker lost mid-task has the task rescheduled by Dask on another worker; a task that keeps
killing workers (Dask's ``allowed-failures``, 3 by default) is recorded as rejected.

The benchmark object is sent with every task and kept per worker process (``_on_worker``), so
a worker builds one instance's inputs once for all the candidates it measures.  Workers
compile into their own artifact store: on different hosts, give them a shared remote cache
(``IRON_REMOTE_CACHE``) so a candidate compiled on one is downloaded by the one that times it.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from typing import Any, Iterator, Sequence, TextIO

from ..errors import IronError
from ..operator import Operator
from .log import Comparison

#: Seconds to wait for the scheduler, and then for a worker that has the device.
CONNECT_TIMEOUT = 20.0


class ClusterError(IronError, RuntimeError):
    """The Dask scheduler cannot be reached, or no worker offers the device."""


_BENCH: dict[str, Any] = {}  # per worker process: the run's benchmark, by run token
_MEASURING = threading.Lock()  # one measurement at a time per worker process, whatever --nthreads


def _on_worker(token: str, bench):
    """The benchmark of run ``token`` in this worker process (the first copy received)."""
    if token not in _BENCH:
        _BENCH.clear()  # an earlier run's benchmark and its cached inputs
        _BENCH[token] = bench
    return _BENCH[token]


def _compile(bench, op: Operator) -> str | None:
    return bench.compile([op], None).get(bench.key(op), "compile error: not started")


def _measure(token: str, bench, instance, op: Operator, best: float | None):
    with _MEASURING:
        return _on_worker(token, bench).measure(instance, op, best)


def _compare(token: str, bench, instance, new: Operator, old: Operator) -> Comparison:
    with _MEASURING:
        return _on_worker(token, bench).compare(instance, new, old)


class Cluster:
    """The tuner's benchmark calls, run on the Dask cluster behind ``scheduler``."""

    def __init__(self, scheduler: Any, bench, device: str, out: TextIO):
        try:
            from distributed import Client
        except ImportError:
            raise ClusterError("--scheduler needs Dask's distributed scheduler: install "
                               "iron[cluster]") from None
        self.bench, self.resource, self.out = bench, device, out
        self.token = uuid.uuid4().hex
        if isinstance(scheduler, Client):
            self.client, self._own = scheduler, False
        else:
            try:
                self.client = Client(scheduler, timeout=CONNECT_TIMEOUT)
            except (OSError, TimeoutError, ValueError) as e:
                raise ClusterError(f"cannot reach the Dask scheduler at {scheduler}: {e} (start "
                                   "one with `dask scheduler`)") from None
            self._own = True
        workers = self._device_workers()
        print(f"cluster {self.client.scheduler.address}: {len(workers)} workers offer "
              f"{device}; compiles go to any worker, measurements to those", file=out,
              flush=True)
        hosts = Counter(host for host, _ in workers)
        for host, n in sorted(hosts.items()):
            if n > 1:
                print(f"warning: {n} workers offering {device} run on host {host}: they measure "
                      "at the same time, so if they share one device (the host cpu does) each "
                      "disturbs the other's timings; run one worker per device", file=out,
                      flush=True)

    def _device_workers(self) -> list[tuple[str, str]]:
        """(host, address) of the workers that advertise the device, waiting a little for one
        to join."""
        deadline = time.monotonic() + CONNECT_TIMEOUT
        while True:
            info = self.client.scheduler_info(n_workers=-1)["workers"]
            found = [(w.get("host", a), a) for a, w in info.items()
                     if w.get("resources", {}).get(self.resource)]
            if found or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        if not found:
            raise ClusterError(
                f"no worker of the Dask scheduler at {self.client.scheduler.address} offers "
                f"the device {self.resource} ({len(info)} workers): start one on the device's "
                f"host with `dask worker ADDRESS --nthreads 1 --resources {self.resource}=1`")
        return found

    def close(self) -> None:
        if self._own:
            self.client.close()

    def _key(self, kind: str) -> str:
        return f"iron-{kind}-{uuid.uuid4().hex}"

    def compile(self, ops: Sequence[Operator], deadline: float | None) -> dict[str, str | None]:
        """Compile on any workers: artifact key -> None (ready) or the error."""
        futures = {self.client.submit(_compile, self.bench, op,
                                      key=self._key("compile")): self.bench.key(op)
                   for op in ops}
        return {futures[f]: result for f, result in self._as_completed(futures, deadline)}

    def measure(self, jobs: Sequence[tuple[Any, Operator]], best: float | None,
                deadline: float | None) -> Iterator[tuple[Any, Operator, Any]]:
        """Measure every (instance, candidate) on the device's workers, yielding results as
        they finish; at ``deadline`` the rest are cancelled."""
        from .measure import Measurement

        futures = {self.client.submit(_measure, self.token, self.bench, inst, op, best,
                                      resources={self.resource: 1},
                                      key=self._key("measure")): (inst, op)
                   for inst, op in jobs}
        for f, result in self._as_completed(futures, deadline):
            if isinstance(result, str):
                result = Measurement(error=result)
            yield (*futures[f], result)

    def compare(self, instance, new: Operator, old: Operator) -> Comparison:
        future = self.client.submit(_compare, self.token, self.bench, instance, new, old,
                                    resources={self.resource: 1}, key=self._key("compare"))
        return future.result()

    def _as_completed(self, futures: dict, deadline: float | None) -> Iterator[tuple[Any, Any]]:
        """(future, result or error text) as each finishes; cancels the rest at ``deadline``."""
        from distributed import wait

        pending = set(futures)
        try:
            while pending:
                timeout = None if deadline is None else deadline - time.monotonic()
                if timeout is not None and timeout <= 0:
                    break  # the budget ran out
                try:
                    done, pending = wait(pending, timeout=timeout, return_when="FIRST_COMPLETED")
                except TimeoutError:
                    break
                for f in done:
                    if f.status == "finished":
                        yield f, f.result()
                    else:  # the task failed: its worker died too often, ...
                        error = f.exception()
                        yield f, f"{type(error).__name__} on the cluster: {error}"
        finally:
            if pending:
                self.client.cancel(list(pending))
