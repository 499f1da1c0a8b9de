"""``validate_plan``: every invariant of a plan, checked without the solver.

This module does not import OR-Tools: it recomputes every figure with the floating-point
cost model (``planner.costing``) and compares.
"""

from __future__ import annotations

import math

from emgrid.models.base import Node
from emgrid.models.errors import PlanError

from .build import check_inputs
from .costing import evaluate, model_facts, resources_fingerprint
from .plan import BalancePlan
from .resources import Resources

REL_TOL = 1e-9


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=1e-12)


def _gib(b: float) -> str:
    return f"{b / 2**30:.3g} GiB"


def validate_plan(plan: BalancePlan, model: Node, resources: Resources, n_data: int) -> None:
    """Raises PlanError naming the first broken invariant; returns None for a valid plan.

    Checked: the plan was made for this model's structure and these resources; the grid
    fits the workers and the rows; every leaf is on exactly one shard and every shard holds
    a leaf; every used worker appears once; rows are >= 1 and sum to ``n_data``; every
    worker's memory holds its load; and every reported figure equals the recomputed one.
    """
    if not isinstance(plan, BalancePlan):
        raise PlanError(f"plan must be a planner.BalancePlan, got {type(plan).__name__}")
    n_data = check_inputs(model, resources, n_data)
    facts = model_facts(model)
    if plan.model_fingerprint != facts.fingerprint:
        raise PlanError(f"the plan was made for another model (fingerprint {plan.model_fingerprint}, "
                        f"this model's is {facts.fingerprint}); plan again for this model")
    if plan.resources_fingerprint != resources_fingerprint(resources):
        raise PlanError(f"the plan was made for other resources (fingerprint {plan.resources_fingerprint}, "
                        f"these are {resources_fingerprint(resources)}); plan again for these workers")
    if plan.n_data != n_data:
        raise PlanError(f"the plan was made for n_data={plan.n_data}, not {n_data}")
    d, m = plan.data_parallel, plan.model_parallel
    if plan.workers_total != resources.n_workers:
        raise PlanError(f"workers_total={plan.workers_total}, but the resources have {resources.n_workers} workers")
    if plan.workers_used != d * m:
        raise PlanError(f"workers_used={plan.workers_used}, but the grid {d}x{m} uses {d * m}")
    if d * m > resources.n_workers:
        raise PlanError(f"grid {d}x{m} needs {d * m} workers, resources have {resources.n_workers}")
    if d > n_data:
        raise PlanError(f"data_parallel={d} exceeds n_data={n_data}")

    # shards and leaves
    if len(plan.model_cuts) != m:
        raise PlanError(f"the plan has {len(plan.model_cuts)} model cuts for model_parallel={m}")
    order = {p: i for i, p in enumerate(facts.leaf_paths)}
    seen: dict[str, int] = {}
    for s, cut in enumerate(plan.model_cuts):
        if cut.shard != s:
            raise PlanError(f"model cut {s} is labelled shard {cut.shard}; cuts must be in shard order")
        if not cut.leaves:
            raise PlanError(f"shard {s} holds no leaf")
        if len(cut.workers) != d:
            raise PlanError(f"shard {s} names {len(cut.workers)} workers, one per replica needs {d}")
        for leaf in cut.leaves:
            if leaf not in order:
                raise PlanError(f"shard {s} holds {leaf!r}, which is not a leaf of the model")
            if leaf in seen:
                raise PlanError(f"leaf {leaf!r} is on shards {seen[leaf]} and {s}; each leaf goes on exactly one")
            seen[leaf] = s
        if [order[x] for x in cut.leaves] != sorted(order[x] for x in cut.leaves):
            raise PlanError(f"shard {s} lists its leaves out of pre-order")
    missing = [p for p in facts.leaf_paths if p not in seen]
    if missing:
        raise PlanError(f"leaf {missing[0]!r} is on no shard")

    # workers and rows
    index = {w.name: i for i, w in enumerate(resources.workers)}
    grid = []
    for r in range(d):
        row = []
        for s in range(m):
            name = plan.model_cuts[s].workers[r]
            if name not in index:
                raise PlanError(f"shard {s} of replica {r} runs on {name!r}, which is not in the resources")
            row.append(index[name])
        grid.append(row)
    flat = [w for row in grid for w in row]
    if len(set(flat)) != len(flat):
        dup = next(w for w in flat if flat.count(w) > 1)
        raise PlanError(f"worker {resources.workers[dup].name!r} runs more than one (replica, shard)")
    if len(plan.replica_rows) != d or any(r < 1 for r in plan.replica_rows):
        raise PlanError(f"replica_rows must hold {d} counts >= 1, got {list(plan.replica_rows)}")
    if sum(plan.replica_rows) != n_data:
        raise PlanError(f"replica_rows sum to {sum(plan.replica_rows)}, not n_data={n_data}")

    # recomputed figures
    ev = evaluate(facts, resources, n_data, [seen[p] for p in facts.leaf_paths], grid, plan.replica_rows)
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


def _compare(where: str, got: dict, want: dict) -> None:
    for key, w in want.items():
        g = got[key]
        if isinstance(w, float) or isinstance(g, float):
            ok = _close(float(g), float(w))
        else:
            ok = g == w
        if not ok:
            raise PlanError(f"{where}.{key} is {g!r} but recomputes to {w!r}")
