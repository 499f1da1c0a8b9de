"""The multiprocessing executor: one worker process per grid cell on this machine.

Bytes move over pipes: the parent (the coordinator) sends each worker its shard's pickled
part of the model and receives its pickled statistics with an
:class:`executors.step.ShareReport`; the shards of a replica exchange their per-row log
densities directly, over one pipe per pair of shards, as :mod:`executors.coupling`'s flat
messages. Rows never pass through the parent:
the data lives in ``.npy`` files (written once to a temporary directory when the caller
gave arrays) that every worker maps for its own row range only.

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
the parent never blocks on a dead worker. When one
worker of a model-parallel replica fails, its peers lose their pipes to it and report
that too; the parent names the worker that failed first (an error it reported, or a
death), not the peers that stopped because of it.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import traceback
from contextlib import contextmanager
from multiprocessing.connection import Connection, wait
from time import perf_counter
from typing import ClassVar

import numpy as np

from emgrid.models import Node
from emgrid.models.errors import ConfigError, FitError

from . import coupling
from .datafiles import NpyDataset
from .loop import GridOutcome, critical_path, run_em
from .memory import PeakMeter, warm_up
from .protocol import BaseExecutor, FitJob
from .result import FitResult
from .step import WorkerSpec, WorkerStep, grid_layout, reduce_shares
from .threads import DEFAULT_BLAS_THREADS, check_blas_threads, environment, limited, probe, thread_env

_STOP = b""
#: Seconds the parent keeps listening, after a worker reports that it lost a peer, for the
#: peer's own error report or death (the cause, which it names instead).
_CAUSE_GRACE_S = 5.0


class _PeerLost(Exception):
    """A pipe to another shard of the replica broke: that shard failed."""

    def __init__(self, shard: int):
        super().__init__(shard)
        self.shard = shard


def _worker_main(spec: WorkerSpec, directory: str, model: Node, control: Connection,
                 peers: dict[int, Connection], blas_threads: int | None = DEFAULT_BLAS_THREADS) -> None:
    """A worker process: map its rows, then run one step per model received until told to stop."""
    with limited(blas_threads):
        _serve(spec, directory, model, control, peers)


def _serve(spec: WorkerSpec, directory: str, model: Node, control: Connection, peers: dict[int, Connection]) -> None:
    try:
        for root in spec.roots:
            warm_up(model.node_at(root))  # its shard's subtrees: the others are not in its model
        meter = PeakMeter()  # after the imports and the warm-up, before the rows: see executors.memory
        step = WorkerStep(model, spec, NpyDataset(directory).open_rows(spec.start, spec.stop), meter)
        probe(spec.name)
        control.send(("ready", None))
        iteration = 0
        while True:
            payload = control.recv_bytes()
            if payload == _STOP:
                return
            iteration += 1
            t0 = perf_counter()
            model = None  # the last iteration's model: not kept while the new one is unpickled
            model = pickle.loads(payload)
            del payload
            received = perf_counter() - t0
            share = step.run(model, lambda mine: _exchange(spec, peers, mine), iteration)
            share.receive_s = received
            blob = share.payload()
            control.send(("share", share.report(spec.name, len(blob), meter.baseline_bytes)))
            del share
            control.send_bytes(blob)
            del blob
    except _PeerLost as e:
        try:
            control.send(("lost", e.shard))
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
            raise _PeerLost(peer) from None
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
        self.shape = (job.plan.data_parallel, job.plan.model_parallel)
        self.timeout_s = timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.iteration = 0
        self.procs: list = []
        self.conns: list[Connection] = []

    def start(self) -> None:
        """Starts every worker and waits until each has mapped its rows."""
        job, directory, context = self.job, self.directory, self.context
        m = self.shape[1]
        peer_ends: dict[tuple[int, int], dict[int, Connection]] = {(s.replica, s.shard): {} for s in self.cells}
        for r in range(self.shape[0]):
            for i in range(m):
                for j in range(i + 1, m):
                    a, b = context.Pipe(duplex=True)
                    peer_ends[(r, i)][j] = a
                    peer_ends[(r, j)][i] = b
        child_ends = []
        with environment(thread_env(self.blas_threads)), _main_hidden(job.model):
            for spec in self.cells:
                parent, child = context.Pipe(duplex=True)
                p = context.Process(target=_worker_main, name=f"emgrid-{spec.name}", daemon=True,
                                    args=(spec, directory, spec.view.model_for(spec.shard, job.model), child,
                                          peer_ends[(spec.replica, spec.shard)], self.blas_threads))
                p.start()
                self.procs.append(p)
                self.conns.append(parent)
                child_ends.append(child)
        for c in child_ends:
            c.close()
        for ends in peer_ends.values():
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

    def _peer(self, i: int, shard: int) -> int:
        """Index of the worker running ``shard`` in worker ``i``'s replica."""
        me = self.cells[i]
        return next(k for k, s in enumerate(self.cells) if s.replica == me.replica and s.shard == shard)

    def _collect(self, when: str, timeout_s: float | None) -> list:
        """One message from every worker; raises FitError on an error report, a death or a timeout.

        A worker's error report or death is the cause and is raised at once. A worker that
        reports it lost a peer only points at the cause: the parent keeps listening a few
        seconds for the peer's own report or death, and names the peer either way.
        """
        out: list = [None] * len(self.conns)
        pending = {c: i for i, c in enumerate(self.conns)}
        sentinels = {p.sentinel: i for i, p in enumerate(self.procs)}
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
                names = ", ".join(self._who(i) for i in sorted(pending.values()))
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
                            lost.append((i, self._peer(i, body)))
                        else:
                            out[i] = (body, obj.recv_bytes()) if kind == "share" else body
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
        self.iteration += 1
        for i, (c, spec) in enumerate(zip(self.conns, self.cells)):
            try:
                c.send_bytes(payloads[spec.shard])
            except OSError:
                raise self._died(i, f"before iteration {self.iteration}") from None

    def e_step(self, iteration: int) -> GridOutcome:
        t0 = perf_counter()
        got = self._collect(f"in iteration {iteration}", self.timeout_s)
        shares, reduce_bytes = [], 0
        peaks, baselines = {}, {}
        for report, payload in got:  # a ShareReport and the pickled statistics it describes
            shares.append(report.share(pickle.loads(payload)))
            reduce_bytes += len(payload)
            peaks[report.worker], baselines[report.worker] = report.peak_bytes, report.baseline_bytes
        d, m = self.shape
        stats, total = reduce_shares([shares[r * m:(r + 1) * m] for r in range(d)])
        return GridOutcome(stats=stats, loglik=total, **critical_path(shares, perf_counter() - t0),
                           coupling_bytes=sum(s.coupling_bytes for s in shares), reduce_bytes=reduce_bytes,
                           peak_bytes=peaks, baseline_bytes=baselines)

    def close(self, failed: bool = False) -> None:
        """Stops every worker: asks them to stop (up to 5 s in all), then terminates and kills.

        After a failed fit (``failed``) the workers have nothing left to do and some may be
        stuck waiting on a dead peer or hung: they are terminated at once.
        """
        if not failed:
            for c in self.conns:
                try:
                    c.send_bytes(_STOP)
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
                scratch = tempfile.mkdtemp(prefix="emgrid-data-", dir=self.tmp_dir)
                directory = str(NpyDataset.write(job.data, scratch).directory)
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
                shutil.rmtree(scratch, ignore_errors=True)

    def __repr__(self) -> str:
        return (f"MultiprocessingExecutor(start_method={self.start_method!r}, timeout_s={self.timeout_s!r}, "
                f"blas_threads={self.blas_threads!r})")
