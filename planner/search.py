"""The state of one ``balance_plan`` call (:class:`Search`) and its steps: the exact
data-parallel plans, the baselines, the sweep over grids and layouts, the queued programs
and the replica relaxations. ``planner.solve`` documents the plan space and the order of
the steps; each method's docstring states what it establishes.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field

import numpy as np

from emgrid.models.base import Node

from .bounds import Bounds
from .config import SolverConfig
from .costing import capped_rows, coordinator_bytes, mstep_s, price, replica_rows, row_caps, shard_sums
from .dataparallel import solve_groups
from .facts import ModelFacts, model_facts, worker_arrays
from .heuristics import HEURISTICS, columns, run_all
from .placement import (Layout, candidate_layouts, default_layout, replica_mixes, single_replica_layouts,
                        small_layouts)
from .program import make_instance, solve_program
from .resources import Resources
from .scaling import Scale
from .units import UnitTree, build_units

#: Share of the time limit the heuristic sweep may use before the programs start.
SWEEP_SHARE = 0.4
#: Share of the time limit one replica-relaxation program may take (``Search.relax``).
RELAX_SHARE = 0.05
#: Relative slack for comparing float recomputations with solver figures.
FLOAT_TOL = 1e-6
#: Share of the time limit the search plans for; the rest covers the final pricing and
#: the solver's overshoot of its own limit.
DEADLINE_SHARE = 0.9
#: Most splits of the rows into ``d`` positive parts a grid of several replicas searches
#: all of (with every layout, :func:`placement.small_layouts`, that settles it exactly);
#: beyond, rows follow the replicas' speeds (which memory may forbid: a slow replica of
#: large workers may have to take more rows than a fast one of small workers).
MAX_ROW_SPLITS = 64
#: Rows, as shares of ``ceil(n/d)``, at which :meth:`Search.replica_steps` bounds a replica.
STEP_FRACTIONS = (0.5, 0.7, 0.85, 1.0, 1.15, 1.3, 1.5, 1.75, 2.0, 2.5, 3.0)


def compositions(n: int, d: int):
    """Every way to write ``n`` as ``d`` positive parts, in order (``d - 1`` cuts among
    the ``n - 1`` gaps between rows)."""
    for cuts in itertools.combinations(range(1, n), d - 1):
        ends = (0, *cuts, n)
        yield tuple(ends[i + 1] - ends[i] for i in range(d))


#: The leaf-level heuristics of ``bench/planner_baselines.py`` that seed the incumbent, and
#: the largest leaves x shards on which LPT runs among them.
BASELINE_HEURISTICS = ("contiguous", "equal_count", "lpt")
BASELINE_LPT_CELLS = 50_000
#: Share of the time limit after which the baselines run only their linear-time heuristics.
BASELINE_SHARE = 0.1


def previous_assignment(facts: ModelFacts, plan) -> tuple[int, np.ndarray] | None:
    """``(M, leaf_shard)`` of ``plan`` (a :class:`planner.plan.BalancePlan` of this model), or
    None when it has no model parallelism or names other leaves (another model's plan)."""
    if plan is None or plan.model_parallel < 2:
        return None
    shard_of = plan.shard_of_leaf()
    if set(shard_of) != set(facts.leaf_paths):
        return None
    return plan.model_parallel, np.array([shard_of[p] for p in facts.leaf_paths], dtype=np.int64)


def shard_counts(n_workers: int, n_leaves: int) -> list[int]:
    """The shard counts the benchmark's baselines try: 1..64 and the powers of two beyond."""
    top = min(n_workers, n_leaves)
    out = set(range(1, min(top, 64) + 1))
    k = 128
    while k <= top:
        out.add(k)
        k *= 2
    out.add(top)
    return sorted(out)


@dataclass
class Incumbent:
    total: float
    d: int
    m: int
    layout: Layout
    rows: tuple[int, ...]
    leaf_shard: np.ndarray
    source: str


@dataclass
class Queued:
    bound: float
    d: int
    m: int
    layout: Layout
    rows: tuple[int, ...]
    hint: np.ndarray | None
    hint_total: float
    heuristic_totals: list[float] = field(default_factory=list)


class Search:
    """The state of one ``balance_plan`` call."""

    def __init__(self, model: Node, resources: Resources, n_data: int, cfg: SolverConfig,
                 previous=None, dtype: str = "float64"):
        self.t0 = time.perf_counter()
        self.cfg = cfg
        self.resources = resources
        self.n = n_data
        self.facts: ModelFacts = model_facts(model, dtype)
        self.mstep = mstep_s(self.facts)
        self.fine: UnitTree = build_units(self.facts, self.facts.n_leaves)
        self.coarse: UnitTree = self.fine if self.facts.n_leaves <= cfg.max_units else build_units(
            self.facts, cfg.max_units)
        self.best: Incumbent | None = None
        self.grid_notes: dict[tuple[int, int], list[float]] = {}  # bounds of an exact grid's layouts
        self.exact: dict[tuple[int, int], bool] = {}  # placement and rows settled by dominance
        self.all_splits: dict[tuple[int, int], bool] = {}  # every split of the rows searched
        self.relaxed: dict[tuple[int, int], float] = {}  # replica-relaxation bounds (:meth:`relax`)
        self.any_rows: dict[tuple[int, int], float] = {}  # bounds over every split (:meth:`any_rows_lower`)
        self.best_by_m: dict[int, float] = {}
        self.bound_by_m: dict[int, float] = {}  # least bound of the pruned grids of each M
        self.queue: list[Queued] = []
        self.faults: list[str] = []
        self.counts = {"grids": 0, "layouts": 0, "pruned": 0, "programs": 0, "programs_optimal": 0,
                       "grids_unfit": 0, "layouts_unfit": 0}
        self.exhausted = False  # the time limit ended the sweep before any plan fitted
        self.unproven: list[str] = []  # grids left without a plan and without a proof that none fits
        self.unfit_m: set[int] = set()  # shard counts no grid of which can hold its replica
        self.heuristic_best: tuple[float, str] | None = None
        speed, memory = worker_arrays(resources)
        self.uniform = bool(np.all(speed == speed[0]) and np.all(memory == memory[0]))
        self.coordinated = coordinator_bytes(self.facts, resources) > 0 and bool(np.isfinite(memory).any())
        #: ``(M, leaf_shard)`` of an earlier plan of this model (a re-plan's), tried on every
        #: layout of ``M`` shards and the program's hint where it beats the heuristics'
        self.previous = previous_assignment(self.facts, previous)

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def budget(self) -> float:
        """Seconds the search may still spend."""
        return DEADLINE_SHARE * self.cfg.time_limit_s - 0.05 - self.elapsed()

    def cutoff(self) -> float:
        return math.inf if self.best is None else self.best.total * (1 - self.cfg.relative_gap)

    def offer(self, total: float, fits, d, m, layout, rows, leaf_shard, source) -> None:
        if fits is False:
            return
        self.best_by_m[m] = min(self.best_by_m.get(m, math.inf), total)
        if source != "cp-sat" and (self.heuristic_best is None or total < self.heuristic_best[0]):
            self.heuristic_best = (total, source)
        if self.best is None or total < self.best.total:
            self.best = Incumbent(total, d, m, layout, tuple(int(r) for r in rows), np.asarray(leaf_shard), source)

    def note_bound(self, m: int, bound: float) -> None:
        self.bound_by_m[m] = min(self.bound_by_m.get(m, math.inf), bound)

    def note(self, d: int, m: int, bound: float) -> None:
        """A lower bound of one layout of grid ``d x m`` (``inf``: proven to have no fitting plan)."""
        self.grid_notes.setdefault((d, m), []).append(bound)

    def layouts(self, d: int, m: int) -> list[Layout]:
        """The layouts searched for ``d x m``; records whether they settle the grid exactly."""
        if self.uniform and (d == 1 or not self.coordinated):
            self.exact[(d, m)] = True
            return candidate_layouts(self.resources, d, m)
        if d == 1:
            out, complete = single_replica_layouts(self.resources, m, self.coordinated)
            self.exact[(d, m)] = complete
            return out
        small = small_layouts(self.resources, d, m, self.coordinated)
        # every split of the rows when they are few, else rows follow speed; exact with every layout
        every_split = math.comb(self.n - 1, d - 1) <= MAX_ROW_SPLITS
        self.exact[(d, m)] = every_split and small is not None
        self.all_splits[(d, m)] = every_split
        return small if small is not None else candidate_layouts(self.resources, d, m)

    def grid_lower(self, d: int, m: int, bounds: Bounds) -> float:
        """A lower bound of every plan of grid ``d x m`` (see the module docstring)."""
        if not bounds.grid_fits(d, m):
            return math.inf
        analytic = bounds.grid_bound(d, m)
        notes = self.grid_notes.get((d, m))
        if self.exact.get((d, m)) and notes:
            return max(analytic, min(notes))
        return max(analytic, self.relaxed.get((d, m), 0.0), self.any_rows.get((d, m), 0.0))

    def any_rows_lower(self, d: int, m: int, bounds: Bounds) -> float:
        """:meth:`Bounds.any_rows_bound` over every mix of replicas of ``d x m`` (0 when the
        mixes are too many): a bound over every placement and every split of the rows."""
        if (d, m) not in self.any_rows:
            mixes = replica_mixes(self.resources, d, m)
            out = 0.0 if mixes is None else bounds.any_rows_bound(mixes, d)
            if mixes is not None and out < self.cutoff() and not self.coarse.grouped and self.budget() >= 0.1:
                out = max(out, bounds.any_rows_bound(mixes, d, self.replica_steps(mixes, d, m, bounds)))
            self.any_rows[(d, m)] = out
        return self.any_rows[(d, m)]

    def replica_steps(self, mixes, d: int, m: int, bounds: Bounds) -> dict[int, list[tuple[int, float]]]:
        """Program bounds of one replica of each kind of ``mixes`` at a few row counts
        around ``n/d`` (:data:`STEP_FRACTIONS`), each ``(rows, seconds)``: a replica of that
        kind with at least those rows takes at least that long (cost and memory are
        non-decreasing in rows), the exchanges over the ``d`` replicas included."""
        caps = bounds.replica_caps(mixes, d)
        used = np.flatnonzero((mixes.counts > 0).any(axis=0) & (caps >= 1))
        extra = bounds.replica_comm(d, m)
        out: dict[int, list[tuple[int, float]]] = {}
        share = -(-self.n // d)
        for k in used:
            xs = sorted({min(int(caps[k]), max(1, math.ceil(f * share))) for f in STEP_FRACTIONS} | {int(caps[k])})
            layout = Layout(name=f"replica-kind/{k}", grid=(mixes.workers[k],))
            for x in xs:
                if self.budget() < 0.1:
                    return out
                got = self.replica_program(layout, (x,), d, bounds, extra)
                out.setdefault(int(k), []).append((x, got))
                if got >= self.cutoff():
                    break  # more rows cost no less
        return out

    # ------------------------------------------------------------ data parallel, baselines
    def data_parallel(self, ds: list[int]) -> dict[tuple[int, int], float]:
        """The exact ``M = 1`` plans (``planner.dataparallel``); returns each grid's bound."""
        out = {}
        for g in solve_groups(self.facts, self.resources, self.n, ds):
            for d in ds:
                if g.d_range[0] <= d <= g.d_range[1]:
                    out[(d, 1)] = g.lower
            if g.grid is None:
                continue
            layout = Layout(name="data-parallel", grid=g.grid)
            leaf_shard = np.zeros(self.facts.n_leaves, dtype=np.int64)
            total, fits = self.price_leaves(leaf_shard, 1, layout, g.rows)
            self.offer(total, fits, len(g.grid), 1, layout, g.rows, leaf_shard, "data-parallel")
            self.best_by_m[1] = min(self.best_by_m.get(1, math.inf), total)
        return out

    def baselines(self, grids: list[tuple[int, int]], bounds: Bounds) -> None:
        """The benchmark's leaf-level baselines (module docstring, item 4) as incumbents; a
        grid whose bound is not below the incumbent is skipped (no baseline there can win)."""
        pinned = len(grids) == 1
        ms = sorted({m for _, m in grids if m > 1}) if pinned else shard_counts(self.resources.n_workers,
                                                                              self.facts.n_leaves)
        speed, _ = worker_arrays(self.resources)
        for m in ms:
            if m == 1 or m > self.fine.n_units:
                continue
            d = grids[0][0] if pinned else min(self.n, self.resources.n_workers // m)
            if not bounds.grid_fits(d, m) or (self.best is not None and bounds.grid_bound(d, m) >= self.best.total):
                continue
            layout = default_layout(self.resources, d, m)
            rows = replica_rows(self.n, speed[np.asarray(layout.grid)].min(axis=1))
            cols = columns(self.facts, self.resources, layout.grid, rows)
            if self.previous is not None and self.previous[0] == m:
                total, fits = self.price_leaves(self.previous[1], m, layout, rows)
                self.offer(total, fits, d, m, layout, rows, self.previous[1], "previous")
            for name in BASELINE_HEURISTICS:
                if name == "lpt" and (self.fine.n_units * m > BASELINE_LPT_CELLS
                                      or self.elapsed() > BASELINE_SHARE * self.cfg.time_limit_s):
                    continue
                unit_shard = HEURISTICS[name](self.fine, cols)
                total, fits = self.price_leaves(unit_shard, m, layout, rows)
                self.offer(total, fits, d, m, layout, rows, unit_shard, f"baseline/{name}")

    def price_leaves(self, leaf_shard, m, layout, rows):
        p = price(self.facts, self.resources, self.n, shard_sums(self.facts, leaf_shard, m), layout.grid, rows)
        return p.breakdown.total_s, p.fits

    # ------------------------------------------------------------ sweep
    def sweep(self, grids: list[tuple[int, int]], bounds: Bounds) -> None:
        fitting = [g for g in grids if bounds.grid_fits(*g)]
        self.counts["grids_unfit"] = len(grids) - len(fitting)
        self.unfit_m = {m for _, m in grids} - {m for _, m in fitting}
        ordered = sorted(fitting, key=lambda g: (bounds.grid_bound(*g), g[1], g[0]))
        for k, (d, m) in enumerate(ordered):
            lb = bounds.grid_bound(d, m)
            share = SWEEP_SHARE if self.best is not None else 1.0
            late = k > 0 and self.elapsed() > share * DEADLINE_SHARE * self.cfg.time_limit_s
            if lb >= self.cutoff() or late:
                if self.best is None:
                    self.exhausted = True
                    self.unproven += [f"{d2}x{m2}" for d2, m2 in ordered[k:]]
                self.counts["pruned"] += len(ordered) - k
                for d2, m2 in ordered[k:]:
                    self.note_bound(m2, bounds.grid_bound(d2, m2))
                return
            self.counts["grids"] += 1
            for layout in self.layouts(d, m):
                for rows in self.row_options(layout):
                    self.visit(layout, bounds, rows)

    def row_options(self, layout: Layout) -> list[list[int]]:
        """Every split of the rows into ``d`` positive parts when :meth:`layouts` said they
        are few (:data:`MAX_ROW_SPLITS`); else rows following the replicas' slowest speeds
        and, with the coordinator in the grid, also the same rows with replica 0 taking the
        fewest among the replicas of its speed."""
        if self.all_splits.get((layout.d, layout.m)):
            return [list(c) for c in compositions(self.n, layout.d)]
        speed_of, _ = worker_arrays(self.resources)
        slowest = speed_of[np.asarray(layout.grid)].min(axis=1)
        rows = replica_rows(self.n, slowest)
        out = [rows]
        if self.coordinated and layout.d > 1:
            peers = np.flatnonzero(slowest == slowest[0])
            r = int(peers[np.argmin(np.asarray(rows)[peers])])
            if rows[r] != rows[0]:
                swapped = list(rows)
                swapped[0], swapped[r] = swapped[r], swapped[0]
                out.append(swapped)
        return out

    def visit(self, layout: Layout, bounds: Bounds, rows: list[int], repair: bool = True) -> None:
        """Prices every heuristic on ``layout`` with ``rows`` and queues its program; when the
        rows were not searched all (:meth:`row_options`), also each heuristic's assignment
        with the rows its memory allows (:meth:`repaired_rows`), and queues those rows too."""
        d, m = layout.d, layout.m
        self.counts["layouts"] += 1
        g = np.asarray(layout.grid)
        speed_of, memory_of = worker_arrays(self.resources)
        memory = memory_of[g]
        if not bounds.layout_fits(memory, rows):
            self.counts["layouts_unfit"] += 1
            self.note(d, m, math.inf)
            return
        cols = columns(self.facts, self.resources, layout.grid, rows)
        lb = bounds.layout_bound(m, cols.a, rows, speed_of[g])
        if lb >= self.cutoff():
            self.counts["pruned"] += 1
            self.note(d, m, lb)
            self.note_bound(m, lb)
            return
        q = Queued(bound=lb, d=d, m=m, layout=layout, rows=tuple(rows), hint=None, hint_total=math.inf)
        assignments = []
        for name, unit_shard in run_all(self.coarse, cols).items():
            leaf_shard = self.coarse.leaf_shard(unit_shard, self.facts.n_leaves)
            assignments.append(leaf_shard)
            total, fits = self.price_leaves(leaf_shard, m, layout, rows)
            self.offer(total, fits, d, m, layout, rows, leaf_shard, name)
            if fits is not False:
                q.heuristic_totals.append(total)
                if total < q.hint_total:
                    q.hint, q.hint_total = unit_shard, total
        if self.previous is not None and self.previous[0] == m:
            leaf_shard = self.previous[1]
            total, fits = self.price_leaves(leaf_shard, m, layout, rows)
            self.offer(total, fits, d, m, layout, rows, leaf_shard, "previous")
            unit_shard = self.coarse.unit_shard(leaf_shard)
            if fits is not False and unit_shard is not None and total < q.hint_total:
                q.hint, q.hint_total = unit_shard, total
        if self.coarse is not self.fine:
            for name, unit_shard in run_all(self.fine, cols, names=("lpt", "contiguous")).items():
                total, fits = self.price_leaves(unit_shard, m, layout, rows)
                self.offer(total, fits, d, m, layout, rows, unit_shard, name + "/leaves")
        self.queue.append(q)
        if repair and d > 1 and not self.all_splits.get((d, m)):
            tried = {tuple(rows)}
            for leaf_shard in assignments:
                other = self.repaired_rows(leaf_shard, layout)
                if other is not None and tuple(other) not in tried:
                    tried.add(tuple(other))
                    self.visit(layout, bounds, other, repair=False)

    def repaired_rows(self, leaf_shard, layout: Layout) -> list[int] | None:
        """Rows by speed as in :meth:`row_options`, capped where a replica of ``layout``
        cannot hold them with this assignment (:func:`costing.row_caps`,
        :func:`costing.capped_rows`); None when they need no cap or cannot be capped."""
        speed_of, _ = worker_arrays(self.resources)
        slowest = speed_of[np.asarray(layout.grid)].min(axis=1)
        rows = replica_rows(self.n, slowest)
        caps = row_caps(self.facts, self.resources, self.n, shard_sums(self.facts, leaf_shard, layout.m), layout.grid)
        if all(x <= c for x, c in zip(rows, caps)):
            return None
        return capped_rows(self.n, slowest, caps)

    # ------------------------------------------------------------ programs
    def solve_queue(self) -> None:
        cfg = self.cfg
        for q in sorted(self.queue, key=lambda q: (q.bound, q.m, q.d)):
            remaining = self.budget()
            cells = self.coarse.n_units * q.m
            if q.bound >= self.cutoff():
                self.counts["pruned"] += 1
                self.note(q.d, q.m, q.bound)
                self.note_bound(q.m, q.bound)
                continue
            if (remaining < 0.05 or self.counts["programs"] >= cfg.max_programs or cells > cfg.max_program_cells
                    or q.m > self.coarse.n_units):
                self.note(q.d, q.m, q.bound)
                if self.best is None:
                    self.unproven.append(f"{q.d}x{q.m} ({q.layout.name}, not solved: "
                                         f"{'time limit' if remaining < 0.05 else 'program limits'})")
                continue
            bound = self.program(q, remaining)
            self.note(q.d, q.m, bound)
            if self.best is None and bound < math.inf:
                self.unproven.append(f"{q.d}x{q.m} ({q.layout.name}, solver stopped without a plan or a proof)")

    def relax_all(self, grids: list[tuple[int, int]], bounds: Bounds) -> None:
        """Replica relaxations (:meth:`relax`) and, with several replicas, bounds over every
        split of the rows (:meth:`any_rows_lower`) of the grids not settled exactly, cheapest
        bound first, while time is left."""
        todo = sorted((g for g in grids if g[1] > 1 and not self.exact.get(g, False) and bounds.grid_fits(*g)),
                      key=lambda g: bounds.grid_bound(*g))
        for d, m in todo:
            if bounds.grid_bound(d, m) >= self.cutoff():
                break
            if self.budget() < 0.1:
                return
            got = self.relax(d, m, bounds)
            if got is not None:
                self.relaxed[(d, m)] = got
            if d > 1 and self.grid_lower(d, m, bounds) < self.cutoff() and self.budget() >= 0.1:
                self.any_rows_lower(d, m, bounds)

    def relax(self, d: int, m: int, bounds: Bounds) -> float | None:
        """A lower bound of every plan of ``d x m`` from its largest replica alone.

        Some replica holds ``R >= ceil(n/d)`` rows on ``m`` distinct workers; cost and memory
        are non-decreasing in rows, the compute, the coupling and the spanning nodes' broadcast are
        at least that replica's, and its workers are dominated by one of
        ``single_replica_layouts`` (the coordinator's bytes dropped, a relaxation). So the
        least bound of the ``1 x m`` programs with ``R = ceil(n/d)`` rows over those layouts,
        plus ``Bounds.replica_comm(d, m)``, bounds the grid. Only leaf-level units give a
        valid program bound; None when grouped or the layouts are too many."""
        if self.coarse.grouped:
            return None
        layouts, complete = single_replica_layouts(self.resources, m, coordinated=False)
        if not complete:
            return None
        rows = (-(-self.n // d),)
        best = math.inf
        extra = bounds.replica_comm(d, m)
        for layout in layouts:
            best = min(best, self.replica_program(layout, rows, d, bounds, extra, best))
        return best

    def replica_program(self, layout: Layout, rows: tuple[int], d: int, bounds: Bounds, extra: float,
                        enough: float = math.inf) -> float:
        """A bound of one replica of a ``d``-replica grid on ``layout`` (one row of
        workers) with ``rows``, ``extra`` (its exchanges over the replicas) included: its
        program's bound when time is left, else the analytic one; ``inf`` when it cannot
        hold the rows; the analytic one when that is already ``enough``."""
        m = layout.m
        g = np.asarray(layout.grid)
        speed_of, memory_of = worker_arrays(self.resources)
        if not bounds.layout_fits(memory_of[g], rows, d):
            return math.inf
        cols = columns(self.facts, self.resources, layout.grid, rows, d)
        lb = bounds.layout_bound(m, cols.a, rows, speed_of[g])
        remaining = self.budget()
        if lb + extra >= enough or remaining < 0.05 or self.coarse.n_units * m > self.cfg.max_program_cells:
            return lb + extra
        hint = HEURISTICS["lpt"](self.coarse, cols)
        ref, fits = self.price_leaves(self.coarse.leaf_shard(hint, self.facts.n_leaves), m, layout, rows)
        # only a plan the program accepts is a hint (see :meth:`program` on hints and presolve);
        # the pricing knows one replica's memory only
        ok = fits is not False and d == 1
        q = Queued(bound=lb, d=1, m=m, layout=layout, rows=rows, hint=hint if ok else None,
                   hint_total=ref if ok else math.inf)
        got = self.program(q, min(remaining, RELAX_SHARE * self.cfg.time_limit_s), offer=False, memory_d=d,
                           extra_s=extra)
        return got + extra

    def program(self, q: Queued, remaining: float, offer: bool = True, memory_d: int = 0,
                extra_s: float = 0.0) -> float:
        """Solves one layout's program; returns the bound it establishes. ``offer=False``
        (a relaxation, :meth:`relax`): the solution is not a plan, and the coordinator's
        bytes are dropped; ``memory_d``: the relaxed grid's replicas, whose memory applies;
        ``extra_s``: what the caller adds to the returned bound (the program searches only
        below the incumbent less it)."""
        self.counts["programs"] += 1
        ref = self.best.total if self.best is not None else q.hint_total
        if not math.isfinite(ref) or ref <= 0:
            ref = max(q.bound, 1e-9)
        max_mem = max([w.memory_bytes or 0 for w in self.resources.workers] + [1])
        inst = make_instance(self.coarse, self.resources, q.layout, q.rows, self.facts.block_rows,
                             Scale.for_instance(ref, max_mem), ref,
                             coordinator_bytes(self.facts, self.resources) if offer else 0.0, memory_d)
        scale = inst.scale
        hint = q.hint
        # search only below the incumbent (less the gap): a proof that nothing is there bounds the grid
        cutoff_s = self.cutoff() - extra_s - self.mstep
        cutoff_ticks = math.floor(cutoff_s * scale.ticks_per_s) if math.isfinite(cutoff_s) and cutoff_s > 0 else None
        if cutoff_ticks is not None and not q.hint_total < self.cutoff():
            # a hint above the cutoff cannot help, and CP-SAT's interleaved search aborts on one
            # it can prove infeasible in presolve ("heuristics.fixed_search != nullptr")
            hint = None
        res = solve_program(inst, hint, self.cfg, remaining, cutoff_ticks=cutoff_ticks)
        where = f"grid {q.d}x{q.m} layout {q.layout.name}"
        bound = q.bound
        if res.unit_shard is not None:
            leaf_shard = self.coarse.leaf_shard(res.unit_shard, self.facts.n_leaves)
            total, fits = self.price_leaves(leaf_shard, q.m, q.layout, q.rows)
            got = scale.seconds(res.objective_ticks) + self.mstep  # the program leaves out the constant
            if fits is False and memory_d <= 1:  # the pricing knows one replica's memory only
                self.faults.append(f"{where}: the solver's assignment does not fit when recomputed")
            elif got > total * (1 + FLOAT_TOL) + 1e-12 or got < total * (1 - 1e-4) - 1e-9:
                self.faults.append(f"{where}: solver objective {got!r} s, recomputed {total!r} s")
            elif offer:
                self.offer(total, fits, q.d, q.m, q.layout, q.rows, leaf_shard, "cp-sat")
                other = self.repaired_rows(leaf_shard, q.layout) if not self.all_splits.get((q.d, q.m), True) else None
                if other is not None:  # the solver's assignment with the rows its memory allows
                    self.offer(*self.price_leaves(leaf_shard, q.m, q.layout, other), q.d, q.m, q.layout, other,
                               leaf_shard, "cp-sat/rows")
        if res.status == "cutoff":
            # nothing below the incumbent; grouped units restrict the plans, so prove nothing
            return bound if self.coarse.grouped else max(bound, scale.seconds(res.bound_ticks) + self.mstep)
        if res.status == "infeasible":
            if q.heuristic_totals:
                self.faults.append(f"{where}: solver claims infeasible, a heuristic plan fits")
            elif not self.coarse.grouped:
                return math.inf
            return bound
        if res.bound_ticks is None:
            return bound
        solver_bound = scale.seconds(res.bound_ticks) + self.mstep
        worst_ok = min(q.heuristic_totals, default=math.inf)
        if res.unit_shard is not None and res.status != "model_invalid":
            worst_ok = min(worst_ok, self.price_leaves(self.coarse.leaf_shard(res.unit_shard, self.facts.n_leaves),
                                                       q.m, q.layout, q.rows)[0])
        if solver_bound > worst_ok * (1 + FLOAT_TOL) + 1e-12:
            self.faults.append(f"{where}: solver bound {solver_bound!r} s exceeds a fitting plan's {worst_ok!r} s")
            return bound
        if res.status == "optimal":
            self.counts["programs_optimal"] += 1
        return bound if self.coarse.grouped else max(bound, solver_bound)
