"""Regularization knobs: pseudo-statistics added before the M-step (``models.regularize``)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from emgrid.executors import optimize
from emgrid.models import HMM, Categorical, DiagGaussian, FullGaussian, Gaussian, Mixture
from emgrid.models.errors import ConfigError, ConvergenceWarning
from emgrid.models.regularize import Regularization, regularize


def _fit_once(model, data, **reg):
    stats = model.accumulate(data)
    return model.estimate(regularize(model, stats, Regularization(**reg)))


def test_zero_knobs_leave_the_statistics_untouched():
    g = Gaussian(0.0, 1.0)
    stats = g.accumulate(np.arange(5.0))
    assert regularize(g, stats, Regularization()) is stats and regularize(g, stats, None) is stats


def test_reg_covar_is_added_to_variances_and_covariance_diagonals():
    x = np.random.default_rng(0).normal(size=(400, 3)) @ np.array([[1.0, 0.3, 0.0], [0.0, 1.0, 0.5], [0.0, 0.0, 0.2]])
    full = _fit_once(FullGaussian(np.zeros(3), np.eye(3)), x, reg_covar=0.1)
    np.testing.assert_allclose(full.cov, np.cov(x.T, bias=True) + 0.1 * np.eye(3), rtol=1e-10)
    diag = _fit_once(DiagGaussian(np.zeros(3), np.ones(3)), x, reg_covar=0.1)
    np.testing.assert_allclose(diag.var, x.var(axis=0) + 0.1, rtol=1e-10)
    const = _fit_once(Gaussian(0.0, 1.0), np.full(50, 2.0), reg_covar=1e-3)
    assert float(const.var) == pytest.approx(1e-3, rel=1e-9) and float(const.mean) == 2.0


def test_reg_covar_matches_scikit_learn():
    mixture = pytest.importorskip("sklearn.mixture")
    x = np.random.default_rng(1).normal(size=(300, 2))
    ours = _fit_once(FullGaussian(np.zeros(2), np.eye(2)), x, reg_covar=0.05)
    theirs = mixture.GaussianMixture(1, covariance_type="full", reg_covar=0.05).fit(x)
    np.testing.assert_allclose(ours.cov, theirs.covariances_[0], rtol=1e-8)


def test_pseudo_counts_smooth_every_probability():
    cat = _fit_once(Categorical([0.25, 0.25, 0.25, 0.25]), np.array([0, 0, 0, 3]), pseudo_count=1.0)
    np.testing.assert_allclose(cat.probs, np.array([4.0, 1.0, 1.0, 2.0]) / 8.0)
    mix = Mixture([Gaussian(-50.0, 1.0), Gaussian(50.0, 1.0)], [0.5, 0.5])
    fitted = _fit_once(mix, np.zeros(10) - 50.0, pseudo_count=2.0)
    np.testing.assert_allclose(fitted.weights, [12.0 / 14.0, 2.0 / 14.0], rtol=1e-9)
    hmm = HMM([Categorical([0.9, 0.1]), Categorical([0.1, 0.9])], [[0.5, 0.5], [0.5, 0.5]], [0.5, 0.5], 3.0)
    rows = [np.array([0, 0, 0, 0])]
    plain, smooth = _fit_once(hmm, rows), _fit_once(hmm, rows, pseudo_count=1.0)
    assert smooth.transitions.min() > plain.transitions.min() and smooth.initial.min() > plain.initial.min()


def test_optimize_takes_the_knobs_on_every_executor():
    x = np.concatenate([np.random.default_rng(2).normal(size=300), np.full(5, 9.0)])
    start = Mixture([Gaussian(0.0, 1.0), Gaussian(9.0, 1.0)], [0.5, 0.5])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        plain = optimize(x, start, max_iter=5, tol=0.0)
        local = optimize(x, start, max_iter=5, tol=0.0, reg_covar=0.01)
        mp = optimize(x, start, max_iter=5, tol=0.0, reg_covar=0.01, executor="multiprocessing")
    assert float(plain.model.children[1].var) < 1e-5 < 0.01 <= float(local.model.children[1].var)
    np.testing.assert_allclose(mp.log_likelihood, local.log_likelihood, rtol=1e-9)


@pytest.mark.parametrize("kw", [{"reg_covar": -1.0}, {"pseudo_count": float("nan")}, {"reg_covar": "big"}])
def test_bad_knobs_are_config_errors(kw):
    with pytest.raises(ConfigError, match=next(iter(kw))):
        optimize(np.zeros(3), Gaussian(0.0, 1.0), **kw)
