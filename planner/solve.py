"""``balance_plan``: enumerate grids, bound, prune, solve, recompute, check the solver.

The plans searched are the plans ``validate_plan`` accepts: every grid, every choice of
workers and of the worker at each cell (idle workers included), every split of the rows,
every assignment of leaves to shards. Placement and rows are decided as follows, each
with its argument:

1. ``M = 1`` grids are solved exactly, placement and rows included, by
   ``planner.dataparallel`` (bisection on the compute time; its docstring proves it).
2. ``M > 1`` grids whose placement is settled by dominance are *exact*: (a) all workers
   identical and either one replica or no coordinator bytes on cell ``(0, 0)``: every
   placement costs the same, and the cost and the memory of every replica are
   non-decreasing in its rows, so any rows ``v`` are dominated by the balanced rows ``b``
   (``max b = ceil(n/D) <= max v``, and every replica holds ``max b`` rows if one holds
   ``max v``); (b) one replica (rows = ``n_data``): the layouts of
   ``placement.single_replica_layouts`` (every worker multiset closed under dominance,
   each worker type at column 0); (c) several replicas on every layout of distinct cost
   (``placement.small_layouts``: every arrangement of worker types closed under dominance,
   up to permutations of replicas and columns) with every split of the rows into ``D``
   positive parts, when both are few (``search.MAX_ROW_SPLITS``). Their lower bound is the
   least bound over their layouts and rows. (When the splits are more, each heuristic's
   assignment is also tried with the rows its memory allows, ``Search.repaired_rows``, and
   those rows are queued too.)
3. Other ``M > 1`` grids (heterogeneous workers with ``D > 1``, or the coordinator's cell
   with ``D > 1`` and known memory) are searched on every layout of distinct cost when
   there are few, else on the four of ``placement.candidate_layouts``, with every split of
   the rows when they are few, else rows following speed (and, with the coordinator,
   also with replica 0 taking the fewest rows among its equals). Their lower bound holds
   for every placement and every split of the rows: the largest of the analytic
   ``Bounds.grid_bound``, the replica relaxation (``Search.relax``: the ``1 x M``
   programs of the largest replica, ``ceil(n/D)`` rows) and, with ``D > 1``, the bound
   over every mix of replicas and every split of the rows (``Search.any_rows_lower``:
   each replica at least its own bound at its rows, from single-replica programs at a few
   row counts, under its memory's row cap), so ``status`` is ``"optimal"`` only when a
   bound proves it.
4. Before the sweep, the benchmark's baselines (``lpt``, ``contiguous`` and
   ``equal_count`` on single leaves, ``D = min(n, P // M)`` on the default layout) seed the
   incumbent, so the result is never worse than any of them (LPT, whose cost grows with
   leaves x shards, only up to ``search.BASELINE_LPT_CELLS`` and within
   ``search.BASELINE_SHARE`` of the time limit; a grid whose bound is not below the
   incumbent is skipped, since none of its plans can win).
5. Every grid ``D x M`` whose largest replica can fit its workers' memory
   (``Bounds.grid_fits``) gets an analytic lower bound and the grids are visited in bound
   order, for at most ``SWEEP_SHARE`` of the time limit once a fitting plan is known; each
   layout is priced by every heuristic (``planner.heuristics``) and queued; a grid or
   layout whose bound is not below the incumbent (by more than the relative gap) is pruned.
6. The queued layouts are solved with CP-SAT in bound order (``planner.program``), under
   what is left of the time limit, each searching only below the incumbent less the
   relative gap (a proof that nothing is there is the layout's bound, and ends its solve
   early; the best heuristic is the hint only while no incumbent is known, since the
   incumbent is never above it); every solution is
   re-priced in floating point, and a solver bound above a fitting plan of the same
   layout is recorded in ``extra["solver_faults"]`` and not used.
7. The lower bound is the least bound over all grids; ``status`` is ``"optimal"`` when the
   objective is within the relative gap of it. When no plan fits, the error says whether
   infeasibility is proven (every grid refuted by a memory bound, by ``dataparallel`` or by
   an exact program) or the search ran out of time or left grids unsolved.
"""

from __future__ import annotations

import math

from emgrid.models.base import Node
from emgrid.models.data import check_dtype
from emgrid.models.errors import InfeasiblePlanError, PlanError

from .bounds import Bounds
from .build import assemble
from .check import check_grid, check_inputs
from .config import SolverConfig
from .costing import evaluate
from .plan import BalancePlan
from .rationale import grid_rationale, infeasible_message
from .resources import Resources
from .search import FLOAT_TOL, Search


def enumerate_grids(n_workers: int, n_data: int, max_m: int) -> list[tuple[int, int]]:
    return [(d, m) for m in range(1, min(max_m, n_workers) + 1) for d in range(1, min(n_data, n_workers // m) + 1)]


def balance_plan(model: Node, resources: Resources, *, n_data: int, grid: tuple[int, int] | None = None,
                 solver: SolverConfig | None = None, previous: BalancePlan | None = None,
                 dtype: str = "float64") -> BalancePlan:
    """The plan minimizing the predicted iteration time (see the module docstring).

    ``grid=(D, M)`` pins the grid; ``solver`` sets the time limit, gap, seed and workers.
    ``previous``: an earlier plan of this model (an elastic fit's, before it lost a worker):
    its leaves' shards are priced on every layout with as many shards, as an incumbent and
    as the program's hint, so the result is never worse than that assignment on these
    resources; the search is otherwise the same.
    ``dtype``: the float type the fit holds its data and runs its E-step in (``"float64"`` or
    ``"float32"``, ``models.cost.in_dtype``); the plan records it.
    Raises ``InfeasiblePlanError`` naming the binding constraint when nothing fits.
    """
    n = check_inputs(model, resources, n_data)
    dtype = check_dtype(dtype)
    if solver is not None and not isinstance(solver, SolverConfig):
        raise PlanError(f"solver must be a planner.SolverConfig, got {type(solver).__name__}")
    if previous is not None and not isinstance(previous, BalancePlan):
        raise PlanError(f"previous must be a BalancePlan, got {type(previous).__name__}")
    search = Search(model, resources, n, solver or SolverConfig(), previous, dtype)
    facts = search.facts
    if grid is not None:
        if not isinstance(grid, (tuple, list)) or len(grid) != 2:
            raise PlanError(f"grid must be a pair (D, M), got {grid!r}")
        grids = [check_grid(grid[0], grid[1], n_data=n, n_workers=resources.n_workers, n_leaves=facts.n_leaves)]
    else:
        grids = enumerate_grids(resources.n_workers, n, facts.n_leaves)
    bounds = Bounds(facts, resources, n, max(m for _, m in grids))
    dp_lower = search.data_parallel([d for d, m in grids if m == 1]) if any(m == 1 for _, m in grids) else {}
    search.baselines(grids, bounds)
    split = [g for g in grids if g[1] > 1]
    search.sweep(split, bounds)
    if dp_lower and all(v == math.inf for v in dp_lower.values()):
        search.unfit_m.add(1)
    search.solve_queue()
    search.relax_all(split, bounds)
    best = search.best
    if best is None:
        msg = infeasible_message(facts, resources, n, grid, bounds)
        if search.unproven:
            tried = ", ".join(search.unproven[:6]) + (" ..." if len(search.unproven) > 6 else "")
            msg = (f"no fitting plan found, and infeasibility is not proven: the search ran out of time or "
                   f"limits within {search.cfg.time_limit_s} s before finishing {len(search.unproven)} "
                   f"grid(s) ({tried}); {msg}")
        elif any(not search.exact.get(g, False) for g in split if bounds.grid_fits(*g)):
            left = [f"{d}x{m}" for d, m in split if bounds.grid_fits(d, m) and not search.exact.get((d, m), False)]
            msg = (f"no fitting plan found, and infeasibility is not proven: grids {', '.join(left[:6])} were "
                   f"searched on a few worker layouts or with rows following speed only; {msg}")
        raise InfeasiblePlanError(msg)
    lowers = [dp_lower.get(g, math.inf) if g[1] == 1 else search.grid_lower(*g, bounds) for g in grids]
    lower = min([best.total, *lowers])
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
        "relative_gap": search.cfg.relative_gap + FLOAT_TOL,
        "grids_exact": sum(1 for g in grids if g[1] == 1 or search.exact.get(g, False)),
    }
    solve_time = search.elapsed()
    plan = assemble(facts, resources, n, ev, best.layout.as_lists(), status=status, lower_bound_s=lower,
                    solve_time_s=solve_time, rationale="pending", extra=extra)
    why = grid_rationale(plan, facts, resources, search.best_by_m, search.bound_by_m, search.unfit_m,
                         pinned=grid is not None)
    return plan.model_copy(update={"rationale": why})
