"""The in-process executor: every worker of the grid in this process, one after another.

The shards of a replica run in lockstep (each block's exchange is a dict merge), so the
whole ``D x M`` grid, model-parallel shards included, runs here exactly as it does across
processes: the same worker step, the same column reduces and shard M-steps
(:mod:`executors.mstep`), the same payloads (counted, not sent). BLAS and OpenMP run
``blas_threads`` threads (one by default) while the fit runs, and the caller's setting
comes back after (:mod:`executors.threads`).
"""

from __future__ import annotations

from time import perf_counter
from typing import ClassVar

from emgrid.models import Node

from .loop import GridOutcome, run_em
from .memory import PeakMeter
from .protocol import BaseExecutor, FitJob
from .result import FitResult
from .mstep import ShardPart, report_payload, tree_sum, update_bytes
from .step import WorkerStep, grid_layout, run_replica_lockstep
from .threads import DEFAULT_BLAS_THREADS, probe


class _LastReading:
    """The grid's meter as its cells see it. One process has one peak, which the grid reads
    once per E-step, after its columns' M-steps (so the reading covers the cells' passes
    too); a cell's share carries the grid's last reading instead of reading ``/proc`` again
    (the grid reports its own reading, not the cells')."""

    __slots__ = ("baseline_bytes", "last")

    def __init__(self, meter: PeakMeter):
        self.baseline_bytes = meter.baseline_bytes
        self.last = 0

    def peak_bytes(self) -> int:
        return self.last


class LocalGrid:
    """Every worker's rows held in this process (views of the caller's arrays); the cells of
    one shard's column share its :class:`ShardPart` (one process: nothing to copy)."""

    def __init__(self, job: FitJob):
        self.meter = PeakMeter()  # one process: one meter for every cell of the grid
        self.cells_meter = _LastReading(self.meter)
        data = job.open_data()
        self.layout = grid_layout(job.model, job.plan, job.dtype)
        self.steps = [[WorkerStep.from_full(job.model, spec, data, self.cells_meter) for spec in row]
                      for row in self.layout]
        self.view = self.layout[0][0].view
        self.regularization = job.regularization
        self.parts: list[ShardPart] = []
        probe("local")

    def broadcast(self, model: Node, payloads: list[bytes]) -> None:
        self.parts = [ShardPart(self.view, s, self.view.model_for(s, model), self.regularization)
                      for s in range(self.view.n_shards)]

    def e_step(self, iteration: int) -> GridOutcome:
        models = [p.part for p in self.parts]
        shares = [run_replica_lockstep(row, models, iteration) for row in self.steps]
        flat = [s for row in shares for s in row]
        t0 = perf_counter()
        columns, reduce_bytes = [], 0
        for s, part in enumerate(self.parts):
            column = [row[s] for row in shares]
            reduce_bytes += sum(len(w.payload()) for w in column[1:])
            report = part.estimate(*tree_sum([(w.stats, w.loglik) for w in column]))
            reduce_bytes += len(report_payload(report))
            columns.append(report)
        reduce_s = perf_counter() - t0 - sum(c.mstep_s for c in columns)
        self.cells_meter.last = peak = self.meter.peak_bytes()
        return GridOutcome(columns=columns, compute_s=sum(s.compute_s for s in flat),
                           coupling_s=sum(s.coupling_s for s in flat), reduce_s=reduce_s,
                           coupling_bytes=sum(s.coupling_bytes for s in flat), reduce_bytes=reduce_bytes,
                           peak_bytes={"local": peak}, baseline_bytes={"local": self.meter.baseline_bytes})

    def update(self, skeleton: Node, payload: bytes) -> int:
        d = len(self.layout)
        # one replica: the head's new subtrees go to no other worker (not pickled to be counted)
        pending = [len(p.pending_payload()) if d > 1 and p.view.evaluates(p.shard) else 0 for p in self.parts]
        for part in self.parts:
            part.apply(skeleton)
        return update_bytes(self.view, d, len(payload), pending)

    def fetch(self, shard: int) -> dict[str, Node]:
        return self.parts[shard].owned()


class LocalExecutor(BaseExecutor):
    """Runs the whole grid in the calling process (no parallelism; the reference for the others).

    ``blas_threads``: BLAS and OpenMP threads while the fit runs (default 1; ``None`` leaves
    the caller's setting); the caller's setting is restored after.
    """

    name: ClassVar[str] = "local"

    def __init__(self, blas_threads: int | None = DEFAULT_BLAS_THREADS):
        super().__init__(blas_threads)  # its own, so that an unknown option names LocalExecutor

    def _run(self, job: FitJob) -> FitResult:
        return run_em(LocalGrid(job), job, self.name)
