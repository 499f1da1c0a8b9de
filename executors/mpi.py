"""The MPI executor: one rank per grid cell, every rank calling ``optimize`` under ``mpiexec``.

``COMM_WORLD`` is split twice: a *replica* communicator per data replica (its ``M`` shards,
ranked by shard) carries the coupling, an allgather of the owned roots' per-row log
densities per block; a *shard* communicator per model shard (its ``D`` replicas, ranked by
replica) carries the reduce, a gather of the statistics to the shard's replica 0, which
sums them in replica order. The shards' totals are gathered on the coordinator (the rank
of cell ``(0, 0)``), which runs the M-step and broadcasts the model to every rank.

Ranks beyond the plan's ``D x M`` workers stay idle but receive every broadcast, so every
rank returns the same FitResult. A plan with more workers than ranks is refused before
any work, on every rank, with the same PlanError.
"""

from __future__ import annotations

import pickle
import re
import sys
import traceback
from time import perf_counter
from typing import ClassVar

from models import Node, take_rows
from models.errors import FitError, PlanError
from planner.plan import BalancePlan
from planner.resources import Resources

from .loop import GridOutcome, critical_path, run_em
from .protocol import BaseExecutor, FitJob
from .result import FitResult
from .step import PROTOCOL, WorkerShare, WorkerSpec, WorkerStep, grid_layout, join_shards, merge_exchange, reduce_shard

_RANK_NAME = re.compile(r"rank(\d+)")


def rank_map(plan: BalancePlan, size: int) -> dict[tuple[int, int], int]:
    """The rank of every grid cell ``(r, s)``.

    Workers named ``rank<i>`` (as ``Resources.from_mpi`` names them) run on rank ``i``;
    otherwise cell ``(r, s)`` runs on rank ``r * M + s``.
    """
    grid = plan.worker_grid()
    cells = {(r, s): name for r, row in enumerate(grid) for s, name in enumerate(row)}
    named = {cell: _RANK_NAME.fullmatch(name) for cell, name in cells.items()}
    if all(named.values()):
        ranks = {cell: int(m.group(1)) for cell, m in named.items()}
        if max(ranks.values()) < size:
            return ranks
    m = plan.model_parallel
    return {(r, s): r * m + s for (r, s) in cells}


class _Comms:
    """This rank's place in the grid and its communicators."""

    def __init__(self, world, plan: BalancePlan, layout: list[list[WorkerSpec]]):
        from mpi4py import MPI

        self.world = world
        ranks = rank_map(plan, world.Get_size())
        me = world.Get_rank()
        cell = next((c for c, rank in ranks.items() if rank == me), None)
        self.spec: WorkerSpec | None = None if cell is None else layout[cell[0]][cell[1]]
        self.coordinator = ranks[(0, 0)]
        undefined = MPI.UNDEFINED
        self.replica = world.Split(undefined if cell is None else cell[0], 0 if cell is None else cell[1])
        self.shard = world.Split(undefined if cell is None else cell[1], 0 if cell is None else cell[0])

    @property
    def is_coordinator(self) -> bool:
        return self.world.Get_rank() == self.coordinator

    def free(self) -> None:
        from mpi4py import MPI

        for c in (self.replica, self.shard):
            if c != MPI.COMM_NULL:
                c.Free()


class MpiGrid:
    """One rank's side of the grid; the coordinator drives it through :func:`run_em`."""

    def __init__(self, job: FitJob, comms: _Comms):
        self.comms = comms
        spec = comms.spec
        self.step = None
        if spec is not None:
            self.step = WorkerStep(job.model, spec, take_rows(job.open_data(), spec.start, spec.stop))
        self.model: Node = job.model
        self.received_s = 0.0  # unpickling the last broadcast model

    # ---------------------------------------------------------------- coordinator
    def broadcast(self, model: Node, payload: bytes) -> None:
        self.comms.world.bcast(("model", payload), root=self.comms.coordinator)
        self.model = model

    def e_step(self, iteration: int) -> GridOutcome:
        t0 = perf_counter()
        reduced = self.worker_share()
        columns, workers = reduced
        stats, ll = join_shards([(pickle.loads(blob), part) for blob, part in columns])
        return GridOutcome(stats=stats, loglik=ll, **critical_path(workers, perf_counter() - t0),
                           coupling_bytes=sum(w.coupling_bytes for w in workers),
                           reduce_bytes=sum(w.payload_bytes for w in workers))

    # ---------------------------------------------------------------- every active rank
    def worker_share(self):
        """This rank's step and its part in the reduce; the coordinator gets every shard's total."""
        c, spec = self.comms, self.comms.spec
        share = self.step.run(self.model, lambda mine: merge_exchange(c.replica.allgather(mine)))
        payload = share.payload()
        brief = _Brief(self.received_s, share.compute_s, share.coupling_s, share.coupling_bytes, len(payload))
        column = c.shard.gather((payload, share.loglik, brief), root=0)
        if spec.replica != 0:
            return None
        stats, ll = reduce_shard([WorkerShare(stats=pickle.loads(p), loglik=part) for p, part, _ in column])
        totals = c.replica.gather((pickle.dumps(stats, protocol=PROTOCOL), ll, [b for _, _, b in column]), root=0)
        if spec.shard != 0:
            return None
        return [(blob, part) for blob, part, _ in totals], [b for _, _, briefs in totals for b in briefs]

    def serve(self) -> FitResult:
        """A non-coordinator rank: run a step per model broadcast until the result arrives."""
        c = self.comms
        while True:
            kind, body = c.world.bcast(None, root=c.coordinator)
            if kind == "model":
                t0 = perf_counter()
                self.model = pickle.loads(body)
                self.received_s = perf_counter() - t0
                if c.spec is not None:
                    try:
                        self.worker_share()
                    except BaseException:  # the other ranks wait in a collective: end the job
                        abort_job(c.world)
                        raise
            elif kind == "done":
                return pickle.loads(body)
            else:
                raise FitError(body)


def abort_job(world) -> None:
    """After an unexpected error on one rank: print it and abort every rank (they would hang)."""
    if world.Get_size() > 1:
        sys.stderr.write(f"emgrid: rank {world.Get_rank()} failed; aborting the MPI job\n{traceback.format_exc()}")
        sys.stderr.flush()
        world.Abort(1)


class _Brief:
    """A worker's timings and byte counts, as they travel with its statistics."""

    __slots__ = ("receive_s", "compute_s", "coupling_s", "coupling_bytes", "payload_bytes")

    def __init__(self, receive_s, compute_s, coupling_s, coupling_bytes, payload_bytes):
        self.receive_s, self.compute_s, self.coupling_s = receive_s, compute_s, coupling_s
        self.coupling_bytes, self.payload_bytes = coupling_bytes, payload_bytes

    def __getstate__(self):
        return (self.receive_s, self.compute_s, self.coupling_s, self.coupling_bytes, self.payload_bytes)

    def __setstate__(self, state):
        self.receive_s, self.compute_s, self.coupling_s, self.coupling_bytes, self.payload_bytes = state


class MpiExecutor(BaseExecutor):
    """One rank per worker under ``mpiexec``; ``comm`` defaults to ``MPI.COMM_WORLD``."""

    name: ClassVar[str] = "mpi"

    def __init__(self, comm=None):
        from mpi4py import MPI

        self.comm = comm if comm is not None else MPI.COMM_WORLD

    def default_resources(self) -> Resources:
        return Resources.from_mpi(self.comm)

    def make_plan(self, model: Node, resources: Resources, n_data: int) -> BalancePlan:
        """Rank 0 plans; every rank receives the same plan (or the same error)."""
        plan, error = None, None
        if self.comm.Get_rank() == 0:
            try:
                plan = super().make_plan(model, resources, n_data)
            except Exception as e:  # noqa: BLE001 - re-raised on every rank below
                error = e
        plan, error = self.comm.bcast((plan, error), root=0)
        if error is not None:
            raise error
        return plan

    def check_plan(self, plan: BalancePlan) -> None:
        size = self.comm.Get_size()
        if plan.workers_used > size:
            raise PlanError(
                f"the plan needs {plan.workers_used} workers ({plan.data_parallel}x{plan.model_parallel} grid) "
                f"but this MPI job has {size} rank(s); start mpiexec with -n {plan.workers_used} or more, "
                f"or plan for {size} worker(s)"
            )

    def run(self, job: FitJob) -> FitResult:
        comms = _Comms(self.comm, job.plan, grid_layout(job.model, job.plan))
        try:
            grid = MpiGrid(job, comms)
            if not comms.is_coordinator:
                return grid.serve()
            return self._coordinate(grid, job)
        finally:
            comms.free()

    def _coordinate(self, grid: MpiGrid, job: FitJob) -> FitResult:
        world, root = self.comm, grid.comms.coordinator
        try:
            result = run_em(grid, job, self.name)
        except FitError as e:
            world.bcast(("error", str(e)), root=root)
            raise
        except BaseException:  # the other ranks wait in a collective: end the job
            abort_job(world)
            raise
        world.bcast(("done", pickle.dumps(result, protocol=PROTOCOL)), root=root)
        return result
