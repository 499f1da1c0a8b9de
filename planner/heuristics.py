"""Quick placements of units onto the shard columns of one grid layout.

Each heuristic returns ``unit_shard`` (the shard of every unit of a ``UnitTree``); the
planner expands it to leaves and prices it with the exact cost model. They give the exact
program its hint and its first incumbent, and serve as baselines in the benchmark:

- ``lpt``: longest processing time first: units by FLOPs, each onto the shard column where
  it finishes earliest (FLOPs times the column's seconds per FLOP-row), among columns it
  still fits in;
- ``karmarkar_karp``: the ``M``-way largest differencing method on FLOPs, the heaviest
  subset onto the fastest column;
- ``bytes_first``: units by memory need, each onto the column with the most room left;
- ``contiguous``: runs of consecutive units (pre-order) with near-equal FLOPs (the seed
  planner's split, applied to whatever units it is given);
- ``equal_count``: runs of consecutive units with equal counts (Megatron's even layer split).

Memory is estimated per column from the column's largest row count and smallest memory;
the exact model has the last word.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from .costing import base_bytes, fixed_bytes
from .facts import ModelFacts, worker_arrays
from .resources import Resources
from .units import UnitTree


@dataclass(frozen=True, eq=False)
class Columns:
    """What a heuristic needs to know about the ``M`` shard columns of one layout."""

    a: np.ndarray  # seconds per (FLOP per root row) of each column: max_r rows_r / speed(r, s)
    rows_hi: np.ndarray  # the largest row count of each column
    block_hi: np.ndarray  # min(rows_hi, block rows)
    cap: np.ndarray  # smallest known memory of each column less the base bytes (inf when unknown)
    d: int  # replicas of the layout

    @property
    def m(self) -> int:
        return len(self.a)



class Packing:
    """Memory used on each column while units are placed, one copy per data column."""

    def __init__(self, ut: UnitTree, cols: Columns):
        c = ut.unit_cost
        self.ut = ut
        self.cols = cols
        self.base = c["work"][:, None] * cols.block_hi[None, :] + fixed_bytes(c["param"], c["stat"], c["cache"], cols.d)[:, None]
        self.scratch = c["scratch"][:, None] * cols.block_hi[None, :]
        self.group_bytes = ut.group_data[:, None] * cols.rows_hi[None, :]
        self.touched = np.zeros((len(ut.group_data), cols.m), dtype=bool)
        self.used = np.zeros(cols.m)
        self.top = np.zeros(cols.m)  # the column's largest scratch so far (counted in used)

    def need(self, u: int) -> np.ndarray:
        """Bytes unit ``u`` would add to every column."""
        out = self.base[u] + np.maximum(self.scratch[u] - self.top, 0.0)
        for g in self.ut.unit_groups[u]:
            out += np.where(self.touched[g], 0.0, self.group_bytes[g])
        return out

    def room(self, u: int) -> np.ndarray:
        return self.cols.cap - self.used - self.need(u)

    def add(self, u: int, s: int) -> None:
        self.used[s] += self.need(u)[s]
        self.top[s] = max(self.top[s], self.scratch[u, s])
        for g in self.ut.unit_groups[u]:
            self.touched[g, s] = True


def columns(facts: ModelFacts, resources: Resources, grid, rows, d: int | None = None) -> Columns:
    """The columns of layout ``grid``; ``d``: the replicas whose memory applies (default the layout's)."""
    g = np.asarray(grid, dtype=np.int64)
    d = g.shape[0] if d is None else d
    speeds, memories = worker_arrays(resources)
    speed, mem = speeds[g], memories[g]
    rows_f = np.asarray(rows, dtype=np.float64)[:, None]
    hi = np.broadcast_to(rows_f, g.shape).max(axis=0)
    return Columns(a=(rows_f / speed).max(axis=0), rows_hi=hi, block_hi=np.minimum(hi, float(facts.block_rows)),
                   cap=mem.min(axis=0) - base_bytes(facts, d), d=d)


def _fix_empty(unit_shard: np.ndarray, weights: np.ndarray, m: int) -> np.ndarray:
    """Moves the lightest unit of the most populated shard into each empty shard."""
    out = unit_shard.copy()
    counts = np.bincount(out, minlength=m)
    for s in np.flatnonzero(counts == 0):
        donor = int(np.argmax(counts))
        members = np.flatnonzero(out == donor)
        u = members[np.argmin(weights[members])]
        out[u] = s
        counts[donor] -= 1
        counts[s] += 1
    return out


def lpt(ut: UnitTree, cols: Columns) -> np.ndarray:
    m = cols.m
    flops = ut.unit_cost["flops"]
    pack = Packing(ut, cols) if np.isfinite(cols.cap).any() else None  # no memory to track when unknown
    load = np.zeros(m)
    out = np.zeros(ut.n_units, dtype=np.int64)
    empty = m
    order = np.argsort(-flops, kind="stable")
    for k, u in enumerate(order):
        finish = cols.a * (load + flops[u])
        room = pack.room(u) if pack is not None else np.zeros(m)
        ok = room >= 0
        if ut.n_units - k <= empty:  # every remaining unit must open an empty shard
            ok &= load == 0
        cand = np.flatnonzero(ok)
        if cand.size:
            s = int(cand[np.argmin(finish[cand])])
        else:
            s = int(np.argmax(np.where(load == 0, np.inf, room))) if ut.n_units - k <= empty else int(np.argmax(room))
        if load[s] == 0:
            empty -= 1
        out[u] = s
        load[s] += flops[u] if flops[u] > 0 else 1e-300
        if pack is not None:
            pack.add(u, s)
    return _fix_empty(out, flops, m)


def karmarkar_karp(ut: UnitTree, cols: Columns) -> np.ndarray:
    m = cols.m
    flops = ut.unit_cost["flops"]
    heap = []
    for u in range(ut.n_units):
        sums = [float(flops[u])] + [0.0] * (m - 1)
        sets = [[u]] + [[] for _ in range(m - 1)]
        heapq.heappush(heap, (-float(flops[u]), u, sums, sets))
    tie = ut.n_units
    while len(heap) > 1:
        _, _, s1, t1 = heapq.heappop(heap)
        _, _, s2, t2 = heapq.heappop(heap)
        pairs = sorted(((s1[i] + s2[m - 1 - i], t1[i] + t2[m - 1 - i]) for i in range(m)), key=lambda p: -p[0])
        sums = [p[0] for p in pairs]
        sets = [p[1] for p in pairs]
        heapq.heappush(heap, (-(sums[0] - sums[-1]), tie, sums, sets))
        tie += 1
    _, _, sums, sets = heap[0]
    fastest = np.argsort(cols.a, kind="stable")
    out = np.zeros(ut.n_units, dtype=np.int64)
    for rank, members in enumerate(sets):  # sets are sorted by decreasing sum
        out[members] = fastest[rank]
    return _fix_empty(out, flops, m)


def bytes_first(ut: UnitTree, cols: Columns) -> np.ndarray:
    m = cols.m
    flops = ut.unit_cost["flops"]
    pack = Packing(ut, cols)
    load = np.zeros(m)
    out = np.zeros(ut.n_units, dtype=np.int64)
    finite = np.isfinite(cols.cap)
    size = pack.base.max(axis=1) + np.array([pack.group_bytes[list(g)].sum(axis=0).max() if g else 0.0
                                             for g in ut.unit_groups])
    for u in np.argsort(-size, kind="stable"):
        need = pack.need(u)
        room = np.where(finite, cols.cap - pack.used - need, -pack.used - need)
        best = room.max()
        cand = np.flatnonzero(room >= best - 1e-9 * max(1.0, abs(best)))
        s = int(cand[np.argmin(cols.a[cand] * (load[cand] + flops[u]))])
        out[u] = s
        pack.add(u, s)
        load[s] += flops[u]
    return _fix_empty(out, flops, m)


def _runs(weights: np.ndarray, m: int) -> np.ndarray:
    """Shard of each item for ``m`` consecutive runs of near-equal total weight."""
    n = len(weights)
    cum = np.cumsum(weights)
    total = cum[-1] if cum[-1] > 0 else 1.0
    bounds = [0]
    for s in range(1, m):
        lo, hi = bounds[-1] + 1, n - (m - s)
        cand = np.arange(lo, hi + 1)
        bounds.append(int(cand[np.argmin(np.abs(cum[cand - 1] - total * s / m))]))
    bounds.append(n)
    out = np.empty(n, dtype=np.int64)
    for s in range(m):
        out[bounds[s]:bounds[s + 1]] = s
    return out


def contiguous(ut: UnitTree, cols: Columns) -> np.ndarray:
    return _runs(ut.unit_cost["flops"], cols.m)


def equal_count(ut: UnitTree, cols: Columns) -> np.ndarray:
    return _runs(np.ones(ut.n_units), cols.m)


#: Every heuristic by name; ``karmarkar_karp`` runs only up to ``KK_MAX_CELLS`` units x shards.
HEURISTICS = {"lpt": lpt, "karmarkar_karp": karmarkar_karp, "bytes_first": bytes_first, "contiguous": contiguous,
              "equal_count": equal_count}
KK_MAX_CELLS = 40_000


def run_all(ut: UnitTree, cols: Columns, names=("lpt", "karmarkar_karp", "bytes_first", "contiguous")):
    """``{name: unit_shard}`` of the named heuristics that apply to this many units and shards."""
    out = {}
    for name in names:
        if cols.m > ut.n_units:
            break
        if name == "karmarkar_karp" and ut.n_units * cols.m > KK_MAX_CELLS:
            continue
        out[name] = HEURISTICS[name](ut, cols)
    return out
