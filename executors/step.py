"""The worker step: one worker's share of one EM iteration, shared by every executor.

A worker is the cell ``(replica r, shard s)`` of a plan's ``D x M`` grid. It holds the rows
``plan.replica_ranges()[r]`` restricted to the columns shard ``s`` reads, and evaluates the
*shard roots* whose leaves lie on shard ``s`` (what a shard holds is the model's business:
:class:`models.shard.ShardView`). Per block of rows it runs the upward pass of its shard
roots, exchanges their per-row log densities with the other shards of its replica (the
*coupling*), and runs the rest of the block's passes, folding the statistics of what it
evaluates (the lead shard also those of the spanning nodes, and the log-likelihood).

The step is a generator (:meth:`WorkerStep.passes`) that yields at every exchange, so the
same code runs the shards of a replica in lockstep in one process and, driven by
:meth:`WorkerStep.run` with a blocking exchange, in one process per worker. Executors
supply only the exchange, the reduce and the broadcast: how bytes move. What every
transport sends back after a step is one :class:`ShareReport` beside the pickled statistics.

Two things every executor gets from here alike: the fault-injection testing hook
(:mod:`executors.faults`, read once per worker from ``EMGRID_FAULT``) fires inside
:meth:`WorkerStep.passes`, and every share reports the worker's peak memory
(:mod:`executors.memory`).
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import NamedTuple

import numpy as np

from emgrid.models import Node, ShardView, Stats, take_rows
from emgrid.models.data import Data, with_dtype
from emgrid.models.engine import block_rows
from emgrid.models.stats import StatsAccumulator
from emgrid.planner.costing import WORKER_BASE_BYTES
from emgrid.planner.plan import BalancePlan

from . import faults
from .datafiles import rows_as
from .memory import PeakMeter, release_free_memory

#: Pickle protocol of every pickled payload (statistics, models; the coupling moves flat arrays, executors.coupling).
PROTOCOL = 5

Exchange = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


@dataclass(frozen=True)
class WorkerSpec:
    """One cell of the grid: where it sits, which rows it holds, and its shard's view."""

    replica: int
    shard: int
    name: str
    start: int  # first row of the replica
    stop: int  # one past its last row
    view: ShardView  # what every shard of the plan holds (the same for every cell)
    block_rows: int  # rows per block, the whole model's (a shard's part of it cannot tell)
    index: int = 0  # grid index r * M + s
    trims: bool = True  # hands free heap pages back before each pass (see :data:`TRIM_MIN_BYTES`)
    dtype: str = "float64"  # the float type of its blocks (``models.data.with_dtype``)

    @property
    def rows(self) -> int:
        return self.stop - self.start

    @property
    def roots(self) -> tuple[str, ...]:
        """The shard roots this worker evaluates, in pre-order; ``("",)`` when the tree is whole here."""
        return self.view.roots_of(self.shard)

    @property
    def replica_roots(self) -> tuple[tuple[str, ...], ...]:
        """Every shard's roots (by shard), in the order its coupling messages carry them."""
        return self.view.roots_by_shard

    @property
    def active(self) -> bool:
        """False for the idle shards of a plan whose tree sits whole on one shard."""
        return self.view.evaluates(self.shard)

    @property
    def exchanges(self) -> bool:
        """Whether the shards of this replica exchange per block."""
        return not self.view.whole


#: A worker whose plan holds less than this beyond the fixed base skips the per-pass
#: ``malloc_trim`` (:func:`memory.release_free_memory`, about 14 us, 5% of an iteration on
#: iris): what an M-step frees there is too little to move its meter.
TRIM_MIN_BYTES = 1 << 20


def grid_layout(model: Node, plan: BalancePlan, dtype: str = "float64") -> list[list[WorkerSpec]]:
    """``layout[r][s]``: the spec of every worker of the plan's grid (computed once per fit),
    its blocks in ``dtype``."""
    view = ShardView.of(model, plan.shard_of_leaf(), len(plan.model_cuts))
    rows_per_block = block_rows(model)
    names = plan.worker_grid()
    m = len(plan.model_cuts)
    planned = {w.name: w.memory_bytes for w in plan.per_worker}
    return [[WorkerSpec(replica=r, shard=s, name=names[r][s], start=start, stop=stop, view=view,
                        block_rows=rows_per_block, index=r * m + s, dtype=dtype,
                        trims=planned.get(names[r][s], TRIM_MIN_BYTES + WORKER_BASE_BYTES)
                        >= TRIM_MIN_BYTES + WORKER_BASE_BYTES)
             for s in range(m)]
            for r, (start, stop) in enumerate(plan.replica_ranges())]


@dataclass
class WorkerShare:
    """A worker's result for one iteration."""

    stats: Stats
    loglik: float
    compute_s: float = 0.0
    coupling_s: float = 0.0
    coupling_bytes: int = 0
    receive_s: float = 0.0  # unpickling the broadcast model, where the worker had to
    peak_bytes: int = 0  # the worker's peak resident memory above its baseline so far (executors.memory)

    def payload(self) -> bytes:
        """The statistics as they cross the wire in the reduce."""
        return pickle.dumps(self.stats, protocol=PROTOCOL)

    def report(self, worker: str, stats_bytes: int, baseline_bytes: int) -> "ShareReport":
        """What the worker sends beside its pickled statistics (``stats_bytes`` long)."""
        return ShareReport(worker=worker, loglik=self.loglik, receive_s=self.receive_s, compute_s=self.compute_s,
                           coupling_s=self.coupling_s, coupling_bytes=self.coupling_bytes, stats_bytes=stats_bytes,
                           peak_bytes=self.peak_bytes, baseline_bytes=baseline_bytes)


class ShareReport(NamedTuple):
    """A worker's share of one iteration as every transport sends it to the coordinator,
    beside its pickled statistics (:meth:`WorkerShare.payload`, ``stats_bytes`` long), which
    travel as bytes of their own and are what ``bytes_moved["reduce"]`` counts."""

    worker: str
    loglik: float
    receive_s: float
    compute_s: float
    coupling_s: float
    coupling_bytes: int
    stats_bytes: int
    peak_bytes: int  # see executors.memory
    baseline_bytes: int


class ShardPayloads(Sequence[bytes]):
    """The pickled part of ``model`` every shard holds (:meth:`ShardView.model_for`; the
    same for every replica), made when a transport asks for it: only the last one asked for
    is kept, so the coordinator never holds every shard's pickle at once (ask shard by
    shard where the transport can). ``sizes`` records each one's length once made."""

    def __init__(self, model: Node, layout: Sequence[Sequence[WorkerSpec]]):
        self.model = model
        self.view = layout[0][0].view
        self.sizes: dict[int, int] = {}
        self._last: tuple[int, bytes] | None = None

    def __len__(self) -> int:
        return self.view.n_shards

    def __getitem__(self, s: int) -> bytes:
        if not 0 <= s < len(self):
            raise IndexError(s)
        if self._last is None or self._last[0] != s:
            self._last = None  # the previous pickle goes before the next one is made
            blob = pickle.dumps(self.view.model_for(s, self.model), protocol=PROTOCOL)
            self._last = (s, blob)
            self.sizes[s] = len(blob)
        return self._last[1]

    def size(self, s: int) -> int:
        """Shard ``s``'s payload length (made now if no transport asked for it)."""
        return self.sizes[s] if s in self.sizes else len(self[s])


class WorkerStep:
    """One worker's rows (restricted to its shard's columns) and its share of every E-step."""

    def __init__(self, model: Node, spec: WorkerSpec, replica_data: Data, meter: PeakMeter | None = None, *,
                 own_rows: bool = True):
        """``replica_data``: the rows of the worker's replica, every column (views are fine).

        ``meter``: the worker's memory meter, started before its rows were opened (a new one
        started now when not given). ``own_rows``: the rows are the worker's own (mapped from
        the dataset's files for it, or shipped to it), whose vectors it reads into memory
        column-major; False for views of a caller's arrays, which are never copied but to
        change their dtype (``rows_as``).
        """
        self.spec = spec
        self.meter = meter if meter is not None else PeakMeter()
        self.faults = faults.from_env(spec.name, spec.index)
        # its columns only, then their floats in its dtype (read from the files, not mapped)
        self.data = rows_as(spec.view.columns_for(spec.shard, model, replica_data), spec.dtype, own_rows=own_rows)

    @classmethod
    def from_full(cls, model: Node, spec: WorkerSpec, data: Data, meter: PeakMeter | None = None) -> "WorkerStep":
        """From the whole dataset, a caller's arrays (the local executor): slices the worker's
        rows first (views, nothing read) and copies none but to change their dtype."""
        return cls(model, spec, take_rows(data, spec.start, spec.stop), meter, own_rows=False)

    def passes(self, model: Node, iteration: int = 0) -> Generator[dict[str, np.ndarray], dict[str, np.ndarray], WorkerShare]:
        """The E-step on this worker's rows; yields its shard roots' log densities per block.

        ``model`` is the worker's part of the model (:func:`shard_payloads`, or the whole
        model). The value sent back in must be every shard root's log density for the block (all
        shards of the replica). Returns the worker's :class:`WorkerShare`. ``iteration``
        (from 1; 0 = not counted) is what the fault-injection hook matches.
        """
        if self.spec.trims:
            release_free_memory()  # what the last M-step freed goes back before this pass allocates
        spec, view = self.spec, self.spec.view
        folded = StatsAccumulator()
        ll = 0.0
        compute = 0.0
        sent = 0
        due = self.faults if iteration and self.faults else ()
        if spec.active and spec.rows > 0:
            step = spec.block_rows
            ones = np.ones(min(step, spec.rows))
            n_blocks = math.ceil(spec.rows / step)
            for k, a in enumerate(range(0, spec.rows, step)):
                if due:
                    faults.fire(due, spec.name, iteration, k, k == n_blocks - 1)
                t0 = perf_counter()
                b = min(spec.rows, a + step)
                block = with_dtype(take_rows(self.data, a, b), spec.dtype)  # rows in memory arrive cast
                w = ones[: b - a]
                if not spec.exchanges:
                    out, part = view.whole_block(model, block, w)
                else:
                    cache, mine = view.up(spec.shard, model, block)
                    # the coupling carries float64 on every transport, in memory too, so that
                    # the nodes above the shard roots add the same numbers everywhere
                    mine = {r: np.asarray(v, dtype=np.float64) for r, v in mine.items()}
                    sent += sum(v.nbytes for v in mine.values())
                    compute += perf_counter() - t0
                    every = yield mine
                    t0 = perf_counter()
                    out, part = view.down(spec.shard, model, block, w, cache, every)
                    # the block's kept arrays and exchanged densities go now, not when the
                    # next block's upward pass rebinds the names: held across it, they would
                    # put a second block of working arrays into the worker's peak
                    del cache, mine, every
                folded.add(out)
                del out
                ll += part
                compute += perf_counter() - t0
        elif due:
            faults.fire(due, spec.name, iteration, 0, True)
        stats = folded.result()
        if due:
            stats = faults.poison(due, iteration, stats)
        return WorkerShare(stats=stats, loglik=ll, compute_s=compute, coupling_bytes=sent,
                           peak_bytes=self.meter.peak_bytes())

    def run(self, model: Node, exchange: Exchange, iteration: int = 0) -> WorkerShare:
        """The E-step with a blocking ``exchange`` (an allgather over the replica's shards)."""
        gen = self.passes(model, iteration)
        coupling = 0.0
        try:
            mine = next(gen)
            while True:
                t0 = perf_counter()
                got = [exchange(mine)]
                mine = None  # neither this block's densities nor the exchanged ones stay here
                coupling += perf_counter() - t0
                mine = gen.send(got.pop())  # while the generator runs the next block
        except StopIteration as done:
            share = done.value
        share.coupling_s = coupling
        return share


def run_replica_lockstep(steps: Sequence[WorkerStep], models: Sequence[Node], iteration: int = 0) -> list[WorkerShare]:
    """The shards of one replica in one process, ``models[s]`` shard ``s``'s part: every
    block's exchange done in memory."""
    gens = [st.passes(model, iteration) for st, model in zip(steps, models)]
    shares: list[WorkerShare | None] = [None] * len(gens)
    coupling = [0.0] * len(gens)
    sends: list = [None] * len(gens)
    live = list(range(len(gens)))
    while live:
        yielded = {}
        for i in live:
            try:
                yielded[i] = gens[i].send(sends[i])
            except StopIteration as done:
                shares[i] = done.value
        if not yielded:
            break
        t0 = perf_counter()
        every: dict[str, np.ndarray] = {}  # every shard root's log density (the shards' keys are disjoint)
        for i in sorted(yielded):
            every.update(yielded[i])
        dt = (perf_counter() - t0) / len(yielded)
        for i in yielded:
            sends[i] = every
            coupling[i] += dt
        live = sorted(yielded)
    for share, c in zip(shares, coupling):
        share.coupling_s = c
    return shares


def sum_in_order(values):
    """Left-to-right sum, the one order every executor uses so traces agree to the last bit."""
    it = iter(values)
    total = next(it)
    for v in it:
        total = total + v
    return total
