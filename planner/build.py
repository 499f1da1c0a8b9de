"""Turns an assignment (grid, leaf-to-shard map, placement, rows) into a full ``BalancePlan``.

Every plan the package returns, the exact one and every heuristic or baseline one, is
made here, so all of them report figures from the one cost model (``planner.costing``).
"""

from __future__ import annotations

import numbers

import numpy as np

from emgrid.models.base import Node
from emgrid.models.errors import PlanError

from .costing import Evaluation, ModelFacts, evaluate, model_facts, resources_fingerprint
from .plan import BalancePlan, ModelCut
from .placement import default_layout, names_to_indices
from .resources import Resources


def check_count(value, field: str, *, minimum: int = 1) -> int:
    """An exact integer >= ``minimum``; raises PlanError naming the field and the value."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise PlanError(f"{field} must be an integer >= {minimum}, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise PlanError(f"{field} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_inputs(model, resources, n_data) -> int:
    """The checks every public entry point shares; returns ``n_data`` as an int."""
    if not isinstance(model, Node):
        raise PlanError(f"model must be a model node (e.g. models.Mixture), got {type(model).__name__}")
    if not isinstance(resources, Resources):
        raise PlanError(f"resources must be a planner.Resources, got {type(resources).__name__}")
    return check_count(n_data, "n_data")


def check_grid(facts: ModelFacts, resources: Resources, n_data: int, d, m) -> tuple[int, int]:
    d = check_count(d, "data_parallel")
    m = check_count(m, "model_parallel")
    if d * m > resources.n_workers:
        raise PlanError(f"grid {d}x{m} needs {d * m} workers, resources have {resources.n_workers}")
    if d > n_data:
        raise PlanError(f"data_parallel={d} exceeds n_data={n_data}: every replica needs at least one row")
    if m > facts.n_leaves:
        raise PlanError(f"model_parallel={m} exceeds the model's {facts.n_leaves} leaves: every shard needs a leaf")
    return d, m


def leaf_shards(facts: ModelFacts, shard_of_leaf: dict[str, int], m: int) -> np.ndarray:
    """``shard_of_leaf`` as a pre-order array, checked: every leaf once, shards ``0..m-1``
    each holding at least one leaf."""
    if not isinstance(shard_of_leaf, dict):
        raise PlanError(f"shard_of_leaf must be a dict from leaf path to shard, got {type(shard_of_leaf).__name__}")
    leaf_set = set(facts.leaf_paths)
    unknown = sorted(set(shard_of_leaf) - leaf_set)
    if unknown:
        raise PlanError(f"shard_of_leaf names {unknown[0]!r}, which is not a leaf of the model")
    missing = [p for p in facts.leaf_paths if p not in shard_of_leaf]
    if missing:
        raise PlanError(f"leaf {missing[0]!r} ({_desc(facts, missing[0])}) is on no shard")
    for p, s in shard_of_leaf.items():
        if isinstance(s, bool) or not isinstance(s, numbers.Integral) or not 0 <= s < m:
            raise PlanError(f"leaf {p!r} is on shard {s!r}; shards are 0..{m - 1}")
    arr = np.array([int(shard_of_leaf[p]) for p in facts.leaf_paths], dtype=np.int64)
    empty = sorted(set(range(m)) - set(arr.tolist()))
    if empty:
        raise PlanError(f"shard {empty[0]} holds no leaf; a {m}-way split needs every shard to hold one")
    return arr


def _desc(facts: ModelFacts, path: str) -> str:
    return facts.descriptions[facts.paths.index(path)]


def placement_indices(resources: Resources, placement, d: int, m: int) -> list[list[int]]:
    if placement is None:
        return default_layout(resources, d, m).as_lists()
    if len(placement) != d or any(len(row) != m for row in placement):
        shape = (len(placement), [len(row) for row in placement])
        raise PlanError(f"placement must be {d} rows of {m} worker names, got {shape}")
    try:
        idx = names_to_indices(resources, placement)
    except KeyError as e:
        raise PlanError(f"placement names worker {e.args[0]!r}, which is not in the resources") from None
    flat = [w for row in idx for w in row]
    if len(set(flat)) != len(flat):
        dup = next(w for w in flat if flat.count(w) > 1)
        raise PlanError(f"worker {resources.workers[dup].name!r} appears twice in the placement")
    return idx


def check_rows(replica_rows, d: int, n_data: int) -> list[int]:
    rows = [check_count(r, f"replica_rows[{i}]") for i, r in enumerate(replica_rows)]
    if len(rows) != d:
        raise PlanError(f"replica_rows must hold {d} counts (one per replica), got {len(rows)}")
    if sum(rows) != n_data:
        raise PlanError(f"replica_rows sum to {sum(rows)}, not n_data={n_data}")
    return rows


def plan_from_assignment(model: Node, resources: Resources, n_data: int, *, data_parallel: int, model_parallel: int,
                         shard_of_leaf: dict[str, int], placement: list[list[str]] | None = None,
                         replica_rows=None, status: str = "feasible", lower_bound_s: float = 0.0,
                         solve_time_s: float = 0.0, rationale: str | None = None,
                         extra: dict | None = None) -> BalancePlan:
    """The full plan of one assignment, every figure computed by ``costing.evaluate``.

    ``placement[r][s]`` names the worker running shard ``s`` of replica ``r`` (default: the
    ``speed/chunked`` layout); ``replica_rows`` defaults to rows proportional to each
    replica's slowest worker. The plan may not fit (``fits=False``); ``validate_plan``
    rejects such plans.
    """
    n_data = check_inputs(model, resources, n_data)
    facts = model_facts(model)
    d, m = check_grid(facts, resources, n_data, data_parallel, model_parallel)
    arr = leaf_shards(facts, shard_of_leaf, m)
    grid = placement_indices(resources, placement, d, m)
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
    info = {"block_rows": facts.block_rows,
            "coupling_bytes_per_row": sums.coupling_bytes_per_row if m > 1 else 0.0,
            "split_nodes": [facts.paths[v] for v in np.flatnonzero(sums.split)] if m > 1 else [],
            "straggler": busiest.name}
    info.update(extra or {})
    plan = BalancePlan(
        data_parallel=d, model_parallel=m, workers_used=d * m, workers_total=resources.n_workers,
        model_cuts=cuts, model_flops=float(facts.flops.sum()), model_bytes=int(round(facts.param.sum())),
        per_worker_flops=float(max(w.flops for w in ev.loads)), fits=ev.fits, rationale=rationale or "", extra=info,
        status=status, objective_s=total, lower_bound_s=float(min(lower_bound_s, total)),
        solve_time_s=float(solve_time_s), predicted_iteration_s=total, breakdown=ev.breakdown, n_data=n_data,
        replica_rows=ev.rows, per_worker=ev.loads, model_fingerprint=facts.fingerprint,
        resources_fingerprint=resources_fingerprint(resources),
    )
    if not rationale:
        from .explain import default_rationale

        plan = plan.model_copy(update={"rationale": default_rationale(plan)})
    return plan
