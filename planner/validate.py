"""``validate_plan``: every invariant of a plan, checked without the solver.

The structure is checked by ``planner.check.check_plan_structure`` (shared with
``plan_from_assignment`` and the executors); on top, every figure is recomputed with the
floating-point cost model (``planner.costing``) and compared, and every worker's memory
is checked against its load. This module does not import OR-Tools.
"""

from __future__ import annotations

import math

from emgrid.models.base import Node
from emgrid.models.errors import PlanError

from .check import check_plan_structure, check_resources
from .costing import evaluate
from .plan import BalancePlan
from .resources import Resources

REL_TOL = 1e-9
#: Slack on a reported gap against the one recomputed from ``objective_s`` and ``lower_bound_s``.
GAP_TOL = 1e-6
#: The relative gap an "optimal" plan may have when it does not record its own
#: (``extra["relative_gap"]``): ``SolverConfig``'s default.
DEFAULT_RELATIVE_GAP = 1e-4


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=1e-12)


def _gib(b: float) -> str:
    return f"{b / 2**30:.3g} GiB"


def validate_plan(plan: BalancePlan, model: Node, resources: Resources, n_data: int) -> None:
    """Raises PlanError naming the first broken invariant; returns None for a valid plan.

    Checked: the structure (:func:`planner.check.check_plan_structure`, strict, against
    ``resources``: the plan was made for this model's structure and these resources, the
    grid fits the workers and the rows, every leaf is on exactly one shard and every shard
    holds a leaf, every used worker appears once, rows are >= 1 and sum to ``n_data``);
    every worker's memory holds its load; every reported figure equals the recomputed one; and
    the status agrees with the lower bound and the gap (:func:`_check_status`).
    """
    if resources is None:
        check_resources(resources)  # a plan is validated against resources, never without
    shape = check_plan_structure(plan, model, n_data, resources)
    facts, grid = shape.facts, shape.grid
    n_data = plan.n_data

    # recomputed figures
    ev = evaluate(facts, resources, n_data, shape.leaf_shard, grid, plan.replica_rows)
    for load in ev.loads:
        if load.memory_limit is not None and load.memory_bytes > load.memory_limit:
            raise PlanError(f"worker {load.name!r} (replica {load.replica}, shard {load.shard}) needs "
                            f"{_gib(load.memory_bytes)} ({load.memory_bytes} bytes) but has {_gib(load.memory_limit)}")
    if plan.fits != ev.fits:
        raise PlanError(f"fits={plan.fits} but the recomputed memory check gives {ev.fits}")
    _compare("breakdown", plan.breakdown.model_dump(), ev.breakdown.model_dump())
    for name, value in (("objective_s", plan.objective_s), ("predicted_iteration_s", plan.predicted_iteration_s)):
        if not _close(value, ev.total_s):
            raise PlanError(f"{name}={value!r} but the recomputed iteration time is {ev.total_s!r}")
    if plan.lower_bound_s > plan.objective_s * (1 + REL_TOL) + 1e-12:
        raise PlanError(f"lower_bound_s={plan.lower_bound_s!r} exceeds objective_s={plan.objective_s!r}")
    _check_status(plan)
    if len(plan.per_worker) != len(ev.loads):
        raise PlanError(f"per_worker lists {len(plan.per_worker)} workers, the grid has {len(ev.loads)}")
    for got, want in zip(plan.per_worker, ev.loads):
        _compare(f"per_worker[{want.name}]", got.model_dump(), want.model_dump())
    for s, cut in enumerate(plan.model_cuts):
        sums = ev.sums
        want = {"flops_per_row": float(sums.flops[s]), "param_bytes": int(round(sums.param[s])),
                "stat_bytes": int(round(sums.stat[s])), "data_bytes_per_row": float(sums.data[s]),
                "work_bytes_per_row": float(sums.work[s]), "scratch_bytes_per_row": float(sums.scratch[s])}
        _compare(f"model_cuts[{s}]", {k: getattr(cut, k) for k in want}, want)
    _compare("plan", {"model_flops": plan.model_flops, "model_bytes": plan.model_bytes,
                      "per_worker_flops": plan.per_worker_flops},
             {"model_flops": float(facts.flops.sum()), "model_bytes": int(round(facts.param.sum())),
              "per_worker_flops": max(w.flops for w in ev.loads)})


def _check_status(plan: BalancePlan) -> None:
    """``status`` agrees with the bound: the gap ``(objective - lower_bound) / objective``
    equals ``extra["gap"]`` when reported, and an ``"optimal"`` plan's gap is at most its
    ``extra["relative_gap"]`` (default :data:`DEFAULT_RELATIVE_GAP`)."""
    obj, lb = plan.objective_s, plan.lower_bound_s
    gap = (obj - lb) / obj if obj > 0 else 0.0
    reported = plan.extra.get("gap")
    if isinstance(reported, (int, float)) and not isinstance(reported, bool) and abs(reported - gap) > GAP_TOL:
        raise PlanError(f"extra['gap']={reported!r} but objective_s={obj!r} and lower_bound_s={lb!r} give {gap!r}")
    if plan.status == "optimal":
        allowed = plan.extra.get("relative_gap", DEFAULT_RELATIVE_GAP)
        if not isinstance(allowed, (int, float)) or isinstance(allowed, bool):
            raise PlanError(f"extra['relative_gap'] must be a number, got {allowed!r}")
        if gap > float(allowed) + GAP_TOL:
            raise PlanError(f"status='optimal' but lower_bound_s={lb!r} is {gap:.3%} below objective_s={obj!r} "
                            f"(the relative gap allowed is {float(allowed):.3g})")


def _compare(where: str, got: dict, want: dict) -> None:
    for key, w in want.items():
        g = got[key]
        if isinstance(w, float) or isinstance(g, float):
            ok = _close(float(g), float(w))
        else:
            ok = g == w
        if not ok:
            raise PlanError(f"{where}.{key} is {g!r} but recomputes to {w!r}")
