"""The exact planner against exhaustive search on small instances (<= 7 leaves, <= 8 workers).

Exhaustive search prices every grid, every layout and every assignment of leaves to shards
with the cost model (``tests/planner/brute.py``); the planner's objective must equal its
optimum, and its lower bound must not exceed it.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from emgrid.models import Composite, Gaussian, Mixture, Poisson, Sequence
from emgrid.planner import InfeasiblePlanError, Network, Resources, Worker, balance_plan, validate_plan
from emgrid.planner.facts import model_facts
from tests.planner.brute import brute_force
from tests.planner.helpers import SOLVER, dg, fg, probs, uniform, memory_share
from tests.strategies import models

REL = 1e-6
#: No relative gap: the planner must reach the exhaustive optimum itself.
EXACT = SOLVER.model_copy(update={"relative_gap": 0.0})


def check_against_brute_force(model, res, n):
    best, arg = brute_force(model, res, n)
    try:
        plan = balance_plan(model, res, n_data=n, solver=EXACT)
    except InfeasiblePlanError:
        assert best == math.inf, f"the planner found no plan, exhaustive search found {best} at {arg}"
        return None
    validate_plan(plan, model, res, n)
    assert best < math.inf
    assert plan.objective_s == pytest.approx(best, rel=REL, abs=1e-15), (plan.objective_s, best, arg)
    assert plan.lower_bound_s <= best * (1 + REL)
    assert plan.status == "optimal"
    return plan


def random_resources(rng: random.Random, p: int, mixed: bool, tight: bool, model, n: int) -> Resources:
    speeds = [rng.choice([1e6, 2e6, 4e6]) if mixed else 2e6 for _ in range(p)]
    mems = [memory_share(model, n, rng.uniform(0.25, 1.2)) if tight else None for _ in range(p)]
    net = Network(latency_s=rng.choice([1e-9, 1e-7, 1e-6]), bytes_per_s=rng.choice([1e8, 1e10]))
    return Resources(workers=tuple(Worker(name=f"w{i}", flops_per_s=s, memory_bytes=m)
                                   for i, (s, m) in enumerate(zip(speeds, mems))), network=net)


@settings(max_examples=100)
@given(models(max_leaves=5), st.integers(1, 6), st.sampled_from([1, 2, 3, 50]), st.integers(0, 2**31),
       st.booleans(), st.booleans())
def test_random_small_instances_match_exhaustive_search(model, p, n, seed, mixed, tight):
    assume(2 <= model_facts(model).n_leaves <= 5)
    rng = random.Random(seed)
    res = random_resources(rng, p, mixed, tight, model, n)
    check_against_brute_force(model, res, n)


def test_seven_leaves_three_workers_mixed():
    model = Composite([Mixture([fg(5), dg(5), dg(5)], probs(3)), Sequence(Poisson(2.0), 6.0),
                       Mixture([Gaussian(0, 1), Gaussian(1, 1), Gaussian(2, 1)], probs(3))])
    res = Resources(workers=(Worker(name="a", flops_per_s=4e6), Worker(name="b", flops_per_s=1e6),
                             Worker(name="c", flops_per_s=2e6)),
                    network=Network(latency_s=1e-8, bytes_per_s=1e10))
    plan = check_against_brute_force(model, res, 2)
    assert plan.model_parallel > 1


def test_six_leaves_eight_workers_tight_memory():
    model = Composite([Mixture([fg(8), fg(8), dg(8), dg(8)], probs(4)), Sequence(Poisson(2.0), 8.0), Gaussian(0, 1)])
    res = uniform(8, memory=memory_share(model, 5, 0.9), flops=2e6, network=Network(latency_s=1e-8, bytes_per_s=1e10))
    plan = check_against_brute_force(model, res, 40)
    assert plan.model_parallel > 1 and plan.fits is True


def test_brute_force_agrees_the_plan_space_is_infeasible():
    model = Composite([fg(6), fg(6)])
    res = uniform(4, memory=200, flops=2e6)
    best, _ = brute_force(model, res, 10)
    assert best == math.inf
    with pytest.raises(InfeasiblePlanError):
        balance_plan(model, res, n_data=10, solver=EXACT)
    np.testing.assert_equal(best, math.inf)
