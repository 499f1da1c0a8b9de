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

Failures. A rank whose step raises does not leave the others waiting in a collective:
every message of the E-step carries a failure slot. The failing rank still takes part in
the one coupling allgather its replica's other shards are waiting in (with its failure
instead of log densities), after which all of them stop the pass; then every rank joins
the reduce as usual, carrying its failure or nothing, so the failure reaches the
coordinator, which raises a FitError naming the rank, its worker and the iteration and
broadcasts it: every rank raises the same FitError. Anything that breaks outside these
collectives (an error in the reduce or M-step machinery itself) still aborts the job
(``MPI_Abort``), and a rank that dies outright (killed, ``os._exit``) is torn down with
the whole job by the process manager (``mpiexec``/hydra reports the dead process and
exits non-zero): MPI collectives cannot outlive a member.
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
from .memory import PeakMeter, warm_up
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


class _PeerFailed(Exception):
    """Another shard of this rank's replica reported a failure in the coupling allgather."""


class _Failure:
    """What a failed rank sends up the reduce: who it is, and what went wrong (as text)."""

    __slots__ = ("rank", "message", "trace")

    def __init__(self, rank: int, message: str, trace: str):
        self.rank, self.message, self.trace = rank, message, trace

    def __getstate__(self):
        return (self.rank, self.message, self.trace)

    def __setstate__(self, state):
        self.rank, self.message, self.trace = state


def _fit_error(message: str, trace: str | None) -> FitError:
    err = FitError(message)
    if trace:
        err.add_note(f"the failing rank's traceback:\n{trace.rstrip()}")
    return err


class MpiGrid:
    """One rank's side of the grid; the coordinator drives it through :func:`run_em`."""

    def __init__(self, job: FitJob, comms: _Comms):
        self.comms = comms
        warm_up(job.model)
        self.meter = PeakMeter()  # before this rank takes its rows: see executors.memory
        spec = comms.spec
        self.step = None
        if spec is not None:
            self.step = WorkerStep(job.model, spec, take_rows(job.open_data(), spec.start, spec.stop), self.meter)
        self.model: Node = job.model
        self.received_s = 0.0  # unpickling the last broadcast model

    # ---------------------------------------------------------------- coordinator
    def broadcast(self, model: Node, payload: bytes) -> None:
        self.comms.world.bcast(("model", payload), root=self.comms.coordinator)
        self.model = model

    def e_step(self, iteration: int) -> GridOutcome:
        t0 = perf_counter()
        columns, workers, failures = self.worker_share(iteration)
        if failures:
            first = min(failures, key=lambda f: f.rank)
            raise _fit_error(first.message, first.trace)
        stats, ll = join_shards([(pickle.loads(blob), part) for blob, part in columns])
        return GridOutcome(stats=stats, loglik=ll, **critical_path(workers, perf_counter() - t0),
                           coupling_bytes=sum(w.coupling_bytes for w in workers),
                           reduce_bytes=sum(w.payload_bytes for w in workers),
                           peak_bytes={w.name: w.peak_bytes for w in workers},
                           baseline_bytes={w.name: w.baseline_bytes for w in workers})

    # ---------------------------------------------------------------- every active rank
    def worker_share(self, iteration: int):
        """This rank's step and its part in the reduce.

        The coordinator gets ``(columns, briefs, failures)``: every shard's total and every
        worker's brief, or (``None``, ``None``, failures) when some rank failed; the other
        ranks get None.
        """
        c, spec = self.comms, self.comms.spec
        share, failure, exchanged = None, None, 0

        def exchange(mine):
            nonlocal exchanged
            got = c.replica.allgather((None, mine))
            exchanged += 1
            if any(f is not None for f, _ in got):
                raise _PeerFailed()
            return merge_exchange(part for _, part in got)

        try:
            share = self.step.run(self.model, exchange, iteration)
        except _PeerFailed:
            pass  # the shard that failed reports it
        except Exception as e:  # noqa: BLE001 - carried to the coordinator, raised there on every rank
            rank = c.world.Get_rank()
            summary = traceback.format_exception_only(type(e), e)[-1].strip()
            failure = _Failure(rank, f"rank {rank} (worker {spec.name!r}, replica {spec.replica}, shard {spec.shard}) "
                               f"failed in iteration {iteration}: {summary}",
                               traceback.format_exc())
            if exchanged < self.step.exchanges_per_pass(self.model):
                c.replica.allgather((failure, None))  # the other shards wait in this block's exchange
        if share is not None:
            payload = share.payload()
            brief = _Brief(spec.name, self.received_s, share.compute_s, share.coupling_s, share.coupling_bytes,
                           len(payload), share.peak_bytes, self.meter.baseline_bytes)
            mine = (payload, share.loglik, brief, None)
        else:
            mine = (None, 0.0, None, failure)
        column = c.shard.gather(mine, root=0)
        if spec.replica != 0:
            return None
        failures = [f for _, _, _, f in column if f is not None]
        if failures or any(p is None for p, _, _, _ in column):
            totals = c.replica.gather((None, 0.0, [], failures), root=0)
        else:
            stats, ll = reduce_shard([WorkerShare(stats=pickle.loads(p), loglik=part) for p, part, _, _ in column])
            totals = c.replica.gather((pickle.dumps(stats, protocol=PROTOCOL), ll, [b for _, _, b, _ in column], []),
                                      root=0)
        if spec.shard != 0:
            return None
        failures = [f for _, _, _, fs in totals for f in fs]
        if failures or any(blob is None for blob, _, _, _ in totals):
            return None, None, failures or [_Failure(c.world.Get_rank(), f"a rank stopped in iteration {iteration} "
                                                     "without saying why", "")]
        return ([(blob, part) for blob, part, _, _ in totals], [b for _, _, briefs, _ in totals for b in briefs], [])

    def serve(self) -> FitResult:
        """A non-coordinator rank: run a step per model broadcast until the result arrives."""
        c = self.comms
        iteration = 0
        while True:
            kind, body = c.world.bcast(None, root=c.coordinator)
            if kind == "model":
                iteration += 1
                t0 = perf_counter()
                self.model = None  # not kept while the new one is unpickled
                self.model = pickle.loads(body)
                del body
                self.received_s = perf_counter() - t0
                if c.spec is not None:
                    try:
                        self.worker_share(iteration)
                    except BaseException:  # the other ranks wait in a collective: end the job
                        abort_job(c.world)
                        raise
            elif kind == "done":
                return pickle.loads(body)
            else:
                message, trace = body
                raise _fit_error(message, trace)


def abort_job(world) -> None:
    """After an unexpected error on one rank: print it and abort every rank (they would hang)."""
    if world.Get_size() > 1:
        sys.stderr.write(f"emgrid: rank {world.Get_rank()} failed; aborting the MPI job\n{traceback.format_exc()}")
        sys.stderr.flush()
        world.Abort(1)


class _Brief:
    """A worker's timings, byte counts and memory, as they travel with its statistics."""

    __slots__ = ("name", "receive_s", "compute_s", "coupling_s", "coupling_bytes", "payload_bytes", "peak_bytes",
                 "baseline_bytes")

    def __init__(self, name, receive_s, compute_s, coupling_s, coupling_bytes, payload_bytes, peak_bytes,
                 baseline_bytes):
        self.name, self.receive_s, self.compute_s, self.coupling_s = name, receive_s, compute_s, coupling_s
        self.coupling_bytes, self.payload_bytes = coupling_bytes, payload_bytes
        self.peak_bytes, self.baseline_bytes = peak_bytes, baseline_bytes

    def __getstate__(self):
        return tuple(getattr(self, k) for k in self.__slots__)

    def __setstate__(self, state):
        for k, v in zip(self.__slots__, state):
            setattr(self, k, v)


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
            trace = next((n.split("\n", 1)[1] for n in getattr(e, "__notes__", ()) if "\n" in n), None)
            world.bcast(("error", (str(e), trace)), root=root)
            raise
        except BaseException:  # the other ranks wait in a collective: end the job
            abort_job(world)
            raise
        world.bcast(("done", pickle.dumps(result, protocol=PROTOCOL)), root=root)
        return result
