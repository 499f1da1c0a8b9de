"""Turns an assignment (grid, leaf-to-shard map, placement, rows) into a full ``BalancePlan``.

Every plan the package returns, the exact one and every heuristic or baseline one, is
made here, so all of them report figures from the one cost model (``planner.costing``).
The assignment is checked by ``planner.check``, as ``validate_plan`` checks a plan.
"""

from __future__ import annotations

import numpy as np

from emgrid.models.base import Node
from emgrid.models.data import check_dtype

from .check import check_grid, check_inputs, check_leaf_shards, check_placement, check_rows
from .costing import Evaluation, evaluate, iteration_bytes
from .explain import default_rationale
from .facts import ModelFacts, model_facts, resources_fingerprint
from .placement import default_layout
from .plan import BalancePlan, ModelCut
from .resources import Resources


def plan_from_assignment(model: Node, resources: Resources, n_data: int, *, data_parallel: int, model_parallel: int,
                         shard_of_leaf: dict[str, int], placement: list[list[str]] | None = None,
                         replica_rows=None, status: str = "feasible", lower_bound_s: float = 0.0,
                         solve_time_s: float = 0.0, rationale: str | None = None,
                         extra: dict | None = None, dtype: str = "float64") -> BalancePlan:
    """The full plan of one assignment, every figure computed by ``costing.evaluate`` for
    data and E-step in ``dtype``.

    ``placement[r][s]`` names the worker running shard ``s`` of replica ``r`` (default: the
    ``speed/chunked`` layout); ``replica_rows`` defaults to rows proportional to each
    replica's slowest worker. The plan may not fit (``fits=False``); ``validate_plan``
    rejects such plans.
    """
    n_data = check_inputs(model, resources, n_data)
    facts = model_facts(model, check_dtype(dtype))
    d, m = check_grid(data_parallel, model_parallel, n_data=n_data, n_workers=resources.n_workers,
                      n_leaves=facts.n_leaves)
    arr = check_leaf_shards(facts.leaf_paths, facts.describe, shard_of_leaf, m)
    grid = (default_layout(resources, d, m).as_lists() if placement is None
            else check_placement(placement, d, m, resources))
    rows = None if replica_rows is None else check_rows(replica_rows, d, n_data)
    ev = evaluate(facts, resources, n_data, arr, grid, rows)
    return assemble(facts, resources, n_data, ev, grid, status=status, lower_bound_s=lower_bound_s,
                    solve_time_s=solve_time_s, rationale=rationale, extra=extra)


def assemble(facts: ModelFacts, resources: Resources, n_data: int, ev: Evaluation, grid: list[list[int]], *,
             status: str, lower_bound_s: float, solve_time_s: float, rationale: str | None,
             extra: dict | None) -> BalancePlan:
    """A BalancePlan from an evaluation (no checks: callers pass checked assignments)."""
    d, m = len(grid), len(grid[0])
    names = [w.name for w in resources.workers]
    sums = ev.sums
    cuts = tuple(
        ModelCut(shard=s, workers=tuple(names[grid[r][s]] for r in range(d)),
                 leaves=tuple(facts.leaf_paths[i] for i in sums.leaves[s]),
                 flops_per_row=float(sums.flops[s]), param_bytes=int(round(sums.param[s])),
                 stat_bytes=int(round(sums.stat[s])), data_bytes_per_row=float(sums.data[s]),
                 work_bytes_per_row=float(sums.work[s]), scratch_bytes_per_row=float(sums.scratch[s]))
        for s in range(m)
    )
    busiest = max(ev.loads, key=lambda w: (w.compute_s, w.flops))
    total = ev.breakdown.total_s
    reduce_b, broadcast_b = iteration_bytes(sums, d)
    info = {"block_rows": facts.block_rows,
            "reduce_bytes": reduce_b, "broadcast_bytes": broadcast_b,
            "coupling_bytes_per_row": sums.coupling_bytes_per_row if m > 1 else 0.0,
            "spanning_nodes": [facts.paths[v] for v in np.flatnonzero(sums.spanning)] if m > 1 else [],
            "straggler": busiest.name}
    info.update(extra or {})
    plan = BalancePlan(
        data_parallel=d, model_parallel=m, workers_used=d * m, workers_total=resources.n_workers,
        model_cuts=cuts, model_flops=float(facts.flops.sum()), model_bytes=int(round(facts.param.sum())),
        per_worker_flops=float(max(w.flops for w in ev.loads)), fits=ev.fits, rationale=rationale or "", extra=info,
        status=status, objective_s=total, lower_bound_s=float(min(lower_bound_s, total)),
        solve_time_s=float(solve_time_s), predicted_iteration_s=total, breakdown=ev.breakdown, n_data=n_data,
        replica_rows=ev.rows, per_worker=ev.loads, model_fingerprint=facts.fingerprint,
        resources_fingerprint=resources_fingerprint(resources), dtype=facts.dtype,
    )
    if not rationale:
        plan = plan.model_copy(update={"rationale": default_rationale(plan)})
    return plan
