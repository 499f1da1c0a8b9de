"""Analytic lower bounds of the iteration time, valid for every assignment of a grid.

With ``m > 1`` shards the root is spanning (every shard holds a leaf) and the spanning
nodes form a top part of the tree whose *owned roots* (its non-spanning children) number at least
``m``. A tree knapsack (:func:`min_cuts`) gives, for every ``k``, the least total of a
cost over the spanning nodes, or over the owned roots, of any such cut with ``k`` or more
owned roots: ``X_spanning(k)`` for FLOPs, statistics, parameters, fixed and working bytes,
and ``C_min(k)`` for coupling bytes. Each spanning node is evaluated by all ``m`` shards, so
``sum_s F_s >= TF + (m-1) F_spanning(m)`` (``TF``, ``TS``, ``TP``: the model's totals) and
likewise for the other sums. A leaf's ancestors are each spanning or owned by the leaf's
shard, so some shard evaluates the heaviest chain ``leaf + ancestors`` (FLOPs, statistics,
parameters). For a layout with per-column seconds per FLOP-row
``a_s = max_r rows_r / speed(r, s)``:

- compute ``>= max( (TF + (m-1) F_spanning(m)) / sum_s 1/a_s,  min_s a_s * chain_F )``,
  because ``F_s <= T / a_s``; with node visits (``K``, ``c = NODE_CALL_S``, ``beta`` the
  blocks of the replica of most rows times ``c``, ``a*`` that replica's ``a``) also
  ``>= ((TF + (m-1) F_spanning) + beta min_s(1/a*_s) (TK + (m-1) K_spanning)) / sum_s 1/a*_s``,
  ``>= beta (TK + (m-1) K_spanning) / m`` (the shard of most visits) and ``>= beta chain_K``
  (:meth:`Bounds.grid_bound` with ``beta`` from ``ceil(n/d)`` rows);
- coupling ``>= ceil(rows_max / B) L(m) lat + rows_max (m-1)/m C_min(m) / bw``;
- reduce ``>= L(d) (lat + max((TS + (m-1) S_spanning(m)) / m, chain_S) / bw)``; broadcast
  likewise with parameters, plus ``L(m) (lat + P_spanning(m) / bw)``.

:meth:`Bounds.grid_bound` relaxes the layout away (the fastest ``d*m`` workers share the
work; ``rows_max >= ceil(n/d)``) so that grids can be ordered before any layout is built.

Memory gives necessary conditions. A replica with ``n`` rows (block ``b = min(n, B)``)
holds every node and data column at least once, every spanning node on every shard, and on
every shard the data column of one of its leaves:
``need(n) = max(sum_g data_g, m min_col) n + sum_v (work_v b + 2 (param_v + stat_v)) +
(m-1) (Fix_spanning(m) + Work_spanning(m) b) + [m > 1] m b C_min(m)`` on its ``m`` workers; one
worker holds the hungriest leaf with the spanning nodes, and every worker at least the
lightest leaf with them. A grid whose largest replica
(``ceil(n_data/d)`` rows) cannot meet these on the ``m`` largest memories, or a layout
whose replica cannot on its own workers, has no fitting plan.
"""

from __future__ import annotations

import math

import numpy as np

from emgrid.models.cost import ceil_log2

from emgrid.models.units import NODE_CALL_S

from .costing import COUPLING_COPIES, base_bytes, block_counts, compute_factor, fixed_bytes, least_fixed_bytes, mstep_s
from .facts import ModelFacts
from .placement import ReplicaMixes
from .resources import Resources

#: Rows of :func:`min_cuts`' cost table.
SPANNING_FIELDS = ("flops", "stat", "param", "fixed", "work", "calls")


class Bounds:
    """Grid-independent facts of one model, and the bounds built on them."""

    def __init__(self, facts: ModelFacts, resources: Resources, n_data: int, max_shards: int):
        self.facts = facts
        self.n_data = n_data
        self.tf, self.ts, self.tp = (float(x.sum()) for x in (facts.flops, facts.stat, facts.param))
        self.chain_f, self.chain_s, self.chain_p = (_chain(facts, x) for x in (facts.flops, facts.stat, facts.param))
        fixed = least_fixed_bytes(facts.param, facts.stat, facts.cache)  # the spanning nodes' tables: any D
        #: by whether the grid has one replica (``costing.fixed_bytes``)
        whole = {one: fixed_bytes(facts.param, facts.stat, facts.cache, 1 if one else 2) for one in (True, False)}
        self.base = {one: base_bytes(facts, 1 if one else 2) for one in (True, False)}
        zeros = np.zeros(facts.n_nodes)
        pieces = np.stack([zeros] * len(SPANNING_FIELDS) + [facts.couple])
        spanning = np.stack([facts.flops, facts.stat, facts.param, fixed, facts.work_spanning, facts.calls, zeros])
        table = min_cuts(facts, max_shards, pieces, spanning)
        self.spanning = {f: table[i] for i, f in enumerate(SPANNING_FIELDS)}
        self.c_min = table[-1]
        speeds = np.sort([w.flops_per_s for w in resources.workers])[::-1]
        self.speeds = speeds
        self.speed_prefix = np.concatenate([[0.0], np.cumsum(speeds)])
        self.f_max = float(speeds[0])
        self.lat = resources.network.latency_s
        self.bw = resources.network.bytes_per_s
        self.block = facts.block_rows
        self.calls = float(facts.calls.sum()) * NODE_CALL_S
        self.chain_k = _chain(facts, facts.calls) * NODE_CALL_S
        self.mstep = mstep_s(facts)
        self.fixed = {one: float(f.sum()) for one, f in whole.items()}
        self.data_row = float(facts.group_data.sum())
        # some worker computes the largest scratch; a spanning node may hold less than a whole one
        self.work_row = float(np.minimum(facts.work, facts.work_spanning).sum()
                              + np.minimum(facts.scratch, facts.scratch_spanning).max())
        lv = facts.leaf_nodes
        self.leaf_fixed = {one: f[lv] for one, f in whole.items()}
        self.leaf_data = facts.data[lv]
        self.leaf_work = facts.work[lv] + facts.scratch[lv]
        self.min_column = float(facts.group_data[facts.data_group[lv]].min())
        mems = [w.memory_bytes for w in resources.workers]
        self.unknown_memory = any(x is None for x in mems)
        known = np.sort([float(x) for x in mems if x is not None])[::-1]
        self.mem_prefix = np.concatenate([[0.0], np.cumsum(known)])
        self.mem_max = float(known[0]) if len(known) else math.inf

    # ------------------------------------------------------------ time
    def _sf(self, field: str, m: int) -> float:
        return float(self.spanning[field][m]) if m > 1 else 0.0

    def _comm(self, d: int, m: int, rows_max: int) -> float:
        lat, bw = self.lat, self.bw
        out = 0.0
        ld = ceil_log2(d)
        if ld:
            out += ld * (lat + max((self.ts + (m - 1) * self._sf("stat", m)) / m, self.chain_s) / bw)
            out += ld * (lat + max((self.tp + (m - 1) * self._sf("param", m)) / m, self.chain_p) / bw)
        if m > 1:
            out += ceil_log2(m) * (lat + self._sf("param", m) / bw)
            out += math.ceil(rows_max / self.block) * ceil_log2(m) * lat
            out += rows_max * (m - 1) / m * float(self.c_min[m]) / bw
        return out

    def replica_comm(self, d: int, m: int) -> float:
        """The reduce and broadcast over ``d`` replicas (``L(d)`` terms), bounded below as in
        the module docstring: what a ``d x m`` plan adds to its largest replica alone."""
        ld = ceil_log2(d)
        if not ld:
            return 0.0
        stat = max((self.ts + (m - 1) * self._sf("stat", m)) / m, self.chain_s)
        param = max((self.tp + (m - 1) * self._sf("param", m)) / m, self.chain_p)
        return ld * (2 * self.lat + (stat + param) / self.bw)

    def _work(self, m: int) -> float:
        return self.tf + (m - 1) * self._sf("flops", m)

    def grid_bound(self, d: int, m: int) -> float:
        """A bound for every layout of the ``d x m`` grid."""
        n = self.n_data
        rows_max = -(-n // d)
        # the busiest worker's T >= F_i / s_i + V_i for all i, so S T >= F + sum s_i V_i >=
        # F + s_min V, V >= the visits of every node once per block of the data
        visits = float(block_counts(n, self.block)) * self._visits(m) * self.speeds[d * m - 1]
        beta = float(block_counts(rows_max, self.block))  # the replica of most rows visits every node per block
        compute = max((n * self._work(m) + visits) / self.speed_prefix[d * m], rows_max * self.chain_f / self.f_max,
                      beta * self._visits(m) / m, beta * self.chain_k)
        return compute * compute_factor(m) + self._comm(d, m, rows_max) + self.mstep

    def _visits(self, m: int) -> float:
        """Seconds of node visits per block summed over the shards: ``c (K + (m-1) K_spanning(m))``."""
        return self.calls + (m - 1) * self._sf("calls", m) * NODE_CALL_S

    def layout_bound(self, m: int, a: np.ndarray, rows, speed: np.ndarray | None = None, d: int | None = None) -> float:
        """A bound for every assignment on one layout (``a`` per column, ``rows`` per replica;
        with ``speed[r, s]`` the node visits count too: on the replica ``r*`` of most rows,
        ``T >= a*_s F_s + beta K_s`` with ``a*_s = rows_r* / speed(r*, s)`` and ``beta`` its
        blocks times ``c``, so ``T sum_s 1/a*_s >= sum_s F_s + beta min_s(1/a*_s) sum_s K_s``).
        ``d``: the grid's replicas when ``rows`` are some of them only (default: one per row)."""
        compute = max(self._work(m) / float(np.sum(1.0 / a)), float(a.min()) * self.chain_f)
        if speed is not None:
            r = int(np.argmax(rows))
            inv = np.asarray(speed[r], dtype=np.float64) / float(rows[r])
            beta = float(block_counts(int(rows[r]), self.block))
            compute = max(compute, (self._work(m) + beta * float(inv.min()) * self._visits(m)) / float(inv.sum()),
                          beta * self.chain_k, beta * self._visits(m) / m)
        return compute * compute_factor(m) + self._comm(d or len(rows), m, int(max(rows))) + self.mstep

    def replica_caps(self, mixes: ReplicaMixes, d: int) -> np.ndarray:
        """The most rows a replica of each kind of ``mixes`` can hold (:meth:`layout_fits`)."""
        return np.array([_last_true(lambda x, mem=mem: self.layout_fits(mem[None, :], [x], d), self.n_data)
                         for mem in mixes.memory], dtype=np.int64)

    def any_rows_bound(self, mixes: ReplicaMixes, d: int, steps: dict[int, list] | None = None) -> float:
        """A bound for every layout of a ``d x m`` grid built of ``mixes``
        (``placement.replica_mixes``) and every split of the rows; ``inf`` when none fits.

        Every plan's time is at least each replica's own :meth:`layout_bound` with its rows
        (the exchanges over the ``d`` replicas included, its rows as the most rows), which is
        non-decreasing in the rows; a replica holds at least one row and at most the rows
        :meth:`layout_fits` allows it. So at a time ``T`` a replica of kind ``k`` takes at most
        ``y_k(T)`` rows (the most whose bound is at most ``T``, capped; none allowed when one
        row's bound exceeds ``T``), and some mix must reach ``n`` rows: bisection on ``T``
        returns a ``T`` that is forced or proven too small for every mix. ``steps[k]``: pairs
        ``(x, t)``, a replica of kind ``k`` with ``x`` rows or more takes at least ``t``
        (program bounds, :meth:`Search.any_rows_lower`), raising its bound where they apply."""
        n = self.n_data
        m = mixes.speed.shape[1]
        caps = self.replica_caps(mixes, d)
        gs = []
        for k, sp in enumerate(mixes.speed):
            pts = sorted((steps or {}).get(k, []))
            xs = np.array([x for x, _ in pts], dtype=np.int64)
            ts = np.maximum.accumulate([t for _, t in pts]) if pts else np.zeros(0)

            def g(x, sp=sp, xs=xs, ts=ts):
                j = int(np.searchsorted(xs, x, side="right"))
                step = float(ts[j - 1]) if j else 0.0
                return max(step, self.layout_bound(m, x / sp, [x], sp[None, :], d=d))

            gs.append(g)
        counts = mixes.counts[np.all((mixes.counts == 0) | (caps >= 1), axis=1)]
        if not len(counts) or int((counts @ caps).max()) < n:
            return math.inf
        used = np.flatnonzero(counts.any(axis=0))
        one = np.full(len(caps), math.inf)
        one[used] = [gs[k](1) for k in used]

        def enough(t: float) -> bool:
            y = np.zeros(len(caps))
            for k in used:
                if one[k] <= t:
                    y[k] = _last_true(lambda x: gs[k](x) <= t, int(caps[k]))
            ok = np.all((counts == 0) | (one <= t), axis=1)
            return bool(ok.any() and (counts[ok] @ y).max() >= n)

        lo = float(np.min(np.where(counts > 0, one, -math.inf).max(axis=1)))  # the mix whose rows start cheapest
        if enough(lo):
            return lo
        hi = max(gs[k](int(caps[k])) for k in used)
        while hi - lo > 1e-9 * hi:
            mid = 0.5 * (lo + hi)
            if enough(mid):
                hi = mid
            else:
                lo = mid
        return lo

    # ------------------------------------------------------------ memory
    def replica_need(self, rows: int, m: int = 1, d: int = 2) -> float:
        """The least bytes one replica of ``rows`` rows needs over its ``m`` workers (``d`` replicas)."""
        b = min(rows, self.block)
        one = d == 1
        out = (self.fixed[one] + max(self.data_row, m * self.min_column) * rows + self.work_row * b
               + m * self.base[one])
        if m > 1:
            out += ((m - 1) * (self._sf("fixed", m) + self._sf("work", m) * b)
                    + m * b * COUPLING_COPIES * float(self.c_min[m]))
        return out

    def leaf_need(self, rows: int, m: int = 1, least: bool = False, d: int = 2) -> float:
        """The hungriest (``least``: the lightest) leaf's own bytes with ``rows`` rows, plus
        the spanning nodes' least: some worker holds the first, every worker the second."""
        b = min(rows, self.block)
        one = d == 1
        need = self.leaf_fixed[one] + self.leaf_data * rows + self.leaf_work * b
        out = float(need.min() if least else need.max()) + self.base[one]
        if m > 1:
            out += self._sf("fixed", m) + self._sf("work", m) * b + b * COUPLING_COPIES * float(self.c_min[m])
        return out

    def grid_fits(self, d: int, m: int) -> bool:
        """False when no layout of the grid can hold its largest replica."""
        if self.unknown_memory:
            return True
        rows = -(-self.n_data // d)
        if self.leaf_need(rows, m, d=d) > self.mem_max:
            return False
        top = min(m, len(self.mem_prefix) - 1)
        if self.leaf_need(rows, m, least=True, d=d) > self.mem_prefix[top] - self.mem_prefix[top - 1]:
            return False  # the m-th largest memory cannot hold even the lightest shard
        return self.replica_need(rows, m, d) <= self.mem_prefix[top]

    def layout_fits(self, memory: np.ndarray, rows, d: int | None = None) -> bool:
        """False when some replica of the layout cannot hold itself (``memory[r, s]``, inf
        for unknown) on a grid of ``d`` replicas (default: the layout's)."""
        m = memory.shape[1]
        d = memory.shape[0] if d is None else d
        rows = np.asarray(rows)
        top, total, low = memory.max(axis=1), memory.sum(axis=1), memory.min(axis=1)
        for n in np.unique(rows):
            at = rows == n
            n = int(n)
            if (self.leaf_need(n, m, d=d) > top[at].min() or self.replica_need(n, m, d) > total[at].min()
                    or self.leaf_need(n, m, least=True, d=d) > low[at].min()):
                return False
        return True


def _last_true(pred, hi: int) -> int:
    """The largest ``x`` in ``1..hi`` with ``pred(x)`` for a predicate true up to some point
    and false after; 0 when ``pred(1)`` is false."""
    if hi < 1 or not pred(1):
        return 0
    lo = 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if pred(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _chain(facts: ModelFacts, x: np.ndarray) -> float:
    """The largest sum of ``x`` over a leaf and its ancestors."""
    acc = np.zeros(facts.n_nodes)
    acc[0] = x[0]
    for v in range(1, facts.n_nodes):
        acc[v] = acc[int(facts.parent[v])] + x[v]
    return float(acc[facts.leaf_nodes].max())


def min_cuts(facts: ModelFacts, k_max: int, piece: np.ndarray, spanning: np.ndarray) -> np.ndarray:
    """``out[t, k]``: the least ``sum_{owned roots} piece[t] + sum_{spanning nodes} spanning[t]``
    over the cuts of the tree with at least ``k`` owned roots (each row ``t`` minimized on
    its own); ``out[:, 0] = out[:, 1] = 0`` (no spanning node) and ``inf`` beyond the leaves.

    Tree knapsack: ``h_v[t, p]`` is the cheapest covering of ``v``'s subtree by ``p`` owned
    roots (``p = 1``: ``v`` whole; ``p >= 2``: ``v`` spanning, the min-plus convolution of
    its children plus ``spanning[t, v]``), with ``p`` saturating at ``k_max`` ("at least").
    """
    cap = max(2, min(k_max, facts.n_leaves))
    n_t = piece.shape[0]
    h: list[np.ndarray | None] = [None] * facts.n_nodes
    for v in range(facts.n_nodes - 1, -1, -1):
        acc = None
        for c in facts.children[v]:
            g = h[c]
            h[c] = None
            acc = g if acc is None else _merge(acc, g, cap)
        if acc is None:
            out = np.full((n_t, 2), np.inf)
        else:
            out = acc + spanning[:, v:v + 1]
        out[:, 0] = np.inf
        out[:, 1] = piece[:, v]
        h[v] = out
    root = h[0]
    res = np.full((n_t, cap + 1), np.inf)
    res[:, :2] = 0.0
    if root.shape[1] > 2:
        tail = np.minimum.accumulate(root[:, ::-1], axis=1)[:, ::-1]
        res[:, 2:root.shape[1]] = tail[:, 2:]
    return res


def _merge(a: np.ndarray, b: np.ndarray, cap: int) -> np.ndarray:
    """Row-wise min-plus convolution of piece-count tables, the count saturating at ``cap``."""
    size = min(a.shape[1] + b.shape[1] - 1, cap + 1)
    out = np.full((a.shape[0], size), np.inf)
    for q in range(1, b.shape[1]):
        bq = b[:, q:q + 1]
        hi = min(a.shape[1], cap - q)  # p + q < cap land exactly; the rest saturate into out[cap]
        if hi > 1:
            np.minimum(out[:, 1 + q:hi + q], a[:, 1:hi] + bq, out=out[:, 1 + q:hi + q])
        if a.shape[1] + q - 1 >= cap:
            lo = max(1, cap - q)
            out[:, cap] = np.minimum(out[:, cap], a[:, lo:].min(axis=1) + bq[:, 0])
    return out
