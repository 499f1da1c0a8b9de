"""The exact optimum of the plan space ``validate_plan`` accepts, by exhaustive search.

An oracle for the exact planner that shares nothing with its CP-SAT program: no units, no
layouts, no heuristics, no scaling, no bounds of ``planner/``. It reads only the cost model
(``planner.costing``: ``shard_sums`` and the constants of ``price``) and checks its answer
with the project's own ``plan_from_assignment`` and ``validate_plan``.

What it enumerates
    Every grid ``D x M`` with ``D*M <= workers``, ``D <= n_data``, ``M <= leaves``; every
    partition of the leaves into ``M`` nonempty shards; every placement of distinct workers
    on the ``D*M`` cells (the others stay idle); every split of ``n_data`` into ``D`` row
    counts >= 1. A candidate is kept when every known worker's memory holds its cell
    (``ceil(bytes) <= memory``, as ``costing.price`` and ``validate_plan`` check).

Reductions, and why each is exact
    1. *Shard labels.* ``shard_sums`` and ``price`` treat the shards alike (every term is a
       sum, a max or a count over shards, and a node is spanning whatever the labels), except
       that cell ``(0, 0)`` carries ``coordinator_bytes`` when ``coordinator_in_grid``.
       Relabelling the shards, with the grid's columns permuted alike, keeps every figure;
       so the partitions are enumerated unlabelled (blocks in the order of their first
       leaf) and, with the coordinator in the grid, once for each block that may sit in
       column 0 (the remaining columns are still interchangeable).
    2. *Replica order.* Permuting the grid's rows together with their row counts keeps
       every figure (compute and coupling are maxima over replicas, reduce and broadcast do
       not see rows), except row 0 with the coordinator. The other replicas are therefore
       enumerated as a multiset; row 0 is chosen freely when it coordinates.
    3. *Identical workers.* ``price`` sees a worker only through its speed and memory; two
       workers equal in both are interchangeable, so a placement is a matrix of worker
       *types* with each type used at most as often as it occurs.
    4. *Rows, for a fixed grid, partition and placement.* Replica ``r``'s busiest-cell time
       ``g_r(n) = max_s n F_s / v_rs + ceil(n / B) c K_s`` and the coupling of one replica
       ``h(n)`` (the same function for every replica) are nondecreasing in its rows ``n``,
       in exact arithmetic and in IEEE rounding (each operation is monotone); so is every
       cell's memory. The total is ``T = phi(max_r g_r(n_r), max_r h(n_r)) + const`` with
       ``phi`` nondecreasing in both and ``max_r h(n_r) = h(max_r n_r)``. Memory caps each
       replica at ``u_r`` rows (the largest ``n`` whose cells fit; bisection is exact on a
       monotone predicate). For a compute level ``t`` let ``cap_r(t) = max{n <= u_r :
       g_r(n) <= t}`` and ``m*(t)`` the least ``m`` with ``sum_r min(cap_r(t), m) >= n_data``
       (rows can always be taken away from a replica down to 1, which raises neither term).
       Every split with compute ``t`` has ``max n >= m*(t)``, and a split with compute
       ``<= t`` and largest replica ``m*(t)`` exists, so the optimum over splits is
       ``min_t psi(t)``, ``psi(t) = phi(t, h(m*(t)))``, over the floats ``t`` from the least
       feasible one, ``t_min`` (found by bisection on the ordered bit patterns of the
       floats: feasibility is monotone in ``t``), to ``t_max``, where ``m*`` reaches its
       least value (``psi`` only grows beyond). With ``M = 1`` there is no coupling and the
       optimum is ``psi(t_min)``. With ``M > 1``, ``[t_min, t_max]`` is searched by branch and
       bound on float intervals ``[a, b]``: every ``t`` in it has ``psi(t) >=
       phi(a, h(m*(b)))``; an interval with ``m*(a) = m*(b)`` has its minimum at ``a``; one
       whose bound is not below the best value known is dropped; otherwise it is halved
       (in bit patterns) until its ends are adjacent floats. Every float ``t`` is thus
       either evaluated or covered by a bound, so the result is the exact optimum over all
       ``C(n_data - 1, D - 1)`` splits, for ``n_data`` up to 1e6 in milliseconds.
    5. *Candidates in bound order.* Each candidate gets a lower bound before its rows are
       searched (``max_r g_r(1)``, the fluid bound ``n_data / sum_r 1/alpha_r`` with
       ``alpha_r = max_s F_s / v_rs + c K_s / B <= g_r(n) / n``, and the coupling of the
       least possible largest replica), scaled down by ``1 - 1e-12`` against rounding;
       candidates are searched in bound order and the search stops when the next bound is
       not below the best total. The result is exact to that ``1e-12``.

The best candidate is rebuilt with ``plan_from_assignment`` and checked by
``validate_plan``; its ``objective_s`` must agree with the oracle's own recomputation of
``price`` (relative 1e-12), or the oracle raises: the cost model changed under it.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from emgrid.models.base import Node
from emgrid.models.cost import ceil_log2
from emgrid.models.units import NODE_CALL_S
from emgrid.planner import BalancePlan, Resources, plan_from_assignment, validate_plan
from emgrid.planner.costing import (COUPLING_COPIES, base_bytes, compute_factor, coordinator_bytes,
                                    fixed_bytes, mstep_s, shard_sums)
from emgrid.planner.facts import model_facts

#: Relative margin of every lower bound against floating-point rounding.
BOUND_MARGIN = 1e-12
#: Relative agreement required between the oracle's pricing and ``plan_from_assignment``.
PRICE_TOL = 1e-12


# ---------------------------------------------------------------- enumeration pieces
def set_partitions(n: int, m: int):
    """Every partition of ``range(n)`` into ``m`` nonempty blocks, as a restricted growth
    string: ``labels[i]`` is the block of item ``i``, blocks numbered by first item."""
    labels = [0] * n

    def rec(i: int, used: int):
        if n - i < m - used:
            return
        if i == n:
            if used == m:
                yield tuple(labels)
            return
        for b in range(min(used + 1, m)):
            labels[i] = b
            yield from rec(i + 1, max(used, b + 1))

    if n >= m >= 1:
        yield from rec(0, 0)


def column_labellings(labels: tuple[int, ...], m: int, coordinator: bool):
    """The labelled partitions one unlabelled partition stands for: itself, and with the
    coordinator in the grid each block moved to column 0 (swapped with block 0)."""
    yield labels
    if coordinator:
        for j in range(1, m):
            yield tuple(j if b == 0 else 0 if b == j else b for b in labels)


def _bits(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", x))[0]


def _float(b: int) -> float:
    return struct.unpack("<d", struct.pack("<q", b))[0]


# ---------------------------------------------------------------- one partition's figures
@dataclass(frozen=True)
class Shards:
    """One labelled partition's per-shard figures, as ``costing.price`` uses them."""

    leaf_shard: tuple[int, ...]
    m: int
    flops: tuple[float, ...]  # F_s
    call_s: tuple[float, ...]  # c K_s (NODE_CALL_S * calls)
    data: tuple[float, ...]  # bytes per row
    block: tuple[float, ...]  # bytes per row of a block: work + scratch + coupling copies
    fixed: tuple[float, ...]  # parameter and statistic copies (``costing.fixed_bytes`` for its grid's D)
    base: float  # bytes every worker holds whatever its shard (``costing.base_bytes``)
    couple: float  # coupling bytes per row (0 for M = 1)
    max_stat: float
    max_param: float
    spanning_param: float


def shards_of(facts, leaf_shard: tuple[int, ...], m: int, d: int) -> Shards:
    """The sums of one leaf partition, with the memory of a grid of ``d`` replicas (one
    replica or several: the two memory models of ``costing.fixed_bytes``)."""
    ss = shard_sums(facts, np.array(leaf_shard, dtype=np.int64), m)
    couple = ss.coupling_bytes_per_row if m > 1 else 0.0
    block = ss.work + ss.scratch + COUPLING_COPIES * couple
    return Shards(leaf_shard=leaf_shard, m=m, flops=tuple(float(x) for x in ss.flops),
                  call_s=tuple(float(x) for x in NODE_CALL_S * ss.calls), data=tuple(float(x) for x in ss.data),
                  block=tuple(float(x) for x in block),
                  fixed=tuple(float(x) for x in fixed_bytes(ss.param, ss.stat, ss.cache, d)),
                  base=base_bytes(facts, d), couple=float(couple),
                  max_stat=float(ss.stat.max()), max_param=float(ss.param.max()), spanning_param=float(ss.spanning_param))


# ---------------------------------------------------------------- one replica
def memory_cap(sh: Shards, memories, block_rows: int, n_max: int, coord_extra: float) -> int:
    """Most rows (<= n_max) with which every cell fits (``memories[s]``: the memory of the
    worker on shard ``s``, None when unknown; cell 0 adds ``coord_extra``); 0 when even one
    row does not fit. A cell's bytes grow with its rows, so each cell's predicate is
    monotone and the replica's cap is the least of its cells' caps."""
    return min([n_max] + [_cell_cap(sh, s, mem, block_rows, n_max, coord_extra if s == 0 else 0.0)
                          for s, mem in enumerate(memories) if mem is not None])


def _cell_cap(sh: Shards, s: int, mem: int, block_rows: int, n_max: int, extra: float) -> int:
    """Most rows (<= n_max) whose bytes on shard ``s`` fit ``mem``: a first guess from the
    linear pieces of the bytes, then exact steps with ``price``'s own arithmetic."""
    b = float(block_rows)
    data, blk, fixed = sh.data[s], sh.block[s], sh.fixed[s]

    def fits(n: int) -> bool:
        nf = float(n)
        need = data * nf + blk * min(nf, b) + fixed + sh.base
        if extra:
            need += extra
        return math.ceil(need) <= mem

    room = mem - (fixed + sh.base + extra)
    if room < 0:
        guess = 0
    elif data + blk <= 0:
        guess = n_max
    elif room <= (data + blk) * b:
        guess = int(room / (data + blk))
    elif data <= 0:
        guess = n_max
    else:
        guess = int((room - blk * b) / data)
    guess = max(0, min(n_max, guess))
    while guess < n_max and fits(guess + 1):
        guess += 1
    while guess > 0 and not fits(guess):
        guess -= 1
    return guess


class Replica:
    """One replica's cells: worker types per shard, its time ``g(n)`` and memory cap ``u``."""

    __slots__ = ("speeds", "flops", "call_s", "block_rows", "u", "alpha", "g1")

    def __init__(self, sh: Shards, speeds, memories, block_rows: int, n_max: int, coord_extra: float,
                 u: int | None = None):
        self.speeds = speeds
        self.flops = sh.flops
        self.call_s = sh.call_s
        self.block_rows = block_rows
        self.u = memory_cap(sh, memories, block_rows, n_max, coord_extra) if u is None else u
        self.alpha = max(f / v + c / block_rows for f, v, c in zip(sh.flops, speeds, sh.call_s))
        self.g1 = self.g(1)

    def g(self, n: int) -> float:
        """Busiest cell's compute seconds with ``n`` rows (``price``'s ``seconds``)."""
        blocks = math.ceil(n / self.block_rows)
        return max((n * f) / v + blocks * c for f, v, c in zip(self.flops, self.speeds, self.call_s))

    def cap(self, t: float, limit: int) -> int:
        """Most rows ``n <= limit`` with ``g(n) <= t`` (0 when none)."""
        if self.g1 > t:
            return 0
        if self.g(limit) <= t:
            return limit
        lo, hi = 1, limit
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.g(mid) <= t:
                lo = mid
            else:
                hi = mid
        return lo


# ---------------------------------------------------------------- rows of one candidate
class RowSearch:
    """The exact best split of ``n`` rows over ``replicas`` (reduction 4 of the module)."""

    def __init__(self, replicas: list[Replica], n: int, m: int, h, combine):
        self.reps = replicas
        self.n = n
        self.d = len(replicas)
        self.m = m
        self.h = h
        self.combine = combine
        self.limits = [min(r.u, n - self.d + 1) for r in replicas]

    def caps(self, t: float) -> list[int]:
        return [r.cap(t, lim) for r, lim in zip(self.reps, self.limits)]

    def feasible_caps(self, caps: list[int]) -> bool:
        return min(caps) >= 1 and sum(caps) >= self.n

    def least_max(self, caps: list[int]) -> int:
        """Least ``m`` with ``sum min(caps, m) >= n`` (caps feasible)."""
        lo, hi = -(-self.n // self.d) - 1, max(caps)  # sum(min(caps, lo)) < n <= sum(min(caps, hi))
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if sum(min(c, mid) for c in caps) >= self.n:
                hi = mid
            else:
                lo = mid
        return hi

    def rows_at(self, t: float) -> list[int]:
        """A split with compute <= t and largest replica ``m*(t)``."""
        caps = self.caps(t)
        top = self.least_max(caps)
        rows = [min(c, top) for c in caps]
        excess = sum(rows) - self.n
        for r in range(self.d - 1, -1, -1):
            take = min(excess, rows[r] - 1)
            rows[r] -= take
            excess -= take
        assert excess == 0
        return rows

    def t_min(self) -> float:
        """The least float ``t`` whose caps admit a split."""
        hi = max(r.g(lim) for r, lim in zip(self.reps, self.limits))
        lo_v = max(max(r.g1 for r in self.reps), self.n / sum(1.0 / r.alpha for r in self.reps)) * (1 - 1e-9)
        if self.feasible_caps(self.caps(lo_v)):
            lo_v = 0.0
        lo, hb = _bits(lo_v), _bits(hi)  # lo infeasible, hb feasible
        while hb - lo > 1:
            mid = (lo + hb) // 2
            if self.feasible_caps(self.caps(_float(mid))):
                hb = mid
            else:
                lo = mid
        return _float(hb)

    def psi(self, t: float) -> tuple[float, int]:
        top = self.least_max(self.caps(t))
        return self.combine(t, self.h(top)), top

    def solve(self, cutoff: float) -> tuple[float, list[int] | None, int]:
        """``(best total, its rows, evaluations)``; rows None when nothing beats ``cutoff``
        or no split fits."""
        if min(self.limits) < 1 or sum(self.limits) < self.n:
            return math.inf, None, 0
        if self.d == 1:
            t = self.reps[0].g(self.n)
            total = self.combine(t, self.h(self.n))
            return (total, [self.n], 1) if total < cutoff else (total, None, 1)
        a = self.t_min()
        if self.m == 1:
            total = self.combine(a, 0.0)
            return (total, self.rows_at(a), 1) if total < cutoff else (total, None, 1)
        # the least possible largest replica, and the compute level at which it is reached
        m_min = self.least_max(self.limits)
        b = max(r.g(min(lim, m_min)) for r, lim in zip(self.reps, self.limits))
        best_t, best = None, cutoff
        pa, ma = self.psi(a)
        evals = 1
        if pa < best:
            best, best_t = pa, a
        if b <= a:
            return (best, self.rows_at(best_t), evals) if best_t is not None else (pa, None, evals)
        pb, mb = self.psi(b)
        evals += 1
        if pb < best:
            best, best_t = pb, b
        stack = [(a, ma, b, mb)]
        while stack:
            a, ma, b, mb = stack.pop()
            if ma == mb:
                continue  # psi(t) >= psi(a) on [a, b]
            if self.combine(a, self.h(mb)) * (1 - BOUND_MARGIN) >= best:
                continue
            ba, bb = _bits(a), _bits(b)
            if bb - ba <= 1:
                continue
            c = _float((ba + bb) // 2)
            pc, mc = self.psi(c)
            evals += 1
            if pc < best:
                best, best_t = pc, c
            stack.append((c, mc, b, mb))
            stack.append((a, ma, c, mc))
        if best_t is None:
            return min(pa, pb), None, evals
        return best, self.rows_at(best_t), evals


# ---------------------------------------------------------------- the search
@dataclass(frozen=True)
class Best:
    """The oracle's answer."""

    objective_s: float
    plan: BalancePlan | None
    n_candidates: int  # grid x partition x placement classes enumerated (reductions 1-3)
    n_searched: int  # of those, row-searched before the bound stopped the search
    assignment: dict | None  # the arguments of plan_from_assignment for the best plan


def _worker_types(resources: Resources):
    """Worker types (speed, memory) with the indices of the workers of each type."""
    types: dict[tuple, list[int]] = {}
    for i, w in enumerate(resources.workers):
        types.setdefault((float(w.flops_per_s), w.memory_bytes), []).append(i)
    return list(types.items())


def _placements(n_types: int, counts: list[int], d: int, m: int, coordinator: bool):
    """Matrices ``d x m`` of worker types, each type used at most ``counts[k]`` times, up to
    the order of the replicas (all of them, or all but replica 0 with the coordinator)."""
    tuples = []

    def rec_tuple(prefix: list[int]):
        if len(prefix) == m:
            tuples.append(tuple(prefix))
            return
        for k in range(n_types):
            if prefix.count(k) < counts[k]:
                rec_tuple(prefix + [k])

    rec_tuple([])
    use = [0] * n_types

    def take(tp, sign):
        for k in tp:
            use[k] += sign

    def ok(tp) -> bool:
        take(tp, 1)
        good = all(use[k] <= counts[k] for k in tp)
        if not good:
            take(tp, -1)
        return good

    def rec_rows(start: int, rows: list):
        if len(rows) == d:
            yield tuple(rows)
            return
        for j in range(start, len(tuples)):
            tp = tuples[j]
            if ok(tp):
                rows.append(tp)
                yield from rec_rows(j, rows)
                rows.pop()
                take(tp, -1)

    if coordinator:
        for tp in tuples:
            if ok(tp):
                for rest in rec_rows(0, [tp]):
                    yield rest
                take(tp, -1)
    else:
        yield from rec_rows(0, [])


def search(model: Node, resources: Resources, n_data: int, grid: tuple[int, int] | None = None) -> Best:
    """The exhaustive optimum (module docstring); ``grid`` pins ``(D, M)``."""
    facts = model_facts(model)
    n = int(n_data)
    L, W = facts.n_leaves, resources.n_workers
    coordinator = bool(resources.coordinator_in_grid)
    coord_extra = coordinator_bytes(facts, resources)
    net = resources.network
    lat, bw = net.latency_s, net.bytes_per_s
    B = facts.block_rows
    mstep = mstep_s(facts)
    types = _worker_types(resources)
    counts = [len(ix) for _, ix in types]
    grids = [grid] if grid is not None else [(d, m) for m in range(1, min(L, W) + 1)
                                             for d in range(1, min(n, W // m) + 1)]

    @lru_cache(maxsize=None)
    def shards(leaf_shard, m, d):
        return shards_of(facts, leaf_shard, m, min(d, 2))  # memory: one replica or several

    @lru_cache(maxsize=None)
    def cell(leaf_shard, m, d, s, k, coordinates):
        """``(rows cap, per-row time slope, time of one row)`` of shard ``s`` on a worker of
        type ``k`` (with the coordinator's bytes when ``coordinates``) in a grid of ``d`` replicas."""
        sh = shards(leaf_shard, m, min(d, 2))
        (v, mem), _ = types[k]
        u = n if mem is None else _cell_cap(sh, s, mem, B, n, coord_extra if coordinates else 0.0)
        f, c = sh.flops[s], sh.call_s[s]
        return u, f / v + c / B, (1 * f) / v + 1 * c

    def replicas(leaf_shard, m, tps):
        d = len(tps)
        sh = shards(leaf_shard, m, min(d, 2))
        out = []
        for r, tp in enumerate(tps):
            u = min(cell(leaf_shard, m, min(d, 2), s, k, coordinator and r == 0 and s == 0)[0] for s, k in enumerate(tp))
            out.append(Replica(sh, tuple(types[k][0][0] for k in tp), tuple(types[k][0][1] for k in tp), B, n,
                               0.0, u=u))
        return out

    candidates = []  # (bound, d, m, leaf_shard, placement of types)
    for d, m in grids:
        lm, ld = ceil_log2(m), ceil_log2(d)
        placements = list(_placements(len(types), counts, d, m, coordinator))
        for labels in set_partitions(L, m):
            for leaf_shard in column_labellings(labels, m, coordinator):
                sh = shards(leaf_shard, m, min(d, 2))
                const = _const(sh, ld, lm, lat, bw)
                h_lb = _h(-(-n // d), m, lm, lat, bw, B, sh.couple)
                table = [[cell(leaf_shard, m, min(d, 2), s, k, False) for k in range(len(types))] for s in range(m)]
                first = [cell(leaf_shard, m, min(d, 2), 0, k, coordinator) for k in range(len(types))]
                for tps in placements:
                    fit, inv_alpha, g1, room = True, 0.0, 0.0, 0
                    for r, tp in enumerate(tps):
                        u, alpha = n, 0.0
                        for s, k in enumerate(tp):
                            cu, ca, cg = first[k] if r == 0 and s == 0 else table[s][k]
                            if cu < u:
                                u = cu
                            if ca > alpha:
                                alpha = ca
                            if cg > g1:
                                g1 = cg
                        if u < 1:
                            fit = False
                            break
                        room += u
                        inv_alpha += 1.0 / alpha
                    if not fit or room < n:
                        candidates.append((math.inf, d, m, leaf_shard, tps))
                        continue
                    bound = _combine(max(g1, n / inv_alpha), h_lb, m, const, mstep)
                    candidates.append((bound * (1 - BOUND_MARGIN), d, m, leaf_shard, tps))
    candidates.sort(key=lambda c: c[0])

    best, arg, searched = math.inf, None, 0
    for bound, d, m, leaf_shard, tps in candidates:
        if bound >= best:
            break
        searched += 1
        sh = shards(leaf_shard, m, min(d, 2))
        lm, ld = ceil_log2(m), ceil_log2(d)
        const = _const(sh, ld, lm, lat, bw)
        rs = RowSearch(replicas(leaf_shard, m, tps), n, m,
                       lambda k, m=m, lm=lm, c=sh.couple: _h(k, m, lm, lat, bw, B, c),
                       lambda t, hm, m=m, const=const: _combine(t, hm, m, const, mstep))
        total, rows, _ = rs.solve(best)
        if rows is not None and total < best:
            best, arg = total, (d, m, leaf_shard, tps, rows)

    if arg is None:
        return Best(math.inf, None, len(candidates), searched, None)
    d, m, leaf_shard, tps, rows = arg
    pools = {k: list(ix) for k, (_, ix) in enumerate(types)}
    names = [w.name for w in resources.workers]
    placement = [[names[pools[k].pop(0)] for k in tp] for tp in tps]
    assignment = dict(data_parallel=d, model_parallel=m,
                      shard_of_leaf={p: int(s) for p, s in zip(facts.leaf_paths, leaf_shard)},
                      placement=placement, replica_rows=list(rows))
    plan = plan_from_assignment(model, resources, n, **assignment)
    if plan.fits is False:
        raise AssertionError(f"the oracle's best {assignment} does not fit by plan_from_assignment")
    validate_plan(plan, model, resources, n)
    if not math.isclose(plan.objective_s, best, rel_tol=PRICE_TOL, abs_tol=0.0):
        raise AssertionError(f"the oracle priced {assignment} at {best!r} s, plan_from_assignment at "
                             f"{plan.objective_s!r} s: the cost model changed under the oracle")
    return Best(plan.objective_s, plan, len(candidates), searched, assignment)


def best_rows(model: Node, resources: Resources, n_data: int, leaf_shard, placement) -> tuple[float, list[int] | None]:
    """The best total over every split of the rows for one assignment (reduction 4):
    ``leaf_shard[i]`` the shard of leaf ``i``, ``placement[r][s]`` a worker index;
    ``(inf, None)`` when no split fits."""
    facts = model_facts(model)
    n = int(n_data)
    grid = [list(row) for row in placement]
    d, m = len(grid), len(grid[0])
    sh = shards_of(facts, tuple(int(s) for s in leaf_shard), m, d)
    net = resources.network
    lm, ld = ceil_log2(m), ceil_log2(d)
    const = _const(sh, ld, lm, net.latency_s, net.bytes_per_s)
    extra = coordinator_bytes(facts, resources)
    ws = resources.workers
    reps = [Replica(sh, tuple(float(ws[w].flops_per_s) for w in row), tuple(ws[w].memory_bytes for w in row),
                    facts.block_rows, n, extra if r == 0 else 0.0) for r, row in enumerate(grid)]
    mstep = mstep_s(facts)
    rs = RowSearch(reps, n, m, lambda k: _h(k, m, lm, net.latency_s, net.bytes_per_s, facts.block_rows, sh.couple),
                   lambda t, hm: _combine(t, hm, m, const, mstep))
    total, rows, _ = rs.solve(math.inf)
    return (total, rows) if rows is not None else (math.inf, None)


def _const(sh: Shards, ld: int, lm: int, lat: float, bw: float) -> tuple[float, float]:
    """``(reduce, broadcast)`` seconds, as ``price`` computes them."""
    reduce_s = ld * (lat + sh.max_stat / bw) if ld else 0.0
    broadcast = ld * (lat + sh.max_param / bw) if ld else 0.0
    if sh.m > 1:
        broadcast += lm * (lat + sh.spanning_param / bw)
    return reduce_s, broadcast


def _h(rows: int, m: int, lm: int, lat: float, bw: float, block_rows: int, couple: float) -> float:
    """One replica's coupling seconds with ``rows`` rows (0 for ``M = 1``)."""
    if m == 1:
        return 0.0
    return math.ceil(rows / block_rows) * lm * lat + rows * couple * (m - 1) / m / bw


def _combine(compute: float, h_max: float, m: int, const: tuple[float, float], mstep: float) -> float:
    """The total of ``price`` from the compute term and the largest replica's coupling."""
    coupling = h_max + (compute_factor(m) - 1.0) * compute if m > 1 else 0.0
    return compute + coupling + const[0] + const[1] + mstep


def best_plan(model: Node, resources: Resources, n_data: int) -> tuple[float, BalancePlan | None, int]:
    """``(objective_s, plan, n_candidates)`` of the exhaustive optimum; ``(inf, None, n)``
    when no plan fits. For benchmarks; :func:`search` says more."""
    b = search(model, resources, n_data)
    return b.objective_s, b.plan, b.n_candidates
