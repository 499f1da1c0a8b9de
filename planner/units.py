"""Placement units: the pieces of the tree the shard programs move as a whole.

With at most ``SolverConfig.max_units`` leaves every leaf is its own unit and the program
is exact. A larger tree is cut into at most ``max_units`` units by refining from the root,
heaviest piece first (weight = the larger of its share of FLOPs and its share of bytes):
an expanded node's children become pieces, and when they are too many for the budget,
runs of consecutive siblings are grouped (a *chunk*; a heavy chunk is later halved). A
unit is therefore a whole subtree or a run of sibling subtrees, always on one shard.
The program is then exact over these units only; the planner says so and takes its
lower bound from the unrestricted analytic bound instead of the program's.

The *unit tree* keeps the expanded internal nodes; its items are those nodes and the
units. Every cost of a unit is the sum over the nodes it holds; its coupling bytes (paid
when its parent is spanning) are the sum over its top nodes, its scratch bytes the largest of
its nodes' (``ModelFacts.scratch``: one node computes at a time).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from .facts import ModelFacts

COST_FIELDS = ("flops", "param", "stat", "cache", "data", "work", "calls")


@dataclass(frozen=True, eq=False)
class UnitTree:
    """Units and the expanded internal nodes above them."""

    unit_leaves: tuple[tuple[int, ...], ...]  # leaf indices (pre-order) of every unit
    unit_tops: tuple[tuple[int, ...], ...]  # model nodes heading every unit (one, or a run of siblings)
    unit_cost: dict[str, np.ndarray]  # per unit, summed over its nodes ("scratch": their largest)
    unit_couple: np.ndarray  # per unit, bytes per row shipped when its parent is spanning
    unit_parent: np.ndarray  # position in ``internal`` of the unit's parent, -1 for a one-unit tree
    internal: tuple[int, ...]  # model node indices of the expanded nodes, pre-order; internal[0] is the root
    internal_parent: np.ndarray  # position in ``internal``, -1 for the root
    internal_cost: dict[str, np.ndarray]  # the node's own costs
    internal_couple: np.ndarray
    child_units: tuple[tuple[int, ...], ...]  # per internal node
    child_internal: tuple[tuple[int, ...], ...]  # per internal node
    grouped: bool  # True when some unit holds more than one leaf
    unit_groups: tuple[tuple[int, ...], ...]  # data columns (with bytes) each unit reads
    internal_group: np.ndarray  # data column an expanded node reads itself, -1 for none
    group_data: np.ndarray  # bytes per root row of every data column
    mstep_peak: float  # the largest node M-step's bytes (``costing.mstep_peak_bytes`` with D = 1)

    @property
    def n_units(self) -> int:
        return len(self.unit_leaves)

    @property
    def n_internal(self) -> int:
        return len(self.internal)

    def leaf_shard(self, unit_shard, n_leaves: int) -> np.ndarray:
        """Leaf-level shard array from a unit-level one."""
        out = np.empty(n_leaves, dtype=np.int64)
        for u, leaves in enumerate(self.unit_leaves):
            out[list(leaves)] = unit_shard[u]
        return out

    def unit_shard(self, leaf_shard) -> np.ndarray | None:
        """Unit-level shard array from a leaf-level one, or None when a unit is split."""
        out = np.empty(self.n_units, dtype=np.int64)
        for u, leaves in enumerate(self.unit_leaves):
            vals = {int(leaf_shard[i]) for i in leaves}
            if len(vals) != 1:
                return None
            out[u] = vals.pop()
        return out


def _subtree_nodes(facts: ModelFacts, v: int) -> range:
    """Pre-order node indices of the subtree of ``v`` (contiguous in pre-order)."""
    end = v + 1
    while end < facts.n_nodes and _is_below(facts, end, v):
        end += 1
    return range(v, end)


def _is_below(facts: ModelFacts, node: int, anc: int) -> bool:
    while node > anc:
        node = int(facts.parent[node])
    return node == anc


def build_units(facts: ModelFacts, max_units: int) -> UnitTree:
    """Units of at most ``max_units`` pieces (every leaf when the tree has that few)."""
    n = facts.n_nodes
    end = np.arange(1, n + 1)
    for v in range(n - 1, -1, -1):  # subtree end in pre-order
        for c in facts.children[v]:
            end[v] = max(end[v], end[c])
    sub = {f: np.concatenate([[0.0], np.cumsum(getattr(facts, f))]) for f in COST_FIELDS}

    def subtree_sum(f, v):
        return sub[f][end[v]] - sub[f][v]

    tot_f = max(float(facts.flops.sum()), 1e-300)
    tot_b = max(float((facts.param + facts.stat).sum() + facts.data.sum()), 1e-300)

    def weight(tops):
        f = sum(subtree_sum("flops", v) for v in tops)
        b = sum(subtree_sum("param", v) + subtree_sum("stat", v) + subtree_sum("data", v) for v in tops)
        return max(f / tot_f, b / tot_b)

    if facts.n_leaves <= max_units:
        pieces = [(int(v),) for v in facts.leaf_nodes]
        expanded = [v for v in range(n) if not facts.is_leaf[v]]
    else:
        pieces, expanded = _refine(facts, max_units, weight)

    expanded = sorted(expanded)
    pos = {v: i for i, v in enumerate(expanded)}
    pieces.sort(key=lambda tops: tops[0])
    unit_leaves, unit_parent = [], []
    child_units: list[list[int]] = [[] for _ in expanded]
    child_internal: list[list[int]] = [[] for _ in expanded]
    for u, tops in enumerate(pieces):
        lo, hi = int(facts.leaf_lo[tops[0]]), int(facts.leaf_hi[tops[-1]])
        unit_leaves.append(tuple(range(lo, hi)))
        par = int(facts.parent[tops[0]])
        unit_parent.append(pos[par] if par >= 0 else -1)
        if par >= 0:
            child_units[pos[par]].append(u)
    internal_parent = []
    for i, v in enumerate(expanded):
        par = int(facts.parent[v])
        internal_parent.append(pos[par] if par >= 0 else -1)
        if par >= 0:
            child_internal[pos[par]].append(i)
    # summed directly (prefix-sum differences would make equal units differ in the last bits)
    unit_cost = {f: np.array([sum(float(getattr(facts, f)[v:end[v]].sum()) for v in tops) for tops in pieces])
                 for f in COST_FIELDS}
    unit_cost["scratch"] = np.array([max(float(facts.scratch[v:end[v]].max()) for v in tops) for tops in pieces])
    has_data = facts.data > 0
    unit_groups = []
    for tops in pieces:
        nodes = np.concatenate([np.arange(v, end[v]) for v in tops])
        unit_groups.append(tuple(sorted(set(facts.data_group[nodes[has_data[nodes]]].tolist()))))
    unit_cost["data"] = np.array([float(facts.group_data[list(g)].sum()) for g in unit_groups])
    idx = np.array(expanded, dtype=np.int64)
    return UnitTree(
        unit_leaves=tuple(unit_leaves), unit_tops=tuple(pieces), unit_cost=unit_cost,
        unit_couple=np.array([float(sum(facts.couple[v] for v in tops)) for tops in pieces]),
        unit_parent=np.array(unit_parent, dtype=np.int64), internal=tuple(expanded),
        internal_parent=np.array(internal_parent, dtype=np.int64),
        internal_cost={f: getattr(facts, f)[idx] if len(idx) else np.zeros(0)
                       for f in (*COST_FIELDS, "scratch", "work_spanning", "scratch_spanning")},
        internal_couple=facts.couple[idx] if len(idx) else np.zeros(0),
        child_units=tuple(tuple(c) for c in child_units), child_internal=tuple(tuple(c) for c in child_internal),
        grouped=any(len(lv) > 1 for lv in unit_leaves), unit_groups=tuple(unit_groups),
        internal_group=np.array([int(facts.data_group[v]) if has_data[v] else -1 for v in expanded], dtype=np.int64),
        group_data=facts.group_data,
        mstep_peak=float(facts.mstep.max(initial=0.0)),
    )


def _refine(facts: ModelFacts, max_units: int, weight) -> tuple[list[tuple[int, ...]], list[int]]:
    """Heaviest-first refinement of the root into at most ``max_units`` pieces."""
    heap: list[tuple[float, int, tuple[int, ...]]] = []
    counter = 0
    expanded: list[int] = []

    def push(tops):
        nonlocal counter
        heapq.heappush(heap, (-weight(tops), counter, tops))
        counter += 1

    push((0,))
    frozen: list[tuple[int, ...]] = []
    while heap:
        count = len(heap) + len(frozen)
        _, _, tops = heapq.heappop(heap)
        if len(tops) == 1:
            v = tops[0]
            kids = facts.children[v]
            if not kids:
                frozen.append(tops)
                continue
            room = max_units - count + 1
            if room < 2:
                frozen.append(tops)
                continue
            expanded.append(v)
            for run in _runs(list(kids), min(room, len(kids)), weight):
                push(run)
        else:
            if max_units - count < 1:
                frozen.append(tops)
                continue
            for run in _runs(list(tops), 2, weight):
                push(run)
    return [t for _, _, t in heap] + frozen, expanded


def _runs(items: list[int], k: int, weight) -> list[tuple[int, ...]]:
    """``items`` cut into ``k`` consecutive runs of near-equal weight."""
    if k >= len(items):
        return [(v,) for v in items]
    w = np.array([weight((v,)) for v in items])
    cum = np.cumsum(w)
    total = cum[-1] if cum[-1] > 0 else 1.0
    cuts, start = [], 0
    for j in range(1, k):
        lo, hi = start + 1, len(items) - (k - j)
        cand = np.arange(lo, hi + 1)
        cut = int(cand[np.argmin(np.abs(cum[cand - 1] - total * j / k))])
        cuts.append(cut)
        start = cut
    bounds = [0, *cuts, len(items)]
    return [tuple(items[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]


def unit_signature(ut: UnitTree, u: int) -> tuple:
    """Units with equal signatures (same parent, costs and data columns) are interchangeable."""
    return (int(ut.unit_parent[u]), *(float(ut.unit_cost[f][u]) for f in sorted(ut.unit_cost)),
            float(ut.unit_couple[u]), ut.unit_groups[u])


def unit_order(ut: UnitTree) -> list[int]:
    """Units by decreasing FLOPs, interchangeable units adjacent."""
    return sorted(range(ut.n_units), key=lambda u: (-ut.unit_cost["flops"][u], unit_signature(ut, u), u))


def unit_classes(ut: UnitTree) -> list[list[int]]:
    """Runs of interchangeable units, in :func:`unit_order`."""
    out: list[list[int]] = []
    last = None
    for u in unit_order(ut):
        sig = unit_signature(ut, u)
        if out and sig == last:
            out[-1].append(u)
        else:
            out.append([u])
        last = sig
    return out
