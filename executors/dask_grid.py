"""The Dask executor: every grid cell a long-lived Dask actor (``client.submit(..., actor=True)``).

What moves, and when, is every cell's (:mod:`executors.cell`); how, here: a cell maps its own
row range of the dataset's ``.npy`` files (a dataset on disk, on a file system the workers
share), or receives its replica's rows, only its shard's columns, scattered once to its
worker (data in memory); then its actor serves it over sockets for the whole fit
(:class:`executors.actors.EngineGrid`): the coordinator's calls, and a cell's messages to its
peers (coupling, partial sums, new subtrees) cell to cell.

Cells are placed on the workers the plan names when it was made for this cluster
(``Resources.from_dask(client)``, whose worker names are the cluster's slots); otherwise in
turn over the workers' threads. Several cells on one worker share its process (each runs
on a thread of its own).

Faults: a cell that raises stops the fit with a FitError naming it and the iteration; a
cell whose worker dies is noticed within about half a second (its actor's future is lost, or
the scheduler no longer lists the worker); with ``timeout_s``, one that does not answer in
time is named. Every cell is aborted and released after the fit, however it ended; a cell
still running then (a hung step) has its worker process ended (its nanny starts a new one),
the only way to stop a Python thread.

A cluster the executor starts (``address=None``, :func:`local_cluster`) listens on 127.0.0.1
only, with no dashboard, keeps its worker folders in a run-tagged scratch folder
(:class:`executors.scratch.Scratch`), ends with this process, and is closed after the fit;
its workers ignore SIGINT (a terminal's Ctrl-C reaches them too: emgrid's one line comes
first, not 60 lines of their tracebacks), and they and this process keep distributed's and
tornado's loggers quiet while the fit runs (:func:`executors.dask_cells.dask_setup`). A
cluster named by ``address`` is used as it is.
"""

from __future__ import annotations

import logging
import os
import uuid
from contextlib import ExitStack, nullcontext, suppress
from time import perf_counter, sleep
from typing import ClassVar
from urllib.parse import urlparse

from emgrid.models.errors import FitError
from emgrid.planner.resources import Resources, dask_slots

from . import dask_cells
from .actors import EngineGrid, forwarded_env, import_extra
from .cellgrid import GridExecutor, WorkerLost, describe_error
from .dask_cells import DaskCell, Shipped, quiet_logs
from .protocol import FitJob
from .result import FitResult
from .scratch import Scratch
from .threads import DEFAULT_BLAS_THREADS, thread_env

#: Longest wait for the scheduler to drop a worker whose cell's connection ended.
_SCHEDULER_NOTICES_S = 5.0
#: What a call to an actor whose worker is gone raises (``distributed.actor``).
_UNREACHABLE = "Unable to contact Actor's worker"


def _import_distributed():
    return import_extra("dask", "distributed")


def local_cluster(n_workers: int, blas_threads: int | None, scratch: Scratch):
    """A ``LocalCluster`` for one fit: ``n_workers`` processes of one thread, everything on
    127.0.0.1 (the scheduler's HTTP endpoint, which it keeps without a dashboard, on a port
    of its own rather than 8787, which another cluster may hold), no dashboard, worker
    folders in ``scratch``, and :func:`executors.dask_cells.dask_setup` run in every worker.
    The workers' environment is given to them alone (``env``): a nanny sets its
    ``pre-spawn-environ`` in this process's ``os.environ`` and leaves it there, so that the
    caller's later processes would start with Dask's ``MALLOC_TRIM_THRESHOLD_`` and thread
    limits; none is set."""
    distributed = _import_distributed()
    import dask

    # the scheduler's folder in the scratch folder too
    with dask.config.set({"temporary-directory": str(scratch.path), "distributed.nanny.pre-spawn-environ": {}}):
        return distributed.LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                                        host="127.0.0.1", dashboard_address=None, silence_logs=logging.CRITICAL,
                                        scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
                                        local_directory=str(scratch.path), preload=[dask_cells.__name__],
                                        env=thread_env(blas_threads))


async def _end_process() -> None:
    """Ends the worker process it runs in at once (its nanny, if any, starts a new one)."""
    os._exit(70)


class DaskGrid(EngineGrid):
    """The coordinator's side: one actor per cell on a ``distributed.Client``, each serving its
    cell over sockets to this process and to the cells it meets."""

    engine = "Dask"

    def __init__(self, job: FitJob, ex: GridExecutor, client, own_cluster: bool):
        super().__init__(job, ex)
        self.client = client
        self.own_cluster = own_cluster  # the cluster goes with the fit: its busy workers need no ending
        self.futures: list = []  # the actors' futures: holding them keeps the actors alive
        self.actors: list = []
        self.addresses: list[str] = []

    # ------------------------------------------------------------ naming and liveness
    def where(self, i: int) -> str:
        pid = self.infos[i].get("pid")
        return f", pid {pid} on Dask worker {self.addresses[i]}" if pid else f", Dask worker {self.addresses[i]}"

    def _live_workers(self) -> set[str]:
        return set(self.client.scheduler_info(n_workers=-1)["workers"])

    def ended(self, i: int) -> str:
        """A cell whose connection ended died with its worker: waits (a few seconds at most)
        until the scheduler no longer lists that worker, so that a re-plan is not placed on it
        (its socket tells of the death before the scheduler has noticed)."""
        deadline = perf_counter() + _SCHEDULER_NOTICES_S
        while perf_counter() < deadline:
            try:
                if self.addresses[i] not in self._live_workers():
                    break
            except Exception:  # noqa: BLE001 - the scheduler is unreachable: nothing to wait for
                break
            sleep(0.05)
        return "died"

    def resources_now(self) -> Resources:
        return Resources.from_dask(self.client)

    # ------------------------------------------------------------ placement and start
    def _placement(self) -> list[str]:
        slots = dask_slots(self.client.scheduler_info(n_workers=-1)["workers"])
        if not slots:
            raise FitError("the Dask cluster has no workers")
        by_name = {name: address for name, address, _ in slots}
        if all(spec.name in by_name for spec in self.cells):
            return [by_name[spec.name] for spec in self.cells]
        return [slots[i % len(slots)][1] for i in range(len(self.cells))]

    def launch(self) -> None:
        client = self.client
        self.addresses = self._placement()
        env, token = forwarded_env(), uuid.uuid4().hex[:8]
        for (spec, part, rows), address in zip(self.shipped(), self.addresses):
            if rows is not None:
                rows = client.scatter(Shipped(rows), workers=[address], direct=True, hash=False)
            self.futures.append(client.submit(DaskCell, spec, part, self.directory, rows, self.blas_threads, env,
                                              actor=True, workers=[address], allow_other_workers=False, pure=False,
                                              key=f"emgrid-{spec.name}-{token}"))
        self.actors = self._built()
        hosts = [urlparse(address).hostname for address in self.addresses]
        self.relay(_reachable_host(client), lambda i, *to: self.actors[i].serve(*to, self.shape[0], hosts[i]))

    def _built(self) -> list:
        """Every cell's actor once its constructor ran; FitError naming a cell whose
        constructor raised (opening its rows, say) or that was not built within the startup
        timeout."""
        deadline = perf_counter() + self.startup_timeout_s
        for i, f in enumerate(self.futures):
            try:
                f.result(timeout=max(0.0, deadline - perf_counter()))
            except Exception as e:  # noqa: BLE001 - named below
                if isinstance(e, TimeoutError) and perf_counter() >= deadline:
                    raise FitError(f"no answer within {self.startup_timeout_s:g} s while starting from "
                                   f"{self.who(i)}") from None
                raise self.failed(i, "while starting", *describe_error(e)) from None
        return [f.result() for f in self.futures]

    def ended_early(self) -> BaseException | None:
        sleep(0.05)
        for i, f in enumerate(self.serving):
            if f.done():
                try:
                    f.result()
                    return FitError(f"{self.who(i)} ended while starting")
                except Exception as e:  # noqa: BLE001 - its error, or its worker's death
                    if isinstance(e, OSError) and str(e) == _UNREACHABLE:
                        return WorkerLost(f"{self.who(i)} died while starting (its worker cannot be reached)", i,
                                          self.cells[i].name)
                    return self.failed(i, "while starting", *describe_error(e))
        return None

    def waits(self, cells: list[int]) -> dict[int, str]:
        """What each of ``cells`` waits for (:meth:`Cell.waits_for`, asked of its actor while
        its cell's thread waits), at most a second for all; one that does not answer counts
        as stuck."""
        asked = {i: self.actors[i].waits_for(separate_thread=False) for i in cells if i < len(self.actors)}
        deadline = perf_counter() + 1.0
        out = {}
        for i, f in asked.items():
            with suppress(Exception):
                out[i] = f.result(timeout=max(0.0, deadline - perf_counter()))
        return out

    # ------------------------------------------------------------ the end
    def close(self, failed: bool = False) -> None:
        """Stops every cell (after a failure: aborts it, so that one waiting for a peer ends)
        and releases its actor; ends the worker processes of cells still running a step
        (after a hang: a Python thread cannot be stopped otherwise; their nannies start new
        ones), unless the cluster goes away anyway. Each step is best effort: a worker may
        be gone, the client closing."""
        if not failed:
            self.ask_to_stop()
        else:  # a cell waiting for a peer is aborted; one waiting for a call sees its end of file
            for a in self.actors:
                with suppress(Exception):
                    a.abort(separate_thread=False)
            self.hang_up_all()
        deadline = perf_counter() + (5.0 if not failed else 2.0)
        while any(not f.done() for f in self.serving) and perf_counter() < deadline:
            sleep(0.02)
        busy = {self.addresses[i] for i, f in enumerate(self.serving) if not f.done()}
        self.hang_up_all()
        closing = []
        for a in self.actors:
            with suppress(Exception):
                closing.append(a.close(separate_thread=False))
        for c in closing:
            with suppress(Exception):
                c.result(timeout=1.0)
        self.actors, self.serving = [], []
        if self.futures:
            with suppress(Exception):
                self.client.cancel(self.futures, force=True)
        self.futures = []
        live = sorted(busy & self._live_workers()) if busy and not self.own_cluster else []
        if live:
            with suppress(Exception):
                self.client.run(_end_process, workers=live, wait=False)


def _reachable_host(client) -> str:
    """This process's address as the cluster's workers reach it: loopback for a scheduler on
    loopback, else the address this machine uses towards the scheduler."""
    host = urlparse(client.scheduler.address).hostname or "127.0.0.1"
    if host in ("127.0.0.1", "localhost", "::1"):
        return "127.0.0.1"
    from distributed.utils import get_ip

    return get_ip(host)


class DaskExecutor(GridExecutor):
    """Dask actors, one per grid cell, on a Dask cluster.

    ``address``: the scheduler's address (``"tcp://host:8786"``), or a
    ``distributed.Client`` to use as it is; ``None`` starts a local cluster for the run
    (``n_workers`` processes, default one per grid cell, one thread each) and closes it
    after. ``timeout_s``, ``startup_timeout_s``, ``blas_threads``: as every grid executor's
    (:class:`executors.cellgrid.GridExecutor`; the BLAS limit holds in each cell's process
    while the cell lives).
    """

    name: ClassVar[str] = "dask"
    shown_option: ClassVar[str] = "address"

    def __init__(self, address=None, timeout_s: float | None = None, startup_timeout_s: float = 120.0,
                 n_workers: int | None = None, blas_threads: int | None = DEFAULT_BLAS_THREADS):
        _import_distributed()
        super().__init__(timeout_s, startup_timeout_s, blas_threads)
        self.address = address
        self.n_workers = n_workers

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
        with quiet_logs() if self.address is None else nullcontext():
            return super().run(job)

    def _run(self, job: FitJob) -> FitResult:
        distributed = _import_distributed()
        with ExitStack() as after:  # in reverse: the cells, the client, the cluster, its folder
            client, close = self._client()
            cluster = None
            if client is None:
                scratch = Scratch("dask")
                after.callback(scratch.close)
                cluster = local_cluster(self.n_workers or job.plan.workers_used, self.blas_threads, scratch)
                after.callback(cluster.close)
                client = distributed.Client(cluster, direct_to_workers=True)
                close = client.close
            after.callback(close)
            return self.fit_on(job, DaskGrid, client, cluster is not None)


__all__ = ["DaskExecutor", "DaskCell", "DaskGrid"]
