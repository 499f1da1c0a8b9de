"""How bytes move between the ranks of an MPI fit: one link per rank, point to point.

Every message is a small pickled header (tag :data:`HEAD`) followed by its raw bodies (tag
:data:`BODY`: a coupling message's float64 array, a pickle, as they are), sent with
``Isend`` on a duplicate of the fit's communicator. MPI keeps two messages of one sender in
order, so a header's bodies are the next ones from its sender. A rank receives on its own
thread, only when it waits: :meth:`MpiLink.pump` takes one message that arrived and files
it (a cell's message into its mailbox, a call into the queue of calls, an answer into the
coordinator's answers), or raises what the coordinator says to every rank (a
:class:`FitError`, a stop).

Deadlines. A wait polls (without sleeping for its first 50 ms, as MPI's blocking calls do,
then sleeping between polls; a blocking ``MPI_Mprobe`` of MPICH cost a few milliseconds per
message here) and answers in its pauses what another rank asks it (what it waits for). With
``timeout_s``, once its deadline passed, a wait judges: a rank other than the coordinator asks every rank, names those
that do not answer within a second (the coordinator first of all: it waits on while the
coordinator answers), tells those that do, and aborts the job (``MPI_Abort`` with
:data:`ABORT_STATUS`) when its process exits, after the caller has handled the error (a
checkpoint, say): the hung rank could not be stopped otherwise. The coordinator's own
deadline is its collect's (:mod:`executors.cellgrid`): its link raises :class:`Deadline`.

Dead peers. MPICH does not always notice that a peer died, nor does the process manager always
end the job, and a wait without ``timeout_s`` would then last forever. So a wait, in its pauses
(never in its first :data:`_SPIN_S`), looks every :data:`PEER_CHECK_S` whether the processes of
the other ranks on its host still live (:meth:`MpiLink._look`); when one ended, it raises
:class:`PeerDied` naming that rank and aborts the job (``MPI_Abort`` with :data:`ABORT_STATUS`)
when its process exits, as for a hung rank. Ranks on other hosts are not looked at.
"""

from __future__ import annotations

import atexit
import os
import pickle
import socket
import sys
import time
import traceback
from collections import deque
from contextlib import suppress
from time import perf_counter

from emgrid.models.errors import FitError

from .cellgrid import Failed, Lost
from .step import PROTOCOL
from .warden import pid_alive

#: The status ``mpiexec`` exits with when the rank that named a hung rank aborts the job
#: (``emgrid fit``'s exit code for a fit that failed while running).
ABORT_STATUS = 3
HEAD, BODY = 1, 2
#: A pending wait polls without sleeping for its first ``_SPIN_S`` (yielding the core between
#: polls), then sleeps between polls, from ``_NAP_MIN_S`` up to ``_NAP_MAX_S``: a short wait
#: costs nothing, a long one at most 2% more, and leaves the core to the others.
_SPIN_S, _NAP_MIN_S, _NAP_MAX_S = 0.05, 2e-5, 1e-3
#: ... and for its first ``_BUSY_S`` it polls without yielding the core at all (a yield on a
#: busy machine hands the core away for a time slice, many times a message's latency).
_BUSY_S = 0.002
#: How long a rank whose deadline passed waits for the others' answers.
ANSWER_GRACE_S = 1.0
#: Seconds a rank that aborts the job waits for its last output to be forwarded first.
ABORT_GRACE_S = 0.5
#: Seconds between a waiting rank's looks at the processes of the other ranks on its host.
PEER_CHECK_S = 0.5


class NoAnswer(FitError):
    """A rank did not answer within the timeout; raised on the rank that found it and on every
    rank it told. The job ends when the rank that found it exits (it aborts the job then)."""


class PeerDied(FitError):
    """The process of a rank on this host ended while this rank waited; raised on the rank that
    found it, which aborts the job when its process exits (the others end with it)."""


class Deadline(Exception):
    """The coordinator's wait passed the deadline its collect set."""


def no_answer(message: str, notes: list[str]) -> NoAnswer:
    err = NoAnswer(message)
    err.add_note("when the fit stopped:\n" + "\n".join(f"  {line}" for line in notes))
    return err


def this_host() -> tuple[str, str]:
    """What ranks whose pids can be looked at from one another share: the host's name and,
    on Linux, the pid namespace (ranks in two containers of one host have pids of their own)."""
    try:
        space = os.readlink("/proc/self/ns/pid")
    except OSError:
        space = ""
    return socket.gethostname(), space


def ended(pid: int) -> bool:
    """Whether process ``pid`` of this host ended: no such process, or a zombie, which
    ``os.kill(pid, 0)`` still reaches (an ended process its parent has not reaped: a process
    manager that missed the death has not reaped it either)."""
    if not pid_alive(pid):
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[:1] in ([b"Z"], [b"X"])
    except OSError:
        return False  # no /proc here, or it ended just now: the next look tells


_ABORT_REGISTERED = False


def abort_when_done(world) -> None:
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


class MpiLink:
    """This rank's messages (see the module). ``who``: every rank as a message names it;
    ``timeout_s``: None for blocking waits; ``peers``: the pid of every other rank on this
    host (:func:`this_host`), by rank, which its waits look at."""

    def __init__(self, world, coordinator: int, who: list[str], timeout_s: float | None,
                 peers: dict[int, int] | None = None):
        from mpi4py import MPI

        self.MPI = MPI
        self.world = world
        self.data = world.Dup()
        self.me, self.size = world.Get_rank(), world.Get_size()
        self.coordinator = coordinator
        self.who = who
        self.timeout_s = timeout_s
        self.status = MPI.Status()
        self.sends: list = []  # requests in flight (each holds its buffer)
        self.cell = None  # the cell this rank runs, whose mailbox its messages go to
        self.calls: deque = deque()  # the coordinator's calls, in order
        self.answers: dict[int, object] = {}  # on the coordinator: by cell, what came back
        self.interrupt = False  # on the coordinator: a failure's answer stops its own cell's wait
        self.deadline: float | None = None
        self.limit_s = 0.0
        self.when = "while starting"
        self.token = None  # (this rank, round) of its last question
        self.replies: dict[int, str] = {}
        self.rounds = 0
        self.waiting_since, self.nap = 0.0, _NAP_MIN_S
        self.peers = dict(peers or {})
        self.looked = perf_counter()  # when the waits last looked at the peers

    # ------------------------------------------------------------ sending
    def post(self, rank: int, header: tuple, bodies=(), wait: bool = False) -> None:
        """``header`` and its ``bodies`` to ``rank``; ``wait``: completed before returning, so
        the caller may let the bodies go (a shard's pickled part)."""
        byte = self.MPI.BYTE
        requests = [self.data.Isend([pickle.dumps((*header, len(bodies)), protocol=PROTOCOL), byte], rank, HEAD)]
        requests += [self.data.Isend([b, byte], rank, BODY) for b in bodies]
        if wait:
            self._wait_all(requests)
        else:
            # a request holds its buffer until it is dropped: the completed ones go at once, or a
            # model-parallel rank would keep every block's coupling message of the last
            # iterations (a copy of its shard roots' densities per row, unplanned)
            self.sends = [r for r in self.sends if not r.Test()] + requests

    def flush(self) -> None:
        """Completes this rank's sends (before it returns its result)."""
        self._wait_all(self.sends)
        self.sends = []

    def free(self) -> None:
        self.data.Free()

    # ------------------------------------------------------------ deadlines
    def arm(self, when: str, base_s: float | None = None) -> None:
        """A deadline for the waits from now on: the coordinator's collect sets its own; the
        other ranks wait longer than it (``2 * timeout_s + 2 s``), so that a hung worker is
        named by the coordinator, and the coordinator by the others only when it hangs."""
        self.when = when
        if self.timeout_s is None:
            return
        base = self.timeout_s if base_s is None else base_s
        self.limit_s = 2 * base + 2 * ANSWER_GRACE_S
        self.deadline = perf_counter() + self.limit_s

    def disarm(self) -> None:
        self.deadline = None

    # ------------------------------------------------------------ receiving
    def pump(self, until: float | None = None) -> bool:
        """Files one message, waiting for it (until ``until``, when given: False if none came)."""
        polls = 0
        while (msg := self.data.Improbe(self.MPI.ANY_SOURCE, HEAD, self.status)) is None:
            if until is not None and perf_counter() >= until:
                return False
            polls += 1
            self._idle(polls)
        source = self.status.Get_source()
        header = pickle.loads(self._take(msg))
        *fields, n = header
        bodies = []
        for _ in range(n):
            bodies.append(self._take(self.data.Mprobe(source, BODY, self.status)))
        self._file(source, fields, bodies)
        return True

    def _take(self, msg) -> bytearray:
        buf = bytearray(self.status.Get_count(self.MPI.BYTE))
        msg.Recv([buf, self.MPI.BYTE])
        return buf

    def _file(self, source: int, fields: list, bodies: list) -> None:
        kind = fields[0]
        if kind == "cell":
            _, key, extra = fields
            self.cell.deliver(key, bodies[0], extra)
        elif kind == "call":
            self.calls.append((fields[1], fields[2], bodies))
        elif kind == "answer":
            _, cell, answer = fields
            self.answers[cell] = answer
            if self.interrupt and isinstance(answer, (Failed, Lost)):
                raise Interrupted()
        elif kind == "ask":
            self.post(source, ("reply", fields[1], self.me, self.doing()))
        elif kind == "reply":
            _, token, rank, doing = fields
            if token == self.token:
                self.replies[rank] = doing
        elif kind == "tell":
            raise no_answer(fields[1], fields[2])
        elif kind == "error":  # the fit's FitError, its notes in one
            err = FitError(fields[1])
            if fields[2]:
                err.add_note(fields[2].rstrip())
            raise err
        elif kind == "stop":  # the coordinator's callback stopped the fit (Ctrl-C, SIGTERM)
            raise KeyboardInterrupt()
        else:
            raise RuntimeError(f"unknown message {kind!r} from rank {source}")

    def next_call(self) -> tuple:
        """The coordinator's next call ``(method, args, bodies)``."""
        while not self.calls:
            self.pump()
        return self.calls.popleft()

    def doing(self) -> str:
        """What this rank waits for, in words."""
        waits = self.cell.waits_for() if self.cell is not None else ""
        return waits or f"waits for the coordinator's next call ({self.when})"

    def ask(self, ranks: list[int]) -> dict[int, str]:
        """What each of ``ranks`` is doing, asked for at most :data:`ANSWER_GRACE_S`; the
        silent ones are absent."""
        self.rounds += 1
        self.token = (self.me, self.rounds)
        self.replies = {}
        for r in ranks:
            self.post(r, ("ask", self.token))
        end = perf_counter() + ANSWER_GRACE_S
        while len(self.replies) < len(ranks) and perf_counter() < end:
            self.pump(until=min(end, perf_counter() + _NAP_MAX_S))
        return dict(self.replies)

    def tell(self, ranks, message: str, notes: list[str]) -> None:
        for r in ranks:
            self.post(r, ("tell", message, notes))
        abort_when_done(self.world)

    # ------------------------------------------------------------ waiting
    def _wait_all(self, requests: list) -> None:
        polls = 0
        while requests and not self.MPI.Request.Testall(requests):
            polls += 1
            self._idle(polls)

    def _idle(self, polls: int) -> None:
        """One pause of a pending wait (``polls`` counts them, from 1): yield the core while the
        wait is short; then answer questions, judge once the deadline passed, look at the peers
        every :data:`PEER_CHECK_S`, and sleep."""
        now = perf_counter()
        if polls == 1:
            self.waiting_since, self.nap = now, _NAP_MIN_S / 2
        if now - self.waiting_since < _BUSY_S:
            return  # a short wait keeps the core, as MPI's blocking calls do
        if now - self.waiting_since < _SPIN_S:
            os.sched_yield()
            return
        if self.deadline is not None and now > self.deadline:
            if self.me == self.coordinator:
                raise Deadline(self.cell.waits_for() if self.cell is not None else "")
            self._judge()
        if self.peers and now - self.looked >= PEER_CHECK_S:
            self._look(now)
        self.nap = min(_NAP_MAX_S, 2 * self.nap)
        time.sleep(self.nap)

    def _look(self, now: float) -> None:
        """Raises :class:`PeerDied` if the process of a rank on this host ended (one
        ``os.kill(pid, 0)`` and one read of ``/proc/PID/stat`` per peer), and has the job
        aborted when this process exits: the others wait for the dead rank too. A rank on
        another host cannot be looked at (its pid means nothing here): a wait for it ends
        by the process manager, or by ``timeout_s``."""
        self.looked = now
        for rank, pid in self.peers.items():
            if ended(pid):
                err = PeerDied(f"{self.who[rank]} died {self.when}")
                err.add_note(f"found by {self.who[self.me]}, which {self.doing()}")
                abort_when_done(self.world)
                raise err

    def _judge(self) -> None:
        """This rank's deadline passed: ask every rank; name those that do not answer, or
        wait on while the coordinator does (it judges its workers)."""
        self.deadline = None  # no judging again while asking
        others = [r for r in range(self.size) if r != self.me]
        replies = self.ask(others)
        silent = [r for r in others if r not in replies]
        if not silent or self.coordinator in replies:
            self.deadline = perf_counter() + self.limit_s
            return
        message = f"no answer within {self.limit_s:g} s {self.when} from {', '.join(self.who[r] for r in silent)}"
        notes = [f"{self.who[r]} {doing}" for r, doing in sorted({**replies, self.me: self.doing()}.items())]
        self.tell(sorted(replies), message, notes)
        raise no_answer(message, notes)


class Interrupted(Exception):
    """On the coordinator: a cell's failure arrived while its own cell waited."""


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
        with suppress(OSError):  # another rank of this machine unlinked it first
            os.unlink(name)


def abort_job(world) -> None:
    """After an unexpected error on one rank: print it and abort every rank (they would hang)."""
    if world.Get_size() > 1:
        sys.stderr.write(f"emgrid: rank {world.Get_rank()} failed; aborting the MPI job\n{traceback.format_exc()}")
        sys.stderr.flush()
        world.Abort(1)
