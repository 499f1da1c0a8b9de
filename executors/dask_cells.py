"""What runs in the worker processes of a Dask fit: each cell's actor (:class:`DaskCell`, over
:class:`executors.cell.Cell`) and the set-up of the workers of a cluster the executor starts
(:func:`dask_setup`, a Dask preload)."""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from contextlib import contextmanager

from .cell import Cell

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


class Shipped:
    """Rows shipped to a cell, wrapped so that ``client.scatter`` sends them as one object."""

    __slots__ = ("data",)

    def __init__(self, data):
        self.data = data


class DaskCell:
    """The Dask actor of one cell (:class:`executors.cell.Cell`), with a thread of its own
    per call that may wait.

    The coordinator calls ``info``, ``connect``, ``waits_for``, ``abort`` and ``close`` with
    ``separate_thread=False``, and the cells call each other's ``deliver`` so (they run on
    the worker's event loop, briefly); ``load``, ``run``, ``update`` and ``owned`` are
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

        def send(target, key, payload, extra):
            proxy = self.peers.get(target)
            if proxy is None:
                from distributed.actor import Actor

                proxy = self.peers[target] = Actor(DaskCell, *peers[target], worker=worker)
            proxy.deliver(key, payload, extra, separate_thread=False)

        self.cell.connect(send, replicas)

    def deliver(self, key, payload, extra) -> None:
        self.cell.deliver(key, payload, extra)

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

    async def run(self, iteration: int):
        return await self._threaded(self.cell.run, iteration)

    async def update(self, iteration: int, skeleton: bytes) -> None:
        return await self._threaded(self.cell.update, iteration, skeleton)

    async def update_and_run(self, previous: int, skeleton: bytes, iteration: int):
        return await self._threaded(self.cell.update_and_run, previous, skeleton, iteration)

    async def owned(self) -> dict:
        return await self._threaded(self.cell.owned)

    def waits_for(self) -> str:
        return self.cell.waits_for()

    def abort(self) -> None:
        self.cell.abort()

    def close(self) -> None:
        self.cell.close()
        self.peers = None
