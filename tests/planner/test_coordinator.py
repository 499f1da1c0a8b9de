"""A coordinator that is also a worker (MPI's cell (0, 0)) carries the M-step's memory."""

from __future__ import annotations

import numpy as np
import pytest

from emgrid.models import Categorical, Mixture
from emgrid.planner import InfeasiblePlanError, balance_plan, validate_plan
from emgrid.planner.costing import coordinator_bytes, evaluate
from emgrid.planner.facts import model_facts
from tests.planner.helpers import probs, uniform, whole_model_memory


def tables(k: int = 4, v: int = 20_000) -> Mixture:
    """A model whose parameters and statistics dominate its memory."""
    return Mixture([Categorical(probs(v)) for _ in range(k)], probs(k))


def coordinating(resources):
    return resources.model_copy(update={"coordinator_in_grid": True})


def test_only_cell_zero_zero_carries_the_coordinators_copies():
    model = tables()
    facts = model_facts(model)
    leaf_shard = np.array([0, 0, 1, 1])
    for res in (uniform(4), uniform(4, memory=2**40)):
        apart = evaluate(facts, res, 1000, leaf_shard, [[0, 1], [2, 3]])
        inside = evaluate(facts, coordinating(res), 1000, leaf_shard, [[0, 1], [2, 3]])
        extra = [b.memory_bytes - a.memory_bytes for a, b in zip(apart.loads, inside.loads)]
        assert coordinator_bytes(facts, res) == 0.0
        assert extra[0] == pytest.approx(coordinator_bytes(facts, coordinating(res)), abs=1)
        assert extra[1:] == [0, 0, 0]
        assert inside.breakdown == apart.breakdown


def test_a_worker_that_fits_the_model_but_not_the_m_step_gets_no_plan():
    model = tables()
    facts = model_facts(model)
    limit = whole_model_memory(model, 1000) + int(coordinator_bytes(facts, coordinating(uniform(1))) / 2)
    res = uniform(1, memory=limit)
    plan = balance_plan(model, res, n_data=1000)
    assert plan.fits
    with pytest.raises(InfeasiblePlanError):
        balance_plan(model, coordinating(res), n_data=1000)


def test_the_plan_for_a_coordinating_grid_validates_and_reports_the_extra_bytes():
    model = tables()
    res = coordinating(uniform(2, memory=2**30))
    plan = balance_plan(model, res, n_data=5000, grid=(2, 1))
    validate_plan(plan, model, res, 5000)
    first, second = plan.per_worker
    assert first.memory_bytes - second.memory_bytes == pytest.approx(coordinator_bytes(model_facts(model), res), abs=1)
