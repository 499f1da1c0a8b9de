"""``plan_from_assignment`` fills every field; ``validate_plan`` rejects what is broken."""

from __future__ import annotations

import pytest

from emgrid.models import Gaussian, Mixture
from emgrid.planner import BalancePlan, PlanError, Resources, plan_from_assignment, validate_plan
from emgrid.planner.check import check_plan_structure
from tests.planner.helpers import nest, uniform, whole_model_memory


@pytest.fixture
def case():
    model = nest()
    res = uniform(8)
    leaves = [p for p, _ in model.leaves()]
    shard = {p: i % 2 for i, p in enumerate(leaves)}
    plan = plan_from_assignment(model, res, 1000, data_parallel=4, model_parallel=2, shard_of_leaf=shard)
    return model, res, plan


def test_plan_from_assignment_fills_every_field(case):
    model, res, plan = case
    validate_plan(plan, model, res, 1000)
    assert plan.workers_used == 8 and plan.workers_idle == 0 and plan.is_model_parallel
    assert sum(plan.replica_rows) == 1000 and len(plan.per_worker) == 8
    assert plan.objective_s == plan.predicted_iteration_s == pytest.approx(plan.breakdown.total_s)
    b = plan.breakdown
    assert b.total_s == pytest.approx(b.compute_s + b.coupling_s + b.reduce_s + b.broadcast_s + b.mstep_s)
    assert b.coupling_s > 0 and b.reduce_s > 0
    order = [p for p, _ in model.leaves()]
    for cut in plan.model_cuts:
        assert list(cut.leaves) == sorted(cut.leaves, key=order.index)
    assert plan.worker_grid()[1][0] == plan.model_cuts[0].workers[1]
    assert plan.fits is None  # memory unknown
    assert plan.rationale


def test_json_round_trip(case):
    model, res, plan = case
    again = BalancePlan.from_json(plan.to_json())
    assert again == plan
    validate_plan(again, model, res, 1000)


def test_fitted_parameters_keep_the_plan():
    a = Mixture([Gaussian(0, 1), Gaussian(2, 1)], [0.5, 0.5])
    b = Mixture([Gaussian(7, 3), Gaussian(-2, 0.5)], [0.2, 0.8])
    res = uniform(2)
    plan = plan_from_assignment(a, res, 10, data_parallel=2, model_parallel=1, shard_of_leaf={"0": 0, "1": 0})
    validate_plan(plan, b, res, 10)


@pytest.mark.parametrize("kwargs, match", [
    ({"data_parallel": 0}, "data_parallel must be an integer >= 1, got 0"),
    ({"data_parallel": 2.0}, "data_parallel must be an integer"),
    ({"data_parallel": 8, "model_parallel": 2}, "needs 16 workers"),
    ({"data_parallel": 1, "model_parallel": 12, "workers": 16}, "exceeds the model's 11 leaves"),
    ({"shard_of_leaf": {"0.0": 0}}, "is on no shard"),
    ({"shard_of_leaf": "all"}, "must be a dict"),
    ({"placement": [["w0", "w0"]] * 4}, "appears twice"),
    ({"placement": [["w0", "nope"]] * 4}, "not in the resources"),
    ({"replica_rows": [1, 1, 1, 1]}, "sum to 4, not n_data=1000"),
])
def test_bad_assignments_raise_plan_error(kwargs, match):
    model = nest()
    leaves = [p for p, _ in model.leaves()]
    args = {"data_parallel": 4, "model_parallel": 2, "shard_of_leaf": {p: i % 2 for i, p in enumerate(leaves)}}
    args.update(kwargs)
    workers = args.pop("workers", 8)
    with pytest.raises(PlanError, match=match):
        plan_from_assignment(model, uniform(workers), 1000, **args)


def test_empty_shard_and_unknown_leaf_are_rejected():
    model = nest()
    leaves = [p for p, _ in model.leaves()]
    with pytest.raises(PlanError, match="shard 1 holds no leaf"):
        plan_from_assignment(model, uniform(8), 10, data_parallel=1, model_parallel=2,
                             shard_of_leaf={p: 0 for p in leaves})
    with pytest.raises(PlanError, match="not a leaf"):
        plan_from_assignment(model, uniform(8), 10, data_parallel=1, model_parallel=1,
                             shard_of_leaf={**{p: 0 for p in leaves}, "9": 0})


@pytest.mark.parametrize("n_data", [0, -3, 2.5, True, "10"])
def test_bad_n_data_names_field_and_value(n_data):
    model = nest()
    with pytest.raises(PlanError, match="n_data must be an integer >= 1"):
        plan_from_assignment(model, uniform(2), n_data, data_parallel=1, model_parallel=1,
                             shard_of_leaf={p: 0 for p, _ in model.leaves()})


def test_validate_rejects_another_model_or_resources(case):
    model, res, plan = case
    with pytest.raises(PlanError, match="another model"):
        validate_plan(plan, Mixture([Gaussian(0, 1), Gaussian(1, 1)], [0.5, 0.5]), res, 1000)
    with pytest.raises(PlanError, match="other resources"):
        validate_plan(plan, model, uniform(9), 1000)
    with pytest.raises(PlanError, match="n_data=1000, not 999"):
        validate_plan(plan, model, res, 999)


def test_validate_rejects_tampered_figures(case):
    model, res, plan = case
    bad = plan.model_copy(update={"objective_s": plan.objective_s * 1.01})
    with pytest.raises(PlanError, match="objective_s"):
        validate_plan(bad, model, res, 1000)
    bd = plan.breakdown.model_copy(update={"coupling_s": 0.0})
    with pytest.raises(PlanError, match="breakdown.coupling_s"):
        validate_plan(plan.model_copy(update={"breakdown": bd}), model, res, 1000)
    with pytest.raises(PlanError, match="lower_bound_s"):
        validate_plan(plan.model_copy(update={"lower_bound_s": plan.objective_s * 2}), model, res, 1000)


def test_validate_rejects_a_leaf_on_two_shards_and_a_shared_worker(case):
    model, res, plan = case
    cuts = list(plan.model_cuts)
    cuts[1] = cuts[1].model_copy(update={"leaves": cuts[1].leaves + (cuts[0].leaves[0],)})
    with pytest.raises(PlanError, match="on shards 0 and 1"):
        validate_plan(plan.model_copy(update={"model_cuts": tuple(cuts)}), model, res, 1000)
    cuts = list(plan.model_cuts)
    cuts[1] = cuts[1].model_copy(update={"workers": cuts[0].workers})
    with pytest.raises(PlanError, match="more than one"):
        validate_plan(plan.model_copy(update={"model_cuts": tuple(cuts)}), model, res, 1000)


def test_validate_rejects_rows_and_grid_errors(case):
    model, res, plan = case
    with pytest.raises(PlanError, match="replica_rows"):
        validate_plan(plan.model_copy(update={"replica_rows": (0, 500, 250, 250)}), model, res, 1000)
    with pytest.raises(PlanError, match="workers_used"):
        validate_plan(plan.model_copy(update={"workers_used": 7}), model, res, 1000)


def test_validate_rejects_a_worker_out_of_memory():
    model = nest()
    need = whole_model_memory(model, 100)
    res = Resources.uniform(1, memory_bytes=need - 1)
    plan = plan_from_assignment(model, res, 100, data_parallel=1, model_parallel=1,
                                shard_of_leaf={p: 0 for p, _ in model.leaves()})
    assert plan.fits is False
    with pytest.raises(PlanError, match=r"worker 'w0' .* needs .* but has"):
        validate_plan(plan, model, res, 100)
    fitting = Resources.uniform(1, memory_bytes=need)
    ok = plan_from_assignment(model, fitting, 100, data_parallel=1, model_parallel=1,
                              shard_of_leaf={p: 0 for p, _ in model.leaves()})
    assert ok.fits is True
    validate_plan(ok, model, fitting, 100)


def test_one_fault_one_message_from_the_builder_and_the_validator(case):
    """``plan_from_assignment`` and ``validate_plan`` share their structural checks."""
    model, res, plan = case
    grid = plan.worker_grid()
    grid[1][0] = grid[0][0]
    with pytest.raises(PlanError) as built:
        plan_from_assignment(model, res, 1000, data_parallel=4, model_parallel=2, shard_of_leaf=plan.shard_of_leaf(),
                             placement=grid)
    cuts = list(plan.model_cuts)
    cuts[0] = cuts[0].model_copy(update={"workers": tuple(row[0] for row in grid)})
    with pytest.raises(PlanError) as checked:
        validate_plan(plan.model_copy(update={"model_cuts": tuple(cuts)}), model, res, 1000)
    assert str(built.value) == str(checked.value)
    assert f"worker {grid[0][0]!r} appears twice" in str(checked.value)


@pytest.mark.parametrize("shard", [2, -1, True, "0", 1.0])
def test_a_leaf_on_a_shard_outside_the_grid_is_named(shard):
    model = nest()
    sol = {p: i % 2 for i, (p, _) in enumerate(model.leaves())}
    sol["0.1"] = shard
    with pytest.raises(PlanError, match=r"leaf '0.1' is on shard .*; shards are 0..1"):
        plan_from_assignment(model, uniform(8), 1000, data_parallel=4, model_parallel=2, shard_of_leaf=sol)


def test_leaves_out_of_pre_order_are_rejected(case):
    model, res, plan = case
    cuts = list(plan.model_cuts)
    cuts[0] = cuts[0].model_copy(update={"leaves": cuts[0].leaves[::-1]})
    with pytest.raises(PlanError, match="shard 0 lists its leaves out of pre-order"):
        validate_plan(plan.model_copy(update={"model_cuts": tuple(cuts)}), model, res, 1000)


def test_a_hand_built_plan_passes_the_lenient_check_only(case):
    """An executor runs an idle shard under a placeholder fingerprint (``strict=False``);
    ``validate_plan`` refuses it, as it refuses a plan whose leaves do not match."""
    model, res, plan = case
    leaves = tuple(p for p, _ in model.leaves())
    cuts = (plan.model_cuts[0].model_copy(update={"leaves": ()}),
            plan.model_cuts[1].model_copy(update={"leaves": leaves}))
    hand = plan.model_copy(update={"model_cuts": cuts, "model_fingerprint": "test"})
    shape = check_plan_structure(hand, model, 1000, strict=False)
    assert shape.leaf_shard.tolist() == [1] * len(leaves) and shape.grid is None
    with pytest.raises(PlanError, match="another model"):
        check_plan_structure(hand, model, 1000)
    with pytest.raises(PlanError, match="shard 0 holds no leaf"):
        check_plan_structure(hand.model_copy(update={"model_fingerprint": plan.model_fingerprint}), model, 1000)
    with pytest.raises(PlanError, match="n_data=1000, not 999"):
        check_plan_structure(hand, model, 999, strict=False)
    other = Mixture([Gaussian(0, 1), Gaussian(1, 1)], [0.5, 0.5])
    with pytest.raises(PlanError, match=r"is on no shard|not a leaf of the model \(its leaves"):
        check_plan_structure(hand, other, 1000, strict=False)
    assert check_plan_structure(plan, model, 1000, res).grid == [
        [[w.name for w in res.workers].index(name) for name in row] for row in plan.worker_grid()]
