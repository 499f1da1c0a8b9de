"""The MPI executor: one rank per grid cell, every rank calling ``optimize`` under ``mpiexec``.

``COMM_WORLD`` is split twice: a *replica* communicator per data replica (its ``M`` shards,
ranked by shard) carries the coupling, an allgather of the shard roots' per-row log
densities per block; a *shard* communicator per model shard (its ``D`` replicas, ranked by
replica) carries the reduce, a gather of the statistics to the shard's replica 0, which
sums them in replica order. The shards' totals are gathered on the coordinator (the rank
of cell ``(0, 0)``), which runs the M-step and sends every rank its shard's part of the new model.

Ranks beyond the plan's ``D x M`` workers stay idle but receive every broadcast, so every
rank returns the same FitResult. A plan with more workers than ranks is refused before
any work, on every rank, with the same PlanError.

Failures. A rank whose step raises does not leave the others waiting in a collective:
every message of the E-step carries a failure slot. The failing rank still takes part in
the one coupling allgather its replica's other shards are waiting in (its message's status
says it failed, :mod:`executors.coupling`), after which all of them stop the pass; then every rank joins
the reduce as usual, carrying its failure or nothing, so the failure reaches the
coordinator, which raises a FitError naming the rank, its worker and the iteration and
broadcasts it: every rank raises the same FitError. Anything that breaks outside these
collectives (an error in the reduce or M-step machinery itself) still aborts the job
(``MPI_Abort``), and a rank that dies outright (killed, ``os._exit``) is torn down with
the whole job by the process manager (``mpiexec``/hydra reports the dead process and
exits non-zero): MPI collectives cannot outlive a member.

Stopping. A callback that raises KeyboardInterrupt on the coordinator (``emgrid fit`` does
when its launcher was interrupted) stops the fit between iterations: the coordinator tells
every rank to stop instead of sending the next model, and every rank raises
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
one that did not arrive. The coordinator's deadline is ``timeout_s`` from its broadcast, the
other ranks' ``2 * timeout_s + 2 s`` from their receipt of the model, so a hung worker is named by the
coordinator, and the coordinator (itself a worker) by the others only when it hangs. The
rank that names it raises ``FitError("no answer within T s in iteration I from rank R
(worker ..., pid ...)")``, sends the same error to every rank that answered, which raise it
too, and aborts the job (``MPI_Abort`` with status :data:`ABORT_STATUS`) when its process
exits, after the caller has handled the error (written a checkpoint, say): the hung rank
could not be stopped otherwise. Without ``timeout_s`` the blocking collectives run exactly
as before, at no extra cost. With it, a wait polls without sleeping for its first 50 ms, as
MPI's blocking calls do, so that the fixed cost of an iteration stays that of the blocking
collectives.

Every active rank sends its share up the reduce as the multiprocessing workers send theirs:
an :class:`executors.step.ShareReport` beside its pickled statistics.

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

from emgrid.models import Node
from emgrid.models.errors import ConfigError, FitError, PlanError
from emgrid.planner.plan import BalancePlan
from emgrid.planner.resources import Resources

from . import coupling
from .loop import GridOutcome, critical_path, run_em
from .memory import PeakMeter, warm_up
from .protocol import BaseExecutor, FitJob
from .result import FitResult
from .step import PROTOCOL, WorkerSpec, WorkerStep, grid_layout, join_shards, reduce_shard
from .threads import DEFAULT_BLAS_THREADS, check_blas_threads, limited, probe

_RANK_NAME = re.compile(r"rank(\d+)")

#: The status ``mpiexec`` exits with when the rank that named a hung rank aborts the job
#: (``emgrid fit``'s exit code for a fit that failed while running).
ABORT_STATUS = 3
# Message tags of the timed transport: data on one duplicate of the world communicator ...
_BCAST, _COUPLE, _REDUCE, _TOTALS = 1, 2, 3, 4
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
        me = world.Get_rank()
        cell = next((c for c, rank in ranks.items() if rank == me), None)
        self.spec: WorkerSpec | None = None if cell is None else layout[cell[0]][cell[1]]
        #: the spec of the worker every rank runs (idle ranks are absent)
        self.specs = {rank: layout[r][s] for (r, s), rank in ranks.items()}
        self.coordinator = ranks[(0, 0)]
        undefined = MPI.UNDEFINED
        self.replica = world.Split(undefined if cell is None else cell[0], 0 if cell is None else cell[1])
        self.shard = world.Split(undefined if cell is None else cell[1], 0 if cell is None else cell[0])
        if cell is not None:
            d, m = plan.data_parallel, plan.model_parallel
            replica = tuple(ranks[(cell[0], s)] for s in range(m))
            shard = tuple(ranks[(r, cell[1])] for r in range(d))
            self.coupling = _Group(self.replica, replica, _COUPLE, "in the coupling exchange")
            self.reduce = _Group(self.shard, shard, _REDUCE, "in the reduce")
            self.totals = _Group(self.replica, replica, _TOTALS, "in the reduce")

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


class _NoAnswer(FitError):
    """A rank did not answer within the timeout; raised on the rank that found it and on every
    rank it told. The job ends when the rank that found it exits (it aborts the job then)."""


def _no_answer(message: str, notes: list[str]) -> _NoAnswer:
    err = _NoAnswer(message)
    err.add_note("when the fit stopped:\n" + "\n".join(f"  {line}" for line in notes))
    return err


_ABORT_REGISTERED = False


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
        world.Abort(ABORT_STATUS)

    atexit.register(abort)


class _Blocking:
    """No timeout: mpi4py's blocking collectives, exactly as fast as MPI makes them."""

    def __init__(self, world):
        self.world = world

    def bcast(self, obj, root: int):
        return self.world.bcast(obj, root=root)

    def scatter(self, objs: list | None, root: int):
        """``objs[r]`` to rank ``r``, one message at a time: the root holds one pickle, not
        one per rank (mpi4py's ``scatter`` pickles them all before sending)."""
        if self.world.Get_rank() != root:
            return self.world.recv(source=root, tag=_BCAST)
        for r in range(self.world.Get_size()):
            if r != root:
                self.world.send(objs[r], dest=r, tag=_BCAST)
        return objs[root]

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

    def arm(self, iteration: int) -> None:
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

    def finish(self) -> None:
        """The end of an iteration: every rank's share is in (after this, no deadline until
        the next model: the coordinator's M-step and callback take what they take)."""
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

    def scatter(self, objs: list | None, root: int):
        """``objs[r]`` to rank ``r``, one message at a time (the root holds one pickle)."""
        if self.me == root:
            for r in range(self.size):
                if r != root:
                    blob = pickle.dumps(objs[r], protocol=PROTOCOL)
                    self._wait_all([self.data.Isend([blob, self.MPI.BYTE], r, _BCAST)], "sending to every rank")
                    del blob
            return objs[root]
        return self._receive([root], _BCAST, "for the coordinator's next message")[root]

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
    """One rank's side of the grid; the coordinator drives it through :func:`run_em`."""

    def __init__(self, job: FitJob, comms: _Comms, net: _Blocking | _Timed):
        self.comms = comms
        self.net = net
        self.layout = comms.layout
        warm_up(job.model)
        self.meter = PeakMeter()  # before this rank takes its rows: see executors.memory
        spec = comms.spec
        self.step = None
        if spec is not None:
            self.step = WorkerStep(job.model, spec, job.open_rows(spec.start, spec.stop), self.meter)
            probe(spec.name)
        self.model: Node = job.model
        self.received_s = 0.0  # unpickling the last broadcast model
        self.broadcasts = 0
        net.startup()

    # ---------------------------------------------------------------- coordinator
    def broadcast(self, model: Node, payloads: list[bytes]) -> None:
        """Each rank its shard's part of the model (a scatter; idle ranks get none)."""
        self.broadcasts += 1
        self.net.arm(self.broadcasts)  # run_em broadcasts once per iteration, before its E-step
        specs = self.comms.specs
        self.net.scatter([("model", payloads[specs[r].shard] if r in specs else None)
                          for r in range(self.comms.world.Get_size())], self.comms.coordinator)
        self.model = model

    def tell(self, message) -> None:
        """The same message to every rank (what the ranks that serve wait for)."""
        self.net.scatter([message] * self.comms.world.Get_size(), self.comms.coordinator)

    def e_step(self, iteration: int) -> GridOutcome:
        t0 = perf_counter()
        columns, workers, failures = self.worker_share(iteration)
        self.net.finish()
        if failures:
            first = min(failures, key=lambda f: f.rank)
            raise _fit_error(first.message, first.trace)
        stats, ll = join_shards([(pickle.loads(blob), part) for blob, part in columns])
        return GridOutcome(stats=stats, loglik=ll, **critical_path(workers, perf_counter() - t0),
                           coupling_bytes=sum(w.coupling_bytes for w in workers),
                           reduce_bytes=sum(w.stats_bytes for w in workers),
                           peak_bytes={w.worker: w.peak_bytes for w in workers},
                           baseline_bytes={w.worker: w.baseline_bytes for w in workers})

    # ---------------------------------------------------------------- every active rank
    def worker_share(self, iteration: int):
        """This rank's step and its part in the reduce.

        The coordinator gets ``(columns, reports, failures)``: every shard's total and every
        worker's :class:`ShareReport`, or (``None``, ``None``, failures) when some rank failed; the other
        ranks get None.
        """
        c, spec, net = self.comms, self.comms.spec, self.net
        share, failure, exchanged = None, None, 0

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
            share = self.step.run(self.model, exchange, iteration)
        except _PeerFailed:
            pass  # the shard that failed reports it
        except _NoAnswer:
            raise  # a rank hangs: the timed transport already told every rank that answers
        except Exception as e:  # noqa: BLE001 - carried to the coordinator, raised there on every rank
            rank = c.world.Get_rank()
            summary = traceback.format_exception_only(type(e), e)[-1].strip()
            failure = _Failure(rank, f"rank {rank} (worker {spec.name!r}, replica {spec.replica}, shard {spec.shard}) "
                               f"failed in iteration {iteration}: {summary}",
                               traceback.format_exc())
            if exchanged < self.step.exchanges_per_pass():
                # the other shards wait in this block's exchange
                net.allgather_arrays(c.coupling, coupling.FAILED_LENGTH, coupling.mark_failed)
        if share is not None:
            share.receive_s = self.received_s
            payload = share.payload()
            mine = (payload, share.report(spec.name, len(payload), self.meter.baseline_bytes), None)
            del share, payload  # the statistics travel pickled: not held twice through the reduce
        else:
            mine = (None, None, failure)
        column = net.gather(c.reduce, mine)
        del mine
        if spec.replica != 0:
            return None
        failures = [f for _, _, f in column if f is not None]
        reports = [r for _, r, _ in column]
        if failures or any(p is None for p, _, _ in column):
            totals = net.gather(c.totals, (None, 0.0, [], failures))
        elif len(column) == 1:  # one replica: its statistics go on as they came
            blob, report, _ = column.pop()
            totals = net.gather(c.totals, (blob, report.loglik, reports, []))
        else:
            stats, ll = reduce_shard([r.share(pickle.loads(p)) for p, r, _ in column])
            del column
            totals = net.gather(c.totals, (pickle.dumps(stats, protocol=PROTOCOL), ll, reports, []))
        if spec.shard != 0:
            return None
        failures = [f for _, _, _, fs in totals for f in fs]
        if failures or any(blob is None for blob, _, _, _ in totals):
            return None, None, failures or [_Failure(c.world.Get_rank(), f"a rank stopped in iteration {iteration} "
                                                     "without saying why", "")]
        return ([(blob, part) for blob, part, _, _ in totals], [r for _, _, reports, _ in totals for r in reports], [])

    def serve(self) -> FitResult:
        """A non-coordinator rank: run a step per model broadcast until the result arrives."""
        c, net = self.comms, self.net
        iteration = 0
        while True:
            kind, body = net.scatter(None, c.coordinator)
            if kind == "model":
                iteration += 1
                net.arm(iteration)
                t0 = perf_counter()
                self.model = None  # not kept while the new one is unpickled
                self.model = pickle.loads(body) if body is not None else None
                del body
                self.received_s = perf_counter() - t0
                if c.spec is not None:
                    try:
                        self.worker_share(iteration)
                    except _NoAnswer:
                        raise  # every rank that answers raises it; the job ends with the one that judged
                    except BaseException:  # the other ranks wait in a collective: end the job
                        abort_job(c.world)
                        raise
                net.finish()
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


_SHM_RELEASED = False


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
        return result

    def __repr__(self) -> str:
        return f"MpiExecutor(timeout_s={self.timeout_s!r}, blas_threads={self.blas_threads!r})"


def _describe(rank: int, spec: WorkerSpec | None, pid: int) -> str:
    if spec is None:
        return f"rank {rank} (idle, pid {pid})"
    return f"rank {rank} (worker {spec.name!r}, replica {spec.replica}, shard {spec.shard}, pid {pid})"
