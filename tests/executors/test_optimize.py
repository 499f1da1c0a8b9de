"""``optimize`` and ``get``: the result's contents, stopping, callbacks and every refusal."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from emgrid import executors
from emgrid.executors import FitResult, NpyDataset, get, optimize
from emgrid.executors.loop import check_finite
from emgrid.executors.result import PHASES
from emgrid.models import Composite, Gaussian, Mixture, Poisson, n_rows
from emgrid.models.errors import ConfigError, DataError, FitError, PlanError
from emgrid.planner import Resources

from .plans import assert_same_trace, grid_plan


@pytest.fixture(scope="module")
def small():
    model = Mixture([Gaussian(-1.0, 1.0), Gaussian(1.5, 2.0)], [0.5, 0.5])
    truth = Mixture([Gaussian(-3.0, 0.5), Gaussian(2.0, 1.0)], [0.3, 0.7])
    return model, truth.sample(500, np.random.default_rng(1))


def test_the_result_holds_model_trace_timings_bytes_and_plan(nested):
    model, data = nested
    n = n_rows(model.prepare(data))
    plan = grid_plan(model, n, 2, 2)
    res = optimize(data, model, plan=plan, max_iter=3, tol=0.0)
    assert isinstance(res, FitResult)
    assert res.iterations == len(res.log_likelihood) == len(res.timings) == len(res.bytes_moved) == 3
    assert res.plan is plan and res.executor == "local" and not res.converged
    assert type(res.model) is type(model) and res.model is not model
    for t in res.timings:
        assert set(t) == set(PHASES) | {"total"} and all(v >= 0 for v in t.values())
    for b in res.bytes_moved:
        assert set(b) == set(PHASES)
        assert b["broadcast"] > 0 and b["reduce"] > 0 and b["coupling"] > 0 and b["compute"] == b["mstep"] == 0
    back = pickle.loads(pickle.dumps(res))
    assert back.log_likelihood == res.log_likelihood and back.plan == plan
    assert "iterations=3" in repr(res)
    assert set(res.mean_timings()) == set(PHASES) | {"total"}


def test_it_stops_when_the_relative_change_is_within_tol(small):
    model, data = small
    res = optimize(data, model, plan=grid_plan(model, 500), max_iter=500, tol=1e-6)
    assert res.converged and res.iterations < 500
    ll = res.log_likelihood
    assert abs(ll[-1] - ll[-2]) <= 1e-6 * abs(ll[-1])
    assert all(abs(b - a) > 1e-6 * abs(b) for a, b in zip(ll[:-2], ll[1:-1]))


def test_max_iter_bounds_the_iterations(small):
    model, data = small
    res = optimize(data, model, plan=grid_plan(model, 500), max_iter=2, tol=0.0)
    assert res.iterations == 2 and not res.converged


def test_the_callback_sees_every_iteration(small):
    model, data = small
    seen = []
    res = optimize(data, model, plan=grid_plan(model, 500, 2, 1), max_iter=4, tol=0.0,
                   callback=lambda it, ll, so_far: seen.append((it, ll, so_far.iterations)))
    assert seen == [(i + 1, ll, i + 1) for i, ll in enumerate(res.log_likelihood)]


def test_a_dataset_on_disk_gives_the_in_memory_trace(nested, tmp_path):
    model, data = nested
    n = n_rows(model.prepare(data))
    plan = grid_plan(model, n, 2, 2)
    dataset = NpyDataset.write(data, tmp_path / "ds", model=model)
    assert dataset.n_rows == n and NpyDataset(tmp_path / "ds").n_rows == n
    on_disk = optimize(dataset, model, plan=plan, max_iter=3, tol=0.0)
    in_memory = optimize(data, model, plan=plan, max_iter=3, tol=0.0)
    assert on_disk.log_likelihood == in_memory.log_likelihood


def test_get_knows_the_executors_and_refuses_others():
    assert executors.names() == ["dask", "local", "mpi", "multiprocessing", "ray", "spark"]
    assert get("local").name == "local"
    assert get("multiprocessing", timeout_s=5.0).timeout_s == 5.0
    with pytest.raises(ConfigError, match="unknown executor 'flink'.*dask, local, mpi, multiprocessing, ray, spark"):
        get("flink")
    with pytest.raises(ConfigError, match="'local'.*colour"):
        get("local", colour="red")
    with pytest.raises(ConfigError, match="start_method"):
        get("multiprocessing", start_method="fork")


def test_bad_arguments_are_refused(small):
    model, data = small
    plan = grid_plan(model, 500)
    with pytest.raises(ConfigError, match="max_iter"):
        optimize(data, model, plan=plan, max_iter=0)
    with pytest.raises(ConfigError, match="tol"):
        optimize(data, model, plan=plan, tol=-1.0)
    with pytest.raises(ConfigError, match="executor"):
        optimize(data, model, plan=plan, executor=42)
    with pytest.raises(ConfigError, match="model"):
        optimize(data, {"family": "Gaussian"}, plan=plan)


def test_a_plan_for_other_rows_or_another_model_is_refused(small):
    model, data = small
    with pytest.raises(PlanError, match="n_data=400.*500"):
        optimize(data, model, plan=grid_plan(model, 400))
    other = Composite([Mixture([Gaussian(0.0, 1.0), Gaussian(1.0, 1.0)], [0.5, 0.5]), Poisson(1.0)])
    with pytest.raises(PlanError, match="leaves"):
        optimize(data, model, plan=grid_plan(other, 500, 1, 2))


def test_a_plan_is_checked_against_the_resources_given_with_it(small):
    model, data = small
    plan = grid_plan(model, 500, 2, 1)  # made for two workers
    optimize(data, model, plan=plan, resources=Resources.uniform(2), max_iter=1, tol=0.0)
    with pytest.raises(PlanError, match="resources"):
        optimize(data, model, plan=plan, resources=Resources.uniform(1), max_iter=1)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_values_whose_squares_would_overflow_are_refused_naming_the_row():
    model = Composite([Poisson(2.0), Gaussian(0.0, 1.0)])
    data = (np.array([1, 2, 3]), np.array([3.0, 1e200, -1e200]))
    with pytest.raises(DataError, match=r"data\[1\]: Gaussian data holds 1e\+200 at row 1"):
        optimize(data, model, plan=grid_plan(model, 3, 1, 2), max_iter=3)


def test_non_finite_statistics_stop_the_fit_naming_the_node_and_the_iteration():
    with pytest.raises(FitError, match=r"iteration 4: the statistics of node '1' \(Gaussian\) are not finite"):
        check_finite(("1", "Gaussian"), -3.0, 4)
    with pytest.raises(FitError, match=r"iteration 2: the log-likelihood is -inf"):
        check_finite(None, float("-inf"), 2)
    check_finite(None, -3.0, 1)


def test_without_a_plan_it_plans_for_the_resources_first(nested):
    model, data = nested
    res = optimize(data, model, resources=Resources.uniform(3), max_iter=3, tol=0.0)
    plan = res.plan
    assert plan.workers_used <= 3 and plan.n_data == n_rows(model.prepare(data))
    reference = optimize(data, model, plan=grid_plan(model, plan.n_data), max_iter=3, tol=0.0)
    assert_same_trace(res.log_likelihood, reference.log_likelihood)
