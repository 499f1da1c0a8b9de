"""The in-process executor: every worker of the grid in this process, one after another.

The shards of a replica run in lockstep (each block's exchange is a dict merge), so the
whole ``D x M`` grid, model-parallel shards included, runs here exactly as it does across
processes: the same worker step, the same reduce order, the same payloads. BLAS and OpenMP run
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
from .step import WorkerStep, grid_layout, reduce_shares, run_replica_lockstep
from .threads import DEFAULT_BLAS_THREADS, check_blas_threads, limited, probe


class LocalGrid:
    """Every worker's rows held in this process (views of the caller's arrays)."""

    def __init__(self, job: FitJob):
        self.meter = PeakMeter()  # one process: one meter for every cell of the grid
        data = job.open_data()
        self.layout = grid_layout(job.model, job.plan)
        self.steps = [[WorkerStep.from_full(job.model, spec, data, self.meter) for spec in row] for row in self.layout]
        self.model: Node = job.model
        probe("local")

    def broadcast(self, model: Node, payloads: list[bytes]) -> None:
        self.model = model  # one process: every cell evaluates the whole model

    def e_step(self, iteration: int) -> GridOutcome:
        shares = [run_replica_lockstep(row, self.model, iteration) for row in self.steps]
        flat = [s for row in shares for s in row]
        t0 = perf_counter()
        reduce_bytes = sum(len(s.payload()) for s in flat)
        stats, ll = reduce_shares(shares)
        return GridOutcome(stats=stats, loglik=ll, compute_s=sum(s.compute_s for s in flat),
                           coupling_s=sum(s.coupling_s for s in flat), reduce_s=perf_counter() - t0,
                           coupling_bytes=sum(s.coupling_bytes for s in flat), reduce_bytes=reduce_bytes,
                           peak_bytes={"local": self.meter.peak_bytes()},
                           baseline_bytes={"local": self.meter.baseline_bytes})


class LocalExecutor(BaseExecutor):
    """Runs the whole grid in the calling process (no parallelism; the reference for the others).

    ``blas_threads``: BLAS and OpenMP threads while the fit runs (default 1; ``None`` leaves
    the caller's setting); the caller's setting is restored after.
    """

    name: ClassVar[str] = "local"

    def __init__(self, blas_threads: int | None = DEFAULT_BLAS_THREADS):
        self.blas_threads = check_blas_threads(blas_threads)

    def run(self, job: FitJob) -> FitResult:
        with limited(self.blas_threads):
            return run_em(LocalGrid(job), job, self.name)

    def __repr__(self) -> str:
        return f"LocalExecutor(blas_threads={self.blas_threads!r})"
