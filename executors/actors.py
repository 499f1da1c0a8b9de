"""What the cluster engines' executors (Dask, Ray, Spark) share beyond the cell
(:mod:`executors.cell`) and the coordinator's grid (:mod:`executors.cellgrid`): their optional
imports, the testing hooks their cells need, the rows shipped to a cell, and the
coordinator's side of cells that an engine runs and that serve over sockets
(:class:`EngineGrid`).

The testing hooks (``EMGRID_FAULT``, ``EMGRID_THREAD_PROBE``) travel to the cells explicitly:
an engine's worker processes were started before the fit, with their own environment.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection, Listener
from typing import ClassVar

from emgrid.models import Node
from emgrid.models.data import Data, column_major, take_rows
from emgrid.models.errors import ConfigError

from . import faults
from .conns import ConnGrid, hang_up
from .step import WorkerSpec
from .threads import PROBE_ENV

#: The environment variables of the testing hooks that the coordinator forwards to its cells.
FORWARDED_ENV = (faults.ENV, PROBE_ENV)


def forwarded_env() -> dict[str, str]:
    """The testing hooks set in this (the coordinator's) environment, for the cells."""
    return {k: os.environ[k] for k in FORWARDED_ENV if os.environ.get(k)}


class MissingExtraError(ConfigError, ImportError):
    """An executor whose optional dependency is not installed (a configuration error that
    is also an ImportError)."""


def import_extra(engine: str, package: str):
    """The module ``package`` of an engine's optional dependency, or the one-line error that
    names its install line when it is not installed."""
    try:
        return importlib.import_module(package)
    except ImportError:
        raise MissingExtraError(f'the "{engine}" executor needs {package}, which is not installed: '
                                f'pip install "emgrid[{engine}]"') from None


def last_exception_line(report: str, otherwise: str) -> str:
    """The ``Name: message`` line of the last exception in an engine's error report (a Ray
    actor's, a Spark task's), or ``otherwise`` when it names none: a line naming an error or
    exception class first, a JVM's own lines last."""
    lines = [ln.strip() for ln in report.splitlines() if re.match(r"^[A-Za-z_][\w.]*(: |$)", ln.strip())]
    python = [ln for ln in lines if not ln.startswith(("py4j.", "org.apache.", "java.", "scala."))]
    named = [ln for ln in python if re.match(r"^[\w.]*(Error|Exception|Fault|Exit|Interrupt)(: |$)", ln)]
    found = named or python or lines
    return found[-1] if found else otherwise


def shipped_rows(spec: WorkerSpec, model_part: Node, data: Data) -> Data:
    """What the coordinator ships a cell of in-memory data: its replica's rows, only the
    columns its shard reads, vectors column-major (``models.data``; the engine serializes them
    once)."""
    return column_major(spec.view.columns_for(spec.shard, model_part, take_rows(data, spec.start, spec.stop)))


class EngineGrid(ConnGrid):
    """The coordinator's side of cells an engine runs (Dask's or Ray's actors, Spark's barrier
    tasks), each serving its cell over sockets (:mod:`executors.conns`). A subclass starts the
    cells (:meth:`launch`; actors with :meth:`relay`, which relays their addresses, and then
    say how one that ended while starting ended, :meth:`ended_early`); here are what each
    cell starts with, the wait until every cell has opened its rows, and the hang-up."""

    #: The engine, as a message names it.
    engine: ClassVar[str]

    def __init__(self, job, ex):
        super().__init__(job, ex)
        self.directory = job.directory  # the cells map their rows from it, else they are shipped
        self.conns: list[Connection | None] = [None] * len(self.cells)
        self.serving: list = []  # each cell's engine call that serves it, for :meth:`relay`

    def shipped(self) -> Iterator[tuple[WorkerSpec, Node, Data | None]]:
        """Every cell's spec, its shard's part of the starting model and, for data in memory,
        its rows (:func:`shipped_rows`; None when it maps them from :attr:`directory`)."""
        data = None if self.directory is not None else self.job.open_data()
        for spec in self.cells:
            part = spec.view.model_for(spec.shard, self.job.model)
            yield spec, part, None if data is None else shipped_rows(spec, part, data)

    def launch(self) -> None:
        """Starts every cell and connects it (:attr:`conns`)."""
        raise NotImplementedError

    def ended_early(self) -> BaseException | None:
        """The error of a cell whose call in :attr:`serving` ended while the cells started, if
        any (asked again and again by :meth:`relay`: it waits about 50 ms)."""
        raise NotImplementedError

    def start(self) -> None:
        self.launch()
        self.collect(dict.fromkeys(range(len(self.cells))), "while starting", self.startup_timeout_s)
        self.infos = self.call_all("info", (), "while starting", self.startup_timeout_s)

    def relay(self, host: str, serve: Callable[[int, tuple, bytes], object]) -> None:
        """Has every cell serve for the whole fit (``serve(i, address, authkey)`` starts cell
        ``i``'s :func:`executors.conns.serve_relayed` towards this process's ``address`` on
        ``host`` and returns its engine call, kept in :attr:`serving`) and relays the cells'
        addresses (:meth:`accept_relayed`)."""
        authkey = os.urandom(32)
        listener = Listener((host, 0), authkey=authkey)
        try:
            self.serving = [serve(i, listener.address, authkey) for i in range(len(self.cells))]
            self.accept_relayed(listener, self.ended_early, self.engine)
        finally:
            listener.close()

    def hang_up_all(self) -> None:
        """Ends every cell's control connection (a cell waiting for a call sees its end)."""
        for c in self.conns:
            if c is not None:
                hang_up(c)
        self.conns = [None] * len(self.cells)
