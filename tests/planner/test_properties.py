"""Random nested models on random resources, feasible by construction.

Memory is unknown, or at least what one worker needs for the whole model and every row,
so a plan always exists. For every drawn instance: ``validate_plan`` passes, the objective
is no worse than any heuristic on any grid and layout, no better than the lower bound, and
the plan survives a JSON round trip.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from emgrid.planner import BalancePlan, Network, Resources, Worker, balance_plan, validate_plan
from emgrid.planner.costing import price, replica_rows, shard_sums
from emgrid.planner.facts import model_facts
from emgrid.planner.heuristics import HEURISTICS, columns
from emgrid.planner.placement import candidate_layouts
from emgrid.planner.solve import enumerate_grids
from emgrid.planner.units import build_units
from tests.planner.helpers import SOLVER, whole_model_memory
from tests.strategies import models


@st.composite
def instances(draw):
    model = draw(models())
    n = draw(st.sampled_from([1, 3, 1000, 10**6]))
    p = draw(st.integers(1, 12))
    need = whole_model_memory(model, n)
    workers = []
    for i in range(p):
        speed = draw(st.sampled_from([1e8, 1e9, 3e9]))
        memory = draw(st.one_of(st.none(), st.integers(need, 4 * need)))
        workers.append(Worker(name=f"w{i}", flops_per_s=speed, memory_bytes=memory))
    net = Network(latency_s=draw(st.sampled_from([1e-7, 1e-5, 1e-4])), bytes_per_s=draw(st.sampled_from([1e8, 1e10])))
    return model, Resources(workers=tuple(workers), network=net), n


def heuristic_totals(model, res, n):
    """Every fitting heuristic plan's iteration time, over every grid and layout."""
    facts = model_facts(model)
    fine = build_units(facts, facts.n_leaves)
    speed = np.array([w.flops_per_s for w in res.workers])
    out = []
    for d, m in enumerate_grids(res.n_workers, n, facts.n_leaves):
        for layout in candidate_layouts(res, d, m):
            rows = replica_rows(n, speed[np.asarray(layout.grid)].min(axis=1))
            cols = columns(facts, res, layout.grid, rows)
            for name, fn in HEURISTICS.items():
                leaf_shard = fn(fine, cols)
                p = price(facts, res, n, shard_sums(facts, leaf_shard, m), layout.grid, rows)
                if p.fits is not False:
                    out.append((p.breakdown.total_s, name, d, m, layout.name))
    return out


@settings(max_examples=60)
@given(instances())
def test_random_instances_plan_validly_and_beat_every_heuristic(instance):
    model, res, n = instance
    plan = balance_plan(model, res, n_data=n, solver=SOLVER)
    validate_plan(plan, model, res, n)
    assert plan.lower_bound_s <= plan.objective_s * (1 + 1e-9)
    for total, *where in heuristic_totals(model, res, n):
        assert plan.objective_s <= total * (1 + 1e-9), (plan.objective_s, total, where)
    again = BalancePlan.from_json(plan.to_json())
    assert again == plan
    validate_plan(again, model, res, n)
    assert plan.fits is (None if any(w.memory_bytes is None for w in res.workers
                                     if w.name in {x.name for x in plan.per_worker}) else True)
