"""``balance_plan``: enumerate grids, bound, prune, solve, recompute, check the solver.

1. Every grid ``D x M`` (``D*M <= workers``, ``D <= n_data``, ``M <= leaves``) whose
   largest replica can fit its workers' memory (``Bounds.grid_fits``) gets an analytic
   lower bound (``planner.bounds``), and the grids are visited in bound order, for at most
   ``SWEEP_SHARE`` of the time limit once a fitting plan is known.
2. For each grid and each distinct layout (``planner.placement``) the rows follow the
   layout's speeds; ``M = 1`` is priced exactly, ``M > 1`` by every heuristic
   (``planner.heuristics``) on the placement units and, for grouped trees, on the leaves.
   The best fitting plan so far is the incumbent; a grid or layout whose bound is not
   below it (by more than the relative gap) is pruned.
3. The surviving layouts are solved with CP-SAT in bound order (``planner.program``),
   hinted with their best heuristic, under what is left of the time limit (at most
   ``max_programs`` programs of at most ``max_program_cells`` units x shards; larger
   grids keep their heuristic plan and analytic bound).
4. Every solution is re-priced in floating point; the solver's objective must agree, and
   its bound may not exceed any fitting heuristic plan of the same layout: a violation is
   recorded in ``extra["solver_faults"]`` and the bound is not used.
5. The lower bound is the least bound over all grids and layouts (pruned ones count with
   their analytic bound); ``status`` is ``"optimal"`` when the objective is within the
   relative gap of it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from emgrid.models.base import Node
from emgrid.models.errors import InfeasiblePlanError, PlanError

from .bounds import Bounds
from .build import assemble
from .check import check_grid, check_inputs
from .config import SolverConfig
from .costing import coordinator_bytes, evaluate, mstep_s, price, replica_rows, shard_sums
from .facts import ModelFacts, model_facts, worker_arrays
from .heuristics import columns, run_all
from .placement import Layout, candidate_layouts
from .plan import BalancePlan
from .program import make_instance, solve_program
from .rationale import grid_rationale, infeasible_message
from .resources import Resources
from .scaling import Scale
from .units import UnitTree, build_units

#: Share of the time limit the heuristic sweep may use before the programs start.
SWEEP_SHARE = 0.4
#: Relative slack for comparing float recomputations with solver figures.
FLOAT_TOL = 1e-6
#: Share of the time limit the search plans for; the rest covers the final pricing and
#: the solver's overshoot of its own limit.
DEADLINE_SHARE = 0.9


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

    def __init__(self, model: Node, resources: Resources, n_data: int, cfg: SolverConfig):
        self.t0 = time.perf_counter()
        self.cfg = cfg
        self.resources = resources
        self.n = n_data
        self.facts: ModelFacts = model_facts(model)
        self.mstep = mstep_s(self.facts)
        self.fine: UnitTree = build_units(self.facts, self.facts.n_leaves)
        self.coarse: UnitTree = self.fine if self.facts.n_leaves <= cfg.max_units else build_units(
            self.facts, cfg.max_units)
        self.best: Incumbent | None = None
        self.bounds_seen: list[float] = []  # bounds of everything not solved exactly
        self.best_by_m: dict[int, float] = {}
        self.bound_by_m: dict[int, float] = {}  # least bound of the pruned grids of each M
        self.queue: list[Queued] = []
        self.faults: list[str] = []
        self.counts = {"grids": 0, "layouts": 0, "pruned": 0, "programs": 0, "programs_optimal": 0,
                       "grids_unfit": 0, "layouts_unfit": 0}
        self.exhausted = False  # the time limit ended the sweep before any plan fitted
        self.unfit_m: set[int] = set()  # shard counts no grid of which can hold its replica
        self.heuristic_best: tuple[float, str] | None = None

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
                self.counts["pruned"] += len(ordered) - k
                self.bounds_seen.append(lb)  # the least bound of every grid left
                for d2, m2 in ordered[k:]:
                    self.note_bound(m2, bounds.grid_bound(d2, m2))
                return
            self.counts["grids"] += 1
            for layout in candidate_layouts(self.resources, d, m):
                self.visit(layout, bounds)

    def visit(self, layout: Layout, bounds: Bounds) -> None:
        d, m = layout.d, layout.m
        self.counts["layouts"] += 1
        g = np.asarray(layout.grid)
        speed_of, memory_of = worker_arrays(self.resources)
        rows = replica_rows(self.n, speed_of[g].min(axis=1))
        memory = memory_of[g]
        if not bounds.layout_fits(memory, rows):
            self.counts["layouts_unfit"] += 1
            return
        if m == 1:
            leaf_shard = np.zeros(self.facts.n_leaves, dtype=np.int64)
            total, fits = self.price_leaves(leaf_shard, 1, layout, rows)
            self.offer(total, fits, d, 1, layout, rows, leaf_shard, "data-parallel")
            if fits is False:
                self.bounds_seen.append(math.inf)
            return
        cols = columns(self.facts, self.resources, layout.grid, rows)
        lb = bounds.layout_bound(m, cols.a, rows)
        if lb >= self.cutoff():
            self.counts["pruned"] += 1
            self.bounds_seen.append(lb)
            self.note_bound(m, lb)
            return
        q = Queued(bound=lb, d=d, m=m, layout=layout, rows=tuple(rows), hint=None, hint_total=math.inf)
        for name, unit_shard in run_all(self.coarse, cols).items():
            leaf_shard = self.coarse.leaf_shard(unit_shard, self.facts.n_leaves)
            total, fits = self.price_leaves(leaf_shard, m, layout, rows)
            self.offer(total, fits, d, m, layout, rows, leaf_shard, name)
            if fits is not False:
                q.heuristic_totals.append(total)
                if total < q.hint_total:
                    q.hint, q.hint_total = unit_shard, total
        if self.coarse is not self.fine:
            for name, unit_shard in run_all(self.fine, cols, names=("lpt", "contiguous")).items():
                total, fits = self.price_leaves(unit_shard, m, layout, rows)
                self.offer(total, fits, d, m, layout, rows, unit_shard, name + "/leaves")
        self.queue.append(q)

    # ------------------------------------------------------------ programs
    def solve_queue(self) -> None:
        cfg = self.cfg
        for q in sorted(self.queue, key=lambda q: (q.bound, q.m, q.d)):
            remaining = self.budget()
            cells = self.coarse.n_units * q.m
            if q.bound >= self.cutoff():
                self.counts["pruned"] += 1
                self.bounds_seen.append(q.bound)
                self.note_bound(q.m, q.bound)
                continue
            if (remaining < 0.05 or self.counts["programs"] >= cfg.max_programs or cells > cfg.max_program_cells
                    or q.m > self.coarse.n_units):
                self.bounds_seen.append(q.bound)
                continue
            self.bounds_seen.append(self.program(q, remaining))

    def program(self, q: Queued, remaining: float) -> float:
        """Solves one layout's program; returns the bound it establishes."""
        self.counts["programs"] += 1
        ref = self.best.total if self.best is not None else q.hint_total
        if not math.isfinite(ref) or ref <= 0:
            ref = max(q.bound, 1e-9)
        max_mem = max([w.memory_bytes or 0 for w in self.resources.workers] + [1])
        scale = Scale.for_instance(ref, max_mem)
        inst = make_instance(self.coarse, self.resources, q.layout, q.rows, self.facts.block_rows, scale, ref,
                             coordinator_bytes(self.facts, self.resources))
        hint = q.hint if q.hint_total <= 3.5 * ref else None
        res = solve_program(inst, hint, self.cfg, remaining)
        where = f"grid {q.d}x{q.m} layout {q.layout.name}"
        bound = q.bound
        if res.unit_shard is not None:
            leaf_shard = self.coarse.leaf_shard(res.unit_shard, self.facts.n_leaves)
            total, fits = self.price_leaves(leaf_shard, q.m, q.layout, q.rows)
            got = scale.seconds(res.objective_ticks) + self.mstep  # the program leaves out the constant
            if fits is False:
                self.faults.append(f"{where}: the solver's assignment does not fit when recomputed")
            elif got > total * (1 + FLOAT_TOL) + 1e-12 or got < total * (1 - 1e-4) - 1e-9:
                self.faults.append(f"{where}: solver objective {got!r} s, recomputed {total!r} s")
            else:
                self.offer(total, fits, q.d, q.m, q.layout, q.rows, leaf_shard, "cp-sat")
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


def enumerate_grids(n_workers: int, n_data: int, max_m: int) -> list[tuple[int, int]]:
    return [(d, m) for m in range(1, min(max_m, n_workers) + 1) for d in range(1, min(n_data, n_workers // m) + 1)]


def balance_plan(model: Node, resources: Resources, *, n_data: int, grid: tuple[int, int] | None = None,
                 solver: SolverConfig | None = None) -> BalancePlan:
    """The plan minimizing the predicted iteration time (see the module docstring).

    ``grid=(D, M)`` pins the grid; ``solver`` sets the time limit, gap, seed and workers.
    Raises ``InfeasiblePlanError`` naming the binding constraint when nothing fits.
    """
    n = check_inputs(model, resources, n_data)
    if solver is not None and not isinstance(solver, SolverConfig):
        raise PlanError(f"solver must be a planner.SolverConfig, got {type(solver).__name__}")
    search = Search(model, resources, n, solver or SolverConfig())
    facts = search.facts
    if grid is not None:
        if not isinstance(grid, (tuple, list)) or len(grid) != 2:
            raise PlanError(f"grid must be a pair (D, M), got {grid!r}")
        grids = [check_grid(grid[0], grid[1], n_data=n, n_workers=resources.n_workers, n_leaves=facts.n_leaves)]
    else:
        grids = enumerate_grids(resources.n_workers, n, facts.n_leaves)
    bounds = Bounds(facts, resources, n, max(m for _, m in grids))
    search.sweep(grids, bounds)
    search.solve_queue()
    best = search.best
    if best is None:
        msg = infeasible_message(facts, resources, n, grid, bounds)
        if search.exhausted:
            msg = f"no fitting plan found within the time limit of {search.cfg.time_limit_s} s; {msg}"
        raise InfeasiblePlanError(msg)
    lower = min([best.total, *search.bounds_seen])
    gap = (best.total - lower) / best.total if best.total > 0 else 0.0
    status = "optimal" if gap <= search.cfg.relative_gap + FLOAT_TOL else "feasible"
    ev = evaluate(facts, resources, n, best.leaf_shard, best.layout.as_lists(), best.rows)
    extra = {
        "source": best.source, "layout": best.layout.name, "gap": gap, "units": search.coarse.n_units,
        "units_grouped": search.coarse.grouped, "grids_total": len(grids), "grids_visited": search.counts["grids"],
        "layouts_visited": search.counts["layouts"], "pruned": search.counts["pruned"],
        "grids_unfit": search.counts["grids_unfit"], "layouts_unfit": search.counts["layouts_unfit"],
        "programs": search.counts["programs"], "programs_optimal": search.counts["programs_optimal"],
        "heuristic_best_s": None if search.heuristic_best is None else search.heuristic_best[0],
        "heuristic_best": None if search.heuristic_best is None else search.heuristic_best[1],
        "solver_faults": list(search.faults), "best_by_model_parallel": {str(k): v for k, v in search.best_by_m.items()},
        "time_limit_s": search.cfg.time_limit_s, "seed": search.cfg.seed,
    }
    solve_time = search.elapsed()
    plan = assemble(facts, resources, n, ev, best.layout.as_lists(), status=status, lower_bound_s=lower,
                    solve_time_s=solve_time, rationale="pending", extra=extra)
    why = grid_rationale(plan, facts, resources, search.best_by_m, search.bound_by_m, search.unfit_m,
                         pinned=grid is not None)
    return plan.model_copy(update={"rationale": why})
