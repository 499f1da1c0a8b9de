"""The coordinator's side of a grid of :class:`executors.cell.Cell`, over any transport: the
EM loop's :class:`executors.loop.Grid` and the fault rule, written once.

A transport subclasses :class:`CellGrid` and supplies how a call reaches a cell and how its
answer comes back (:meth:`CellGrid.call`, :meth:`CellGrid.poll`), how to name a cell and say
how it ended (:meth:`CellGrid.who`, :meth:`CellGrid.ended`), and, for a timeout's message,
what the late cells wait for (:meth:`CellGrid.waits`). Everything else is here:

- **broadcast**: each shard's pickled part to the cells of its column, once per run;
- **E-step**: every cell's :meth:`Cell.run`; each head's pickled
  :class:`executors.mstep.ColumnReport` and every cell's report become the
  :class:`executors.loop.GridOutcome`;
- **update**: the new skeleton to every cell (the heads send their subtrees to their columns);
- **fetch**: a shard's current subtrees from its head.

The fault rule (:meth:`CellGrid.collect`): a cell's error or death is the cause and stops the
fit at once, with a :class:`FitError` naming the cell and the iteration; a cell that reports
it lost the link to a peer only points at the cause, so the coordinator keeps listening a
few seconds for the peer's own report or death and names the peer either way; with a
timeout, the late cells that wait for nobody are named, those that wait for a peer are
said to (a note each).
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import ClassVar

from emgrid.models.errors import FitError

from .loop import GridOutcome, critical_path, run_em
from .mstep import ColumnReport, update_bytes
from .protocol import BaseExecutor, FitJob, check_timeouts
from .result import FitResult
from .step import ShareReport, grid_layout
from .threads import DEFAULT_BLAS_THREADS

#: Seconds the coordinator keeps listening, after a cell reports that it lost a peer, for the
#: peer's own error report or death (the cause, which it names instead).
CAUSE_GRACE_S = 5.0
#: Longest wait (seconds) for answers before the coordinator looks again (at a deadline, at a
#: lost peer's grace, at the engine's own liveness checks).
POLL_S = 0.5


#: What stands, in a call's arguments, for a bytes-like one that travels after the call as it
#: is (a shard's pickled part, a skeleton: not pickled again inside the call).
RAW = "<raw>"


def _is_raw(a) -> bool:
    return isinstance(a, (bytes, bytearray, memoryview))


def split_raw(args) -> tuple[list, list]:
    """A call's arguments with every bytes-like one replaced by :data:`RAW`, and those."""
    return [RAW if _is_raw(a) else a for a in args], [a for a in args if _is_raw(a)]


def join_raw(args, bodies) -> list:
    """The arguments :func:`split_raw` split, with ``bodies`` (an iterator) back in place."""
    return [next(bodies) if isinstance(a, str) and a == RAW else a for a in args]


@dataclass
class Failed:
    """A cell's call raised: its one-line summary and its traceback."""

    summary: str
    trace: str


@dataclass
class Died:
    """A cell's process or actor is gone: ``how`` in words ("was killed by signal 9", "died")."""

    how: str


@dataclass
class Lost:
    """A cell lost its link to the cell ``peer`` (a grid index): the peer failed."""

    peer: int


class WorkerLost(FitError):
    """A cell's process or actor is gone (``cell``: its grid index, ``worker``: its plan
    name): the fault an elastic fit re-plans around (:mod:`executors.elastic`), unlike a
    cell's own error, which would recur."""

    def __init__(self, message: str, cell: int, worker: str):
        super().__init__(message)
        self.cell, self.worker = cell, worker


def describe_error(e: BaseException) -> tuple[str, str]:
    """An exception as ``(one-line summary, traceback)``."""
    import traceback

    summary = traceback.format_exception_only(type(e), e)[-1].strip()
    return summary, "".join(traceback.format_exception(type(e), e, e.__traceback__))


def outcome(got: Sequence[tuple[ShareReport, bytes | None, int]], shape: tuple[int, int],
            wall_s: float) -> GridOutcome:
    """The grid's E-step and its columns' M-steps from every cell's report and every head's
    pickled :class:`ColumnReport` (grid order: the heads are the first ``M``)."""
    t0 = perf_counter()
    m = shape[1]
    reports = [report for report, _, _ in got]
    blobs = [blob for _, blob, _ in got[:m]]
    columns: list[ColumnReport] = [pickle.loads(blob) for blob in blobs]
    phases = critical_path(reports, wall_s)
    # the heads' M-steps are timed as such (loop.run_em); what is left beyond the busiest
    # worker is the column reduces and the reports' way here, and their unpickling
    phases["reduce_s"] = max(0.0, phases["reduce_s"] - max(c.mstep_s for c in columns)) + perf_counter() - t0
    return GridOutcome(columns=columns, **phases, coupling_bytes=sum(r.coupling_bytes for r in reports),
                       reduce_bytes=sum(r.stats_bytes for r in reports) + sum(len(b) for b in blobs),
                       peak_bytes={r.worker: r.peak_bytes for r in reports},
                       baseline_bytes={r.worker: r.baseline_bytes for r in reports})


class CellGrid:
    """The coordinator's side of one fit's grid of cells (see the module)."""

    def __init__(self, job: FitJob, ex: GridExecutor):
        """``ex``: the executor, whose timeouts and BLAS threads the grid keeps."""
        self.job = job
        self.timeout_s, self.startup_timeout_s, self.blas_threads = ex.timeout_s, ex.startup_timeout_s, ex.blas_threads
        self.layout = grid_layout(job.model, job.plan, job.dtype)
        self.cells = [spec for row in self.layout for spec in row]  # grid order
        self.view = self.layout[0][0].view
        self.shape = (job.plan.data_parallel, job.plan.model_parallel)
        self.iteration = 0
        self.pending_bytes = [0] * self.shape[1]  # each head's pickled new subtrees, as its last report said
        self.infos: list[dict] = [{} for _ in self.cells]  # each cell's Cell.info, once it started

    # ------------------------------------------------------------ what a transport supplies
    def who(self, i: int) -> str:
        """Cell ``i`` as a message names it."""
        s = self.cells[i]
        return f"worker {s.name!r} (replica {s.replica}, shard {s.shard}{self.where(i)})"

    def where(self, i: int) -> str:
        """Where cell ``i`` runs, as :meth:`who` says it: its pid and host once it started."""
        info = self.infos[i]
        return f", pid {info['pid']} on {info['host']}" if info else ""

    @property
    def pids(self) -> list[int]:
        """The cells' pids (grid order), once they started."""
        return [info.get("pid") for info in self.infos]

    def call(self, i: int, method: str, *args):
        """Starts ``Cell.<method>(*args)`` on cell ``i``; returns what :meth:`poll` waits on
        (raises FitError when the cell cannot be reached)."""
        raise NotImplementedError

    def poll(self, calls: dict[int, object], wait_s: float, when: str) -> list[tuple[int, object]]:
        """The calls of ``calls`` (cell -> its call) that ended, waiting up to ``wait_s`` for
        one: ``(cell, answer)``, the answer a :class:`Failed`, :class:`Died` or
        :class:`Lost`, or what the cell's method returned."""
        raise NotImplementedError

    def ended(self, i: int) -> str:
        """How cell ``i`` ended, in words, when a peer lost its link to it."""
        return "died"

    def waits(self, cells: list[int]) -> dict[int, str]:
        """What each of ``cells`` waits for ('' or absent: nobody), for a timeout's message."""
        return {}

    def resources_now(self):
        """The workers the engine has now (:class:`planner.Resources`), for an elastic fit's
        growth (:meth:`executors.elastic.Elastic.grow`); None: the engine cannot gain any."""
        return None

    def start(self) -> None:
        """Starts every cell (they open their rows) and links them."""
        raise NotImplementedError

    def close(self, failed: bool = False) -> None:
        """Stops every cell; ``failed``: the fit failed (the cells may be stuck: stop them now)."""

    # ------------------------------------------------------------ the fault rule
    def call_all(self, method: str, args: tuple, when: str, timeout_s: float | None,
                 cells: list[int] | None = None) -> list:
        """Every cell's (or each of ``cells``') answer to ``Cell.<method>(*args)``, in order."""
        cells = list(range(len(self.cells))) if cells is None else cells
        return self.collect({i: self.call(i, method, *args) for i in cells}, when, timeout_s)

    def collect(self, calls: dict[int, object], when: str, timeout_s: float | None) -> list:
        """The answers of ``calls`` (in their order); FitError on an error, a death or a
        timeout, by the rule of the module's docstring."""
        out: dict[int, object] = {}
        pending = dict(calls)
        deadline = None if timeout_s is None else perf_counter() + timeout_s
        lost: tuple[int, int, float] | None = None  # (cell that reported, the peer it lost, when)
        while pending:
            now = perf_counter()
            waits = [POLL_S]
            if lost is not None:
                waits.append(lost[2] + CAUSE_GRACE_S - now)
            if deadline is not None:
                waits.append(deadline - now)
            if min(waits) <= 0:
                if lost is not None and now >= lost[2] + CAUSE_GRACE_S:
                    raise self._cause(lost, when)
                raise self._late(sorted(pending), when, timeout_s)
            for i, answer in self.poll(pending, min(waits), when):
                del pending[i]
                if isinstance(answer, Failed):
                    raise self.failed(i, when, answer.summary, answer.trace)
                if isinstance(answer, Died):
                    raise WorkerLost(f"{self.who(i)} {answer.how} {when}", i, self.cells[i].name)
                if isinstance(answer, Lost):
                    lost = lost or (i, answer.peer, perf_counter())
                else:
                    out[i] = answer
        if lost is not None:  # every cell answered, some only that a peer was gone: the peer's end
            raise self._cause(lost, when)
        return [out[i] for i in calls]

    def failed(self, i: int, when: str, summary: str, trace: str) -> FitError:
        """Cell ``i``'s own error ``when``: its one-line ``summary``, its ``trace`` a note."""
        err = FitError(f"{self.who(i)} failed {when}: {summary}")
        err.add_note(f"the worker's traceback:\n{trace.rstrip()}")
        return err

    def _cause(self, lost: tuple[int, int, float], when: str) -> FitError:
        reporter, peer, _ = lost
        err = WorkerLost(f"{self.who(peer)} {self.ended(peer)} {when}", peer, self.cells[peer].name)
        err.add_note(f"{self.who(reporter)} lost its link to it")
        return err

    def _late(self, pending: list[int], when: str, timeout_s: float) -> FitError:
        """The cells that did not answer in time: those not waiting for a peer are named (the
        ones that hang); the others are said to wait for them."""
        waits = self.waits(pending)
        stuck = [i for i in pending if not waits.get(i)] or pending
        err = FitError(f"no answer within {timeout_s:g} s {when} from {', '.join(self.who(i) for i in stuck)}")
        for i in pending:
            if i not in stuck:
                err.add_note(f"{self.who(i)} {waits[i]}")
        return err

    # ------------------------------------------------------------ the EM loop's grid
    def _each(self, method: str, args: tuple, when: str, cells: list[int] | None = None) -> None:
        """``Cell.<method>(*args)`` on every cell (or each of ``cells``), not awaited: every
        transport takes a cell's calls in the order they were made, so an error in one is
        named by the next step's answers."""
        for i in range(len(self.cells)) if cells is None else cells:
            self.call(i, method, *args)

    def broadcast(self, model, payloads) -> None:
        """Shard by shard, so that this process holds one shard's pickle at a time."""
        reg, m = self.job.regularization, self.shape[1]
        for shard in range(m):
            self._each("load", (payloads[shard], reg), f"while receiving the model for iteration {self.iteration + 1}",
                       list(range(shard, len(self.cells), m)))

    def e_step(self, iteration: int) -> GridOutcome:
        self.iteration = iteration
        t0 = perf_counter()
        got = self.call_all("run", (iteration,), f"in iteration {iteration}", self.timeout_s)
        self.pending_bytes = [pending for _, _, pending in got[:self.shape[1]]]
        return outcome(got, self.shape, perf_counter() - t0)

    def update(self, skeleton, payload: bytes) -> int:
        it = self.iteration
        self._each("update", (it, payload), f"in the update after iteration {it}")
        return update_bytes(self.view, self.shape[0], len(payload), self.pending_bytes)

    def fetch(self, shard: int) -> dict:
        (owned,) = self.call_all("owned", (), f"while sending shard {shard}'s subtrees after iteration "
                                 f"{self.iteration}", self.timeout_s, cells=[shard])
        return owned


class GridExecutor(BaseExecutor):
    """An executor whose workers are the grid's cells (multiprocessing, MPI, Dask, Ray).

    ``timeout_s``: the longest one iteration may take before the fit stops with a FitError
    naming the cells that did not answer (``None``: no limit; deaths are noticed regardless,
    as each engine can). ``startup_timeout_s``: the longest the cells may take to start and
    open their rows. ``blas_threads``: BLAS and OpenMP threads in each cell's process, and in
    the coordinator's, while the fit runs (default 1; ``None`` leaves them as they are;
    :mod:`executors.threads` says why).
    """

    #: The option its repr shows before the timeout and the threads (None: none).
    shown_option: ClassVar[str | None] = None

    def __init__(self, timeout_s: float | None = None, startup_timeout_s: float = 120.0,
                 blas_threads: int | None = DEFAULT_BLAS_THREADS):
        check_timeouts(timeout_s, startup_timeout_s)
        self.timeout_s = timeout_s
        self.startup_timeout_s = startup_timeout_s
        super().__init__(blas_threads)
        #: pids of the cells (grid order), while a fit runs.
        self.worker_pids: list[int] = []

    def fit_on(self, job: FitJob, grid: type[CellGrid], *args) -> FitResult:
        """Runs the EM loop on the grid ``grid(job, self, *args)`` (its cells started here),
        and, for ``job.on_worker_loss == "replan"``, on the grids made alike for the
        re-planned jobs after a cell is lost (:class:`executors.elastic.Elastic`); the last
        grid is closed however the fit ends."""
        from .elastic import Elastic

        elastic = Elastic(self, lambda j: grid(j, self, *args), job)
        failed = True
        try:
            elastic.start()
            result = run_em(elastic.grid, job, self.name, elastic)
            failed = False
            return result
        finally:
            self.worker_pids = []
            elastic.close(failed)

    def __repr__(self) -> str:
        shown = f"{self.shown_option}={getattr(self, self.shown_option)!r}, " if self.shown_option else ""
        return f"{type(self).__name__}({shown}timeout_s={self.timeout_s!r}, blas_threads={self.blas_threads!r})"
