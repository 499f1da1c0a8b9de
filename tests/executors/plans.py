"""Plans for executor tests: from the planner's builder, or by hand for shapes it refuses."""

from __future__ import annotations

import numpy as np

from emgrid.planner import Resources, plan_from_assignment
from emgrid.planner.plan import BalancePlan, Breakdown, ModelCut, WorkerLoad


def even_rows(n: int, d: int) -> tuple[int, ...]:
    base, extra = divmod(n, d)
    return tuple(base + (1 if r < extra else 0) for r in range(d))


def round_robin(model, m: int) -> dict[str, int]:
    """Leaf ``i`` (pre-order) on shard ``i % m``: splits every internal node it can."""
    return {p: i % m for i, (p, _) in enumerate(model.leaves())}


def grid_plan(model, n: int, d: int = 1, m: int = 1, shard_of_leaf: dict[str, int] | None = None) -> BalancePlan:
    """The planner's plan of a ``d x m`` grid on ``d * m`` uniform workers (``w0``...)."""
    sol = shard_of_leaf if shard_of_leaf is not None else round_robin(model, m)
    return plan_from_assignment(model, Resources.uniform(d * m), n, data_parallel=d, model_parallel=m,
                                shard_of_leaf=sol, replica_rows=even_rows(n, d))


def hand_plan(model, n: int, d: int, m: int, shard_of_leaf: dict[str, int]) -> BalancePlan:
    """A ``d x m`` plan with placeholder costs, for placements the planner refuses
    (a shard without leaves); worker ``r*m + s`` runs cell ``(r, s)``."""
    names = [f"w{i}" for i in range(d * m)]
    cuts = tuple(
        ModelCut(shard=s, workers=tuple(names[r * m + s] for r in range(d)),
                 leaves=tuple(p for p, _ in model.leaves() if shard_of_leaf[p] == s),
                 flops_per_row=0.0, param_bytes=0, stat_bytes=0, data_bytes_per_row=0.0, work_bytes_per_row=0.0)
        for s in range(m)
    )
    rows = even_rows(n, d)
    loads = tuple(WorkerLoad(name=names[r * m + s], replica=r, shard=s, rows=rows[r], flops=0.0, compute_s=0.0,
                             memory_bytes=0, memory_limit=None) for r in range(d) for s in range(m))
    zero = Breakdown(compute_s=0.0, coupling_s=0.0, reduce_s=0.0, broadcast_s=0.0, total_s=0.0)
    return BalancePlan(data_parallel=d, model_parallel=m, workers_used=d * m, workers_total=d * m,
                       model_cuts=cuts, model_flops=0.0, model_bytes=0, per_worker_flops=0.0, fits=None,
                       rationale="built by hand for a test", status="feasible", objective_s=0.0,
                       lower_bound_s=0.0, solve_time_s=0.0, predicted_iteration_s=0.0, breakdown=zero,
                       n_data=n, replica_rows=rows, per_worker=loads, model_fingerprint="test",
                       resources_fingerprint="test")


def assert_same_trace(actual, expected, rtol: float = 1e-9) -> None:
    """Equal traces: every entry within ``rtol`` of the larger magnitude (or of 1)."""
    a, b = np.asarray(actual, dtype=float), np.asarray(expected, dtype=float)
    assert a.shape == b.shape, f"traces differ in length: {a.shape} vs {b.shape}"
    scale = np.maximum(np.maximum(np.abs(a), np.abs(b)), 1.0)
    worst = float(np.max(np.abs(a - b) / scale))
    assert worst <= rtol, f"traces differ by {worst:.3g} relative:\n{a}\n{b}"


def assert_same_bytes(actual: list[dict], expected: list[dict]) -> None:
    """Equal coupling bytes; pickled payloads equal up to pickle's memo of shared objects
    (an unpickled array's dtype is not the shared singleton, so it is written out again)."""
    assert len(actual) == len(expected)
    for a, b in zip(actual, expected):
        assert a["coupling"] == b["coupling"]
        for phase in ("reduce", "broadcast"):
            assert abs(a[phase] - b[phase]) <= 0.1 * b[phase], (phase, a, b)
