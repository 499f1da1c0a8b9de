"""The multiprocessing executor: one worker process per grid cell on this machine.

Each worker runs one :class:`executors.cell.Cell` served over pipes (:mod:`executors.conns`):
a control pipe from the parent, and one pipe per pair of cells that meet (the shards of a
replica, the replicas of a column).

Rows never pass through the parent: the data lives in ``.npy`` files (written once to a
run-tagged scratch folder when the caller gave arrays, :class:`executors.scratch.Scratch`,
removed however the fit ends) that every worker maps for its own row range only.

Workers start with the ``spawn`` (or ``forkserver``) method and with BLAS and OpenMP limited
to ``blas_threads`` threads (one by default, :mod:`executors.threads`).

A worker's target and arguments are emgrid's own, so it needs nothing from the caller's
``__main__``, which is hidden from spawn's preparation while workers start
(:func:`_main_hidden`): a plain script without an ``if __name__ == "__main__":`` guard runs
once and fits. Only a model with a node class defined in ``__main__`` makes the workers
import the script (to unpickle it), which then needs the guard.

A SIGTERM to the parent while it runs a fit (with the default action in place) unwinds it:
the workers stop and the temporary copy of the data goes, then the process exits 143.

A worker's death is noticed by its process's sentinel (the parent never blocks on a dead
one); the fault rule is :mod:`executors.cellgrid`'s.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
import sys
import threading
from contextlib import contextmanager, nullcontext
from multiprocessing.connection import Connection
from time import perf_counter
from typing import ClassVar

from emgrid.models import Node
from emgrid.models.errors import ConfigError, FitError

from .cell import Cell
from .cellgrid import GridExecutor
from .conns import ConnGrid, serve
from .datafiles import NpyDataset
from .protocol import FitJob
from .result import FitResult
from .scratch import Scratch, set_parent_death_signal
from .step import WorkerSpec
from .threads import DEFAULT_BLAS_THREADS, environment, limited, patched, thread_env

def _worker_main(spec: WorkerSpec, d: int, directory: str, model: Node, control: Connection,
                 links: dict[tuple[int, int], Connection], blas_threads: int | None = DEFAULT_BLAS_THREADS) -> None:
    """A worker process: its :class:`executors.cell.Cell` over pipes, serving the parent's
    calls until told to stop. ``d``: the replicas of the grid; ``links``: by ``(replica,
    shard)``, the pipes to the cells it sends to (:meth:`Cell.targets`). It dies with the
    process that started it (a worker busy in a step would not read its pipe's end soon)."""
    parent = mp.parent_process()
    if parent is not None:
        set_parent_death_signal(signal.SIGKILL, parent.pid)
    def make_cell():
        return Cell(spec, model, directory, None), links

    with limited(blas_threads):
        serve(make_cell, d, control)


@contextmanager
def _main_hidden(model: Node):
    """Inside the block, spawn's preparation data do not name the caller's ``__main__``, so
    the workers started in it do not import (and run) the caller's script again.

    Spawn records ``__main__.__spec__.name`` or ``__main__.__file__`` for the child to import
    as ``__mp_main__``, only so that objects pickled from ``__main__`` resolve there. A
    worker's arguments reference ``__main__`` only when some node's class is defined in it:
    then nothing is hidden (and the script needs its main guard, as with any spawned worker).
    """
    main = sys.modules.get("__main__")
    if main is None or any(type(node).__module__ == "__main__" for _, node in model.nodes()):
        yield
        return
    with patched(main.__dict__, {"__file__": None, "__spec__": None}):  # spawn reads None as absent
        yield


class ProcessGrid(ConnGrid):
    """The parent's side: one control pipe per worker, the workers' sentinels to notice deaths."""

    def __init__(self, job: FitJob, ex: GridExecutor, directory: str, context):
        super().__init__(job, ex)
        self.directory, self.context = directory, context
        self.procs: list = []
        self.conns: list[Connection] = []

    def start(self) -> None:
        """Starts every worker and waits until each has mapped its rows."""
        job, d = self.job, self.shape[0]
        ends: dict[tuple[int, int], dict[tuple[int, int], Connection]] = {(s.replica, s.shard): {} for s in self.cells}
        for spec in self.cells:
            me = (spec.replica, spec.shard)
            for target in Cell.targets(spec, d):
                if me < target:
                    ends[me][target], ends[target][me] = self.context.Pipe(duplex=True)
        child_ends = []
        with environment(thread_env(self.blas_threads)), _main_hidden(job.model):
            for spec in self.cells:
                parent, child = self.context.Pipe(duplex=True)
                cell = (spec.replica, spec.shard)
                p = self.context.Process(target=_worker_main, name=f"emgrid-{spec.name}", daemon=True,
                                         args=(spec, d, self.directory, spec.view.model_for(spec.shard, job.model),
                                               child, ends[cell], self.blas_threads))
                p.start()
                self.procs.append(p)
                self.conns.append(parent)
                child_ends.append(child)
        for c in child_ends:
            c.close()
        for links in ends.values():
            for c in links.values():
                c.close()
        self.collect(dict.fromkeys(range(len(self.cells))), "while starting", self.startup_timeout_s)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def where(self, i: int) -> str:
        return f", pid {self.procs[i].pid}"

    def ended(self, i: int) -> str:
        p = self.procs[i]
        p.join(1.0)
        code = p.exitcode
        if code is None:
            return "stopped answering"
        return f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"

    def sentinel(self, i: int):
        return self.procs[i].sentinel

    def fetch(self, shard: int) -> dict[str, Node]:
        if not self.procs or self.conns[shard].closed:
            raise FitError("the fit's workers have stopped: its shards can no longer be fetched")
        return super().fetch(shard)

    def close(self, failed: bool = False) -> None:
        """Stops every worker: asks them to stop (up to 5 s in all), then terminates and kills.

        After a failed fit (``failed``) the workers have nothing left to do and some may be
        stuck waiting on a dead peer or hung: they are terminated at once.
        """
        if not failed:
            self.ask_to_stop()
            deadline = perf_counter() + 5.0
            for p in self.procs:
                p.join(max(0.0, deadline - perf_counter()))
        for p in self.procs:
            if p.is_alive():
                p.terminate()
        for p in self.procs:
            p.join(2.0)
            if p.is_alive():
                p.kill()
                p.join()
        for c in self.conns:
            c.close()


@contextmanager
def _terminate_unwinds():
    """While a fit runs, a SIGTERM that would kill the coordinator outright (the default
    action) raises SystemExit(143) instead, so that the workers are stopped and the data's
    temporary copy removed on the way out. A handler the caller installed is left alone."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return

    def unwind(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, unwind)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


class MultiprocessingExecutor(GridExecutor):
    """Worker processes on this machine, one per grid cell.

    ``start_method``: ``"spawn"`` or ``"forkserver"`` (a forked numpy with BLAS threads is not
    safe); either way the workers do not import the caller's script, which needs no
    ``if __name__ == "__main__":`` guard (see the module). ``tmp_dir``: where the rows of data
    held in memory are written for the workers. ``timeout_s``, ``startup_timeout_s``,
    ``blas_threads``: as every grid executor's (:class:`executors.cellgrid.GridExecutor`).
    """

    name: ClassVar[str] = "multiprocessing"
    shown_option: ClassVar[str] = "start_method"

    def __init__(self, start_method: str = "spawn", timeout_s: float | None = None,
                 startup_timeout_s: float = 120.0, tmp_dir: str | None = None,
                 blas_threads: int | None = DEFAULT_BLAS_THREADS):
        if start_method not in ("spawn", "forkserver"):
            raise ConfigError(f"start_method must be 'spawn' or 'forkserver', got {start_method!r}")
        super().__init__(timeout_s, startup_timeout_s, blas_threads)
        self.start_method = start_method
        self.tmp_dir = tmp_dir

    def run(self, job: FitJob) -> FitResult:
        with _terminate_unwinds():
            return super().run(job)

    def _run(self, job: FitJob) -> FitResult:
        with Scratch("data", self.tmp_dir) if job.directory is None else nullcontext() as scratch:
            directory = job.directory or str(NpyDataset.write(job.data, scratch.path).directory)
            return self.fit_on(job, ProcessGrid, directory, mp.get_context(self.start_method))
