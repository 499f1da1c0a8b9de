"""The MPI executor: one rank per grid cell, every rank calling ``optimize`` under ``mpiexec``.

No rank holds the whole model (:mod:`executors.mstep`): every rank keeps its own shard's
:class:`ShardPart`. ``COMM_WORLD`` is split twice: a *replica* communicator per data replica
(its ``M`` shards, ranked by shard) carries the coupling, an allgather of the shard roots'
per-row log densities per block; a *column* communicator per model shard (its ``D``
replicas, ranked by replica) joins each shard's workers to its *head*, the rank of cell
``(0, s)``. Per iteration the coordinator (the rank of cell ``(0, 0)``, a head itself) tells
every rank to step; each column reduces its statistics to its head by the tree of
:func:`executors.mstep.column_reduce` (point to point: each partial sum's pickle as raw bytes
beside a small header), the head estimates its subtrees and sends the coordinator only its
:class:`ColumnReport` (a gather over the heads); the coordinator estimates the spanning
nodes and sends every rank the new skeleton, and each head its pending subtrees to its
column (a broadcast over the column). ``fetch`` asks one head for its shard's subtrees.

Ranks beyond the plan's ``D x M`` workers stay idle but receive every message of the
coordinator, and the result, so every rank returns the same FitResult (its ``shards`` a view
of the gathered model; without one, they refuse: the ranks have left the fit). A plan with
more workers than ranks is refused before any work, on every rank, with the same PlanError.

Failures. A rank whose step raises does not leave the others waiting in a collective:
every message of the E-step carries a failure slot. The failing rank still takes part in
the one coupling allgather its replica's other shards are waiting in (its message's status
says it failed, :mod:`executors.coupling`), after which all of them stop the pass; then every rank joins
the reduce as usual, carrying its failure or nothing (and empty statistics), so the failure
reaches the coordinator through its column's head (as does an error in a head's M-step),
which raises a FitError naming the rank, its worker and the iteration and
broadcasts it: every rank raises the same FitError. Anything that breaks outside these
collectives (an error in the reduce or M-step machinery itself) still aborts the job
(``MPI_Abort``), and a rank that dies outright (killed, ``os._exit``) is torn down with
the whole job by the process manager (``mpiexec``/hydra reports the dead process and
exits non-zero): MPI collectives cannot outlive a member.

Stopping. A callback that raises KeyboardInterrupt on the coordinator (``emgrid fit`` does
when its launcher was interrupted) stops the fit between iterations: the coordinator tells
every rank to stop instead of starting the next step, and every rank raises
KeyboardInterrupt, with nothing aborted. A KeyboardInterrupt in the middle of an iteration
still aborts the job (the other ranks wait in a collective).

Shared memory. Once every rank has started, each unlinks the ``/dev/shm/mpich_shm_*`` files
it maps (:func:`release_shared_memory_files`): the mappings stay, and a job that ends
abnormally leaves nothing in ``/dev/shm``.

Timeouts. A rank that hangs (never reaches the next exchange) neither dies nor raises, so
nothing above notices it. With ``timeout_s`` (as the multiprocessing executor's: the longest
one iteration may take; ``None``, the default, waits forever), every rank moves its messages
by nonblocking point-to-point calls polled against a deadline, on a duplicate of the world
communicator (:class:`_Timed`), and ends each iteration in a polled barrier. A rank whose
deadline passes asks every other rank, on a second duplicate, what it is doing: a rank that
waits in a poll loop answers at once, and one that does not answer within a second is the
one that did not arrive. Each phase the coordinator starts (the E-step with its reduce, the
update) has its deadline: the coordinator's ``timeout_s`` from its message, the other ranks'
``2 * timeout_s + 2 s`` from their receipt of it, so a hung worker is named by the
coordinator, and the coordinator (itself a worker) by the others only when it hangs. The
rank that names it raises ``FitError("no answer within T s in iteration I from rank R
(worker ..., pid ...)")``, sends the same error to every rank that answered, which raise it
too, and aborts the job (``MPI_Abort`` with status :data:`ABORT_STATUS`) when its process
exits, after the caller has handled the error (written a checkpoint, say): the hung rank
could not be stopped otherwise. Without ``timeout_s`` the blocking collectives run exactly
as before, at no extra cost. With it, a wait polls without sleeping for its first 50 ms, as
MPI's blocking calls do, so that the fixed cost of an iteration stays that of the blocking
collectives.

Every active rank's :class:`executors.step.ShareReport` travels up its column's tree with
the partial sums, and on to the coordinator with its head's report.

Threads. Every rank runs the fit with its BLAS and OpenMP pools at ``blas_threads`` threads
(one by default; :mod:`executors.threads`) and restores its own setting after: ranks on one
machine each running a pool per core are many times slower than one thread each.
"""

from __future__ import annotations

import atexit
import os
import pickle
import re
import sys
import time
import traceback
from dataclasses import dataclass, replace
from time import perf_counter
from typing import ClassVar

import numpy as np

from emgrid.models import Node, Stats
from emgrid.models.errors import ConfigError, FitError, PlanError
from emgrid.planner.plan import BalancePlan
from emgrid.planner.resources import Resources

from . import coupling
from .loop import GridOutcome, critical_path, fits_here, run_em
from .memory import PeakMeter, map_large_blocks, warm_up
from .protocol import BaseExecutor, FitJob
from .result import FitResult
from .mstep import ShardPart, Shards, column_reduce, report_payload, update_bytes
from .step import PROTOCOL, WorkerSpec, WorkerStep, grid_layout
from .threads import DEFAULT_BLAS_THREADS, check_blas_threads, limited, probe

_RANK_NAME = re.compile(r"rank(\d+)")

#: The status ``mpiexec`` exits with when the rank that named a hung rank aborts the job
#: (``emgrid fit``'s exit code for a fit that failed while running).
ABORT_STATUS = 3
# Message tags of the timed transport: data on one duplicate of the world communicator ...
_BCAST, _COUPLE, _REDUCE, _TOTALS, _STATS, _UPDATE, _FETCH, _MODEL = 1, 2, 3, 4, 5, 6, 7, 8
# ... and questions on another, so that they never match a data message.
_ASK, _ANSWER, _TELL = 1, 2, 3
#: A pending wait polls without sleeping for its first ``_SPIN_S`` (yielding the core between
#: polls), as MPI's own blocking calls do, then sleeps between polls, from ``_NAP_MIN_S`` up
#: to ``_NAP_MAX_S``: a short wait costs nothing, a long one at most 2% more, and leaves the
#: core to the others.
_SPIN_S, _NAP_MIN_S, _NAP_MAX_S = 0.05, 2e-5, 1e-3
#: How long a rank whose deadline passed waits for the others' answers.
_ANSWER_GRACE_S = 1.0


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


@dataclass(frozen=True)
class _Group:
    """The ranks of one exchange: a sub-communicator for the blocking collectives, and its
    members as world ranks (in the sub-communicator's order) for the timed transport."""

    comm: object
    members: tuple[int, ...]
    tag: int
    what: str  # where a rank waits, as a timeout's message says it


class _Comms:
    """This rank's place in the grid and its communicators."""

    def __init__(self, world, plan: BalancePlan, layout: list[list[WorkerSpec]]):
        from mpi4py import MPI

        self.world = world
        self.layout = layout
        ranks = rank_map(plan, world.Get_size())
        self.me = me = world.Get_rank()
        cell = next((c for c, rank in ranks.items() if rank == me), None)
        self.spec: WorkerSpec | None = None if cell is None else layout[cell[0]][cell[1]]
        #: the spec of the worker every rank runs (idle ranks are absent)
        self.specs = {rank: layout[r][s] for (r, s), rank in ranks.items()}
        self.coordinator = ranks[(0, 0)]
        #: the rank of every shard's column head, cell ``(0, s)``, by shard
        self.heads = tuple(ranks[(0, s)] for s in range(plan.model_parallel))
        undefined = MPI.UNDEFINED
        self.replica = world.Split(undefined if cell is None else cell[0], 0 if cell is None else cell[1])
        self.shard = world.Split(undefined if cell is None else cell[1], 0 if cell is None else cell[0])
        if cell is not None:
            d, m = plan.data_parallel, plan.model_parallel
            replica = tuple(ranks[(cell[0], s)] for s in range(m))
            shard = tuple(ranks[(r, cell[1])] for r in range(d))
            self.coupling = _Group(self.replica, replica, _COUPLE, "in the coupling exchange")
            #: this rank's column, its head first (the reduce to it, its new subtrees from it)
            self.column = _Group(self.shard, shard, _UPDATE, "for its column's new subtrees")
            #: on replica 0: the column heads, the coordinator first (their reports to it)
            self.reports = _Group(self.replica, replica, _TOTALS, "in the reduce")

    @property
    def is_coordinator(self) -> bool:
        return self.me == self.coordinator

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


class _NoAnswer(FitError):
    """A rank did not answer within the timeout; raised on the rank that found it and on every
    rank it told. The job ends when the rank that found it exits (it aborts the job then)."""


def _no_answer(message: str, notes: list[str]) -> _NoAnswer:
    err = _NoAnswer(message)
    err.add_note("when the fit stopped:\n" + "\n".join(f"  {line}" for line in notes))
    return err


_ABORT_REGISTERED = False


#: Seconds a rank that aborts the job waits for its last output to be forwarded first.
ABORT_GRACE_S = 0.5


def _abort_when_done(world) -> None:
    """Aborts the whole job when this process exits: the rank that hangs cannot be stopped
    any other way, and the caller handles the FitError (a checkpoint, a message) first."""
    global _ABORT_REGISTERED
    if _ABORT_REGISTERED or world.Get_size() < 2:
        return
    _ABORT_REGISTERED = True

    def abort():
        sys.stderr.flush()
        sys.stdout.flush()
        # the process manager forwards what this rank wrote in its own time; aborting at once
        # can lose the last lines (the FitError's message) on their way
        time.sleep(ABORT_GRACE_S)
        world.Abort(ABORT_STATUS)

    atexit.register(abort)


class _Blocking:
    """No timeout: mpi4py's blocking collectives, exactly as fast as MPI makes them."""

    def __init__(self, world):
        self.world = world

    def bcast(self, obj, root: int):
        return self.world.bcast(obj, root=root)

    def scatter(self, objs, root: int):
        """``objs(r)`` to rank ``r``, made and sent one at a time: the root holds one message,
        not one per rank (mpi4py's ``scatter`` pickles them all before sending)."""
        if self.world.Get_rank() != root:
            return self.world.recv(source=root, tag=_BCAST)
        for r in range(self.world.Get_size()):
            if r != root:
                self.world.send(objs(r), dest=r, tag=_BCAST)
        return objs(root)

    def allgather_arrays(self, group: _Group, size: int, fill) -> list[np.ndarray]:
        """Every member's float64 message (``fill`` writes this rank's ``size`` values), in
        group order, as views of one buffer: the sizes, then the values in place."""
        from mpi4py import MPI

        comm = group.comm
        counts = np.empty(comm.Get_size(), dtype=np.int64)
        comm.Allgather(np.array([size], dtype=np.int64), counts)
        displs = np.concatenate([[0], np.cumsum(counts)[:-1]])
        out = np.empty(int(counts.sum()))
        me = comm.Get_rank()
        fill(out[displs[me]:displs[me] + size])
        comm.Allgatherv(MPI.IN_PLACE, [out, counts, displs, MPI.DOUBLE])
        return [out[d:d + n] for d, n in zip(displs.tolist(), counts.tolist())]

    def gather(self, group: _Group, obj) -> list | None:
        return group.comm.gather(obj, root=0)

    def command(self, obj, dest: int) -> None:
        """``obj`` to rank ``dest`` alone, as :meth:`scatter` sends each rank its part."""
        self.world.send(obj, dest=dest, tag=_BCAST)

    def send_bytes(self, blob, dest: int, tag: int, wait: bool = False) -> None:
        """Bytes to world rank ``dest`` as they are (no pickle around them); blocking, so
        ``wait`` changes nothing here."""
        from mpi4py import MPI

        self.world.Send([blob, MPI.BYTE], dest=dest, tag=tag)

    def recv_bytes(self, source: int, tag: int, what: str) -> bytearray:
        from mpi4py import MPI

        status = MPI.Status()
        msg = self.world.Mprobe(source, tag, status)
        buf = bytearray(status.Get_count(MPI.BYTE))
        msg.Recv([buf, MPI.BYTE])
        return buf

    def bcast_bytes(self, group: _Group, blob):
        """The bytes of the group's first member to every member."""
        from mpi4py import MPI

        comm = group.comm
        n = comm.bcast(None if blob is None else len(blob), root=0)
        if comm.Get_rank() != 0:
            blob = bytearray(n)
        comm.Bcast([blob, MPI.BYTE], root=0)
        return blob

    def arm(self, iteration: int) -> None:
        pass

    def disarm(self) -> None:
        pass

    def startup(self) -> None:
        pass

    def finish(self) -> None:
        pass

    def flush(self) -> None:
        pass

    def free(self) -> None:
        pass


class _Timed:
    """Every wait polled against a deadline: a rank that never arrives is named, not waited for.

    Messages are pickled once and moved with ``Isend`` and a matched probe (``Improbe``) on
    a duplicate of the world communicator (``data``), addressed by world rank with a tag per
    exchange; a pending wait polls, then sleeps between polls, and in those pauses answers
    the questions another rank asks on a second duplicate (``ctl``). See the module's
    docstring for who judges whom, and when.
    """

    def __init__(self, world, coordinator: int, who: list[str], timeout_s: float, startup_timeout_s: float):
        from mpi4py import MPI

        self.MPI = MPI
        self.world = world
        self.me, self.size = world.Get_rank(), world.Get_size()
        self.coordinator = coordinator
        self.who = who  # every world rank, as a message names it
        self.timeout_s, self.startup_timeout_s = timeout_s, startup_timeout_s
        self.data = world.Dup()
        self.ctl = world.Dup()
        self.status = MPI.Status()
        self.sends: list = []
        self.deadline: float | None = None
        self.limit_s = 0.0
        self.when = "while starting"
        self.token = None  # (this rank, round) of its last question
        self.answers: dict[int, str] = {}
        self.rounds = 0
        self.waiting_since, self.nap = 0.0, _NAP_MIN_S  # the current wait's start and sleep

    # ------------------------------------------------------------ deadlines
    def _arm(self, base_s: float, when: str) -> None:
        """The coordinator waits ``base_s``; every other rank longer, so that a hung worker is
        named by the coordinator, and the coordinator by the others only when it hangs itself."""
        self.limit_s = base_s if self.me == self.coordinator else 2 * base_s + 2 * _ANSWER_GRACE_S
        self.deadline = perf_counter() + self.limit_s
        self.when = when

    def arm(self, iteration: int) -> None:
        self._arm(self.timeout_s, f"in iteration {iteration}")

    def startup(self) -> None:
        """Every rank has its rows before the first iteration's deadline starts."""
        self._arm(self.startup_timeout_s, "while starting")
        self._wait(self.data.Ibarrier(), "at the start for every rank to load its rows")
        self.deadline = None

    def disarm(self) -> None:
        """No deadline until the coordinator's next message: its M-step and callback take
        what they take."""
        self.deadline = None

    def finish(self) -> None:
        """The end of an E-step: every rank's share is in (then :meth:`disarm`)."""
        self._wait(self.data.Ibarrier(), "at the end of the iteration for every rank's share")
        self.deadline = None

    # ------------------------------------------------------------ exchanges
    def bcast(self, obj, root: int):
        if self.me == root:
            blob = pickle.dumps(obj, protocol=PROTOCOL)
            sent = [self.data.Isend([blob, self.MPI.BYTE], r, _BCAST) for r in range(self.size) if r != root]
            # completed before the root computes: a large model moves only while the root polls
            self._wait_all(sent, "sending to every rank")
            return obj
        return self._receive([root], _BCAST, "for the coordinator's next message")[root]

    def scatter(self, objs, root: int):
        """``objs(r)`` to rank ``r``, made and sent one at a time (the root holds one message)."""
        if self.me == root:
            for r in range(self.size):
                if r != root:
                    self.command(objs(r), r)
            return objs(root)
        return self._receive([root], _BCAST, "for the coordinator's next message")[root]

    def command(self, obj, dest: int) -> None:
        blob = pickle.dumps(obj, protocol=PROTOCOL)
        self._wait_all([self.data.Isend([blob, self.MPI.BYTE], dest, _BCAST)], "sending to every rank")

    def send_bytes(self, blob, dest: int, tag: int, wait: bool = False) -> None:
        """``wait``: completed before returning, so the caller may let ``blob`` go."""
        request = self.data.Isend([blob, self.MPI.BYTE], dest, tag)
        if wait:
            self._wait_all([request], "sending to every rank")
        else:
            self.sends.append(request)

    def recv_bytes(self, source: int, tag: int, what: str) -> bytearray:
        return self._receive([source], tag, what, self._take_bytes)[source]

    def bcast_bytes(self, group: _Group, blob):
        root = group.members[0]
        if self.me != root:
            return self.recv_bytes(root, group.tag, group.what)
        for r in group.members[1:]:
            self.send_bytes(blob, r, group.tag)
        return blob

    def allgather_arrays(self, group: _Group, size: int, fill) -> list[np.ndarray]:
        mine = np.empty(size)
        fill(mine)
        others = [r for r in group.members if r != self.me]
        for r in others:
            self.sends.append(self.data.Isend([mine, self.MPI.DOUBLE], r, group.tag))
        got = self._receive(others, group.tag, group.what, self._take_array)
        return [mine if r == self.me else got[r] for r in group.members]

    def gather(self, group: _Group, obj) -> list | None:
        root, others = group.members[0], group.members[1:]
        if self.me != root:
            self.sends.append(self.data.Isend([pickle.dumps(obj, protocol=PROTOCOL), self.MPI.BYTE], root, group.tag))
            return None
        got = self._receive(others, group.tag, group.what)
        return [obj] + [got[r] for r in others]

    def flush(self) -> None:
        """Completes this rank's sends (before it returns its result)."""
        self._wait_all(self.sends, "for its messages to be received")
        self.sends = []

    def free(self) -> None:
        for c in (self.data, self.ctl):
            c.Free()

    # ------------------------------------------------------------ waiting
    def _take(self, msg):
        buf = bytearray(self.status.Get_count(self.MPI.BYTE))
        msg.Recv([buf, self.MPI.BYTE])
        return pickle.loads(buf)

    def _take_bytes(self, msg) -> bytearray:
        buf = bytearray(self.status.Get_count(self.MPI.BYTE))
        msg.Recv([buf, self.MPI.BYTE])
        return buf

    def _take_array(self, msg) -> np.ndarray:
        buf = np.empty(self.status.Get_count(self.MPI.DOUBLE))
        msg.Recv([buf, self.MPI.DOUBLE])
        return buf

    def _receive(self, sources: list[int], tag: int, what: str, take=None) -> dict:
        take = take or self._take
        got = {}
        pending = list(sources)
        polls = 0
        while True:
            for r in tuple(pending):
                msg = self.data.Improbe(r, tag, self.status)
                if msg is not None:
                    got[r] = take(msg)
                    pending.remove(r)
            if not pending:
                break
            polls += 1
            self._idle(polls, what, pending)
        if self.sends and self.MPI.Request.Testall(self.sends):
            self.sends = []
        return got

    def _wait(self, request, what: str) -> None:
        polls = 0
        while not request.Test():
            polls += 1
            self._idle(polls, what, None)

    def _wait_all(self, requests: list, what: str) -> None:
        polls = 0
        while requests and not self.MPI.Request.Testall(requests):
            polls += 1
            self._idle(polls, what, None)

    def _idle(self, polls: int, what: str, pending: list[int] | None) -> None:
        """One pause of a pending wait (``polls`` counts them, from 1): yield the core while the
        wait is short; then answer questions, judge once the deadline passed, and sleep."""
        now = perf_counter()
        if polls == 1:
            self.waiting_since, self.nap = now, _NAP_MIN_S / 2
        if now - self.waiting_since < _SPIN_S:
            os.sched_yield()
            return
        self._serve(what, pending)
        if self.deadline is not None and now > self.deadline:
            self._judge(what, pending)
        self.nap = min(_NAP_MAX_S, 2 * self.nap)
        time.sleep(self.nap)

    def _doing(self, what: str, pending: list[int] | None) -> str:
        text = f"{self.who[self.me]} was waiting {what}"
        if pending:
            text += " for " + ", ".join(f"rank {r}" for r in pending)
        return text

    def _serve(self, what: str, pending: list[int] | None) -> None:
        """Answers every question waiting on ``ctl``; collects answers; raises what it is told."""
        while True:
            msg = self.ctl.Improbe(self.MPI.ANY_SOURCE, self.MPI.ANY_TAG, self.status)
            if msg is None:
                return
            source, tag = self.status.Get_source(), self.status.Get_tag()
            body = self._take(msg)
            if tag == _ASK:
                answer = pickle.dumps((body, self.me, self._doing(what, pending)), protocol=PROTOCOL)
                self.sends.append(self.ctl.Isend([answer, self.MPI.BYTE], source, _ANSWER))
            elif tag == _ANSWER:
                token, rank, doing = body
                if token == self.token:
                    self.answers[rank] = doing
            elif tag == _TELL:
                message, notes = body
                raise _no_answer(message, notes)

    def _judge(self, what: str, pending: list[int] | None) -> None:
        """The deadline passed: ask every rank; name those that do not answer, or wait on."""
        self.rounds += 1
        self.token = (self.me, self.rounds)
        self.answers = {}
        ask = pickle.dumps(self.token, protocol=PROTOCOL)
        for r in range(self.size):
            if r != self.me:
                self.sends.append(self.ctl.Isend([ask, self.MPI.BYTE], r, _ASK))
        end = perf_counter() + _ANSWER_GRACE_S
        while len(self.answers) < self.size - 1 and perf_counter() < end:
            time.sleep(_NAP_MAX_S)
            self._serve(what, pending)
        silent = [r for r in range(self.size) if r != self.me and r not in self.answers]
        if not silent or (self.me != self.coordinator and self.coordinator in self.answers):
            # every rank waits in a poll loop (what is late is on its way), or the coordinator
            # does and will judge: wait on
            self.deadline = perf_counter() + self.limit_s
            return
        message = f"no answer within {self.limit_s:g} s {self.when} from {', '.join(self.who[r] for r in silent)}"
        notes = [self._doing(what, pending)] + [self.answers[r] for r in sorted(self.answers)]
        tell = pickle.dumps((message, notes), protocol=PROTOCOL)
        for r in sorted(self.answers):
            self.sends.append(self.ctl.Isend([tell, self.MPI.BYTE], r, _TELL))
        _abort_when_done(self.world)
        raise _no_answer(message, notes)


class MpiGrid:
    """One rank's side of the grid: its :class:`ShardPart` and, on a column's head, its
    column's reduce and M-step. The coordinator drives it through :func:`run_em`, the other
    ranks through :meth:`serve`."""

    def __init__(self, job: FitJob, comms: _Comms, net: _Blocking | _Timed):
        self.comms = comms
        self.net = net
        self.layout = comms.layout
        self.view = self.layout[0][0].view
        self.regularization = job.regularization
        map_large_blocks()
        warm_up(job.model)
        self.meter = PeakMeter()  # before this rank takes its rows: see executors.memory
        spec = comms.spec
        self.step = None
        if spec is not None:
            self.step = WorkerStep(job.model, spec, job.open_rows(spec.start, spec.stop), self.meter)
            probe(spec.name)
        self.part: ShardPart | None = None
        self.pending: bytes | None = None  # a head's new subtrees pickled for its column (D > 1)
        self.pending_bytes: list[int] = []  # on the coordinator: every head's, by shard
        self.iteration = 0
        self.received_s = 0.0  # unpickling and splicing the last model or update
        net.startup()

    # ---------------------------------------------------------------- coordinator
    def tell(self, message) -> None:
        """The same message to every rank (what the ranks that serve wait for)."""
        self.net.scatter(lambda r: message, self.comms.coordinator)

    def broadcast(self, model: Node, payloads: list[bytes]) -> None:
        """Each rank its shard's part of the model, rank by rank: the word, then the pickled
        part as raw bytes (not pickled again inside the word: the root holds one copy of
        one part, a rank the bytes it receives and what they unpickle to); idle ranks get
        the word alone."""
        c = self.comms
        self.net.arm(self.iteration + 1)
        for r in range(c.world.Get_size()):
            if r != c.coordinator:
                self.net.command(("model", r in c.specs), r)
                if r in c.specs:
                    self.net.send_bytes(payloads[c.specs[r].shard], r, _MODEL, wait=True)
        self.net.disarm()
        self.part = ShardPart(self.view, c.spec.shard, self.view.model_for(c.spec.shard, model), self.regularization)

    def e_step(self, iteration: int) -> GridOutcome:
        t0 = perf_counter()
        self.iteration = iteration
        self.net.arm(iteration)
        self.tell(("step", iteration))
        heads = self.worker_share(iteration)
        self.net.finish()
        failures = [f for _, _, fs, _ in heads for f in fs]
        if failures:
            first = min(failures, key=lambda f: f.rank)
            raise _fit_error(first.message, first.trace)
        if any(column is None for column, _, _, _ in heads):
            raise _fit_error(f"a rank stopped in iteration {iteration} without saying why", None)
        columns = [column for column, _, _, _ in heads]
        workers = [w for _, shares, _, _ in heads for w in shares]
        self.pending_bytes = [n for _, _, _, n in heads]
        wall = perf_counter() - t0 - max(column.mstep_s for column in columns)
        return GridOutcome(columns=columns, **critical_path(workers, wall),
                           coupling_bytes=sum(w.coupling_bytes for w in workers),
                           reduce_bytes=sum(c.reduce_bytes + len(report_payload(c)) for c in columns),
                           peak_bytes={w.worker: w.peak_bytes for w in workers},
                           baseline_bytes={w.worker: w.baseline_bytes for w in workers})

    def update(self, skeleton: Node, payload: bytes) -> int:
        self.net.arm(self.iteration)
        self.tell(("update", payload))
        self.apply(payload, skeleton)
        self.net.disarm()
        return update_bytes(self.view, len(self.layout), len(payload), self.pending_bytes)

    def fetch(self, shard: int) -> dict[str, Node]:
        head = self.comms.heads[shard]
        if head == self.comms.me:
            return self.part.owned()
        self.net.arm(self.iteration)
        self.net.command(("fetch", shard), head)
        owned = pickle.loads(self.net.recv_bytes(head, _FETCH, f"for shard {shard}'s subtrees"))
        self.net.disarm()
        return owned

    # ---------------------------------------------------------------- every active rank
    def worker_share(self, iteration: int):
        """This rank's step and its part in its column's tree reduce (:func:`column_reduce`),
        then, on a column's head, the column's M-step; each head sends the coordinator
        ``(ColumnReport or None, the column's ShareReports, failures, bytes of its pending
        subtrees)``. The coordinator gets every head's, by shard; the others None.

        What moves up the tree beside each partial sum (its own message, raw bytes): the
        ShareReports and failures of the sender's subtree, the statistics bytes it moved, and
        the partial log-likelihood. A failed rank sends empty statistics and its failure."""
        c, spec, net = self.comms, self.comms.spec, self.net
        members, d = c.column.members, len(c.column.members)
        share, failure = self._run_step(iteration)
        reports = [] if share is None else [share.report(spec.name, 0, self.meter.baseline_bytes)]
        failures = [] if failure is None else [failure]
        moved = 0
        mine = [(Stats({}), 0.0) if share is None else (share.stats, share.loglik)]
        del share  # the statistics are held by the reduce alone: not twice
        t0 = perf_counter()

        def receive(r: int):
            nonlocal moved
            got, failed, n, ll = pickle.loads(net.recv_bytes(members[r], _REDUCE, "in the reduce"))
            blob = net.recv_bytes(members[r], _STATS, "in the reduce")
            reports.extend(got)
            failures.extend(failed)
            moved += n + len(blob)
            stats = pickle.loads(blob)
            del blob
            return stats, ll

        def send(r: int, partial) -> None:
            blob = pickle.dumps(partial[0], protocol=PROTOCOL)
            net.send_bytes(pickle.dumps((reports, failures, moved, partial[1]), protocol=PROTOCOL), members[r], _REDUCE)
            net.send_bytes(blob, members[r], _STATS)

        partial = column_reduce(spec.replica, d, *mine.pop(), receive, send)
        if partial is None:
            return None
        reduce_s = perf_counter() - t0
        totals, ll = [partial[0]], partial[1]
        del partial  # the column's statistics go to the M-step as their only reference: let go as it goes
        done = None
        if not failures and len(reports) == d:
            try:
                done = self.part.estimate(totals.pop(), ll)
            except Exception as e:  # noqa: BLE001 - carried to the coordinator, raised there on every rank
                failures.append(self._failure(e, f"in the M-step of iteration {iteration}"))
        totals.clear()
        self.pending = None
        if done is not None:
            done.reduce_s, done.reduce_bytes = reduce_s, moved
            if d > 1 and self.part.pending is not None:
                self.pending = self.part.pending_payload()
        return net.gather(c.reports, (done, reports, failures, len(self.pending or b"")))

    def _run_step(self, iteration: int):
        """This rank's E-step: ``(share, None)``, or ``(None, failure)`` when it raised
        (``failure`` None when another shard of its replica did)."""
        c, spec, net = self.comms, self.comms.spec, self.net
        exchanged = 0

        def exchange(mine):
            nonlocal exchanged
            got = net.allgather_arrays(c.coupling, coupling.message_length(mine),
                                       lambda out: coupling.pack_into(out, mine, spec.roots))
            exchanged += 1
            every = coupling.merge(got, spec.replica_roots)
            if every is None:
                raise _PeerFailed()
            return every

        try:
            share = self.step.run(self.part.part, exchange, iteration)
            share.receive_s = self.received_s
            return share, None
        except _PeerFailed:
            return None, None  # the shard that failed reports it
        except _NoAnswer:
            raise  # a rank hangs: the timed transport already told every rank that answers
        except Exception as e:  # noqa: BLE001 - carried to the coordinator, raised there on every rank
            failure = self._failure(e, f"in iteration {iteration}")
            if exchanged < self.step.exchanges_per_pass():
                # the other shards wait in this block's exchange
                net.allgather_arrays(c.coupling, coupling.FAILED_LENGTH, coupling.mark_failed)
            return None, failure

    def _failure(self, e: Exception, when: str) -> _Failure:
        spec, rank = self.comms.spec, self.comms.me
        if isinstance(e, FitError):  # a FitError of the model's own says what it says, as on one process
            return _Failure(rank, str(e), traceback.format_exc())
        summary = traceback.format_exception_only(type(e), e)[-1].strip()
        return _Failure(rank, f"rank {rank} (worker {spec.name!r}, replica {spec.replica}, shard {spec.shard}) "
                        f"failed {when}: {summary}", traceback.format_exc())

    def apply(self, payload: bytes, skeleton: Node | None = None) -> None:
        """The next model here: the coordinator's skeleton and the column head's new subtrees."""
        t0 = perf_counter()
        net, column = self.net, self.comms.column
        skeleton = pickle.loads(payload) if skeleton is None else skeleton
        if len(column.members) == 1:
            self.part.apply(skeleton)
        elif self.comms.me == column.members[0]:
            net.bcast_bytes(column, self.pending)
            self.pending = None
            self.part.apply(skeleton)
        else:
            self.part.part = None  # its old subtrees go before the new ones arrive
            blob = net.bcast_bytes(column, None)
            owned = pickle.loads(blob)
            del blob
            self.part.apply(skeleton, owned)
        self.received_s = perf_counter() - t0

    def serve(self) -> FitResult:
        """A non-coordinator rank: do what the coordinator says until the result arrives."""
        c, net = self.comms, self.net
        while True:
            kind, body = net.scatter(None, c.coordinator)
            if kind == "step":
                self.iteration = body
                net.arm(body)
                if c.spec is not None:
                    self._guarded(self.worker_share, body)
                net.finish()
            elif kind == "update":
                if c.spec is not None:
                    net.arm(self.iteration)
                    self._guarded(self.apply, body)
                    net.disarm()
            elif kind == "model":
                if body:
                    t0 = perf_counter()
                    self.part = None  # not kept while the new one is unpickled
                    blob = net.recv_bytes(c.coordinator, _MODEL, "for its part of the model")
                    part = pickle.loads(blob)
                    del blob
                    self.part = ShardPart(self.view, c.spec.shard, part, self.regularization, private=True)
                    self.received_s = perf_counter() - t0
            elif kind == "fetch":
                net.send_bytes(pickle.dumps(self._guarded(self.part.owned), protocol=PROTOCOL), c.coordinator, _FETCH)
            elif kind == "stop":  # the coordinator's callback stopped the fit (Ctrl-C, SIGTERM)
                net.flush()
                raise KeyboardInterrupt()
            elif kind == "done":
                body = net.bcast(None, c.coordinator)  # the result, pickled once
                net.flush()
                return pickle.loads(body)
            else:
                net.flush()
                message, trace = body
                raise _fit_error(message, trace)

    def _guarded(self, work, *args):
        try:
            return work(*args)
        except _NoAnswer:
            raise  # every rank that answers raises it; the job ends with the one that judged
        except BaseException:  # the other ranks wait in a collective: end the job
            abort_job(self.comms.world)
            raise


_SHM_RELEASED = False


def room_for_the_result(job: FitJob) -> bool:
    """Whether the fitted model is gathered (``FitJob.gather`` None): the result goes to every
    rank, so it must fit where the coordinator runs (:func:`executors.loop.fits_here`) and, on
    every worker whose memory the plan knows, in what the plan leaves free there (twice: the
    pickle and the model)."""
    need = 2 * sum(a.nbytes for _, node in job.model.nodes() for a in node.params().values())
    room = all(w.memory_limit is None or w.memory_limit - w.memory_bytes >= need for w in job.plan.per_worker)
    return room and fits_here(job.model)


def release_shared_memory_files(world) -> None:
    """Unlinks the ``/dev/shm/mpich_shm_*`` files this rank maps, once every rank of the job
    has passed ``MPI_Init`` (``world`` is the whole job and a collective on it just ran): the
    mappings stay, and a job that ends abnormally (a rank killed, ``MPI_Abort``) leaves
    nothing in ``/dev/shm``. Only the whole job's communicator qualifies, once per process."""
    global _SHM_RELEASED
    from mpi4py import MPI

    if _SHM_RELEASED or world.Get_size() != MPI.COMM_WORLD.Get_size() or not os.path.exists("/proc/self/maps"):
        return
    _SHM_RELEASED = True
    try:
        with open("/proc/self/maps") as f:
            names = {line.split()[-1] for line in f if "/dev/shm/mpich_shm_" in line and "(deleted)" not in line}
    except OSError:
        return
    for name in names:
        try:
            os.unlink(name)
        except OSError:
            pass  # another rank of this machine unlinked it first


def abort_job(world) -> None:
    """After an unexpected error on one rank: print it and abort every rank (they would hang)."""
    if world.Get_size() > 1:
        sys.stderr.write(f"emgrid: rank {world.Get_rank()} failed; aborting the MPI job\n{traceback.format_exc()}")
        sys.stderr.flush()
        world.Abort(1)


class MpiExecutor(BaseExecutor):
    """One rank per worker under ``mpiexec``; ``comm`` defaults to ``MPI.COMM_WORLD``.

    ``timeout_s``: as the multiprocessing executor's, the longest one iteration may take
    before the fit stops with a FitError naming the rank(s) that did not arrive (``None``:
    no limit, and the blocking collectives; a rank that dies ends the job regardless).
    ``startup_timeout_s``: with a ``timeout_s``, the longest a rank may take to load its
    rows. Every rank must pass the same timeouts (checked, before any work). ``blas_threads``:
    BLAS and OpenMP threads per rank while the fit runs (default 1; ``None`` leaves each rank's
    own setting).
    """

    name: ClassVar[str] = "mpi"

    def __init__(self, comm=None, timeout_s: float | None = None, startup_timeout_s: float = 120.0,
                 blas_threads: int | None = DEFAULT_BLAS_THREADS):
        from mpi4py import MPI

        if timeout_s is not None and not timeout_s > 0:
            raise ConfigError(f"timeout_s must be > 0 or None, got {timeout_s!r}")
        if not startup_timeout_s > 0:
            raise ConfigError(f"startup_timeout_s must be > 0, got {startup_timeout_s!r}")
        self.comm = comm if comm is not None else MPI.COMM_WORLD
        self.timeout_s = timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.blas_threads = check_blas_threads(blas_threads)

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
        with limited(self.blas_threads):
            return self._run(job)

    def _run(self, job: FitJob) -> FitResult:
        world = self.comm
        # one transport on every rank (blocking and nonblocking calls never match), and the
        # pids that a timeout's message names
        facts = world.allgather((self.timeout_s, self.startup_timeout_s, os.getpid()))
        if any(f[:2] != facts[0][:2] for f in facts):
            raise ConfigError("every MPI rank must pass the same timeout_s and startup_timeout_s; got "
                              + ", ".join(f"rank {r}: {f[0]!r}, {f[1]!r}" for r, f in enumerate(facts)))
        release_shared_memory_files(world)
        if job.gather is None:
            job = replace(job, gather=room_for_the_result(job))
        comms = _Comms(world, job.plan, grid_layout(job.model, job.plan))
        if self.timeout_s is None:
            net = _Blocking(world)
        else:
            who = [_describe(r, comms.specs.get(r), f[2]) for r, f in enumerate(facts)]
            net = _Timed(world, comms.coordinator, who, self.timeout_s, self.startup_timeout_s)
        try:
            grid = MpiGrid(job, comms, net)
            if not comms.is_coordinator:
                return grid.serve()
            return self._coordinate(grid, job)
        finally:
            net.free()
            comms.free()

    def _coordinate(self, grid: MpiGrid, job: FitJob) -> FitResult:
        world, root, net = self.comm, grid.comms.coordinator, grid.net
        stopped = []
        if job.callback is not None:
            callback = job.callback

            def guarded(*args):
                try:
                    return callback(*args)
                except KeyboardInterrupt:
                    stopped.append(True)  # between iterations: every other rank waits for the next model
                    raise

            job = replace(job, callback=guarded)
        try:
            result = run_em(grid, job, self.name)
        except _NoAnswer:
            raise  # every rank that answers was told; a rank that hangs cannot be
        except KeyboardInterrupt:
            if not stopped:  # mid-iteration: the other ranks wait in a collective
                abort_job(world)
                raise
            grid.tell(("stop", None))  # the caller's callback stopped the fit: every rank stops alike
            net.flush()
            raise
        except FitError as e:
            trace = next((n.split("\n", 1)[1] for n in getattr(e, "__notes__", ()) if "\n" in n), None)
            grid.tell(("error", (str(e), trace)))
            net.flush()
            raise
        except BaseException:  # the other ranks wait in a collective: end the job
            abort_job(world)
            raise
        grid.tell(("done", None))
        net.bcast(pickle.dumps(result, protocol=PROTOCOL), root)  # pickled once, whatever the ranks
        net.flush()
        if result.model is None:  # left on the grid: the shards left with the ranks (as on the others)
            result.shards = Shards(grid.view, result.shards.skeleton)
        return result

    def __repr__(self) -> str:
        return f"MpiExecutor(timeout_s={self.timeout_s!r}, blas_threads={self.blas_threads!r})"


def _describe(rank: int, spec: WorkerSpec | None, pid: int) -> str:
    if spec is None:
        return f"rank {rank} (idle, pid {pid})"
    return f"rank {rank} (worker {spec.name!r}, replica {spec.replica}, shard {spec.shard}, pid {pid})"
