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
killing workers (Dask's ``allowed-failures``, 3 by default) is recorded as rejected.  Losing
the cluster itself is not a candidate's fault and records nothing: when the scheduler goes
away, or no worker has offered the device for ``LOST_TIMEOUT`` seconds, the tune stops with a
one-line ``ClusterError`` (its log holds what finished; the profile is not written), and the
same command resumes once the cluster is back.  Dask's own reports of the lost connection
(tracebacks from its reconnection attempts) are kept off the terminal while this client, if
the tuner made it, is open.

The benchmark object is sent with every task and kept per worker process (``_on_worker``), so
a worker builds one instance's inputs once for all the candidates it measures.  Workers
compile into their own artifact store: on different hosts, give them a shared remote cache
(``IRON_REMOTE_CACHE``) so a candidate compiled on one is downloaded by the one that times it.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter
from typing import Any, Iterator, Sequence

from ..errors import IronError
from ..operator import Operator
from .events import ClusterReady, Sink, WorkersShareHost
from .log import Comparison

#: Seconds to wait for the scheduler, and then for a worker that has the device.
CONNECT_TIMEOUT = 20.0
#: Seconds a tune goes on waiting with no worker offering the device before it stops.
LOST_TIMEOUT = 60.0
#: Seconds between checks that the cluster is still there while results are awaited.
POLL = 1.0


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

    def __init__(self, scheduler: Any, bench, device: str, emit: Sink):
        try:
            from distributed import Client
        except ImportError:
            raise ClusterError("--scheduler needs Dask's distributed scheduler: install "
                               "iron[cluster]") from None
        self.bench, self.resource = bench, device
        self.token = uuid.uuid4().hex
        self._alone_since: float | None = None  # when the last device worker left
        self._levels: dict[str, int] = {}  # distributed's log levels before it was quietened
        if isinstance(scheduler, Client):
            self.client, self._own = scheduler, False
        else:
            try:
                self.client = Client(scheduler, timeout=CONNECT_TIMEOUT)
            except (OSError, TimeoutError, ValueError) as e:
                raise ClusterError(f"cannot reach the Dask scheduler at {scheduler}: {e} (start "
                                   "one with `dask scheduler`)") from None
            self._own = True
            # a lost scheduler is said once, by ClusterError, not by each reconnection attempt
            names = ["distributed", *(n for n in logging.root.manager.loggerDict
                                      if n.startswith("distributed."))]
            for name in names:
                logger = logging.getLogger(name)
                self._levels[name] = logger.level
                logger.setLevel(logging.CRITICAL)
        self.address = self.client.scheduler.address
        workers = self._device_workers()
        emit(ClusterReady(self.address, len(workers), device))
        hosts = Counter(host for host, _ in workers)
        for host, n in sorted(hosts.items()):
            if n > 1:
                emit(WorkersShareHost(n, host, device))

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
            try:
                self.client.close(timeout=CONNECT_TIMEOUT)
            except Exception:  # a client that lost its scheduler may fail to say goodbye
                pass
            for name, level in self._levels.items():
                logging.getLogger(name).setLevel(level)

    # ---- a cluster that goes away ---------------------------------------------------------

    def _lost(self, what: str) -> ClusterError:
        return ClusterError(
            f"{what}; the tune stops here: its log keeps every finished measurement and the "
            "profile is unchanged, so the same command resumes once the cluster is back")

    def _check_alive(self) -> None:
        """``ClusterError`` when the scheduler is gone, or no worker has offered the device for
        ``LOST_TIMEOUT`` seconds; otherwise nothing."""
        if self.client.status not in ("running", "connecting", "newly-created"):
            raise self._lost(f"lost the Dask scheduler at {self.address}")
        try:
            info = self.client.scheduler_info(n_workers=-1)["workers"]
        except Exception as e:
            raise self._lost(f"lost the Dask scheduler at {self.address} "
                             f"({type(e).__name__}: {e})") from None
        if any(w.get("resources", {}).get(self.resource) for w in info.values()):
            self._alone_since = None
            return
        now = time.monotonic()
        if self._alone_since is None:
            self._alone_since = now
        elif now - self._alone_since > LOST_TIMEOUT:
            raise self._lost(
                f"no worker of the Dask scheduler at {self.address} has offered the device "
                f"{self.resource} for {LOST_TIMEOUT:g} s ({len(info)} workers left); start one "
                f"with `dask worker {self.address} --nthreads 1 --resources {self.resource}=1`")

    def _fetch(self, future, get):
        """``get()`` (a done future's result or exception), which asks the cluster for it: if
        the worker holding it or the scheduler went away since the task ended,
        ``ClusterError``."""
        try:
            return get()
        except Exception as e:
            raise self._lost(f"the Dask cluster at {self.address} lost the result of "
                             f"{future.key} (its worker or the scheduler went away: "
                             f"{type(e).__name__})") from None

    def _wait(self, futures, timeout: float | None):
        """``distributed.wait`` for the first of ``futures`` to finish, for at most
        ``timeout`` seconds, checking every ``POLL`` seconds that the cluster is still there:
        (done, pending)."""
        from distributed import wait

        end = None if timeout is None else time.monotonic() + timeout
        while True:
            step = POLL if end is None else min(POLL, end - time.monotonic())
            if step <= 0:
                return set(), set(futures)
            try:
                done, pending = wait(futures, timeout=step, return_when="FIRST_COMPLETED")
            except TimeoutError:
                self._check_alive()
                continue
            except Exception as e:  # the futures were cancelled: the scheduler went away
                raise self._lost(f"lost the Dask scheduler at {self.address} "
                                 f"({type(e).__name__})") from None
            if done:
                return done, pending

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
        self._wait([future], None)
        while future.status == "lost":  # its worker died after it finished: computed again
            self._wait([future], None)
        if future.status == "finished":
            return self._fetch(future, future.result)
        if future.status != "error":
            raise self._lost(f"the head-to-head was {future.status} by the Dask scheduler at "
                             f"{self.address}")
        return future.result()  # raises what the head-to-head raised

    def _as_completed(self, futures: dict, deadline: float | None) -> Iterator[tuple[Any, Any]]:
        """(future, result or error text) as each finishes; cancels the rest at ``deadline``."""
        pending = set(futures)
        try:
            while pending:
                timeout = None if deadline is None else deadline - time.monotonic()
                if timeout is not None and timeout <= 0:
                    break  # the budget ran out
                done, pending = self._wait(pending, timeout)
                for f in done:
                    if f.status == "finished":
                        yield f, self._fetch(f, f.result)
                    elif f.status == "error":  # the task failed: its worker died too often
                        error = self._fetch(f, f.exception)
                        yield f, f"{type(error).__name__} on the cluster: {error}"
                    elif f.status == "lost":
                        # its result lived on a worker that died (another task's crash) after
                        # it finished: the scheduler computes it again, since we still hold it
                        pending.add(f)
                    else:  # cancelled by the cluster: not the candidate's doing
                        raise self._lost(f"a task was {f.status} by the Dask scheduler at "
                                         f"{self.address}")
        finally:
            if pending and self.client.status == "running":
                try:
                    self.client.cancel(list(pending))
                except Exception:
                    pass  # the scheduler went away meanwhile: nothing runs there
