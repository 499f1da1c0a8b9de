"""The plan space searched is the plan space ``validate_plan`` accepts (issue 13).

Placement (which worker runs which cell, which stay idle) and rows are checked against
small exhaustive searches of their own: every ordered choice of workers and every split
of the rows for ``M = 1``; every ordered pair of workers and every leaf split for one
replica of two shards. Also: the coordinator's cell, a reference time far below the
optimum, and the status check of ``validate_plan``.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from emgrid.models import Composite, Gaussian, Mixture, Poisson
from emgrid.planner import InfeasiblePlanError, PlanError, Resources, balance_plan, validate_plan
from emgrid.planner.costing import coordinator_bytes, price, replica_rows, shard_sums
from emgrid.planner.facts import model_facts
from emgrid.planner.placement import make_layout, single_replica_layouts
from emgrid.planner.program import make_instance, solve_program
from emgrid.planner.scaling import Scale
from emgrid.planner.units import build_units
from tests.planner.helpers import SOLVER, fg, memory_share, mixed, probs, uniform

EXACT = SOLVER.model_copy(update={"relative_gap": 0.0})


def assignments(n_leaves: int, m: int):
    """Every map of ``n_leaves`` leaves onto ``m`` shards using all of them."""
    for combo in itertools.product(range(m), repeat=n_leaves):
        if len(set(combo)) == m:
            yield np.array(combo, dtype=np.int64)


def compositions(n: int, k: int):
    """Every ``k`` counts >= 1 summing to ``n``."""
    for cuts in itertools.combinations(range(1, n), k - 1):
        b = (0, *cuts, n)
        yield [b[i + 1] - b[i] for i in range(k)]


def best_data_parallel(model, res, n):
    facts = model_facts(model)
    zero = np.zeros(facts.n_leaves, dtype=np.int64)
    sums = shard_sums(facts, zero, 1)
    best = math.inf
    for d in range(1, min(n, res.n_workers) + 1):
        for cells in itertools.permutations(range(res.n_workers), d):
            for rows in compositions(n, d):
                p = price(facts, res, n, sums, [[w] for w in cells], rows)
                if p.fits is not False:
                    best = min(best, p.breakdown.total_s)
    return best


def best_one_replica_two_shards(model, res, n):
    facts = model_facts(model)
    best = math.inf
    for a, b in itertools.permutations(range(res.n_workers), 2):
        for leaf_shard in assignments(facts.n_leaves, 2):
            p = price(facts, res, n, shard_sums(facts, leaf_shard, 2), [[a, b]], [n])
            if p.fits is not False:
                best = min(best, p.breakdown.total_s)
    return best


def model_one():
    return Composite([Mixture([Poisson(1.0), Poisson(3.0)], probs(2)), fg(6), Gaussian(0.0, 1.0)])


@pytest.mark.parametrize("coordinator", [False, True])
@pytest.mark.parametrize("fraction", [None, 0.9, 0.55])
def test_data_parallel_is_exact_over_placement_and_rows(coordinator, fraction):
    model, n = model_one(), 6
    mem = None if fraction is None else memory_share(model, n, fraction)
    res = mixed([1e6, 2e6, 0.5e6, 2e6], [mem, None if mem is None else mem // 2, mem, mem])
    res = res.model_copy(update={"coordinator_in_grid": coordinator})
    best = best_data_parallel(model, res, n)
    for d in range(1, 5):
        try:
            plan = balance_plan(model, res, n_data=n, grid=(d, 1), solver=EXACT)
        except InfeasiblePlanError:
            continue
        validate_plan(plan, model, res, n)
        assert plan.objective_s >= best * (1 - 1e-12)
    try:
        plan = balance_plan(model, res, n_data=n, solver=EXACT)
    except InfeasiblePlanError:
        assert best == math.inf
        return
    validate_plan(plan, model, res, n)
    if plan.model_parallel == 1:
        assert plan.objective_s == pytest.approx(best, rel=1e-9)
    assert plan.objective_s <= best * (1 + 1e-9)


@pytest.mark.parametrize("coordinator", [False, True])
def test_one_replica_placement_is_exact(coordinator):
    model, n = model_one(), 40
    mem = memory_share(model, n, 0.7)
    res = mixed([1e6, 3e6, 2e6], [mem, mem // 2 + 2**17, 2 * mem], network=uniform(1).network)
    res = res.model_copy(update={"coordinator_in_grid": coordinator})
    best = best_one_replica_two_shards(model, res, n)
    plan = balance_plan(model, res, n_data=n, grid=(1, 2), solver=EXACT)
    validate_plan(plan, model, res, n)
    assert plan.status == "optimal"
    assert plan.objective_s == pytest.approx(best, rel=1e-9)
    assert plan.lower_bound_s <= best * (1 + 1e-9)


def test_single_replica_layouts_keep_only_undominated_multisets():
    res = mixed([2e6, 2e6, 1e6, 1e6, 3e6], [100, 100, 200, 50, 10])
    layouts, complete = single_replica_layouts(res, 2, coordinated=False)
    assert complete
    picked = {tuple(sorted(lay.grid[0])) for lay in layouts}
    # w3 (slow, small) is dominated by w0, w1 and w2; w0 and w1 are the same type
    assert all(3 not in p for p in picked)
    assert len(picked) == len(layouts)
    with_coordinator, _ = single_replica_layouts(res, 2, coordinated=True)
    assert len(with_coordinator) > len(layouts)


def test_a_reference_far_below_the_optimum_does_not_cut_plans_off():
    # issue 13, item 4: the time variables' cap comes from the instance, not the reference
    model = Composite([Mixture([Gaussian(0.0, 1.0) for _ in range(6)], probs(6)), fg(8)])
    facts = model_facts(model)
    res = uniform(4)
    ut = build_units(facts, 64)
    layout = make_layout(res, 2, 2)
    rows = replica_rows(10**5, [1.0, 1.0])
    scale = Scale.for_instance(1e-9, 1)
    inst = make_instance(ut, res, layout, rows, facts.block_rows, scale, 1e-9, coordinator_bytes(facts, res))
    out = solve_program(inst, None, SOLVER, 10.0)
    assert out.status in ("optimal", "feasible")
    total = price(facts, res, 10**5, shard_sums(facts, ut.leaf_shard(out.unit_shard, facts.n_leaves), 2),
                  layout.grid, rows).breakdown.total_s
    assert inst.scale.seconds(out.objective_ticks) <= total * (1 + 1e-6)


def test_validate_checks_the_status_against_the_bound():
    model = model_one()
    res = uniform(4)
    plan = balance_plan(model, res, n_data=1000, solver=SOLVER)
    validate_plan(plan, model, res, 1000)
    loose = plan.model_copy(update={"status": "optimal", "lower_bound_s": 0.5 * plan.objective_s,
                                    "extra": {**plan.extra, "gap": 0.5}})
    with pytest.raises(PlanError, match="status='optimal'"):
        validate_plan(loose, model, res, 1000)
    wrong_gap = plan.model_copy(update={"extra": {**plan.extra, "gap": 0.25}})
    with pytest.raises(PlanError, match="gap"):
        validate_plan(wrong_gap, model, res, 1000)
    feasible = loose.model_copy(update={"status": "feasible"})
    validate_plan(feasible, model, res, 1000)


def test_a_cutoff_below_the_optimum_proves_a_bound_and_one_above_keeps_the_optimum():
    """``solve_program(cutoff_ticks=c)`` searches below ``c`` only: under the optimum it
    ends with status "cutoff" and bound ``c + 1`` (at most the optimum), above it with the
    optimum itself."""
    model = Composite([Mixture([Gaussian(0.0, 1.0) for _ in range(6)], probs(6)), fg(8), fg(4)])
    facts = model_facts(model)
    res = uniform(4)
    ut = build_units(facts, 64)
    layout = make_layout(res, 1, 3)
    rows = [10**5]
    scale = Scale.for_instance(1e-3, 1)
    inst = make_instance(ut, res, layout, rows, facts.block_rows, scale, 1e-3, 0.0)
    free = solve_program(inst, None, SOLVER, 10.0)
    assert free.status == "optimal"
    opt = int(round(free.objective_ticks))
    below = solve_program(inst, None, SOLVER, 10.0, cutoff_ticks=opt - 1)
    assert below.status == "cutoff" and below.unit_shard is None and below.bound_ticks == opt
    above = solve_program(inst, None, SOLVER, 10.0, cutoff_ticks=opt + 10)
    assert above.status == "optimal" and int(round(above.objective_ticks)) == opt
