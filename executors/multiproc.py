"""The multiprocessing executor: one worker process per grid cell on this machine.

Bytes move over pipes, and no process holds the whole model (:mod:`executors.mstep`):

- the parent (the coordinator) sends each worker its shard's pickled part of the model
  once per run (:class:`executors.mstep.ShardPart`), then per iteration a step command;
- the shards of a replica exchange their per-row log densities directly, over one pipe
  per pair of shards, as :mod:`executors.coupling`'s flat messages;
- the statistics of shard ``s`` are reduced over the workers of its column by the tree
  of :func:`executors.mstep.tree_rounds` (pickled partial sums and log-likelihoods, over
  one pipe per pair of the tree) to the column's head, the worker of cell ``(0, s)``,
  which runs its shard's M-step and sends the parent only its
  :class:`executors.mstep.ColumnReport`. Every worker sends the parent its
  :class:`executors.step.ShareReport` (timings, memory);
- the parent sends the new skeleton to every worker; each head sends its new subtrees
  down the same tree to the other workers of its column, and the parent fetches a
  shard's subtrees from its head only when asked (:meth:`ProcessGrid.fetch`).

Rows never pass through the parent: the data lives in ``.npy`` files (written once to a
run-tagged scratch folder when the caller gave arrays, :class:`executors.scratch.Scratch`,
removed however the fit ends) that every worker maps for its own row range only.

Workers start with the ``spawn`` (or ``forkserver``) method and with BLAS and OpenMP limited
to ``blas_threads`` threads (one by default, :mod:`executors.threads`): processes each
running several BLAS threads on the same cores are many times slower than one thread each.

A worker's target and arguments are emgrid's own, so it needs nothing from the caller's
``__main__``, which is hidden from spawn's preparation while workers start
(:func:`_main_hidden`): a plain script without an ``if __name__ == "__main__":`` guard runs
once and fits. Only a model with a node class defined in ``__main__`` makes the workers
import the script (to unpickle it), which then needs the guard.

A SIGTERM to the parent while it runs a fit (with the default action in place) unwinds it:
the workers stop and the temporary copy of the data goes, then the process exits 143.

A worker that raises or dies stops the fit with a FitError naming it and the iteration;
the parent never blocks on a dead worker. When one worker fails, the workers it exchanges
with (the other shards of its replica, its column's head or the column's other replicas)
lose their pipes to it and report that too; the parent names the worker that failed first
(an error it reported, or a death), not the peers that stopped because of it.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import signal
import struct
import sys
import threading
import traceback
from contextlib import contextmanager
from multiprocessing.connection import Connection, wait
from time import perf_counter
from typing import ClassVar

import numpy as np

from emgrid.models import Node
from emgrid.models.errors import ConfigError, FitError
from emgrid.models.regularize import Regularization

from . import coupling
from .datafiles import NpyDataset
from .loop import GridOutcome, critical_path, run_em
from .memory import PeakMeter, map_large_blocks, warm_up
from .mstep import ShardPart, column_reduce, report_payload, tree_role, tree_rounds, update_bytes
from .protocol import BaseExecutor, FitJob
from .result import FitResult
from .scratch import Scratch, set_parent_death_signal
from .step import PROTOCOL, WorkerSpec, WorkerStep, grid_layout
from .threads import DEFAULT_BLAS_THREADS, check_blas_threads, environment, limited, probe, thread_env

#: Seconds the parent keeps listening, after a worker reports that it lost a peer, for the
#: peer's own error report or death (the cause, which it names instead).
_CAUSE_GRACE_S = 5.0
_LOGLIK = struct.Struct("<d")  # a partial sum's log-likelihood, as it goes up its column's tree


class _PeerLost(Exception):
    """A pipe to another worker (of the replica, or of the column) broke: that worker failed."""

    def __init__(self, index: int):
        super().__init__(index)
        self.index = index  # the peer's grid index


def _worker_main(spec: WorkerSpec, d: int, directory: str, model: Node, control: Connection,
                 peers: dict[int, Connection], column: dict[int, Connection],
                 regularization: Regularization | None = None,
                 blas_threads: int | None = DEFAULT_BLAS_THREADS) -> None:
    """A worker process: map its rows, then serve the parent's commands until told to stop.

    ``d``: the replicas of the grid. ``peers``: by shard, the pipes to the other shards of
    its replica; ``column``: by replica, the pipes to the workers of its column it meets in
    the column's tree reduce (:func:`executors.mstep.tree_rounds`). It dies with the
    process that started it (a worker busy in a step would not read its pipe's end soon)."""
    parent = mp.parent_process()
    if parent is not None:
        set_parent_death_signal(signal.SIGKILL, parent.pid)
    with limited(blas_threads):
        _serve(spec, d, directory, model, control, peers, column, regularization)


def _serve(spec: WorkerSpec, d: int, directory: str, model: Node, control: Connection,
           peers: dict[int, Connection], column: dict[int, Connection],
           regularization: Regularization | None) -> None:
    try:
        map_large_blocks()
        for root in spec.roots:
            warm_up(model.node_at(root))  # its shard's subtrees: the others are not in its model
        meter = PeakMeter()  # after the imports and the warm-up, before the rows: see executors.memory
        step = WorkerStep(model, spec, NpyDataset(directory).open_rows(spec.start, spec.stop), meter)
        del model  # each run's part comes with its broadcast
        probe(spec.name)
        children, parent = tree_role(spec.replica, d)
        cell = _Column(spec, column)
        control.send(("ready", None))
        part: ShardPart | None = None
        received = 0.0  # seconds spent taking in the model since the last step
        pending = b""  # a head's new subtrees, pickled for the rest of its column
        while True:
            command, arg = control.recv()
            if command == "stop":
                return
            t0 = perf_counter()
            if command == "part":
                part = None  # the last run's part: not kept while the new one is unpickled
                part = ShardPart(spec.view, spec.shard, pickle.loads(control.recv_bytes()), regularization,
                                 private=True)
                received += perf_counter() - t0
            elif command == "update":  # the skeleton from the parent, the subtrees down the column's tree
                skeleton = pickle.loads(control.recv_bytes())
                if parent is not None:
                    pending = cell.recv(parent)
                for r in reversed(children):  # the largest subtree first
                    cell.send(r, pending)
                if parent is None:
                    part.apply(skeleton)
                else:
                    part.apply(skeleton, pickle.loads(pending))
                pending = b""
                del skeleton
                received += perf_counter() - t0
            elif command == "fetch":
                blob = pickle.dumps(part.owned(), protocol=PROTOCOL)
                control.send(("bytes", None))
                control.send_bytes(blob)
                del blob
            elif command == "step":
                share = step.run(part.part, lambda mine: _exchange(spec, peers, mine), arg)
                share.receive_s, received = received, 0.0
                pending = _reduce(spec, d, part, share, cell, meter, control)
                del share
            else:
                raise RuntimeError(f"unknown command {command!r}")
    except _PeerLost as e:
        try:
            control.send(("lost", e.index))
        except OSError:
            pass
    except (EOFError, BrokenPipeError, ConnectionResetError, KeyboardInterrupt):
        return  # the parent went away
    except BaseException as e:
        try:
            summary = traceback.format_exception_only(type(e), e)[-1].strip()
            control.send(("error", (summary, traceback.format_exc())))
        except OSError:
            pass


class _Column:
    """A worker's pipes to the other workers of its column (by replica); a broken one is
    that worker's failure (:class:`_PeerLost`)."""

    def __init__(self, spec: WorkerSpec, conns: dict[int, Connection]):
        self.spec, self.conns = spec, conns

    def _lost(self, replica: int) -> _PeerLost:
        return _PeerLost(replica * self.spec.view.n_shards + self.spec.shard)

    def send(self, replica: int, blob: bytes) -> None:
        try:
            self.conns[replica].send_bytes(blob)
        except OSError:
            raise self._lost(replica) from None

    def recv(self, replica: int) -> bytes:
        try:
            return self.conns[replica].recv_bytes()
        except (EOFError, OSError):
            raise self._lost(replica) from None


def _reduce(spec: WorkerSpec, d: int, part: ShardPart, share, cell: _Column, meter: PeakMeter,
            control: Connection) -> bytes:
    """This worker's part of its column's tree reduce (:func:`executors.mstep.column_reduce`)
    and its report to the parent: a partial sum's sender reports before it sends (so a
    worker the parent still waits for is computing or waiting for its column, never for
    its receiver); the head runs its shard's M-step and reports its column. Returns, on a
    head with other replicas, its new subtrees pickled for them (else empty)."""
    t0 = perf_counter()
    moved = 0

    def receive(r: int):
        nonlocal moved
        (loglik,) = _LOGLIK.unpack(cell.recv(r))
        blob = cell.recv(r)
        moved += len(blob)
        return pickle.loads(blob), loglik

    def send(r: int, partial) -> None:
        stats, loglik = partial
        blob = pickle.dumps(stats, protocol=PROTOCOL)
        share.peak_bytes = meter.peak_bytes()
        control.send(("share", share.report(spec.name, len(blob), meter.baseline_bytes)))
        cell.send(r, _LOGLIK.pack(loglik))
        cell.send(r, blob)

    out = column_reduce(spec.replica, d, share.stats, share.loglik, receive, send)
    share.stats = None  # the partial sum holds them (or what replaced them) now
    if out is None:
        return b""
    box, loglik = [out[0]], out[1]
    del out
    report = part.estimate(box.pop(), loglik)  # the column's totals, passed as their only reference
    report.reduce_s = perf_counter() - t0 - report.mstep_s
    report.reduce_bytes = moved
    pending = part.pending_payload() if d > 1 else b""
    share.peak_bytes = meter.peak_bytes()
    control.send(("head", (share.report(spec.name, 0, meter.baseline_bytes), len(pending))))
    control.send_bytes(report_payload(report))
    return pending


def _exchange(spec: WorkerSpec, peers: dict[int, Connection], mine: dict) -> dict:
    """Allgather over the replica's shards: pairs in one global order, so no send waits forever.
    Messages are :mod:`executors.coupling`'s flat arrays; a received one is read in place."""
    message = coupling.pack(mine, spec.roots)
    messages = {spec.shard: message}
    for peer in sorted(peers):
        conn = peers[peer]
        try:
            if spec.shard < peer:
                conn.send_bytes(message)
                got = conn.recv_bytes()
            else:
                got = conn.recv_bytes()
                conn.send_bytes(message)
        except (EOFError, OSError):
            raise _PeerLost(spec.index - spec.shard + peer) from None
        messages[peer] = np.frombuffer(got)
    del message
    return coupling.merge([messages[s] for s in range(len(spec.replica_roots))], spec.replica_roots)


@contextmanager
def _main_hidden(model: Node):
    """Inside the block, spawn's preparation data do not name the caller's ``__main__``, so
    the workers started in it do not import (and run) the caller's script again.

    Spawn records ``__main__.__spec__.name`` or ``__main__.__file__`` for the child to import
    as ``__mp_main__``, only so that objects pickled from ``__main__`` resolve there. A
    worker's arguments reference ``__main__`` only when some node's class is defined in it:
    then nothing is hidden (and the script needs its main guard, as with any spawned worker).
    """
    main = sys.modules.get("__main__")
    if main is None or any(type(node).__module__ == "__main__" for _, node in model.nodes()):
        yield
        return
    missing = object()
    saved = {k: main.__dict__.get(k, missing) for k in ("__file__", "__spec__")}
    main.__dict__.pop("__file__", None)
    main.__spec__ = None
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is missing:
                main.__dict__.pop(k, None)
            else:
                main.__dict__[k] = v


class ProcessGrid:
    """The parent's side: one control pipe per worker, the workers' sentinels to notice deaths."""

    def __init__(self, job: FitJob, directory: str, context, timeout_s: float | None, startup_timeout_s: float,
                 blas_threads: int | None = DEFAULT_BLAS_THREADS):
        self.job, self.directory, self.context = job, directory, context
        self.blas_threads = blas_threads
        self.layout = grid_layout(job.model, job.plan)
        self.cells = [spec for row in self.layout for spec in row]  # in grid order, as the workers
        self.view = self.layout[0][0].view
        self.shape = (job.plan.data_parallel, job.plan.model_parallel)
        self.timeout_s = timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.iteration = 0
        self.pending_bytes = [0] * self.shape[1]  # each head's pickled new subtrees, as its last report said
        self.procs: list = []
        self.conns: list[Connection] = []

    def start(self) -> None:
        """Starts every worker and waits until each has mapped its rows."""
        job, directory, context = self.job, self.directory, self.context
        d, m = self.shape
        peer_ends: dict[tuple[int, int], dict[int, Connection]] = {(s.replica, s.shard): {} for s in self.cells}
        column_ends: dict[tuple[int, int], dict[int, Connection]] = {(s.replica, s.shard): {} for s in self.cells}
        for r in range(d):
            for i in range(m):
                for j in range(i + 1, m):
                    a, b = context.Pipe(duplex=True)
                    peer_ends[(r, i)][j] = a
                    peer_ends[(r, j)][i] = b
        for s in range(m):
            for receiver, sender in (pair for pairs in tree_rounds(d) for pair in pairs):
                a, b = context.Pipe(duplex=True)
                column_ends[(receiver, s)][sender] = a
                column_ends[(sender, s)][receiver] = b
        child_ends = []
        with environment(thread_env(self.blas_threads)), _main_hidden(job.model):
            for spec in self.cells:
                parent, child = context.Pipe(duplex=True)
                cell = (spec.replica, spec.shard)
                p = context.Process(target=_worker_main, name=f"emgrid-{spec.name}", daemon=True,
                                    args=(spec, d, directory, spec.view.model_for(spec.shard, job.model), child,
                                          peer_ends[cell], column_ends[cell], job.regularization,
                                          self.blas_threads))
                p.start()
                self.procs.append(p)
                self.conns.append(parent)
                child_ends.append(child)
        for c in child_ends:
            c.close()
        for ends in (*peer_ends.values(), *column_ends.values()):
            for c in ends.values():
                c.close()
        self._collect("while starting", self.startup_timeout_s)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def _who(self, i: int) -> str:
        s = self.cells[i]
        return f"worker {s.name!r} (replica {s.replica}, shard {s.shard}, pid {self.procs[i].pid})"

    def _died(self, i: int, when: str) -> FitError:
        p = self.procs[i]
        p.join(1.0)
        code = p.exitcode
        if code is None:
            how = "stopped answering"
        elif code < 0:
            how = f"was killed by signal {-code}"
        else:
            how = f"exited with code {code}"
        return FitError(f"{self._who(i)} {how} {when}")

    def _waiting(self, pending: set[int]) -> set[int]:
        """Of the ``pending`` workers, those that may only be waiting for their column: a
        worker reports after the partial sums of its subtree of the column's reduce
        (:func:`executors.mstep.tree_rounds`), so one with a pending worker below it waits."""
        d, m = self.shape
        below = {r: set(tree_role(r, d)[0]) for r in range(d)}
        changed = True
        while changed:  # each replica's whole subtree
            changed = False
            for r in range(d):
                deeper = set().union(*(below[c] for c in below[r])) - below[r]
                if deeper:
                    below[r] |= deeper
                    changed = True
        return {i for i in pending if any(r * m + i % m in pending for r in below[i // m])}

    def _send(self, i: int, message, payload: bytes | None = None, when: str = "") -> None:
        try:
            self.conns[i].send(message)
            if payload is not None:
                self.conns[i].send_bytes(payload)
        except OSError:
            raise self._died(i, when) from None

    def _collect(self, when: str, timeout_s: float | None, only: list[int] | None = None) -> list:
        """One message from every worker (or those in ``only``); raises FitError on an error
        report, a death or a timeout.

        A worker's error report or death is the cause and is raised at once. A worker that
        reports it lost a peer only points at the cause: the parent keeps listening a few
        seconds for the peer's own report or death, and names the peer either way.
        """
        out: list = [None] * len(self.conns)
        pending = {self.conns[i]: i for i in (range(len(self.conns)) if only is None else only)}
        sentinels = {self.procs[i].sentinel: i for i in pending.values()}
        deadline = None if timeout_s is None else perf_counter() + timeout_s
        lost: list[tuple[int, int]] = []  # (worker that reported, peer it lost)
        lost_at = 0.0  # when the first "lost" report arrived
        while pending:
            left = None if deadline is None else max(0.0, deadline - perf_counter())
            if lost:
                grace = max(0.0, lost_at + _CAUSE_GRACE_S - perf_counter())
                left = grace if left is None else min(left, grace)
            ready = wait(list(pending) + [s for s, i in sentinels.items() if self.conns[i] in pending], left)
            if not ready:
                if lost:
                    i, j = lost[0]
                    err = self._died(j, when)
                    err.add_note(f"{self._who(i)} lost its pipe to it")
                    raise err
                late = set(pending.values())
                late -= self._waiting(late)
                names = ", ".join(self._who(i) for i in sorted(late))
                raise FitError(f"no answer within {timeout_s:g} s {when} from {names}")
            for obj in ready:
                if obj in pending:
                    i = pending[obj]
                    try:
                        kind, body = obj.recv()
                        if kind == "error":
                            summary, trace = body
                            err = FitError(f"{self._who(i)} failed {when}: {summary}")
                            err.add_note(f"the worker's traceback:\n{trace.rstrip()}")
                            raise err
                        if kind == "lost":
                            if not lost:
                                lost_at = perf_counter()
                            lost.append((i, body))
                        else:
                            out[i] = (body, obj.recv_bytes()) if kind in ("head", "bytes") else body
                    except (EOFError, OSError):
                        raise self._died(i, when) from None
                    del pending[obj]
            for obj in ready:
                i = sentinels.get(obj)
                if i is not None and self.conns[i] in pending and not self.conns[i].poll():
                    raise self._died(i, when)
        if lost:  # every worker answered, some only that a peer was gone: the peer's end
            i, j = lost[0]
            raise self._died(j, when)
        return out

    def broadcast(self, model: Node, payloads: list[bytes]) -> None:
        for i, spec in enumerate(self.cells):
            self._send(i, ("part", None), payloads[spec.shard], f"before iteration {self.iteration + 1}")

    def e_step(self, iteration: int) -> GridOutcome:
        t0 = perf_counter()
        self.iteration = iteration
        when = f"in iteration {iteration}"
        for i in range(len(self.cells)):
            self._send(i, ("step", iteration), when=when)
        got = self._collect(when, self.timeout_s)
        m = self.shape[1]
        shares, columns, reduce_bytes = [], [], 0
        peaks, baselines = {}, {}
        for i, body in enumerate(got):
            if i < m:  # a head: its ShareReport and pending subtrees' size, and its pickled ColumnReport
                (report, self.pending_bytes[i]), payload = body
                column = pickle.loads(payload)
                columns.append(column)
                reduce_bytes += len(payload)
            else:  # a sender of a partial sum: its ShareReport counts what it sent
                report = body
                reduce_bytes += report.stats_bytes
            shares.append(report)
            peaks[report.worker], baselines[report.worker] = report.peak_bytes, report.baseline_bytes
        phases = critical_path(shares, perf_counter() - t0 - max(c.mstep_s for c in columns))
        return GridOutcome(columns=columns, **phases, coupling_bytes=sum(s.coupling_bytes for s in shares),
                           reduce_bytes=reduce_bytes, peak_bytes=peaks, baseline_bytes=baselines)

    def update(self, skeleton: Node, payload: bytes) -> int:
        when = f"after iteration {self.iteration}"
        for i in range(len(self.cells)):
            self._send(i, ("update", None), payload, when)
        return update_bytes(self.view, self.shape[0], len(payload), self.pending_bytes)

    def fetch(self, shard: int) -> dict[str, Node]:
        if not self.procs or self.conns[shard].closed:
            raise FitError("the fit's workers have stopped: its shards can no longer be fetched")
        when = f"while sending shard {shard}'s subtrees after iteration {self.iteration}"
        self._send(shard, ("fetch", None), when=when)
        _, payload = self._collect(when, self.timeout_s, only=[shard])[shard]
        return pickle.loads(payload)

    def close(self, failed: bool = False) -> None:
        """Stops every worker: asks them to stop (up to 5 s in all), then terminates and kills.

        After a failed fit (``failed``) the workers have nothing left to do and some may be
        stuck waiting on a dead peer or hung: they are terminated at once.
        """
        if not failed:
            for c in self.conns:
                try:
                    c.send(("stop", None))
                except OSError:
                    pass
            deadline = perf_counter() + 5.0
            for p in self.procs:
                p.join(max(0.0, deadline - perf_counter()))
        for p in self.procs:
            if p.is_alive():
                p.terminate()
        for p in self.procs:
            p.join(2.0)
            if p.is_alive():
                p.kill()
                p.join()
        for c in self.conns:
            c.close()


@contextmanager
def _terminate_unwinds():
    """While a fit runs, a SIGTERM that would kill the coordinator outright (the default
    action) raises SystemExit(143) instead, so that the workers are stopped and the data's
    temporary copy removed on the way out. A handler the caller installed is left alone."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return

    def unwind(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, unwind)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


class MultiprocessingExecutor(BaseExecutor):
    """Worker processes on this machine, one per grid cell.

    ``start_method``: ``"spawn"`` or ``"forkserver"`` (a forked numpy with BLAS threads is not
    safe); either way the workers do not import the caller's script, which needs no
    ``if __name__ == "__main__":`` guard (see the module). ``blas_threads``: BLAS and OpenMP
    threads per worker, and in the parent while the fit runs (default 1; ``None`` leaves them
    as the environment sets them). ``timeout_s``: the longest a worker may take for one iteration before the fit
    stops (``None``: no limit; deaths are noticed regardless). ``startup_timeout_s``: the
    longest a worker may take to start and map its rows.
    """

    name: ClassVar[str] = "multiprocessing"

    def __init__(self, start_method: str = "spawn", timeout_s: float | None = None,
                 startup_timeout_s: float = 120.0, tmp_dir: str | None = None,
                 blas_threads: int | None = DEFAULT_BLAS_THREADS):
        if start_method not in ("spawn", "forkserver"):
            raise ConfigError(f"start_method must be 'spawn' or 'forkserver', got {start_method!r}")
        if timeout_s is not None and not timeout_s > 0:
            raise ConfigError(f"timeout_s must be > 0 or None, got {timeout_s!r}")
        self.start_method = start_method
        self.timeout_s = timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.tmp_dir = tmp_dir
        self.blas_threads = check_blas_threads(blas_threads)
        #: pids of the running workers (grid order), while a fit runs.
        self.worker_pids: list[int] = []

    def run(self, job: FitJob) -> FitResult:
        with limited(self.blas_threads), _terminate_unwinds():
            return self._run(job)

    def _run(self, job: FitJob) -> FitResult:
        scratch = None
        grid = None
        failed = True
        try:
            if isinstance(job.data, NpyDataset):
                directory = str(job.data.directory)
            else:
                scratch = Scratch("data", self.tmp_dir)
                directory = str(NpyDataset.write(job.data, scratch.path).directory)
            grid = ProcessGrid(job, directory, mp.get_context(self.start_method), self.timeout_s,
                               self.startup_timeout_s, self.blas_threads)
            grid.start()
            self.worker_pids = grid.pids
            result = run_em(grid, job, self.name)
            failed = False
            return result
        finally:
            self.worker_pids = []
            if grid is not None:
                grid.close(failed)
            if scratch is not None:
                scratch.close()

    def __repr__(self) -> str:
        return (f"MultiprocessingExecutor(start_method={self.start_method!r}, timeout_s={self.timeout_s!r}, "
                f"blas_threads={self.blas_threads!r})")
