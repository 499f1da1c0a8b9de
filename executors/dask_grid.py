"""The Dask executor: every grid cell a long-lived Dask actor (``client.submit(..., actor=True)``).

How bytes move:

- **Rows**, once, when the cells start: each cell maps its own row range of the dataset's
  ``.npy`` files (a dataset on disk, on a file system the workers share), or receives its
  replica's rows, only its shard's columns, scattered once to its worker (data in memory).
- **Model and statistics**, every iteration: the coordinator calls each cell's ``step`` with
  its shard's pickled model (bytes, over the Dask comm to the cell's worker) and receives its
  pickled statistics and :class:`executors.step.ShareReport`.
- **Coupling**, per block: each cell calls ``deliver`` on the actors of the other shards of its
  replica (worker to worker, on the workers' event loops) with its
  :mod:`executors.coupling` message, and waits for theirs (:mod:`executors.actors`).

Cells are placed on the workers the plan names when it was made for this cluster
(``Resources.from_dask(client)``, whose worker names are the cluster's slots); otherwise in
turn over the workers' threads. Several cells on one worker share its process (each runs
on a thread of its own).

Faults: a cell that raises stops the fit with a FitError naming it and the iteration; a
cell whose worker dies is noticed within about half a second (its actor's future is lost, or
the scheduler no longer lists the worker); with ``timeout_s``, one that does not answer in
time is named. Every cell is aborted and released after the fit, however it ended; a cell
still running then (a hung step) has its worker restarted (``client.restart_workers``),
the only way to stop a Python thread. A cluster the executor started (``address=None``) is
closed after the fit.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import uuid
from time import perf_counter, sleep
from typing import ClassVar

from emgrid.models.errors import FitError
from emgrid.planner.resources import Resources, dask_slots

from .actors import Cell, check_timeouts, failed, forwarded_env, import_extra, no_answer, outcome, shipped_rows
from .datafiles import NpyDataset
from .loop import GridOutcome, run_em
from .protocol import BaseExecutor, FitJob
from .result import FitResult
from .step import grid_layout
from .threads import DEFAULT_BLAS_THREADS, check_blas_threads, limited, thread_env

#: Seconds between two looks at the scheduler's list of workers while a step runs.
_LIVENESS_S = 0.5
#: What a call to an actor whose worker is gone raises (``distributed.actor``).
_UNREACHABLE = "Unable to contact Actor's worker"


def _import_distributed():
    return import_extra("dask", "distributed")


class Shipped:
    """Rows shipped to a cell, wrapped so that ``client.scatter`` sends them as one object."""

    __slots__ = ("data",)

    def __init__(self, data):
        self.data = data


class DaskCell:
    """The Dask actor of one cell (:class:`executors.actors.Cell`) and its own step thread.

    The coordinator calls ``info``, ``connect``, ``deliver``, ``waits_for``, ``abort`` and
    ``close`` with ``separate_thread=False`` (they run on the worker's event loop, briefly);
    ``step`` is a coroutine that runs the step on a thread of the cell's, so the worker's one
    actor thread, shared by the actors of its process, is never held.
    """

    def __init__(self, spec, model, directory, rows, blas_threads, env):
        data = rows.data if isinstance(rows, Shipped) else rows
        self.cell = Cell(spec, model, directory, data, blas_threads, env)
        self.thread_name = f"emgrid-{spec.name}"
        self.peers: dict | None = None

    def info(self) -> dict:
        return self.cell.info()

    def connect(self, peers: dict) -> None:
        """``peers``: shard -> ``(worker address, actor key)`` of that shard's cell in this
        cell's replica. Called on the worker's event loop, where the worker is known; the
        proxies are made on the cell's thread at its first send, bound to this worker (and
        to no client, so they hold no reference to the peers' actors)."""
        from distributed import get_worker

        worker = get_worker()
        self.peers = {}

        def send(peer, iteration, block, shard, message):
            proxy = self.peers.get(peer)
            if proxy is None:
                from distributed.actor import Actor

                proxy = self.peers[peer] = Actor(DaskCell, *peers[peer], worker=worker)
            proxy.deliver(iteration, block, shard, message, separate_thread=False)

        self.cell.connect(send, list(peers))

    def deliver(self, iteration, block, shard, message) -> None:
        self.cell.deliver(iteration, block, shard, message)

    async def step(self, iteration: int, payload: bytes):
        """The cell's step on a daemon thread of its own (a hung one does not hold its
        process at exit)."""
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def settle(result, error):
            if not done.cancelled():
                if error is None:
                    done.set_result(result)
                else:
                    done.set_exception(error)

        def run():
            try:
                result, error = self.cell.run(iteration, payload), None
            except BaseException as e:  # noqa: BLE001 - carried to the coordinator
                result, error = None, e
            loop.call_soon_threadsafe(settle, result, error)

        threading.Thread(target=run, name=self.thread_name, daemon=True).start()
        return await done

    def waits_for(self) -> list[int]:
        return self.cell.waits_for()

    def abort(self) -> None:
        self.cell.abort()

    def close(self) -> None:
        self.cell.close()
        self.peers = None


async def _end_process() -> None:
    """Ends the worker process it runs in at once (its nanny, if any, starts a new one)."""
    os._exit(70)


class DaskGrid:
    """The coordinator's side: one actor per cell, on a ``distributed.Client``."""

    def __init__(self, client, job: FitJob, directory: str | None, timeout_s: float | None,
                 startup_timeout_s: float, blas_threads: int | None):
        self.client, self.job, self.directory = client, job, directory
        self.timeout_s, self.startup_timeout_s, self.blas_threads = timeout_s, startup_timeout_s, blas_threads
        self.layout = grid_layout(job.model, job.plan)
        self.cells = [spec for row in self.layout for spec in row]
        self.shape = (job.plan.data_parallel, job.plan.model_parallel)
        self.iteration = 0
        self.futures: list = []  # the actors' futures: holding them keeps the actors alive
        self.actors: list = []
        self.addresses: list[str] = []
        self.infos: list[dict] = [{} for _ in self.cells]
        self.steps: list = []
        self._checked = 0.0

    # ------------------------------------------------------------ naming and liveness
    def _who(self, i: int) -> str:
        s = self.cells[i]
        pid = self.infos[i].get("pid")
        at = f"pid {pid} on Dask worker {self.addresses[i]}" if pid else f"Dask worker {self.addresses[i]}"
        return f"worker {s.name!r} (replica {s.replica}, shard {s.shard}, {at})"

    def _live_workers(self) -> set[str]:
        return set(self.client.scheduler_info(n_workers=-1)["workers"])

    def _check_alive(self, when: str, force: bool = False) -> None:
        """Raises FitError naming the first cell whose actor or worker is gone."""
        for i, f in enumerate(self.futures):
            if f.status in ("lost", "cancelled"):
                raise FitError(f"{self._who(i)} died {when} (its actor was lost)")
        now = perf_counter()
        if force or now - self._checked >= _LIVENESS_S:
            self._checked = now
            live = self._live_workers()
            for i, a in enumerate(self.addresses):
                if a not in live:
                    raise FitError(f"{self._who(i)} died {when} (the scheduler lost its worker)")

    # ------------------------------------------------------------ placement and start
    def _placement(self) -> list[str]:
        slots = dask_slots(self.client.scheduler_info(n_workers=-1)["workers"])
        if not slots:
            raise FitError("the Dask cluster has no workers")
        by_name = {name: address for name, address, _ in slots}
        if all(spec.name in by_name for spec in self.cells):
            return [by_name[spec.name] for spec in self.cells]
        return [slots[i % len(slots)][1] for i in range(len(self.cells))]

    def start(self) -> None:
        client, job = self.client, self.job
        self.addresses = self._placement()
        env = forwarded_env()
        data = None if self.directory is not None else job.open_data()
        token = uuid.uuid4().hex[:8]
        for spec, address in zip(self.cells, self.addresses):
            part = spec.view.model_for(spec.shard, job.model)
            rows = None
            if data is not None:
                rows = client.scatter(Shipped(shipped_rows(spec, part, data)), workers=[address], direct=True,
                                      hash=False)
            self.futures.append(client.submit(DaskCell, spec, part, self.directory, rows, self.blas_threads, env,
                                              actor=True, workers=[address], allow_other_workers=False, pure=False,
                                              key=f"emgrid-{spec.name}-{token}"))
        deadline = perf_counter() + self.startup_timeout_s
        pending = set(range(len(self.futures)))
        while pending:
            for i in sorted(pending):
                f = self.futures[i]
                if f.status == "error":
                    raise failed(self._who(i), "while starting", f.exception())
                if f.status == "finished":
                    pending.discard(i)
            if not pending:
                break
            self._check_alive("while starting")
            if perf_counter() > deadline:
                names = ", ".join(self._who(i) for i in sorted(pending))
                raise FitError(f"no answer within {self.startup_timeout_s:g} s while starting from {names}")
            try:
                self.futures[min(pending)].result(timeout=0.1)
            except Exception:  # noqa: BLE001 - its status is read above on the next pass
                pass
        self.actors = [f.result() for f in self.futures]
        self.infos = self._call_all([a.info(separate_thread=False) for a in self.actors], "while starting",
                                    self.startup_timeout_s)
        m = self.shape[1]
        where = [(address, f.key) for address, f in zip(self.addresses, self.futures)]
        self._call_all([a.connect({t: where[s.replica * m + t] for t in range(m) if t != s.shard},
                                  separate_thread=False) for a, s in zip(self.actors, self.cells)],
                       "while starting", self.startup_timeout_s)

    @property
    def pids(self) -> list[int]:
        return [info.get("pid") for info in self.infos]

    # ------------------------------------------------------------ one iteration
    def broadcast(self, model, payloads: list[bytes]) -> None:
        self.iteration += 1
        self.steps = [a.step(self.iteration, payloads[s.shard]) for a, s in zip(self.actors, self.cells)]

    def e_step(self, iteration: int) -> GridOutcome:
        t0 = perf_counter()
        got = self._call_all(self.steps, f"in iteration {iteration}", self.timeout_s)
        self.steps = []
        return outcome(got, self.shape, perf_counter() - t0)

    def _call_all(self, calls: list, when: str, timeout_s: float | None) -> list:
        """Every cell's answer to one call each (grid order); FitError on an error, a death
        or a timeout, naming the cell."""
        out: list = [None] * len(calls)
        pending = set(range(len(calls)))
        deadline = None if timeout_s is None else perf_counter() + timeout_s
        while pending:
            for i in sorted(pending):
                if calls[i].done():
                    try:
                        out[i] = calls[i].result()
                    except Exception as e:  # noqa: BLE001 - the cell's own error, or its death, named
                        if isinstance(e, OSError) and str(e) == _UNREACHABLE:
                            raise FitError(f"{self._who(i)} died {when} (its worker cannot be reached)") from None
                        raise failed(self._who(i), when, e) from None
                    pending.discard(i)
            if not pending:
                break
            self._check_alive(when)
            if deadline is not None and perf_counter() > deadline:
                raise no_answer(self._who, self.cells, sorted(pending), self._waits(sorted(pending)), timeout_s, when)
            try:
                calls[min(pending)].result(timeout=0.05)
            except Exception:  # noqa: BLE001 - a timeout, or its error, read on the next pass
                pass
        return out

    def _waits(self, cells: list[int]) -> dict[int, list[int]]:
        """What each of ``cells`` waits for (:meth:`Cell.waits_for`), asked for at most a second."""
        if not self.actors:
            return {}
        asked = {i: self.actors[i].waits_for(separate_thread=False) for i in cells}
        out = {}
        for i, f in asked.items():
            try:
                out[i] = f.result(timeout=1.0)
            except Exception:  # noqa: BLE001 - no answer: it counts as stuck
                pass
        return out

    # ------------------------------------------------------------ the end
    def close(self, own_cluster: bool) -> None:
        """Aborts and releases every cell; ends the worker processes of cells still running a
        step (after a hang: a Python thread cannot be stopped otherwise; their nannies start
        new ones), unless the cluster goes away anyway."""
        closing = []
        for a in self.actors:
            try:
                closing.append(a.close(separate_thread=False))
            except Exception:  # noqa: BLE001 - its worker is gone
                pass
        deadline = perf_counter() + 5.0
        for c in closing:
            try:
                c.result(timeout=max(0.1, deadline - perf_counter()))
            except Exception:  # noqa: BLE001 - best effort: a dead worker cannot close
                pass
        deadline = perf_counter() + 1.0  # aborted, the steps that waited for a peer end now
        while any(not c.done() for c in self.steps) and perf_counter() < deadline:
            sleep(0.02)
        busy = {self.addresses[i] for i, c in enumerate(self.steps) if not c.done()}
        self.actors, self.steps = [], []
        if self.futures:
            try:
                self.client.cancel(self.futures, force=True)
            except Exception:  # noqa: BLE001 - the client is closing or the cluster gone
                pass
        self.futures = []
        if busy and not own_cluster:
            live = sorted(busy & self._live_workers())
            if live:
                try:
                    self.client.run(_end_process, workers=live, wait=False)
                except Exception:  # noqa: BLE001 - best effort after a failed fit
                    pass


class DaskExecutor(BaseExecutor):
    """Dask actors, one per grid cell, on a Dask cluster.

    ``address``: the scheduler's address (``"tcp://host:8786"``), or a
    ``distributed.Client`` to use as it is; ``None`` starts a local cluster for the run
    (``n_workers`` processes, default one per grid cell, one thread each) and closes it
    after. ``timeout_s``: the longest one iteration may take before the fit stops (``None``:
    no limit; deaths are noticed regardless). ``startup_timeout_s``: the longest the cells
    may take to start and open their rows. ``blas_threads``: BLAS and OpenMP threads in each
    cell's process while it lives (default 1; ``None`` leaves them as they are).
    """

    name: ClassVar[str] = "dask"

    def __init__(self, address=None, timeout_s: float | None = None, startup_timeout_s: float = 120.0,
                 n_workers: int | None = None, blas_threads: int | None = DEFAULT_BLAS_THREADS):
        _import_distributed()
        check_timeouts(timeout_s, startup_timeout_s)
        self.address = address
        self.timeout_s = timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.n_workers = n_workers
        self.blas_threads = check_blas_threads(blas_threads)
        #: pids of the cells (grid order), while a fit runs.
        self.worker_pids: list[int] = []

    def _client(self):
        """``(client, close)``: a client of the given cluster, or of one started here."""
        distributed = _import_distributed()
        if isinstance(self.address, distributed.Client):
            return self.address, lambda: None
        if self.address is not None:
            client = distributed.Client(self.address, timeout=self.startup_timeout_s, direct_to_workers=True)
            return client, client.close
        return None, None

    def default_resources(self) -> Resources:
        client, close = self._client()
        if client is None:
            return Resources.local()
        try:
            return Resources.from_dask(client)
        finally:
            close()

    def run(self, job: FitJob) -> FitResult:
        with limited(self.blas_threads):
            return self._run(job)

    def _run(self, job: FitJob) -> FitResult:
        distributed = _import_distributed()
        client, close = self._client()
        cluster = None
        grid = None
        try:
            if client is None:
                n = self.n_workers or job.plan.workers_used
                cluster = distributed.LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                                                   dashboard_address=None, silence_logs=logging.ERROR,
                                                   env=thread_env(self.blas_threads))
                client = distributed.Client(cluster, direct_to_workers=True)
                close = client.close
            directory = str(job.data.directory) if isinstance(job.data, NpyDataset) else None
            grid = DaskGrid(client, job, directory, self.timeout_s, self.startup_timeout_s, self.blas_threads)
            grid.start()
            self.worker_pids = grid.pids
            return run_em(grid, job, self.name)
        finally:
            self.worker_pids = []
            try:
                if grid is not None:
                    grid.close(own_cluster=cluster is not None)
            finally:
                if close is not None:
                    close()
                if cluster is not None:
                    cluster.close()

    def __repr__(self) -> str:
        return (f"DaskExecutor(address={self.address!r}, timeout_s={self.timeout_s!r}, "
                f"blas_threads={self.blas_threads!r})")


__all__ = ["DaskExecutor", "DaskCell", "DaskGrid"]
