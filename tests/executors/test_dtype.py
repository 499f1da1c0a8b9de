"""``dtype="float32"``: the data and the E-step in float32, every sum in float64.

Oracles: the same fit in float64 (float32 rounds each product at 6e-8, so traces and
parameters agree to a few parts in a million, never exactly), the float64 statistics of
the same rows, and the same float32 fit on another executor of the same plan (the same
blocks, so the same bits).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings

from emgrid.executors import optimize
from emgrid.models import (Categorical, Composite, DiagGaussian, Exponential, FullGaussian, Gaussian, Mixture,
                           Node, Poisson, Sequence)
from emgrid.models.data import with_dtype
from emgrid.models.engine import e_step, log_density
from emgrid.models.errors import ConfigError
from emgrid.planner import Resources, balance_plan, validate_plan
from tests import strategies as S

RNG_SEED = 7


def _mixture(leaf, k: int, d: int, rng) -> Mixture:
    if leaf is FullGaussian:
        comps = [FullGaussian(rng.normal(0, 2, d), np.eye(d) * rng.uniform(0.5, 2)) for _ in range(k)]
    elif leaf is DiagGaussian:
        comps = [DiagGaussian(rng.normal(0, 2, d), rng.uniform(0.5, 2, d)) for _ in range(k)]
    else:
        comps = [Gaussian(float(rng.normal(0, 3)), float(rng.uniform(0.5, 2))) for _ in range(k)]
    return Mixture(comps, np.full(k, 1.0 / k))


def _record(rng) -> Mixture:
    """A mixture of records of every kind of column: floats, vectors, codes, counts, sequences."""
    def rec(shift):
        return Composite([DiagGaussian(rng.normal(shift, 1, 3), np.ones(3)), Categorical([0.6, 0.3, 0.1]),
                          Exponential(1.0 + shift), Poisson(2.0 + shift), Sequence(Gaussian(shift, 1.0), 4.0)])
    return Mixture([rec(0.0), rec(2.0)], [0.4, 0.6])


CASES = {
    "diag": lambda rng: _mixture(DiagGaussian, 6, 8, rng),
    "full": lambda rng: _mixture(FullGaussian, 4, 6, rng),
    "scalar": lambda rng: _mixture(Gaussian, 3, 1, rng),
    "records": _record,
}


def _start(model: Node, rng) -> Node:
    """``model`` moved off its truth: one M-step on 500 rows of its own."""
    return model.estimate(e_step(model, model.prepare(model.sample(500, rng)))[0])


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_float32_fit_follows_the_float64_fit(case):
    rng = np.random.default_rng(RNG_SEED)
    truth = CASES[case](rng)
    data = truth.sample(3000, rng)
    start = _start(truth, rng)
    f64 = optimize(data, start, max_iter=15, tol=0)
    f32 = optimize(data, start, max_iter=15, tol=0, dtype="float32")
    a, b = np.array(f64.log_likelihood), np.array(f32.log_likelihood)
    assert a.shape == b.shape
    np.testing.assert_allclose(b, a, rtol=1e-5)
    # EM still climbs in float32 (up to float32's rounding of the total)
    assert np.all(np.diff(b) >= -1e-5 * np.abs(b[1:]))
    for (path, l64), (_, l32) in zip(f64.model.leaves(), f32.model.leaves()):
        for name in ("mean", "var", "cov", "probs", "rate"):
            if hasattr(l64, name) and getattr(l64, name) is not None:
                np.testing.assert_allclose(getattr(l32, name), getattr(l64, name), rtol=1e-3, atol=1e-4,
                                           err_msg=f"{path}.{name}")
    assert f32.plan.dtype == "float32" and f64.plan.dtype == "float64"


@pytest.mark.parametrize("case", ["diag", "full"])
def test_float32_statistics_are_float64_sums_of_the_float32_rows(case):
    """The statistics of a float32 block equal the float64 statistics of the same (float32-
    rounded) rows to float32's product rounding, and come back float64."""
    rng = np.random.default_rng(RNG_SEED + 1)
    model = CASES[case](rng)
    rows = model.prepare(model.sample(5000, rng)).astype(np.float32)
    assert log_density(model, rows).dtype == np.float32  # the kernels ran in float32
    s32, ll32 = e_step(model, rows, rows_per_block=2048)
    s64, ll64 = e_step(model, rows.astype(np.float64), rows_per_block=2048)
    assert ll32 == pytest.approx(ll64, rel=1e-5)
    for path in s64:
        for x32, x64 in zip(s32[path], s64[path]):
            assert np.asarray(x32).dtype == np.float64, path
            np.testing.assert_allclose(x32, x64, rtol=1e-4, atol=1e-3 * np.max(np.abs(x64)), err_msg=path)


@settings(max_examples=15)
@given(S.models_with_data(min_rows=5))
def test_any_model_scores_float32_rows_close_to_float64(pair):
    """On random nested models of every family the float32 E-step's log-likelihood is the
    float64 one's within float32's rounding of the rows and the products."""
    model, data = pair
    data = model.prepare(data)
    rounded = with_dtype(with_dtype(data, "float32"), "float64")  # the same values, float64
    stats32, ll32 = e_step(model, with_dtype(data, "float32"))
    stats64, ll64 = e_step(model, rounded)
    assert set(stats32) == set(stats64)
    assert np.isfinite(ll32)
    assert ll32 == pytest.approx(ll64, rel=1e-4, abs=1e-3 * (1 + abs(ll64)))


@pytest.mark.parametrize("grid", [(2, 1), (1, 2)])
def test_float32_traces_are_the_same_bits_on_every_executor_of_one_plan(grid):
    rng = np.random.default_rng(RNG_SEED + 2)
    truth = _record(rng)
    data = truth.sample(1500, rng)
    resources = Resources.uniform(2, memory_bytes=2**30)
    plan = balance_plan(truth, resources, n_data=1500, grid=grid, dtype="float32")
    local = optimize(data, truth, plan=plan, max_iter=5, tol=0, dtype="float32")
    procs = optimize(data, truth, plan=plan, executor="multiprocessing", max_iter=5, tol=0, dtype="float32")
    np.testing.assert_allclose(procs.log_likelihood, local.log_likelihood, rtol=1e-12)


@pytest.mark.parametrize("grid", [(2, 1), (1, 2)])
def test_float32_workers_reading_a_float64_dataset_hold_what_their_plan_counts(tmp_path, grid):
    """Rows on disk in float64 are read into float32 by each worker (not mapped beside it):
    every worker's measured peak stays within 25% of its float32 plan, which counts its rows
    at half their float64 bytes."""
    from emgrid.executors import NpyDataset

    rng = np.random.default_rng(RNG_SEED + 5)
    model = _mixture(DiagGaussian, 8, 16, rng)
    n = 60_000
    dataset = NpyDataset.write(model.prepare(model.sample(n, rng)), tmp_path / "rows")
    plan = balance_plan(model, Resources.uniform(2), n_data=n, grid=grid, dtype="float32")
    got = optimize(dataset, model, plan=plan, executor="multiprocessing", max_iter=3, tol=0, dtype="float32")
    want = optimize(dataset, model, plan=plan, max_iter=3, tol=0, dtype="float32")
    np.testing.assert_allclose(got.log_likelihood, want.log_likelihood, rtol=1e-12)
    for w in plan.per_worker:
        assert got.worker_peak_bytes[w.name] <= 1.25 * w.memory_bytes, (w.name, got.worker_peak_bytes[w.name],
                                                                       w.memory_bytes)


def test_a_float32_plan_holds_float_rows_in_half_the_bytes():
    rng = np.random.default_rng(RNG_SEED + 3)
    model = _record(rng)
    resources = Resources.uniform(2, memory_bytes=2**30)
    p64 = balance_plan(model, resources, n_data=10_000, grid=(1, 1))
    p32 = balance_plan(model, resources, n_data=10_000, grid=(1, 1), dtype="float32")
    validate_plan(p32, model, resources, 10_000)
    # per row: 3 + 1 + 4 (mean length) float64 values become float32; the codes and counts stay int64
    floats = 8.0 * (3 + 1 + 4)
    assert p64.model_cuts[0].data_bytes_per_row - p32.model_cuts[0].data_bytes_per_row == pytest.approx(floats / 2)
    assert p32.per_worker[0].memory_bytes < p64.per_worker[0].memory_bytes
    assert type(p32).from_json(p32.to_json()).dtype == "float32"


def test_dtype_mismatches_and_unknown_dtypes_are_refused_by_name():
    rng = np.random.default_rng(RNG_SEED + 4)
    model = _mixture(DiagGaussian, 2, 2, rng)
    data = model.sample(100, rng)
    plan = balance_plan(model, Resources.uniform(1), n_data=100)
    with pytest.raises(ConfigError, match="dtype='float64'.*dtype='float32'"):
        optimize(data, model, plan=plan, dtype="float32")
    with pytest.raises(ConfigError, match="dtype must be one of 'float64', 'float32', got 'float16'"):
        optimize(data, model, dtype="float16")
    with pytest.raises(ConfigError, match="dtype must be one of"):
        balance_plan(model, Resources.uniform(1), n_data=100, dtype="half")
    assert optimize(data, model, max_iter=2, tol=0, dtype=np.float32).plan.dtype == "float32"
