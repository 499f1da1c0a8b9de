"""A grid cell as a long-lived actor on a cluster engine (Dask, Ray), and the coordinator's
side of a grid of them: what the ``dask`` and ``ray`` executors share.

A :class:`Cell` lives in an engine's worker process for the whole fit. It opens its own rows
once when it starts (from the dataset's ``.npy`` files, only its row range; or the rows the
coordinator shipped it once, for data held in memory), keeps them, and holds its shard's part
of the model (:class:`executors.mstep.ShardPart`), received once per run (:meth:`Cell.load`).
Every message between cells is *pushed* by the sender (an actor call the engine carries
worker to worker, the coordinator not involved) into the receiver's :class:`Mailbox`, keyed
so that it may arrive in any order and before the receiver has started waiting for it:

- **coupling**, per block: each cell's :mod:`executors.coupling` message to the other
  shards of its replica;
- **column reduce**, per iteration: the cells of shard ``s``'s column sum its statistics
  and log-likelihood by a tree reduce (:func:`executors.mstep.column_reduce`), each cell
  ``(r, s)``, ``r > 0``, pushing its pickled partial sum to its receiver; the column's
  *head* ``(0, s)`` ends with the totals and runs its shard's M-step;
- **update**, per iteration: the head's new subtrees to the other cells of its column.

The coordinator sends each cell its part once per run and the new skeleton per iteration,
and receives every cell's :class:`executors.step.ShareReport` and each head's pickled
:class:`executors.mstep.ColumnReport`; it never holds a shard's subtrees but when it fetches
them (:meth:`Cell.owned`).

A cell runs its steps on a thread of its own (Dask: a thread the cell starts per call, since
the worker's actor thread is shared by every actor of the process; Ray: a threaded actor), so
that deliveries from its peers are taken while it waits. When a fit fails, the coordinator
*aborts* every cell: a cell waiting for a peer that died raises at once instead of waiting
forever.

The testing hooks (``EMGRID_FAULT``, ``EMGRID_THREAD_PROBE``) travel to the cells explicitly:
an engine's worker processes were started before the fit, with their own environment.
"""

from __future__ import annotations

import importlib

import os
import pickle
import socket
import threading
import traceback
from collections.abc import Callable, Sequence
from time import perf_counter

from emgrid.models import Node
from emgrid.models.data import Data
from emgrid.models.errors import ConfigError, FitError
from emgrid.models.regularize import Regularization

from . import coupling, faults
from .datafiles import NpyDataset
from .loop import GridOutcome, critical_path
from .memory import PeakMeter, warm_up
from .mstep import ColumnReport, Partial, ShardPart, column_reduce, report_payload
from .step import PROTOCOL, ShareReport, WorkerSpec, WorkerStep
from .threads import PROBE_ENV, environment, probe

#: The environment variables of the testing hooks that the coordinator forwards to its cells.
FORWARDED_ENV = (faults.ENV, PROBE_ENV)

#: ``send((replica, shard), key, message)``: an engine's delivery of one message to another
#: cell (its ``deliver(key, message)``), not waited for.
Send = Callable[[tuple[int, int], tuple, object], None]


def forwarded_env() -> dict[str, str]:
    """The testing hooks set in this (the coordinator's) environment, for the cells."""
    return {k: os.environ[k] for k in FORWARDED_ENV if os.environ.get(k)}


class MissingExtraError(ConfigError, ImportError):
    """An executor whose optional dependency is not installed (a configuration error that
    is also an ImportError)."""


def import_extra(engine: str, package: str):
    """The module ``package`` of an engine's optional dependency, or the one-line error that
    names its install line when it is not installed."""
    try:
        return importlib.import_module(package)
    except ImportError:
        raise MissingExtraError(f'the "{engine}" executor needs {package}, which is not installed: '
                                f'pip install "emgrid[{engine}]"') from None


class Aborted(RuntimeError):
    """The coordinator stopped the fit while this cell waited for a peer."""


#: Mailbox keys: ``(COUPLING, iteration, block, shard)`` a peer shard's coupling message;
#: ``(STATS, iteration, replica)`` a replica's pickled partial sum of its column's statistics
#: and its log-likelihood, at its receiver in the column's tree reduce; ``(SUBTREES,
#: iteration)`` the head's pickled new subtrees, at the other cells of its column.
COUPLING, STATS, SUBTREES = "coupling", "stats", "subtrees"


class Mailbox:
    """Messages from the cell's peers, by key (the kinds above), taken by the cell's step."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._box: dict[tuple, object] = {}
        self._waiting: Sequence[tuple] = ()
        self._aborted = False

    def put(self, key: tuple, message) -> None:
        with self._cond:
            if not self._aborted:
                self._box[key] = message
                self._cond.notify_all()

    def take(self, keys: Sequence[tuple]) -> list:
        """The messages of ``keys`` (removed), waiting until all are in or the fit is aborted."""
        with self._cond:
            self._waiting = keys
            try:
                self._cond.wait_for(lambda: self._aborted or all(k in self._box for k in keys))
            finally:
                self._waiting = ()
            if self._aborted:
                raise Aborted("the coordinator stopped the fit")
            return [self._box.pop(k) for k in keys]

    def missing(self) -> list[tuple]:
        """The keys a waiting step still lacks (empty when it does not wait)."""
        with self._cond:
            return [k for k in self._waiting if k not in self._box]

    def abort(self) -> None:
        with self._cond:
            self._aborted = True
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
    """One grid cell on an engine's worker: its rows, its worker step, its part of the model
    (:class:`executors.mstep.ShardPart`) and its mailbox; on a column head (replica 0) also
    its shard's column reduce and M-step.

    ``directory``: an :class:`NpyDataset` the cell maps its rows from; otherwise ``rows``:
    the rows of its replica, restricted to its shard's columns (shipped once). ``model``: its
    shard's part of the starting model (to warm up and select its columns; its part for the
    fit comes with :meth:`load`). ``env``: the testing hooks' variables, set while the cell
    starts. ``blas_threads`` limits BLAS and OpenMP in the cell's process from its start
    until :meth:`close`.

    An engine supplies only :meth:`connect`'s ``send`` and calls :meth:`deliver` with what
    another cell sent; everything else is here.
    """

    def __init__(self, spec: WorkerSpec, model: Node, directory: str | None, rows: Data | None,
                 blas_threads: int | None, env: dict[str, str]):
        self.spec = spec
        self._limits = None
        if blas_threads is not None:
            from threadpoolctl import threadpool_limits

            self._limits = threadpool_limits(limits=blas_threads)
        with environment(env):
            for root in spec.roots:
                warm_up(model.node_at(root))
            self.meter = PeakMeter()
            if directory is not None:
                rows = NpyDataset(directory).open_rows(spec.start, spec.stop)
            self.step = WorkerStep(model, spec, rows, self.meter)
            probe(spec.name)
        self.mailbox = Mailbox()
        self.peers: tuple[int, ...] = ()  # the other shards of the replica
        self.replicas = 1  # the cells of its column
        self.send: Send | None = None
        self.part: ShardPart | None = None

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
        """How to reach the cells of :meth:`targets` (``send(target, key, message)`` makes the
        engine call ``deliver(key, message)`` on the cell ``target``, without waiting)."""
        spec = self.spec
        self.send = send
        self.peers = tuple(t for t in range(spec.view.n_shards) if t != spec.shard)
        self.replicas = replicas

    def deliver(self, key: tuple, message) -> None:
        """A peer's message (called by the engine, on any thread)."""
        self.mailbox.put(key, message)

    def waits_for(self) -> str:
        """What this cell's step is waiting for now, in words ('' when it is not waiting)."""
        return describe_wait(self.mailbox.missing())

    def abort(self) -> None:
        """Stops a step waiting for a peer (:class:`Aborted`); the cell takes no further step."""
        self.mailbox.abort()

    def close(self) -> None:
        """Aborts and gives back the BLAS limits (the cell's process outlives it)."""
        self.abort()
        self.part = None
        if self._limits is not None:
            self._limits.restore_original_limits()
            self._limits = None

    # ------------------------------------------------------------ the model
    def load(self, payload: bytes, regularization: Regularization | None) -> None:
        """The part of a run's starting model its shard holds (pickled, as every cell of
        the shard receives it once per run)."""
        # the part is this cell's own (unpickled here), so its M-step may take it apart as it goes
        self.part = ShardPart(self.spec.view, self.spec.shard, pickle.loads(payload), regularization, private=True)

    def update(self, iteration: int, skeleton: bytes) -> int:
        """The next model after ``iteration``'s M-step: the coordinator's new skeleton
        (pickled) and the shard's new subtrees, which the head pushes to the other cells of
        its column and they wait for. Returns the bytes of the subtrees the head pushed (to
        each; 0 elsewhere)."""
        new = pickle.loads(skeleton)
        if not self.head:
            (owned,) = self.mailbox.take([(SUBTREES, iteration)])
            self.part.apply(new, pickle.loads(owned))
            return 0
        sent = 0
        if self.replicas > 1:
            blob = self.part.pending_payload()
            sent = len(blob)
            for r in range(1, self.replicas):
                self.send((r, self.spec.shard), (SUBTREES, iteration), blob)
            del blob
        self.part.apply(new)
        return sent

    def owned(self) -> dict[str, Node]:
        """The shard's current subtrees (asked of a head)."""
        return self.part.owned()

    # ------------------------------------------------------------ one iteration
    def run(self, iteration: int) -> tuple[ShareReport, bytes | None]:
        """One E-step on the cell's part, then the cell's part of its column's tree reduce
        (:func:`executors.mstep.column_reduce`: partial sums pushed, pickled, to the cell's
        receiver in the column, and taken from its mailbox as they come); the head then runs
        its shard's M-step and returns its pickled :class:`ColumnReport` beside its report,
        any other cell None. The report's ``stats_bytes`` is what the cell pushed."""
        blocks = iter(range(1 << 62))
        spec = self.spec

        def exchange(mine: dict) -> dict:
            block = next(blocks)
            message = coupling.pack(mine, spec.roots)
            for peer in self.peers:
                self.send((spec.replica, peer), (COUPLING, iteration, block, spec.shard), message)
            got = self.mailbox.take([(COUPLING, iteration, block, p) for p in self.peers])
            messages = dict(zip(self.peers, got))
            messages[spec.shard] = message
            return coupling.merge([messages[s] for s in range(len(spec.replica_roots))], spec.replica_roots)

        share = self.step.run(self.part.part, exchange, iteration)
        stats, share.stats = share.stats, None  # the running sum holds them now
        t0 = perf_counter()
        pushed = received = 0

        def receive(replica: int) -> Partial:
            nonlocal received
            (blob, loglik), = self.mailbox.take([(STATS, iteration, replica)])
            received += len(blob)
            return pickle.loads(blob), loglik

        def send(replica: int, partial: Partial) -> None:
            nonlocal pushed
            blob = pickle.dumps(partial[0], protocol=PROTOCOL)
            pushed = len(blob)
            self.send((replica, spec.shard), (STATS, iteration, spec.replica), (blob, partial[1]))

        column = column_reduce(spec.replica, self.replicas, stats, share.loglik, receive, send)
        del stats
        if column is None:
            share.peak_bytes = self.meter.peak_bytes()  # the reduce's partial sums too
            return share.report(spec.name, pushed, self.meter.baseline_bytes), None
        reduce_s = perf_counter() - t0
        totals = list(column)
        del column
        loglik = totals.pop()
        out = self.part.estimate(totals.pop(), loglik)  # the only reference to the column's totals
        out.reduce_s, out.reduce_bytes = reduce_s, received
        share.peak_bytes = self.meter.peak_bytes()  # the reduce's and the M-step's too
        return share.report(spec.name, pushed, self.meter.baseline_bytes), report_payload(out)


def shipped_rows(spec: WorkerSpec, model_part: Node, data: Data) -> Data:
    """What the coordinator ships a cell of in-memory data: its replica's rows, only the
    columns its shard reads (views; the engine serializes them once)."""
    from emgrid.models import take_rows

    return spec.view.columns_for(spec.shard, model_part, take_rows(data, spec.start, spec.stop))


def describe_error(e: BaseException) -> tuple[str, str]:
    """A worker's exception as ``(one-line summary, traceback)``."""
    summary = traceback.format_exception_only(type(e), e)[-1].strip()
    return summary, "".join(traceback.format_exception(type(e), e, e.__traceback__))


def failed(who: str, when: str, e: BaseException) -> FitError:
    """The FitError of a cell whose step or start raised ``e``."""
    summary, trace = describe_error(e)
    err = FitError(f"{who} failed {when}: {summary}")
    err.add_note(f"the worker's traceback:\n{trace.rstrip()}")
    return err


def outcome(got: Sequence[tuple[ShareReport, bytes | None]], shape: tuple[int, int], wall_s: float) -> GridOutcome:
    """The grid's E-step and its columns' M-steps from every cell's report and every head's
    pickled :class:`ColumnReport` (grid order: the heads are the first ``M``)."""
    t0 = perf_counter()
    m = shape[1]
    reports = [report for report, _ in got]
    blobs = [blob for _, blob in got[:m]]
    columns: list[ColumnReport] = [pickle.loads(blob) for blob in blobs]
    phases = critical_path(reports, wall_s)
    # the heads' M-steps are timed as such (loop.run_em); what is left beyond the busiest
    # worker is the column reduces and the reports' way here, and their unpickling
    phases["reduce_s"] = max(0.0, phases["reduce_s"] - max(c.mstep_s for c in columns)) + perf_counter() - t0
    return GridOutcome(columns=columns, **phases, coupling_bytes=sum(r.coupling_bytes for r in reports),
                       reduce_bytes=sum(r.stats_bytes for r in reports) + sum(len(b) for b in blobs),
                       peak_bytes={r.worker: r.peak_bytes for r in reports},
                       baseline_bytes={r.worker: r.baseline_bytes for r in reports})


def no_answer(who, cells: Sequence[WorkerSpec], pending: Sequence[int], waits: dict[int, str],
              timeout_s: float, when: str) -> FitError:
    """The FitError of cells that did not answer in time: those not waiting for a peer are
    named first (the ones that hang); the others are said to wait for them
    (``waits[i]``: :meth:`Cell.waits_for`)."""
    stuck = [i for i in pending if not waits.get(i)] or list(pending)
    err = FitError(f"no answer within {timeout_s:g} s {when} from {', '.join(who(i) for i in stuck)}")
    for i in pending:
        if i not in stuck and waits.get(i):
            err.add_note(f"{who(i)} {waits[i]}")
    return err


def check_timeouts(timeout_s, startup_timeout_s) -> None:
    """ConfigError unless ``timeout_s`` is None or > 0 and ``startup_timeout_s`` > 0."""
    if timeout_s is not None and not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
        raise ConfigError(f"timeout_s must be > 0 or None, got {timeout_s!r}")
    if not (isinstance(startup_timeout_s, (int, float)) and startup_timeout_s > 0):
        raise ConfigError(f"startup_timeout_s must be > 0, got {startup_timeout_s!r}")
