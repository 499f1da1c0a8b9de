"""One grid cell, the worker side of every transport, written once over a :data:`Send`.

A :class:`Cell` lives for the whole fit in a worker process (a multiprocessing worker, a Dask
or Ray actor). It opens its own rows once when it starts (from the dataset's ``.npy`` files,
only its row range; or the rows the coordinator shipped it once, for data held in memory),
keeps them, and holds its shard's part of the model (:class:`executors.mstep.ShardPart`),
received once per run (:meth:`Cell.load`).

The cell's *link* is all a transport supplies: ``send(target, key, payload, extra)`` moves one
message to another cell without waiting for it to be taken, and the transport hands what
arrives to :meth:`Cell.deliver`, on any thread. Messages go into the receiver's
:class:`Mailbox`, keyed, so that they may arrive in any order and before the receiver waits
for them; :meth:`Cell.abort` stops a wait. Every message is a bytes-like ``payload`` (a
coupling message's float64 array, a pickle) and a small ``extra``:

- **coupling**, per block: each cell's :mod:`executors.coupling` message to the other
  shards of its replica;
- **column reduce**, per iteration: the cells of shard ``s``'s column sum its statistics
  and log-likelihood by a tree reduce (:func:`executors.mstep.column_reduce`), each cell
  ``(r, s)``, ``r > 0``, sending its pickled partial sum (its log-likelihood the
  ``extra``) to its receiver; the column's *head* ``(0, s)`` ends with the totals, runs its
  shard's M-step and pickles its new subtrees for the rest of its column;
- **update**, per iteration: the head's new subtrees to the other cells of its column.

What a cell returns from :meth:`Cell.run` (its :class:`executors.step.ShareReport`, and on a
head its pickled :class:`executors.mstep.ColumnReport`) the transport carries to the
coordinator (:mod:`executors.cellgrid`, where the fault rule lives). When a fit fails, the
coordinator aborts every cell: a cell waiting for a peer raises at once instead of waiting
forever. A transport that sees a peer's link break aborts with that peer's grid index
(:class:`PeerLost`), which the coordinator reads as a pointer to the cause.
"""

from __future__ import annotations

import os
import pickle
import socket
import threading
from collections.abc import Callable, Sequence
from time import perf_counter

import numpy as np

from emgrid.models import Node
from emgrid.models.data import Data
from emgrid.models.regularize import Regularization

from . import coupling
from .datafiles import NpyDataset
from .memory import PeakMeter, tune_allocator, restore_allocator, warm_up
from .mstep import Partial, ShardPart, column_reduce, report_payload
from .step import PROTOCOL, ShareReport, WorkerSpec, WorkerStep
from .threads import environment, probe

#: ``send((replica, shard), key, payload, extra)``: a transport's delivery of one message to
#: another cell (its :meth:`Cell.deliver`), not waited for.
Send = Callable[[tuple[int, int], tuple, object, object], None]

#: Mailbox keys: ``(COUPLING, iteration, block, shard)`` a peer shard's coupling message;
#: ``(STATS, iteration, replica)`` a replica's pickled partial sum of its column's statistics
#: (its log-likelihood the extra), at its receiver in the column's tree reduce; ``(SUBTREES,
#: iteration)`` the head's pickled new subtrees, at the other cells of its column.
COUPLING, STATS, SUBTREES = "coupling", "stats", "subtrees"


class Aborted(RuntimeError):
    """The coordinator stopped the fit while this cell waited for a peer."""


class PeerLost(Aborted):
    """The link to another cell broke while the fit ran: that cell (``index``, its grid
    index ``r * M + s``) failed."""

    def __init__(self, index: int):
        super().__init__(f"the link to cell {index} broke")
        self.index = index


class Mailbox:
    """Messages from the cell's peers, by key (the kinds above), taken by the cell's step.

    Delivered from other threads by default; a transport that receives on the cell's own
    thread sets ``pump``, which :meth:`take` calls while a message it waits for is missing
    (it files what arrives, and may raise to stop the wait)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._box: dict[tuple, tuple] = {}
        self._waiting: Sequence[tuple] = ()
        self._aborted: Aborted | None = None
        self.pump: Callable[[], None] | None = None

    def put(self, key: tuple, message: tuple) -> None:
        with self._cond:
            if self._aborted is None:
                self._box[key] = message
                self._cond.notify_all()

    def take(self, keys: Sequence[tuple]) -> list[tuple]:
        """The messages of ``keys`` (removed), waiting until all are in or the fit is aborted."""
        if self.pump is not None:
            self._waiting = keys
            try:
                while self._aborted is None and not all(k in self._box for k in keys):
                    self.pump()
            finally:
                self._waiting = ()
        with self._cond:
            self._waiting = keys
            try:
                self._cond.wait_for(lambda: self._aborted is not None or all(k in self._box for k in keys))
            finally:
                self._waiting = ()
            if self._aborted is not None:
                raise self._aborted
            return [self._box.pop(k) for k in keys]

    def missing(self) -> list[tuple]:
        """The keys a waiting step still lacks (empty when it does not wait)."""
        with self._cond:
            return [k for k in self._waiting if k not in self._box]

    def abort(self, lost: int | None = None) -> None:
        """Every wait, now and later, raises :class:`Aborted` (or :class:`PeerLost` naming
        the cell ``lost`` whose link broke); the first reason stays."""
        with self._cond:
            if self._aborted is None:
                self._aborted = Aborted("the coordinator stopped the fit") if lost is None else PeerLost(lost)
            self._box.clear()
            self._cond.notify_all()


def describe_wait(missing: Sequence[tuple]) -> str:
    """What a cell waits for, from its mailbox's missing keys ('' when it does not wait)."""
    if not missing:
        return ""
    kind = missing[0][0]
    if kind == COUPLING:
        return f"waits for the coupling message of shard(s) {sorted({k[3] for k in missing})}"
    if kind == STATS:
        return f"waits for the partial sums of its column's replica(s) {sorted({k[2] for k in missing})}"
    return "waits for the new subtrees of its column's head (replica 0)"


class Cell:
    """One grid cell: its rows, its worker step, its part of the model
    (:class:`executors.mstep.ShardPart`) and its mailbox; on a column head (replica 0) also
    its shard's column reduce and M-step.

    ``directory``: an :class:`NpyDataset` the cell maps its rows from; otherwise ``rows``:
    the rows of its replica, restricted to its shard's columns (shipped once), or without
    ``own_rows`` views of the caller's own arrays (an MPI rank's), used as they are (see
    :class:`executors.step.WorkerStep`). ``model``: its
    shard's part of the starting model (to warm up and select its columns; its part for the
    fit comes with :meth:`load`). ``env``: the testing hooks' variables, set while the cell
    starts. ``blas_threads`` limits BLAS and OpenMP in the cell's process from its start
    until :meth:`close` (``None``: as they are).
    """

    def __init__(self, spec: WorkerSpec, model: Node, directory: str | None, rows: Data | None,
                 blas_threads: int | None = None, env: dict[str, str] | None = None, *, own_rows: bool = True):
        self.spec = spec
        tune_allocator()  # given back at close(): see executors.memory
        self._limits = None
        if blas_threads is not None:
            from threadpoolctl import threadpool_limits

            self._limits = threadpool_limits(limits=blas_threads)
        with environment(env or {}):
            for root in spec.roots:
                warm_up(model.node_at(root))  # its shard's subtrees: the others are not in its model
            self.meter = PeakMeter()  # after the warm-up, before the rows: see executors.memory
            if directory is not None:
                rows = NpyDataset(directory).open_rows(spec.start, spec.stop)
            self.step = WorkerStep(model, spec, rows, self.meter, own_rows=own_rows)
            probe(spec.name)
        self.mailbox = Mailbox()
        self.peers: tuple[int, ...] = ()  # the other shards of the replica
        self.replicas = 1  # the cells of its column
        self.send: Send | None = None
        self.part: ShardPart | None = None
        self.pending = b""  # a head's new subtrees, pickled for the rest of its column
        self.received_s = 0.0  # seconds spent taking in the model since the last step

    @property
    def head(self) -> bool:
        """Whether this cell is its shard's column head (replica 0)."""
        return self.spec.replica == 0

    @staticmethod
    def targets(spec: WorkerSpec, replicas: int) -> list[tuple[int, int]]:
        """The cells ``(replica, shard)`` the cell of ``spec`` sends to in a grid of
        ``replicas`` replicas: the other shards of its replica (coupling) and the other
        replicas of its column (partial sums; a head's new subtrees)."""
        return ([(spec.replica, t) for t in range(spec.view.n_shards) if t != spec.shard]
                + [(r, spec.shard) for r in range(replicas) if r != spec.replica])

    def info(self) -> dict:
        """Where the cell runs: ``pid`` and ``host``."""
        return {"pid": os.getpid(), "host": socket.gethostname()}

    def connect(self, send: Send, replicas: int) -> None:
        """How to reach the cells of :meth:`targets`: ``send(target, key, payload, extra)``
        makes the transport call ``deliver(key, payload, extra)`` on the cell ``target``."""
        self.send = send
        self.peers = tuple(t for t in range(self.spec.view.n_shards) if t != self.spec.shard)
        self.replicas = replicas

    def deliver(self, key: tuple, payload, extra=None) -> None:
        """A peer's message (called by the transport, on any thread)."""
        self.mailbox.put(key, (payload, extra))

    def waits_for(self) -> str:
        """What this cell's step is waiting for now, in words ('' when it is not waiting)."""
        return describe_wait(self.mailbox.missing())

    def abort(self, lost: int | None = None) -> None:
        """Stops a step waiting for a peer (:class:`Aborted`, or :class:`PeerLost` naming the
        cell ``lost``); the cell takes no further step."""
        self.mailbox.abort(lost)

    def close(self) -> None:
        """Aborts and gives back the BLAS limits and the allocator's settings (the cell's
        process may outlive it)."""
        self.abort()
        self.part = None
        restore_allocator()
        if self._limits is not None:
            self._limits.restore_original_limits()
            self._limits = None

    # ------------------------------------------------------------ the model
    def load(self, payload, regularization: Regularization | None) -> None:
        """The part of a run's starting model its shard holds (pickled, as every cell of
        the shard receives it once per run)."""
        t0 = perf_counter()
        self.part = None  # the last run's part: not kept while the new one is unpickled
        # the part is this cell's own (unpickled here), so its M-step may take it apart as it goes
        self.part = ShardPart(self.spec.view, self.spec.shard, pickle.loads(payload), regularization, private=True)
        self.received_s += perf_counter() - t0

    def update(self, iteration: int, skeleton) -> None:
        """The next model after ``iteration``'s M-step: the coordinator's new skeleton
        (pickled) and the shard's new subtrees, which the head sends to the other cells of
        its column and they wait for."""
        t0 = perf_counter()
        new = pickle.loads(skeleton)
        if not self.head:
            ((owned, _),) = self.mailbox.take([(SUBTREES, iteration)])
            self.part.apply(new, pickle.loads(owned))
        else:
            for r in range(1, self.replicas):
                self.send((r, self.spec.shard), (SUBTREES, iteration), self.pending, None)
            self.pending = b""
            self.part.apply(new)
        self.received_s += perf_counter() - t0

    def owned(self) -> dict[str, Node]:
        """The shard's current subtrees (asked of a head)."""
        return self.part.owned()

    # ------------------------------------------------------------ one iteration
    def run(self, iteration: int) -> tuple[ShareReport, bytes | None, int]:
        """One E-step on the cell's part, then the cell's part of its column's tree reduce
        (:func:`executors.mstep.column_reduce`: partial sums sent, pickled, to the cell's
        receiver in the column, and taken from its mailbox as they come); the head then runs
        its shard's M-step. Returns the cell's report (its ``stats_bytes`` what it sent),
        on a head its pickled :class:`ColumnReport` (else None), and the bytes of the new
        subtrees the head sends each other cell of its column at the update (else 0)."""
        blocks = iter(range(1 << 62))
        spec = self.spec

        def exchange(mine: dict) -> dict:
            block = next(blocks)
            message = coupling.pack(mine, spec.roots)
            for peer in self.peers:
                self.send((spec.replica, peer), (COUPLING, iteration, block, spec.shard), message, None)
            got = self.mailbox.take([(COUPLING, iteration, block, p) for p in self.peers])
            messages = {p: np.frombuffer(payload) for p, (payload, _) in zip(self.peers, got)}
            messages[spec.shard] = message
            return coupling.merge([messages[s] for s in range(len(spec.replica_roots))], spec.replica_roots)

        share = self.step.run(self.part.part, exchange, iteration)
        share.receive_s, self.received_s = self.received_s, 0.0
        stats, share.stats = share.stats, None  # the running sum holds them now
        t0 = perf_counter()
        pushed = received = 0

        def receive(replica: int) -> Partial:
            nonlocal received
            ((blob, loglik),) = self.mailbox.take([(STATS, iteration, replica)])
            received += len(blob)
            return pickle.loads(blob), loglik

        def send(replica: int, partial: Partial) -> None:
            nonlocal pushed
            blob = pickle.dumps(partial[0], protocol=PROTOCOL)
            pushed = len(blob)
            share.peak_bytes = self.meter.peak_bytes()  # the partial sum's pickle too
            self.send((replica, spec.shard), (STATS, iteration, spec.replica), blob, partial[1])

        column = column_reduce(spec.replica, self.replicas, stats, share.loglik, receive, send)
        del stats
        if column is None:
            share.peak_bytes = max(share.peak_bytes, self.meter.peak_bytes())
            return share.report(spec.name, pushed, self.meter.baseline_bytes), None, 0
        reduce_s = perf_counter() - t0
        totals = list(column)
        del column
        loglik = totals.pop()
        out = self.part.estimate(totals.pop(), loglik)  # the only reference to the column's totals
        out.reduce_s, out.reduce_bytes = reduce_s, received
        self.pending = self.part.pending_payload() if self.replicas > 1 else b""
        share.peak_bytes = self.meter.peak_bytes()  # the reduce's and the M-step's too
        return share.report(spec.name, pushed, self.meter.baseline_bytes), report_payload(out), len(self.pending)
