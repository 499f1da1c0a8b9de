"""The MPI executor: one rank per grid cell, every rank calling ``optimize`` under ``mpiexec``.

Each rank of the plan's ``D x M`` grid runs one :class:`executors.cell.Cell` (the protocol
every transport shares), the rank of cell ``(0, 0)`` also the coordinator's
:class:`executors.cellgrid.CellGrid` (the EM loop's side and the fault rule); only how bytes
move is MPI's (:mod:`executors.mpi_link`: point to point, a rank receiving only while it
waits, on its own thread). The coordinator's calls go to the ranks in order, so the model
and the updates go without waiting; its own cell's calls run in its own process, and while
its own cell waits for a peer it files the other ranks' answers as they come.

No rank holds the whole model (:mod:`executors.mstep`). Ranks beyond the plan's workers stay
idle until the result, which every rank returns (the same FitResult; its ``shards`` a view of
the gathered model, or, without one, refusing: the ranks have left the fit). A plan with
more workers than ranks is refused before any work, on every rank, with the same PlanError.

Failures. A rank whose call raises answers the coordinator with its error and waits; the
coordinator (whose own cell stops waiting when a failure arrives) raises the FitError naming
the rank, its worker and the iteration, and sends it to every rank, which raise it too
(ranks waiting for the failed one's messages among them). A rank that dies outright (killed,
``os._exit``) is torn down with the whole job by the process manager (``mpiexec``/hydra
reports the dead process and exits non-zero): an MPI job cannot outlive a member. Where the
process manager does not notice, a waiting rank on the same host does
(:mod:`executors.mpi_link`, "Dead peers"); a rank on another host, the process manager or
``timeout_s``.

Stopping. A callback that raises KeyboardInterrupt on the coordinator (``emgrid fit`` does
when its launcher was interrupted) stops the fit between iterations: the coordinator tells
every rank to stop, and every rank raises KeyboardInterrupt, with nothing aborted. A
KeyboardInterrupt in the middle of an iteration aborts the job (the others would wait).

Timeouts. With ``timeout_s`` (as the multiprocessing executor's: the longest one iteration may
take; ``None``, the default, waits forever) the coordinator names the ranks that neither
answered within ``timeout_s`` of its call nor wait for another, and the other ranks wait
longer, so that they name the coordinator only when it hangs (:mod:`executors.mpi_link`,
"Deadlines"). The rank that names a hung rank tells every rank that answered, which raise the
same error, and aborts the job (``MPI_Abort`` with :data:`ABORT_STATUS`) when its process
exits, after the caller has handled the error (written a checkpoint, say): the hung rank could
not be stopped otherwise.

Once every rank has started, each unlinks the ``/dev/shm/mpich_shm_*`` files it maps
(:func:`release_shared_memory_files`), and every rank runs the fit with ``blas_threads``
BLAS and OpenMP threads (:mod:`executors.threads`).
"""

from __future__ import annotations

import os
import pickle
import re
from dataclasses import replace
from time import perf_counter
from typing import ClassVar

from emgrid.models import Node
from emgrid.models.errors import ConfigError, FitError, PlanError
from emgrid.planner.plan import BalancePlan
from emgrid.planner.resources import Resources

from .cell import Cell
from .cellgrid import RAW, CellGrid, Failed, GridExecutor, describe_error, join_raw, split_raw
from .loop import fits_here, param_bytes, run_em
from .mpi_link import (ABORT_STATUS, Deadline, Interrupted, MpiLink, NoAnswer, PeerDied, abort_job, no_answer,
                       release_shared_memory_files, this_host)
from .mstep import Shards
from .protocol import FitJob
from .result import FitResult
from .step import PROTOCOL, WorkerSpec, grid_layout
from .threads import DEFAULT_BLAS_THREADS

__all__ = ["ABORT_STATUS", "MpiExecutor", "rank_map"]

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


class MpiGrid(CellGrid):
    """The coordinator's side: its own cell in this process, every other cell a rank."""

    def __init__(self, job: FitJob, ex: GridExecutor, link: MpiLink, ranks: dict[tuple[int, int], int],
                 cell: Cell | None):
        super().__init__(job, ex)
        self.link, self.cell = link, cell
        self.rank_of = [ranks[(s.replica, s.shard)] for s in self.cells]
        self.own: dict[int, tuple] = {}  # this process's cell: its call, run when answers are awaited
        self.own_waits: dict[int, str] = {}  # what it waited for when the deadline passed
        self.deadline: float | None = None
        self.late_waits: dict[int, str] = {}

    def who(self, i: int) -> str:
        return self.link.who[self.rank_of[i]]

    def start(self) -> None:
        """Every other rank has opened its rows (it answers once it has)."""
        self.collect({i: r for i, r in enumerate(self.rank_of) if r != self.link.me}, "while starting",
                     self.startup_timeout_s)

    def call(self, i: int, method: str, *args):
        rank = self.rank_of[i]
        if rank == self.link.me:
            if method in ("load", "update"):  # not awaited (CellGrid._each): run now, in order
                getattr(self.cell, method)(*args)
            else:
                self.own[i] = (method, args)
            return rank
        marked, bodies = split_raw(args)
        self.link.post(rank, ("call", method, marked), bodies, wait=method == "load")  # one shard's part at a time
        return rank

    def _each(self, method: str, args: tuple, when: str, cells: list[int] | None = None) -> None:
        self.link.when = when  # what a death found in these calls' waits is said to be in
        super()._each(method, args, when, cells)

    def collect(self, calls: dict, when: str, timeout_s: float | None) -> list:
        self.link.when = when
        self.deadline = None if timeout_s is None else perf_counter() + timeout_s
        self.own_waits = {}
        try:
            return super().collect(calls, when, timeout_s)
        finally:
            self.own.clear()

    def poll(self, calls: dict, wait_s: float, when: str) -> list:
        link, out = self.link, []
        for i in [i for i in calls if i in self.own]:
            method, args = self.own.pop(i)
            link.interrupt, link.deadline = True, self.deadline
            try:
                out.append((i, getattr(self.cell, method)(*args)))
            except Interrupted:
                pass  # another cell's failure came in: it is among the answers below
            except Deadline as e:
                self.own_waits[i] = e.args[0] if e.args else ""
            except (FitError, KeyboardInterrupt):
                raise
            except Exception as e:  # noqa: BLE001 - named by the fault rule like any cell's
                out.append((i, Failed(*describe_error(e))))
            finally:
                link.interrupt, link.deadline = False, None
        out += [(i, link.answers.pop(i)) for i in calls if i in link.answers]
        if not out:
            link.pump(until=perf_counter() + wait_s)
        return out

    def waits(self, cells: list[int]) -> dict[int, str]:
        out = {i: self.own_waits.get(i, "") for i in cells if self.rank_of[i] == self.link.me}
        replies = self.link.ask([self.rank_of[i] for i in cells if self.rank_of[i] != self.link.me])
        out.update({i: replies[self.rank_of[i]] for i in cells if self.rank_of[i] in replies})
        self.late_waits = out
        return out

    def _late(self, pending: list[int], when: str, timeout_s: float) -> FitError:
        """Named here, the hung ranks cannot be stopped: every other rank is told (and raises
        the same error) and the job is aborted when this process exits."""
        err = super()._late(pending, when, timeout_s)
        notes = list(getattr(err, "__notes__", ()))
        hung = {self.rank_of[i] for i in pending if not self.late_waits.get(i)}
        self.link.tell([r for r in range(self.link.size) if r != self.link.me and r not in hung], str(err), notes)
        return no_answer(str(err), notes)

    def tell(self, header: tuple, bodies=()) -> None:
        """The same message to every other rank (the end of the fit, a stop, an error)."""
        for r in range(self.link.size):
            if r != self.link.me:
                self.link.post(r, header, bodies)


def _when(method: str, args: list, iteration: int) -> str:
    if method == "run":
        return f"in iteration {args[0]}"
    if method == "update":
        return f"in the update after iteration {args[0]}"
    if method == "load":
        return f"while receiving the model for iteration {iteration + 1}"
    return f"after iteration {iteration}"


def serve(link: MpiLink, cell: Cell | None, index: int | None) -> FitResult:
    """A rank other than the coordinator: do what the coordinator calls until the result
    arrives; a call that raises is answered with its error (the coordinator then sends
    every rank the fit's error, which :meth:`MpiLink.pump` raises)."""
    iteration = 0
    while True:
        method, args, bodies = link.next_call()
        args = join_raw(args, iter(bodies))
        if method == "done":
            link.flush()
            return pickle.loads(args[0])
        link.arm(_when(method, args, iteration))
        try:
            if method in ("load", "update"):  # the calls sent without waiting
                getattr(cell, method)(*args)
            else:
                answer = getattr(cell, method)(*args)
                link.post(link.coordinator, ("answer", index, answer))
                if method == "run":
                    iteration = args[0]
                    continue  # the coordinator's update comes next: the deadline stays
        except (FitError, KeyboardInterrupt):
            raise  # the coordinator's word (or a hung rank named here): as every rank raises it
        except Exception as e:  # noqa: BLE001 - the coordinator names it, as any cell's
            link.post(link.coordinator, ("answer", index, Failed(*describe_error(e))))
        link.disarm()


def room_for_the_result(job: FitJob) -> bool:
    """Whether the fitted model is gathered (``FitJob.gather`` None): the result goes to every
    rank, so it must fit where the coordinator runs (:func:`executors.loop.fits_here`) and, on
    every worker whose memory the plan knows, in what the plan leaves free there (twice: the
    pickle and the model)."""
    need = 2 * param_bytes(job.model)
    room = all(w.memory_limit is None or w.memory_limit - w.memory_bytes >= need for w in job.plan.per_worker)
    return room and fits_here(job.model)


class MpiExecutor(GridExecutor):
    """One rank per worker under ``mpiexec``; ``comm`` defaults to ``MPI.COMM_WORLD``.

    ``timeout_s``, ``startup_timeout_s``, ``blas_threads``: as every grid executor's
    (:class:`executors.cellgrid.GridExecutor`); without ``timeout_s`` the waits have no
    deadline, and a rank that dies ends the job regardless (see the module). Every rank must
    pass the same timeouts (checked, before any work).
    """

    name: ClassVar[str] = "mpi"

    def __init__(self, comm=None, timeout_s: float | None = None, startup_timeout_s: float = 120.0,
                 blas_threads: int | None = DEFAULT_BLAS_THREADS):
        from mpi4py import MPI

        super().__init__(timeout_s, startup_timeout_s, blas_threads)
        self.comm = comm if comm is not None else MPI.COMM_WORLD

    def default_resources(self) -> Resources:
        return Resources.from_mpi(self.comm)

    def make_plan(self, model: Node, resources: Resources, n_data: int, dtype: str = "float64") -> BalancePlan:
        """Rank 0 plans; every rank receives the same plan (or the same error)."""
        plan, error = None, None
        if self.comm.Get_rank() == 0:
            try:
                plan = super().make_plan(model, resources, n_data, dtype)
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

    def _run(self, job: FitJob) -> FitResult:
        world = self.comm
        # one transport on every rank (blocking and polled waits never match), the pids that
        # a message names, and the hosts: a wait looks at the processes of its host's ranks
        facts = world.allgather((self.timeout_s, self.startup_timeout_s, os.getpid(), this_host()))
        if any(f[:2] != facts[0][:2] for f in facts):
            raise ConfigError("every MPI rank must pass the same timeout_s and startup_timeout_s; got "
                              + ", ".join(f"rank {r}: {f[0]!r}, {f[1]!r}" for r, f in enumerate(facts)))
        release_shared_memory_files(world)
        if job.gather is None:
            job = replace(job, gather=room_for_the_result(job))
        layout = grid_layout(job.model, job.plan, job.dtype)
        ranks = rank_map(job.plan, world.Get_size())
        me = world.Get_rank()
        peers = {r: f[2] for r, f in enumerate(facts) if r != me and f[3] == facts[me][3]}
        index = {rank: i for i, rank in enumerate(ranks[(s.replica, s.shard)] for row in layout for s in row)}
        specs = {rank: layout[r][s] for (r, s), rank in ranks.items()}
        pids = [f[2] for f in facts]
        who = [_describe(r, specs.get(r), pids[r]) for r in range(world.Get_size())]
        link = MpiLink(world, ranks[(0, 0)], who, self.timeout_s, peers)
        try:
            link.arm("while starting", self.startup_timeout_s)
            cell = None
            if me in specs:
                spec = specs[me]
                cell = Cell(spec, spec.view.model_for(spec.shard, job.model), None,
                            job.open_rows(spec.start, spec.stop), own_rows=job.directory is not None)
                link.cell = cell
                cell.mailbox.pump = link.pump
                cell.connect(lambda target, key, payload, extra: link.post(ranks[target], ("cell", key, extra),
                                                                            [payload]), job.plan.data_parallel)
            if me != link.coordinator:
                if cell is not None:
                    link.post(link.coordinator, ("answer", index[me], None))  # its rows are open
                return serve(link, cell, index.get(me))
            link.disarm()
            grid = MpiGrid(job, self, link, ranks, cell)
            grid.start()
            return self._coordinate(grid, job)
        finally:
            link.free()

    def _coordinate(self, grid: MpiGrid, job: FitJob) -> FitResult:
        world, link = self.comm, grid.link
        stopped = []
        if job.callback is not None:
            callback = job.callback

            def guarded(*args):
                try:
                    return callback(*args)
                except KeyboardInterrupt:
                    stopped.append(True)  # between iterations: every other rank waits for the next call
                    raise

            job = replace(job, callback=guarded)
        try:
            result = run_em(grid, job, self.name)
        except (NoAnswer, PeerDied):
            raise  # every rank that answers was told, or the job ends: a hung or dead rank cannot hear
        except KeyboardInterrupt:
            if not stopped:  # mid-iteration: the other ranks wait for each other
                abort_job(world)
                raise
            grid.tell(("stop",))  # the caller's callback stopped the fit: every rank stops alike
            link.flush()
            raise
        except FitError as e:
            trace = "\n".join(getattr(e, "__notes__", ())) or None
            grid.tell(("error", str(e), trace))
            link.flush()
            raise
        except BaseException:  # the other ranks wait for each other: end the job
            abort_job(world)
            raise
        grid.tell(("call", "done", [RAW]), [pickle.dumps(result, protocol=PROTOCOL)])  # pickled once
        link.flush()
        if result.model is None:  # left on the grid: the shards left with the ranks (as on the others)
            result.shards = Shards(grid.view, result.shards.skeleton)
        return result

def _describe(rank: int, spec: WorkerSpec | None, pid: int) -> str:
    if spec is None:
        return f"rank {rank} (idle, pid {pid})"
    return f"worker {spec.name!r} (replica {spec.replica}, shard {spec.shard}, rank {rank}, pid {pid})"
