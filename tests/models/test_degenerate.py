"""Degenerate fits stay finite, as ``models/floors.py`` documents."""

from __future__ import annotations

import numpy as np
import pytest

from emgrid.models import (HMM, Categorical, DiagGaussian, Exponential, FullGaussian, Gaussian, Mixture, Poisson,
                    Ragged, Sequence, n_rows)
from emgrid.models.engine import em_step
from emgrid.models.floors import PROB_FLOOR, RATE_FLOOR, VAR_FLOOR


def all_finite(node) -> bool:
    return all(np.all(np.isfinite(v)) for _, n in node.nodes() for v in n.params().values())


def fit(model, x, iters=1):
    data = model.prepare(x)
    for _ in range(iters):
        model, _ = em_step(model, data)
    return model


# ---------------------------------------------------------------- empty mixture components
@pytest.mark.parametrize("far", [
    Gaussian(1e4, 1.0),
    DiagGaussian([1e4, -1e4], [1.0, 1.0]),
    FullGaussian([1e4, 1e4], [[1.0, 0.5], [0.5, 1.0]]),
], ids=["Gaussian", "DiagGaussian", "FullGaussian"])
def test_a_component_that_receives_no_weight_keeps_its_parameters(far):
    near = type(far)(**{k: (v * 0 if k == "mean" else v) for k, v in far.params().items()})
    m = Mixture([near, far], [0.5, 0.5])
    x = near.sample(200, 0)
    got = fit(m, x, iters=3)
    assert all_finite(got)
    for k, v in far.params().items():
        np.testing.assert_array_equal(got.components[1].params()[k], v)
    assert got.weights[1] == pytest.approx(PROB_FLOOR, rel=1e-6)
    assert np.all(np.isfinite(got.log_density(x)))


def test_a_component_whose_rows_all_have_weight_zero_keeps_its_parameters():
    m = Mixture([Poisson(1.0), Poisson(50.0)], [0.5, 0.5])
    x = np.array([0, 1, 2, 60, 55])
    w = np.array([1.0, 1.0, 1.0, 0.0, 0.0])
    got = m.estimate(m.accumulate(x, w))
    assert all_finite(got)
    assert float(got.components[1].rate) == 50.0


def test_an_hmm_state_never_visited_keeps_finite_parameters():
    hmm = HMM([Gaussian(0.0, 1.0), Gaussian(1e4, 1.0)], [[0.5, 0.5], [0.5, 0.5]], [0.5, 0.5], 5.0)
    rows = [Gaussian(0.0, 1.0).sample(6, i) for i in range(20)]
    got = fit(hmm, rows, iters=3)
    assert all_finite(got)
    assert float(got.emissions[1].mean) == 1e4
    assert np.all(got.transitions > 0) and np.all(got.initial > 0)
    assert np.all(np.isfinite(got.log_density(rows)))


# ---------------------------------------------------------------- collapse onto one value
def test_variance_collapse_gives_the_floor():
    x = np.full(30, 2.5)
    g = Gaussian(0.0, 1.0)
    got = g.estimate(g.accumulate(x))
    assert float(got.mean) == pytest.approx(2.5)
    assert float(got.var) == VAR_FLOOR
    assert np.all(np.isfinite(got.log_density(x)))


def test_diag_variance_collapse_gives_the_floor_per_dimension():
    x = np.column_stack([np.full(30, -1.0), np.linspace(0, 1, 30)])
    g = DiagGaussian([0.0, 0.0], [1.0, 1.0])
    got = g.estimate(g.accumulate(x))
    assert got.var[0] == VAR_FLOOR
    assert got.var[1] == pytest.approx(np.var(x[:, 1]))


@pytest.mark.parametrize("d", [1, 3])
def test_full_covariance_collapse_lifts_the_smallest_eigenvalue_to_the_floor(d):
    x = np.tile(np.arange(1.0, d + 1), (25, 1))
    g = FullGaussian(np.zeros(d), np.eye(d))
    got = g.estimate(g.accumulate(x))
    np.testing.assert_allclose(got.mean, np.arange(1.0, d + 1))
    assert np.linalg.eigvalsh(got.cov).min() == pytest.approx(VAR_FLOOR, rel=1e-6)
    assert np.all(np.isfinite(got.log_density(x)))


def test_rank_deficient_covariance_keeps_the_other_directions():
    t = np.linspace(-1, 1, 40)
    x = np.column_stack([t, 2 * t])  # every row on one line
    g = FullGaussian([0.0, 0.0], np.eye(2))
    got = g.estimate(g.accumulate(x))
    low, high = np.linalg.eigvalsh(got.cov)
    assert low == pytest.approx(VAR_FLOOR, rel=1e-6)
    assert high == pytest.approx(5 * np.var(t), rel=1e-6)


# ---------------------------------------------------------------- unseen and zero
def test_an_unseen_categorical_value_gets_the_floor_probability():
    c = Categorical([0.25, 0.25, 0.25, 0.25])
    got = c.estimate(c.accumulate(np.array([0, 1, 1, 3])))
    expected = PROB_FLOOR / (1.0 + PROB_FLOOR)
    assert got.probs[2] == pytest.approx(expected, rel=1e-9)
    ld = got.log_density(np.array([2]))
    assert np.isfinite(ld[0]) and ld[0] == pytest.approx(np.log(expected), rel=1e-9)
    assert got.probs.sum() == pytest.approx(1.0, abs=1e-15)


def test_an_hmm_transition_never_taken_gets_the_floor_probability():
    hmm = HMM([Categorical([0.99, 0.01]), Categorical([0.01, 0.99])], [[0.5, 0.5], [0.5, 0.5]], [0.5, 0.5], 3.0)
    got = fit(hmm, [np.zeros(5, dtype=np.int64)] * 10, iters=5)
    assert np.all(got.transitions > 0) and np.all(np.isfinite(got.transitions))
    assert got.log_density([np.array([1, 1, 0])])[0] > -np.inf


def test_poisson_with_all_zero_counts():
    p = Poisson(3.0)
    got = p.estimate(p.accumulate(np.zeros(50, dtype=np.int64)))
    assert float(got.rate) == RATE_FLOOR
    ld = got.log_density(np.array([0, 1, 4]))
    assert np.all(np.isfinite(ld))
    assert ld[0] == pytest.approx(0.0, abs=1e-9)


def test_exponential_with_all_zero_data():
    e = Exponential(1.0)
    got = e.estimate(e.accumulate(np.zeros(10)))
    assert np.isfinite(float(got.rate)) and float(got.rate) == pytest.approx(1.0 / RATE_FLOOR)
    assert np.all(np.isfinite(got.log_density(np.array([0.0, 1e-9]))))


# ---------------------------------------------------------------- long and empty sequences
def test_long_hmm_sequences_have_finite_log_likelihood():
    hmm = HMM([Gaussian(-5.0, 1.0), Gaussian(5.0, 1.0), Gaussian(0.0, 0.01)],
              [[0.98, 0.01, 0.01], [0.01, 0.98, 0.01], [0.3, 0.3, 0.4]], [0.4, 0.4, 0.2], 2000.0)
    rng = np.random.default_rng(0)
    rows = [rng.normal(0, 20, 2000), rng.normal(-5, 1, 2000), hmm.emissions[2].sample(2000, 1)]
    ld = hmm.log_density(rows)
    assert np.all(np.isfinite(ld))
    got = fit(hmm, rows, iters=2)
    assert all_finite(got)
    assert np.all(np.isfinite(got.log_density(rows)))


def test_long_hmm_with_identical_emissions_is_the_sum_of_emission_densities():
    e = Poisson(4.0)
    hmm = HMM([e, Poisson(4.0)], [[0.9, 0.1], [0.6, 0.4]], [0.3, 0.7], 2000.0)
    x = e.sample(2000, 3)
    np.testing.assert_allclose(hmm.log_density([x]), [e.log_density(x).sum()], rtol=1e-10)


@pytest.mark.parametrize("model", [
    Sequence(Gaussian(0.0, 1.0), 2.0),
    Sequence(Sequence(Categorical([0.5, 0.5]), 2.0), 2.0),
    HMM([Gaussian(0.0, 1.0), Gaussian(3.0, 1.0)], [[0.5, 0.5], [0.5, 0.5]], [0.5, 0.5], 2.0),
], ids=["Sequence", "Sequence-of-Sequence", "HMM"])
def test_empty_sequences_have_log_density_zero(model):
    child = model.children[0]
    rows = [child.sample(0, 0), child.sample(3, 1), child.sample(0, 2)]
    ld = model.log_density(rows)
    assert ld[0] == 0.0 and ld[2] == 0.0
    assert np.isfinite(ld[1])
    only_empty = Ragged.from_rows([child.sample(0, 0)] * 4)
    np.testing.assert_array_equal(model.log_density(only_empty), np.zeros(4))


def test_fitting_only_empty_sequences_keeps_the_parameters():
    hmm = HMM([Gaussian(0.0, 1.0), Gaussian(3.0, 1.0)], [[0.6, 0.4], [0.3, 0.7]], [0.2, 0.8], 2.5)
    got = fit(hmm, [np.zeros(0)] * 5)
    assert got.to_spec() == hmm.to_spec()
    seq = Sequence(Poisson(2.0), 3.0)
    assert fit(seq, [np.zeros(0, dtype=np.int64)] * 5).to_spec() == seq.to_spec()


def test_sampling_zero_rows():
    for m in [Gaussian(0, 1), Sequence(Poisson(1.0), 2.0),
              HMM([Gaussian(0, 1)] * 2, [[0.5, 0.5], [0.5, 0.5]], [0.5, 0.5], 2.0),
              Mixture([Categorical([0.5, 0.5])] * 2, [0.5, 0.5])]:
        assert n_rows(m.sample(0, 0)) == 0
