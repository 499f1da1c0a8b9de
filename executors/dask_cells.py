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
from .conns import serve_relayed

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
    """The Dask actor of one cell: it builds the :class:`executors.cell.Cell` (its rows mapped
    or shipped with the constructor), then :meth:`serve` serves it over sockets for the whole
    fit (:func:`executors.conns.serve_relayed`), on a thread of its own so that the worker's
    actor thread, shared by the actors of its process, is never held. ``waits_for``,
    ``abort`` and ``close`` run on the worker's event loop (``separate_thread=False``): they
    reach a cell while it waits for a peer."""

    def __init__(self, spec, model, directory, rows, blas_threads, env):
        data = rows.data if isinstance(rows, Shipped) else rows
        self.cell = Cell(spec, model, directory, data, blas_threads, env)

    async def serve(self, coordinator, authkey: bytes, d: int, host: str) -> None:
        """:func:`executors.conns.serve_relayed` on a daemon thread (a hung one does not hold
        its process at exit), awaited on the worker's event loop."""
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def settle(error):
            if not done.cancelled():
                done.set_result(None) if error is None else done.set_exception(error)

        def run():
            try:
                serve_relayed(self.cell, coordinator, authkey, d, host)
                error = None
            except BaseException as e:  # noqa: BLE001 - carried to the coordinator
                error = e
            loop.call_soon_threadsafe(settle, error)

        threading.Thread(target=run, name=f"emgrid-{self.cell.spec.name}", daemon=True).start()
        return await done

    def waits_for(self) -> str:
        return self.cell.waits_for()

    def abort(self) -> None:
        self.cell.abort()

    def close(self) -> None:
        self.cell.close()
