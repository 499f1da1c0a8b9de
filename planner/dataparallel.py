"""Exact data-parallel plans (``M = 1``): which workers, which one at cell ``(0, 0)``, how many rows.

With one shard every worker evaluates the whole model, so a plan is a choice of ``D``
workers, of the one at cell ``(0, 0)`` (it carries the coordinator's bytes when
``Resources.coordinator_in_grid``), and of rows ``n_r >= 1`` summing to ``n_data``. Its
iteration time is ``max_r t_r(n_r) + comm(L(D)) + mstep`` (``planner.costing``): with
``M = 1`` there is no coupling, and the reduce and broadcast depend on ``D`` only through
``L(D) = ceil(log2 D)``. Worker ``w`` with ``n`` rows computes for
``t_w(n) = n F / speed_w + ceil(n / B) K c`` and needs ``mem_w(n)`` bytes, both
non-decreasing in ``n``; so for a compute time ``T`` it can take at most
``N_w(T) = max {n <= n_data : t_w(n) <= T, mem_w(n) fits}`` rows (``N'_w(T)`` at cell
``(0, 0)``, with the coordinator's bytes).

**Feasibility of a target.** Some plan of ``D`` replicas has compute time ``<= T`` exactly
when ``D <= n_data`` and ``D`` workers with ``N >= 1``, one of them ``c`` at ``(0, 0)``,
have ``N'_c + sum_{others} N >= n_data``: rows ``1 <= n_r <= N_r`` summing to ``n_data``
then exist, and any plan's rows are such a choice. For a fixed ``c`` the best others are the
``D - 1`` largest ``N``, and within one value of ``L(D)`` (the same communication) a larger
``D`` only adds rows, so the largest admissible ``D`` of the group is the one to test.
Feasibility is monotone in ``T``, so bisection finds, per group, the least feasible ``T``
to float precision: the plan built at the upper end is optimal within ``hi - lo`` over
every placement and every split of the rows, and ``lo`` (infeasible) plus the group's
communication is a lower bound of every plan of the group. A group infeasible at the
largest ``T`` that any worker can need (every ``N`` then limited by memory alone) has no
fitting plan at all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from emgrid.models.cost import ceil_log2
from emgrid.models.units import NODE_CALL_S

from .costing import base_bytes, coordinator_bytes, fixed_bytes, mstep_s, shard_sums
from .facts import ModelFacts, worker_arrays
from .resources import Resources

#: Bisection steps on the compute time (each halves the interval; float precision is reached first).
STEPS = 200
#: The bisection stops when its interval is this small relative to the time (the plan built
#: at its upper end is then optimal to this precision).
REL_STOP = 1e-12


@dataclass(frozen=True)
class DataParallel:
    """The best plan of one ``L(D)`` group (``grid`` None when none fits) and the group's bound."""

    d_range: tuple[int, int]
    total: float
    lower: float
    grid: tuple[tuple[int, ...], ...] | None
    rows: tuple[int, ...] | None


class Workers:
    """Per-worker row limits of the whole model (``M = 1``) on grids of ``d`` replicas (the
    memory with one replica differs from that with several: ``costing.fixed_bytes``; any
    ``d > 1`` gives the same limits)."""

    def __init__(self, facts: ModelFacts, resources: Resources, n_data: int, d: int = 2):
        sums = shard_sums(facts, np.zeros(facts.n_leaves, dtype=np.int64), 1)
        self.n = n_data
        self.speed, mem = worker_arrays(resources)
        self.flops = float(sums.flops[0])
        self.visit = NODE_CALL_S * float(sums.calls[0])
        self.block = facts.block_rows
        self.p = len(self.speed)
        base = fixed_bytes(sums.param[0], sums.stat[0], sums.cache[0], d) + base_bytes(facts, d)
        per_block = float(sums.work[0] + sums.scratch[0])  # M = 1: no coupling copies
        self.cap = self._memory_rows(float(sums.data[0]), per_block, base, mem)
        self.cap_coord = self._memory_rows(float(sums.data[0]), per_block, base + coordinator_bytes(facts, resources),
                                           mem)
        ld_cost = 2 * resources.network.latency_s + (float(sums.stat[0]) + float(sums.param[0])) / \
            resources.network.bytes_per_s
        self.comm_per_level = ld_cost
        self.mstep = mstep_s(facts)

    def _memory_rows(self, data: float, per_block: float, base: float, mem: np.ndarray) -> np.ndarray:
        """Most rows (<= n_data) each worker holds, as ``costing.price`` checks it; 0 when none."""
        def fits(n):
            nf = n.astype(np.float64)
            need = data * nf + per_block * np.minimum(nf, float(self.block)) + base
            return ~(np.ceil(need) > mem)

        lo = np.zeros(self.p, dtype=np.int64)  # fits (0 rows: vacuous)
        hi = np.full(self.p, self.n + 1, dtype=np.int64)  # first that does not fit
        ok = fits(np.full(self.p, self.n, dtype=np.int64))
        lo[ok] = self.n
        hi[ok] = self.n + 1
        while np.any(hi - lo > 1):
            mid = (lo + hi) // 2
            f = fits(mid)
            lo = np.where(f, mid, lo)
            hi = np.where(f, hi, mid)
        return lo

    def seconds(self, rows, speed) -> np.ndarray:
        """``t_w(n)`` exactly as ``costing.price`` computes it."""
        rows_f = np.asarray(rows, dtype=np.float64)
        return (rows_f * self.flops) / speed + np.ceil(rows_f / self.block) * self.visit

    def limits(self, t: float) -> tuple[np.ndarray, np.ndarray]:
        """``N_w(T)`` and ``N'_w(T)`` of every worker.

        With ``k`` blocks a worker meets ``T`` with ``min(k B, (T - k v) / a)`` rows
        (``a = F / speed``, ``v = K c``), a minimum of a rising and a falling line in ``k``,
        so the best ``k`` is next to ``T / (a B + v)``; the float result is then corrected
        against ``t_w`` itself."""
        a = self.flops / self.speed
        v, b = self.visit, float(self.block)
        k0 = np.floor(t / np.maximum(a * b + v, 1e-300))
        best = np.zeros(self.p)
        for k in (k0, k0 + 1):
            k = np.maximum(k, 1.0)
            with np.errstate(divide="ignore", invalid="ignore"):
                by_time = np.where(a > 0, np.floor((t - k * v) / np.where(a > 0, a, 1.0)), np.inf)
            by_time = np.where(t - k * v >= 0, by_time, -1.0)
            best = np.maximum(best, np.minimum(k * b, by_time))
        n = np.clip(best, 0, self.n).astype(np.int64)
        for _ in range(3):  # float corrections
            over = (n > 0) & (self.seconds(n, self.speed) > t)
            n = n - over
            up = (n < self.n) & (self.seconds(n + 1, self.speed) <= t)
            n = n + up
            if not over.any() and not up.any():
                break
        return np.minimum(n, self.cap), np.minimum(n, self.cap_coord)

    def choose(self, t: float, d_lo: int, d_hi: int):
        """``(coordinator, others)`` of a plan with compute ``<= t`` and ``d_lo <= D <= d_hi``,
        or None (see the module docstring)."""
        n_all, n_coord = self.limits(t)
        order = np.argsort(-n_all, kind="stable")
        sorted_n = n_all[order]
        prefix = np.concatenate([[0], np.cumsum(sorted_n)])
        pos = np.empty(self.p, dtype=np.int64)
        pos[order] = np.arange(self.p)
        usable = int((n_all >= 1).sum())
        d = np.minimum(min(d_hi, self.n), 1 + usable - (n_all >= 1))  # the largest D with c at (0, 0)
        k = d - 1
        top = np.where(pos >= k, prefix[k], prefix[np.minimum(k + 1, self.p)] - n_all)
        total = n_coord + top
        ok = (n_coord >= 1) & (d >= d_lo) & (total >= self.n)
        if not ok.any():
            return None
        c = int(np.flatnonzero(ok)[np.argmax(total[ok])])
        picked = [int(w) for w in order[:k[c] + 1] if w != c][:k[c]]
        return c, picked, n_all, n_coord


def solve_groups(facts: ModelFacts, resources: Resources, n_data: int, ds: list[int]) -> list[DataParallel]:
    """The optimal data-parallel plan of every ``L(D)`` group among the replica counts ``ds``."""
    wk_many = Workers(facts, resources, n_data)
    sole = Workers(facts, resources, n_data, d=1)  # the group L(D) = 0 is D = 1 alone
    groups: dict[int, list[int]] = {}
    for d in ds:
        groups.setdefault(ceil_log2(d), []).append(d)
    out = []
    t_max = float(wk_many.seconds(n_data, wk_many.speed).max())
    for level, members in sorted(groups.items()):
        wk = sole if level == 0 else wk_many
        d_lo, d_hi = min(members), max(members)
        comm = level * wk.comm_per_level + wk.mstep
        if level == 0:
            out.append(_one_replica(wk, n_data, comm))
            continue
        if wk.choose(t_max, d_lo, d_hi) is None:
            out.append(DataParallel((d_lo, d_hi), math.inf, math.inf, None, None))
            continue
        lo, hi = 0.0, t_max
        for _ in range(STEPS):
            mid = 0.5 * (lo + hi)
            if not lo < mid < hi or hi - lo <= REL_STOP * hi:
                break
            if wk.choose(mid, d_lo, d_hi) is None:
                lo = mid
            else:
                hi = mid
        c, others, n_all, n_coord = wk.choose(hi, d_lo, d_hi)
        workers = [c, *others]
        rows = [int(n_coord[c])] + [int(n_all[w]) for w in others]
        excess = sum(rows) - n_data
        for r in sorted(range(len(rows)), key=lambda r: wk.speed[workers[r]]):  # slowest give rows back first
            take = min(excess, rows[r] - 1)
            rows[r] -= take
            excess -= take
        grid = tuple((w,) for w in workers)
        compute = float(wk.seconds(rows, wk.speed[workers]).max())
        out.append(DataParallel((d_lo, d_hi), compute + comm, lo + comm, grid, tuple(rows)))
    return out


def _one_replica(wk: Workers, n_data: int, comm: float) -> DataParallel:
    """``D = 1`` in closed form: one worker, at cell ``(0, 0)``, takes every row, so the
    best plan is the fastest worker whose memory holds them all (with the coordinator's
    bytes); its time is also the group's exact bound."""
    fits = wk.cap_coord >= n_data
    if not fits.any():
        return DataParallel((1, 1), math.inf, math.inf, None, None)
    seconds = wk.seconds(np.full(wk.p, n_data), wk.speed)
    c = int(np.flatnonzero(fits)[np.argmin(seconds[fits])])
    total = float(seconds[c]) + comm
    return DataParallel((1, 1), total, total, ((c,),), (n_data,))
