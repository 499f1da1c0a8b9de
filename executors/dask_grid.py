"""The Dask executor: every grid cell a long-lived Dask actor (``client.submit(..., actor=True)``).

How bytes move:

- **Rows**, once, when the cells start: each cell maps its own row range of the dataset's
  ``.npy`` files (a dataset on disk, on a file system the workers share), or receives its
  replica's rows, only its shard's columns, scattered once to its worker (data in memory).
- **Model**, once per run: each cell receives its shard's part of the starting model
  (pickled, :meth:`executors.actors.Cell.load`); per iteration, the coordinator's new
  skeleton (the spanning nodes) goes to every cell and each column's head pushes its
  shard's new subtrees to the other cells of its column.
- **Statistics**, every iteration: the cells of each shard's column sum them by a tree
  reduce, pushing their pickled partial sums to each other's actors; the column's head
  (replica 0) runs its shard's M-step and the coordinator receives only its pickled
  :class:`executors.mstep.ColumnReport`, beside every cell's
  :class:`executors.step.ShareReport`.
- **Coupling**, per block: each cell calls ``deliver`` on the actors of the other shards of its
  replica (worker to worker, on the workers' event loops) with its
  :mod:`executors.coupling` message, and waits for theirs (:mod:`executors.actors`); the
  column messages travel the same way.

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

A cluster the executor starts (:func:`local_cluster`) binds its scheduler, workers and their
HTTP endpoints to 127.0.0.1, with the dashboard off; its worker folders go in a run-tagged
scratch folder (:class:`executors.scratch.Scratch`) that goes after the fit, however it
ends (its workers end with this process: they watch a pipe from it). Its workers ignore
SIGINT (a terminal's Ctrl-C reaches every process of the foreground group: the fit's own
process stops them, after emgrid's line rather than under 60 lines of their tracebacks), and
they and this process keep distributed's and tornado's loggers quiet while the fit runs: a
cell's error reaches the fit's own message (:class:`executors.models.errors.FitError`), not
distributed's log first. A cluster named by ``address`` is used as it is.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import uuid
from contextlib import contextmanager
from time import perf_counter, sleep
from typing import ClassVar

from emgrid.models.errors import FitError
from emgrid.planner.resources import Resources, dask_slots

from .actors import Cell, check_timeouts, failed, forwarded_env, import_extra, no_answer, outcome, shipped_rows
from .datafiles import NpyDataset
from .loop import GridOutcome, run_em
from .mstep import update_bytes
from .protocol import BaseExecutor, FitJob
from .result import FitResult
from .scratch import Scratch
from .step import grid_layout
from .threads import DEFAULT_BLAS_THREADS, check_blas_threads, limited, thread_env

#: Seconds between two looks at the scheduler's list of workers while a step runs.
_LIVENESS_S = 0.5
#: What a call to an actor whose worker is gone raises (``distributed.actor``).
_UNREACHABLE = "Unable to contact Actor's worker"


def _import_distributed():
    return import_extra("dask", "distributed")


#: Loggers kept quiet while a fit runs on a cluster the executor started: distributed's
#: ("Compute Failed" with the cell's traceback, before emgrid's own line) and tornado's
#: (callbacks whose connection closed while the cluster stops).
QUIET_LOGGERS = ("distributed", "tornado")


@contextmanager
def quiet_logs(names=QUIET_LOGGERS, level: int = logging.CRITICAL):
    """The loggers ``names`` at ``level`` or above only, and their previous levels back after."""
    loggers = [logging.getLogger(n) for n in names]
    before = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(max(level, lg.level))
    try:
        yield
    finally:
        for lg, was in zip(loggers, before):
            lg.setLevel(was)


def dask_setup(worker) -> None:
    """Run in every worker process of a cluster the executor starts (a Dask preload: this
    module is named in the cluster's ``preload``), on the worker's main thread before any
    task: SIGINT ignored (the fit's own process stops the workers) and distributed's and
    tornado's loggers quiet (:data:`QUIET_LOGGERS`: the cells' errors travel to the fit)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)


def local_cluster(n_workers: int, blas_threads: int | None, scratch: Scratch):
    """A ``LocalCluster`` for one fit: ``n_workers`` processes of one thread, everything on
    127.0.0.1 (the scheduler's HTTP endpoint, which it keeps without a dashboard, on a port
    of its own rather than 8787, which another cluster may hold), no dashboard, worker
    folders in ``scratch``, and :func:`dask_setup` run in every worker."""
    distributed = _import_distributed()
    import dask

    with dask.config.set({"temporary-directory": str(scratch.path)}):  # the scheduler's folder too
        return distributed.LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                                        host="127.0.0.1", dashboard_address=None, silence_logs=logging.CRITICAL,
                                        scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
                                        local_directory=str(scratch.path), preload=[__name__],
                                        env=thread_env(blas_threads))


class Shipped:
    """Rows shipped to a cell, wrapped so that ``client.scatter`` sends them as one object."""

    __slots__ = ("data",)

    def __init__(self, data):
        self.data = data


class DaskCell:
    """The Dask actor of one cell (:class:`executors.actors.Cell`), with a thread of its own
    per call that may wait.

    The coordinator calls ``info``, ``connect``, ``waits_for``, ``abort`` and ``close`` with
    ``separate_thread=False``, and the cells call each other's ``deliver`` so (they run on
    the worker's event loop, briefly); ``load``, ``step``, ``update`` and ``fetch`` are
    coroutines that run the cell's method on a thread of the cell's, so the worker's one actor
    thread, shared by the actors of its process, is never held, and deliveries are taken
    while the cell waits.
    """

    def __init__(self, spec, model, directory, rows, blas_threads, env):
        data = rows.data if isinstance(rows, Shipped) else rows
        self.cell = Cell(spec, model, directory, data, blas_threads, env)
        self.thread_name = f"emgrid-{spec.name}"
        self.peers: dict | None = None

    def info(self) -> dict:
        return self.cell.info()

    def connect(self, peers: dict, replicas: int) -> None:
        """``peers``: ``(replica, shard)`` -> ``(worker address, actor key)`` of every cell
        this one sends to (:meth:`Cell.targets`). Called on the worker's event loop, where
        the worker is known; the proxies are made on the cell's thread at its first send,
        bound to this worker (and to no client, so they hold no reference to the peers'
        actors)."""
        from distributed import get_worker

        worker = get_worker()
        self.peers = {}

        def send(target, key, message):
            proxy = self.peers.get(target)
            if proxy is None:
                from distributed.actor import Actor

                proxy = self.peers[target] = Actor(DaskCell, *peers[target], worker=worker)
            proxy.deliver(key, message, separate_thread=False)

        self.cell.connect(send, replicas)

    def deliver(self, key, message) -> None:
        self.cell.deliver(key, message)

    async def _threaded(self, method, *args):
        """``method(*args)`` on a daemon thread of the cell's own (a hung one does not hold
        its process at exit), awaited on the worker's event loop."""
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
                result, error = method(*args), None
            except BaseException as e:  # noqa: BLE001 - carried to the coordinator
                result, error = None, e
            loop.call_soon_threadsafe(settle, result, error)

        threading.Thread(target=run, name=self.thread_name, daemon=True).start()
        return await done

    async def load(self, payload: bytes, regularization) -> None:
        return await self._threaded(self.cell.load, payload, regularization)

    async def step(self, iteration: int):
        return await self._threaded(self.cell.run, iteration)

    async def update(self, iteration: int, skeleton: bytes) -> int:
        return await self._threaded(self.cell.update, iteration, skeleton)

    async def fetch(self) -> dict:
        return await self._threaded(self.cell.owned)

    def waits_for(self) -> str:
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
        self.calls: list = []  # the calls of the round in flight (grid order), unanswered when it failed
        self.called: list[int] = []  # the cells they went to
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
        d, m = self.shape
        where = [(address, f.key) for address, f in zip(self.addresses, self.futures)]
        self._call_all([a.connect({t: where[t[0] * m + t[1]] for t in Cell.targets(s, d)}, d, separate_thread=False)
                        for a, s in zip(self.actors, self.cells)], "while starting", self.startup_timeout_s)

    @property
    def pids(self) -> list[int]:
        return [info.get("pid") for info in self.infos]

    # ------------------------------------------------------------ one run, one iteration
    def broadcast(self, model, payloads) -> None:
        """Shard by shard, so that this process holds one shard's pickle at a time."""
        reg, m = self.job.regularization, self.shape[1]
        for shard in range(m):
            blob = payloads[shard]
            cells = list(range(shard, len(self.cells), m))
            self._call_all([self.actors[i].load(blob, reg) for i in cells],
                           f"while receiving the model for iteration {self.iteration + 1}", self.timeout_s, cells=cells)
            del blob

    def e_step(self, iteration: int) -> GridOutcome:
        self.iteration = iteration
        t0 = perf_counter()
        got = self._call_all([a.step(iteration) for a in self.actors], f"in iteration {iteration}", self.timeout_s)
        return outcome(got, self.shape, perf_counter() - t0)

    def update(self, skeleton, payload: bytes) -> int:
        it = self.iteration
        pushed = self._call_all([a.update(it, payload) for a in self.actors], f"in the update after iteration {it}",
                                self.timeout_s)
        return update_bytes(self.layout[0][0].view, self.shape[0], len(payload), pushed[:self.shape[1]])

    def fetch(self, shard: int) -> dict:
        (owned,) = self._call_all([self.actors[shard].fetch()], f"sending shard {shard}'s subtrees after iteration "
                                  f"{self.iteration}", self.timeout_s, cells=[shard])
        return owned

    def _call_all(self, calls: list, when: str, timeout_s: float | None, cells: list[int] | None = None) -> list:
        """Every cell's answer to one call each (grid order, or the order of ``cells``, the
        cells called); FitError on an error, a death or a timeout, naming the cell."""
        cells = list(range(len(calls))) if cells is None else cells
        self.calls, self.called = calls, cells
        out: list = [None] * len(calls)
        pending = set(range(len(calls)))
        deadline = None if timeout_s is None else perf_counter() + timeout_s
        while pending:
            for i in sorted(pending):
                if calls[i].done():
                    try:
                        out[i] = calls[i].result()
                    except Exception as e:  # noqa: BLE001 - the cell's own error, or its death, named
                        who = self._who(cells[i])
                        if isinstance(e, OSError) and str(e) == _UNREACHABLE:
                            raise FitError(f"{who} died {when} (its worker cannot be reached)") from None
                        raise failed(who, when, e) from None
                    pending.discard(i)
            if not pending:
                break
            self._check_alive(when)
            if deadline is not None and perf_counter() > deadline:
                stuck = sorted(cells[i] for i in pending)
                raise no_answer(self._who, self.cells, stuck, self._waits(stuck), timeout_s, when)
            try:
                calls[min(pending)].result(timeout=0.05)
            except Exception:  # noqa: BLE001 - a timeout, or its error, read on the next pass
                pass
        self.calls, self.called = [], []
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
        deadline = perf_counter() + 1.0  # aborted, the calls that waited for a peer end now
        while any(not c.done() for c in self.calls) and perf_counter() < deadline:
            sleep(0.02)
        busy = {self.addresses[i] for i, c in zip(self.called, self.calls) if not c.done()}
        self.actors, self.calls, self.called = [], [], []
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
            if self.address is not None:
                return self._run(job)
            with quiet_logs():
                return self._run(job)

    def _run(self, job: FitJob) -> FitResult:
        distributed = _import_distributed()
        client, close = self._client()
        cluster = None
        scratch = None
        grid = None
        try:
            if client is None:
                scratch = Scratch("dask")
                cluster = local_cluster(self.n_workers or job.plan.workers_used, self.blas_threads, scratch)
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
                try:
                    if close is not None:
                        close()
                    if cluster is not None:
                        cluster.close()
                finally:
                    if scratch is not None:
                        scratch.close()

    def __repr__(self) -> str:
        return (f"DaskExecutor(address={self.address!r}, timeout_s={self.timeout_s!r}, "
                f"blas_threads={self.blas_threads!r})")


__all__ = ["DaskExecutor", "DaskCell", "DaskGrid"]
