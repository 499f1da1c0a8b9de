"""The worker step: one worker's share of one EM iteration, shared by every executor.

A worker is the cell ``(replica r, shard s)`` of a plan's ``D x M`` grid. It holds the rows
``plan.replica_ranges()[r]`` restricted to the leaf columns of shard ``s`` and owns the
maximal unsplit subtrees (*owned roots*) whose leaves lie on shard ``s``. Per block of rows
it evaluates its owned roots, exchanges their per-row log densities with the other shards
of its replica (the *coupling*), evaluates the nodes above them, and folds the statistics
of what it owns (shard 0 also those of the nodes above, and the log-likelihood).

The step is a generator (:meth:`WorkerStep.passes`) that yields at every exchange, so the
same code runs the shards of a replica in lockstep in one process and, driven by
:meth:`WorkerStep.run` with a blocking exchange, in one process per worker. Executors
supply only the exchange, the reduce and the broadcast: how bytes move.

Two things every executor gets from here alike: the fault-injection testing hook
(:mod:`executors.faults`, read once per worker from ``EMGRID_FAULT``) fires inside
:meth:`WorkerStep.passes`, and every share reports the worker's peak memory
(:mod:`executors.memory`).
"""

from __future__ import annotations

import copy
import math
import pickle
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, replace
from time import perf_counter

import numpy as np

from emgrid.models import Composite, Node, Ragged, Stats, owned_roots, take_rows
from emgrid.models.cost import split_nodes
from emgrid.models.base import child_path
from emgrid.models.data import Data, _ragged_unchecked
from emgrid.models.engine import block_rows, shard_block, shard_down, shard_up
from emgrid.planner.plan import BalancePlan

from . import faults
from .memory import PeakMeter

#: Pickle protocol of every pickled payload (statistics, models; the coupling moves flat arrays, executors.coupling).
PROTOCOL = 5

Exchange = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


@dataclass(frozen=True)
class WorkerSpec:
    """One cell of the grid: where it sits, which rows and leaves it holds, what it owns."""

    replica: int
    shard: int
    name: str
    start: int  # first row of the replica
    stop: int  # one past its last row
    leaves: tuple[str, ...]
    owned: tuple[str, ...]  # owned-root paths in pre-order; ("",) when the tree is unsplit
    active: bool  # False for the idle shards of a plan whose tree sits whole on one shard
    first_shard: bool  # folds the nodes above the owned roots and counts the log-likelihood
    exchanges: bool  # whether the shards of this replica exchange per block
    block_rows: int  # rows per block, the whole model's (a shard's part of it cannot tell)
    index: int = 0  # grid index r * M + s
    split: tuple[str, ...] = ()  # paths of the split nodes, which every shard evaluates
    #: every shard's owned roots (by shard), in the order its coupling messages carry them
    replica_owned: tuple[tuple[str, ...], ...] = ()

    @property
    def rows(self) -> int:
        return self.stop - self.start


def grid_layout(model: Node, plan: BalancePlan) -> list[list[WorkerSpec]]:
    """``layout[r][s]``: the spec of every worker of the plan's grid."""
    roots = owned_roots(model, plan.shard_of_leaf())
    split = tuple(sorted(split_nodes(model, plan.shard_of_leaf())))
    rows_per_block = block_rows(model)
    whole = list(roots) == [""]
    names = plan.worker_grid()
    layout = []
    for r, (start, stop) in enumerate(plan.replica_ranges()):
        row = []
        for s, cut in enumerate(plan.model_cuts):
            if whole:
                owner = roots[""] == s
                owned, active, first = (("",) if owner else ()), owner, owner
            else:
                owned = tuple(p for p, sh in roots.items() if sh == s)
                active, first = True, s == 0
            row.append(WorkerSpec(replica=r, shard=s, name=names[r][s], start=start, stop=stop,
                                  leaves=tuple(cut.leaves), owned=owned, active=active, first_shard=first,
                                  exchanges=not whole, index=r * len(plan.model_cuts) + s, split=split,
                                  block_rows=rows_per_block))
        layout.append([replace(spec, replica_owned=tuple(w.owned for w in row)) for spec in row])
    return layout


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


class Elsewhere(Node):
    """Stands for a subtree that another shard of the replica owns, in the model a shard
    receives (:func:`shard_model`): its log density arrives by the exchange, so it is never
    evaluated here, and its parameters stay with its own shard."""

    has_own_stats = False

    def __init__(self, path: str):
        self.path = path

    def params(self):
        return {}

    def describe(self) -> str:
        return f"(subtree {self.path!r} on another shard)"

    def cost(self):
        raise AssertionError(f"{self.describe()} has no cost here")

    def _log_density(self, data):
        raise AssertionError(f"{self.describe()} was evaluated on the wrong shard")

    def _accumulate(self, data, w):
        raise AssertionError(f"{self.describe()} was folded on the wrong shard")


def shard_model(model: Node, spec: WorkerSpec) -> Node:
    """What worker ``spec`` needs of ``model``: its owned subtrees whole and the split nodes
    above them, every other shard's owned subtree an :class:`Elsewhere`; the whole model
    when the tree is not split, and a bare :class:`Elsewhere` for an idle shard."""
    if not spec.active:
        return Elsewhere("")
    if not spec.exchanges:
        return model
    split, owned = frozenset(spec.split), frozenset(spec.owned)

    def prune(node: Node, path: str) -> Node:
        if path in owned:
            return node
        if path not in split:
            return Elsewhere(path)
        twin = copy.copy(node)  # shares the parameter arrays; only the children differ
        twin.children = tuple(prune(c, child_path(path, i)) for i, c in enumerate(node.children))
        return twin

    return prune(model, "")


def shard_payloads(model: Node, layout: Sequence[Sequence[WorkerSpec]]) -> list[bytes]:
    """The pickled :func:`shard_model` of every shard (the same for every replica)."""
    return [pickle.dumps(shard_model(model, spec), protocol=PROTOCOL) for spec in layout[0]]


def restrict_columns(model: Node, data: Data, keep: frozenset[str], path: str = "",
                     split: frozenset[str] = frozenset()) -> Data:
    """``data`` with the columns of leaves outside ``keep`` replaced by None.

    The tuples are kept whole, and the offsets of every sequence level that this shard
    evaluates: those above a kept leaf and those of the ``split`` nodes, which every shard
    evaluates whatever leaves it holds (a sequence wholly on other shards loses its
    offsets too). A column that several leaves read (the components of a mixture, the
    states of an HMM) is kept when any of them is kept.
    """
    if model.is_leaf:
        return data if path in keep else None
    if isinstance(model, Composite):
        return tuple(restrict_columns(c, data[i], keep, child_path(path, i), split)
                     for i, c in enumerate(model.children))
    shared = model._child_data(data, 0)
    parts = [restrict_columns(c, shared, keep, child_path(path, i), split) for i, c in enumerate(model.children)]
    merged = parts[0]
    for part in parts[1:]:
        merged = _union(merged, part)
    if shared is data:
        return merged
    if isinstance(data, Ragged) and shared is data.values:
        return None if _holds_nothing(merged) and path not in split else _ragged_unchecked(merged, data.offsets)
    raise TypeError(f"{model.family} at {path or '<root>'!r}: cannot tell how its children read its data")


def _holds_nothing(data: Data) -> bool:
    """No column at all: None, or tuples of nothing (a kept sequence holds its offsets)."""
    if data is None:
        return True
    return isinstance(data, tuple) and all(_holds_nothing(d) for d in data)


def _union(a: Data, b: Data) -> Data:
    """Two restrictions of one column: every part held by either."""
    if a is None:
        return b
    if b is None:
        return a
    if isinstance(a, tuple):
        return tuple(_union(x, y) for x, y in zip(a, b))
    if isinstance(a, Ragged):
        return _ragged_unchecked(_union(a.values, b.values), a.offsets)
    return a


def _no_exchange(mine):
    raise AssertionError("an unsplit tree has nothing to exchange")


class WorkerStep:
    """One worker's rows (restricted to its shard's columns) and its share of every E-step."""

    def __init__(self, model: Node, spec: WorkerSpec, replica_data: Data, meter: PeakMeter | None = None):
        """``replica_data``: the rows of the worker's replica, every column (views are fine).

        ``meter``: the worker's memory meter, started before its rows were opened (a new one
        started now when not given).
        """
        self.spec = spec
        self.meter = meter if meter is not None else PeakMeter()
        self.faults = faults.from_env(spec.name, spec.index)
        self.data = (restrict_columns(model, replica_data, frozenset(spec.leaves), split=frozenset(spec.split))
                     if spec.active else None)

    @classmethod
    def from_full(cls, model: Node, spec: WorkerSpec, data: Data, meter: PeakMeter | None = None) -> "WorkerStep":
        """From the whole dataset: slices the worker's rows first (views, nothing read)."""
        return cls(model, spec, take_rows(data, spec.start, spec.stop), meter)

    def exchanges_per_pass(self) -> int:
        """How many times :meth:`passes` yields (the same on every shard of a replica)."""
        if not (self.spec.active and self.spec.exchanges):
            return 0
        return math.ceil(self.spec.rows / self.spec.block_rows)

    def passes(self, model: Node, iteration: int = 0) -> Generator[dict[str, np.ndarray], dict[str, np.ndarray], WorkerShare]:
        """The E-step on this worker's rows; yields its owned roots' log densities per block.

        The value sent back in must be every owned root's log density for the block (all
        shards of the replica). Returns the worker's :class:`WorkerShare`. ``iteration``
        (from 1; 0 = not counted) is what the fault-injection hook matches.
        """
        spec = self.spec
        folded: dict[str, list] | None = None
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
                block = take_rows(self.data, a, b)
                w = ones[: b - a]
                if not spec.exchanges:
                    out, part = shard_block(model, block, w, spec.owned, _no_exchange, True)
                else:
                    cache, mine = shard_up(model, block, spec.owned)
                    sent += sum(v.nbytes for v in mine.values())
                    compute += perf_counter() - t0
                    every = yield mine
                    t0 = perf_counter()
                    out, part = shard_down(model, block, w, spec.owned, cache, every, spec.first_shard)
                    # the block's kept arrays and exchanged densities go now, not when the
                    # next block's upward pass rebinds the names: held across it, they put a
                    # second block of working arrays into the worker's peak (1.3-1.5x the plan)
                    del cache, mine, every
                folded = _fold(folded, out)
                del out
                ll += part
                compute += perf_counter() - t0
        elif due:
            faults.fire(due, spec.name, iteration, 0, True)
        stats = Stats({k: tuple(v) for k, v in folded.items()}) if folded is not None else Stats()
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


def _fold(total: dict[str, list] | None, out: dict) -> dict[str, list]:
    """``total + out`` node by node, float arrays added in place (the sums ``Stats.__add__``
    makes, without a new set of arrays per block); the first block's arrays are copied."""
    if total is None:
        return {k: [np.array(v) if isinstance(v, np.ndarray) else v for v in own] for k, own in out.items()}
    for key, own in out.items():
        mine = total.get(key)
        if mine is None:
            total[key] = [np.array(v) if isinstance(v, np.ndarray) else v for v in own]
            continue
        for i, v in enumerate(own):
            m = mine[i]
            if type(m) is np.ndarray and m.dtype.kind == "f" and m.shape == np.shape(v):
                m += v
            else:
                mine[i] = m + v
    return total


def run_replica_lockstep(steps: Sequence[WorkerStep], model: Node, iteration: int = 0) -> list[WorkerShare]:
    """The shards of one replica in one process: every block's exchange done in memory."""
    gens = [st.passes(model, iteration) for st in steps]
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
        every = merge_exchange(yielded[i] for i in sorted(yielded))
        dt = (perf_counter() - t0) / len(yielded)
        for i in yielded:
            sends[i] = every
            coupling[i] += dt
        live = sorted(yielded)
    for share, c in zip(shares, coupling):
        share.coupling_s = c
    return shares


def merge_exchange(parts) -> dict[str, np.ndarray]:
    """Every owned root's log density from the shards' parts (their keys are disjoint)."""
    every: dict[str, np.ndarray] = {}
    for part in parts:
        every.update(part)
    return every


def sum_in_order(values):
    """Left-to-right sum, the one order every executor uses so traces agree to the last bit."""
    it = iter(values)
    total = next(it)
    for v in it:
        total = total + v
    return total


def reduce_shares(shares: Sequence[Sequence[WorkerShare]]) -> tuple[Stats, float]:
    """``shares[r][s]`` to the total statistics and log-likelihood.

    Each shard's column is summed over the replicas in replica order (:func:`reduce_shard`),
    then the shards' totals are joined: they hold disjoint paths, so the join is exact, and
    only one shard of a replica holds a non-zero log-likelihood, so adding the others'
    zeros is exact too. Every executor reduces in exactly this order.
    """
    columns = [reduce_shard([shares[r][s] for r in range(len(shares))]) for s in range(len(shares[0]))]
    return join_shards(columns)


def reduce_shard(column: Sequence[WorkerShare]) -> tuple[Stats, float]:
    """One shard's statistics and log-likelihood summed over the replicas, in replica order."""
    return sum_in_order(w.stats for w in column), sum_in_order(w.loglik for w in column)


def join_shards(columns: Sequence[tuple[Stats, float]]) -> tuple[Stats, float]:
    """The shards' reduced columns joined into the totals, in shard order."""
    return sum_in_order(c[0] for c in columns), sum_in_order(c[1] for c in columns)
