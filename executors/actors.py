"""A grid cell as a long-lived actor on a cluster engine (Dask, Ray), and the coordinator's
side of a grid of them: what the ``dask`` and ``ray`` executors share.

A :class:`Cell` lives in an engine's worker process for the whole fit. It opens its own rows
once when it starts (from the dataset's ``.npy`` files, only its row range; or the rows the
coordinator shipped it once, for data held in memory), keeps them, and runs the shared
:class:`executors.step.WorkerStep` once per model it receives. The shards of a replica
exchange their per-block log densities directly: each cell *pushes* its
:mod:`executors.coupling` message for a block to every other shard's cell (an actor call the
engine carries worker to worker) and waits in its :class:`Mailbox` for theirs. Messages are
keyed by ``(iteration, block, shard)``, so they may arrive in any order and before the
receiver has started the iteration. The coordinator never sees the coupling; it sends each
cell its shard's pickled model and receives its pickled statistics and
:class:`executors.step.ShareReport`, as under ``multiprocessing``.

A cell runs its steps on a thread of its own (Dask: a one-thread pool the cell owns, since
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

import numpy as np

from emgrid.models import Node
from emgrid.models.data import Data
from emgrid.models.errors import ConfigError, FitError

from . import coupling, faults
from .datafiles import NpyDataset
from .loop import GridOutcome, critical_path
from .memory import PeakMeter, warm_up
from .step import ShareReport, WorkerShare, WorkerSpec, WorkerStep, reduce_shares
from .threads import PROBE_ENV, environment, probe

#: The environment variables of the testing hooks that the coordinator forwards to its cells.
FORWARDED_ENV = (faults.ENV, PROBE_ENV)

#: ``send(peer_shard, iteration, block, shard, message)``: an engine's delivery of one message.
Send = Callable[[int, int, int, int, np.ndarray], None]


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


class Mailbox:
    """Coupling messages from the other shards of the replica, by ``(iteration, block, shard)``."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._box: dict[tuple[int, int, int], np.ndarray] = {}
        self._waiting: Sequence[tuple[int, int, int]] = ()
        self._aborted = False

    def put(self, key: tuple[int, int, int], message: np.ndarray) -> None:
        with self._cond:
            self._box[key] = message
            self._cond.notify_all()

    def take(self, keys: Sequence[tuple[int, int, int]]) -> list[np.ndarray]:
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

    def missing(self) -> list[int]:
        """The shards whose messages a waiting step still lacks (empty when it does not wait)."""
        with self._cond:
            return [k[2] for k in self._waiting if k not in self._box]

    def abort(self) -> None:
        with self._cond:
            self._aborted = True
            self._box.clear()
            self._cond.notify_all()


class Cell:
    """One grid cell on an engine's worker: its rows, its worker step and its mailbox.

    ``directory``: an :class:`NpyDataset` the cell maps its rows from; otherwise ``rows``:
    the rows of its replica, restricted to its shard's columns (shipped once). ``env``: the
    testing hooks' variables, set while the cell starts. ``blas_threads`` limits BLAS and
    OpenMP in the cell's process from its start until :meth:`close`.
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
        self.peers: tuple[int, ...] = ()
        self.send: Send | None = None

    def info(self) -> dict:
        """Where the cell runs: ``pid`` and ``host``."""
        return {"pid": os.getpid(), "host": socket.gethostname()}

    def connect(self, send: Send, peers: Sequence[int]) -> None:
        """How to reach the other shards of the replica (``peers``: their shard numbers)."""
        self.send, self.peers = send, tuple(sorted(peers))

    def deliver(self, iteration: int, block: int, shard: int, message: np.ndarray) -> None:
        """A peer's message for one block (called by the engine, on any thread)."""
        self.mailbox.put((iteration, block, shard), message)

    def waits_for(self) -> list[int]:
        """The peers (shards) whose coupling messages this cell's step is waiting for now."""
        return self.mailbox.missing()

    def abort(self) -> None:
        """Stops a step waiting for a peer (:class:`Aborted`); the cell takes no further step."""
        self.mailbox.abort()

    def close(self) -> None:
        """Aborts and gives back the BLAS limits (the cell's process outlives it)."""
        self.abort()
        if self._limits is not None:
            self._limits.restore_original_limits()
            self._limits = None

    def run(self, iteration: int, payload: bytes) -> tuple[ShareReport, bytes]:
        """One E-step on the model in ``payload`` (its shard's part, pickled)."""
        t0 = perf_counter()
        model = pickle.loads(payload)
        received = perf_counter() - t0
        blocks = iter(range(1 << 62))
        spec = self.spec

        def exchange(mine: dict) -> dict:
            block = next(blocks)
            message = coupling.pack(mine, spec.roots)
            for peer in self.peers:
                self.send(peer, iteration, block, spec.shard, message)
            got = self.mailbox.take([(iteration, block, p) for p in self.peers])
            messages = dict(zip(self.peers, got))
            messages[spec.shard] = message
            return coupling.merge([messages[s] for s in range(len(spec.replica_roots))], spec.replica_roots)

        share = self.step.run(model, exchange, iteration)
        share.receive_s = received
        blob = share.payload()
        return share.report(spec.name, len(blob), self.meter.baseline_bytes), blob


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


def outcome(got: Sequence[tuple[ShareReport, bytes]], shape: tuple[int, int], wall_s: float) -> GridOutcome:
    """The grid's E-step from every cell's report and pickled statistics (grid order)."""
    shares: list[WorkerShare] = []
    reduce_bytes = 0
    peaks, baselines = {}, {}
    for report, payload in got:
        shares.append(report.share(pickle.loads(payload)))
        reduce_bytes += len(payload)
        peaks[report.worker], baselines[report.worker] = report.peak_bytes, report.baseline_bytes
    d, m = shape
    stats, total = reduce_shares([shares[r * m:(r + 1) * m] for r in range(d)])
    return GridOutcome(stats=stats, loglik=total, **critical_path(shares, wall_s),
                       coupling_bytes=sum(s.coupling_bytes for s in shares), reduce_bytes=reduce_bytes,
                       peak_bytes=peaks, baseline_bytes=baselines)


def no_answer(who, cells: Sequence[WorkerSpec], pending: Sequence[int], waits: dict[int, list[int]],
              timeout_s: float, when: str) -> FitError:
    """The FitError of cells that did not answer in time: those not waiting for a peer are
    named first (the ones that hang); the others are said to wait for them."""
    stuck = [i for i in pending if not waits.get(i)] or list(pending)
    err = FitError(f"no answer within {timeout_s:g} s {when} from {', '.join(who(i) for i in stuck)}")
    for i in pending:
        if i not in stuck:
            err.add_note(f"{who(i)} waits for the coupling message of shard(s) {waits[i]}")
    return err


def check_timeouts(timeout_s, startup_timeout_s) -> None:
    """ConfigError unless ``timeout_s`` is None or > 0 and ``startup_timeout_s`` > 0."""
    if timeout_s is not None and not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
        raise ConfigError(f"timeout_s must be > 0 or None, got {timeout_s!r}")
    if not (isinstance(startup_timeout_s, (int, float)) and startup_timeout_s > 0):
        raise ConfigError(f"startup_timeout_s must be > 0, got {startup_timeout_s!r}")
