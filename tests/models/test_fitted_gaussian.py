"""A FullGaussian made by an M-step is the node its parameters give, and user-given
parameters are checked in full."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from emgrid.models import FullGaussian, Mixture
from emgrid.models.engine import em_step
from emgrid.models.errors import ModelError


def fitted_components(seed: int, d: int = 3):
    rng = np.random.default_rng(seed)
    x = np.concatenate([rng.normal(size=(60, d)), rng.normal(size=(40, d)) @ rng.normal(size=(d, d)) + 3.0])
    comps = [FullGaussian(rng.normal(size=d), np.eye(d)) for _ in range(2)]
    model, _ = em_step(Mixture(comps, [0.5, 0.5]), Mixture(comps, [0.5, 0.5]).prepare(x))
    return model.components, x


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_fitted_full_gaussian_equals_the_one_its_parameters_build(seed):
    for got in fitted_components(seed)[0]:
        rebuilt = FullGaussian(np.array(got.mean), np.array(got.cov))
        for name in ("mean", "cov", "_chol", "_prec_chol"):
            np.testing.assert_array_equal(getattr(got, name), getattr(rebuilt, name))
        assert got._const == rebuilt._const
        assert got.dim == rebuilt.dim and not got.is_template
        assert not got.mean.flags.writeable and not got.cov.flags.writeable
        assert (got.cov == got.cov.T).all()
        back = pickle.loads(pickle.dumps(got))
        np.testing.assert_array_equal(back._prec_chol, got._prec_chol)


def test_a_fitted_full_gaussian_scores_like_the_one_its_parameters_build():
    comps, x = fitted_components(3)
    for got in comps:
        rebuilt = FullGaussian(np.array(got.mean), np.array(got.cov))
        np.testing.assert_array_equal(got.log_density(x), rebuilt.log_density(x))


@pytest.mark.parametrize("mean, cov, match", [
    ([0.0, 0.0], [[1.0, 0.5], [0.0, 1.0]], "symmetric"),
    ([0.0, 0.0], [[1.0, 0.5 + 1e-6], [0.5, 1.0]], "symmetric"),
    ([0.0, 0.0], [[1.0, 2.0], [2.0, 1.0]], "positive definite"),
    ([0.0, np.nan], [[1.0, 0.0], [0.0, 1.0]], "finite"),
    ([0.0, 0.0], [[1.0, 0.0], [0.0, np.inf]], "finite"),
    ([0.0, 0.0, 0.0], [[1.0, 0.0], [0.0, 1.0]], "shape"),
], ids=["not-symmetric", "slightly-not-symmetric", "not-positive-definite", "nan-mean", "inf-cov", "shapes"])
def test_user_given_parameters_are_still_checked(mean, cov, match):
    with pytest.raises(ModelError, match=match):
        FullGaussian(mean, cov)
    with pytest.raises(ModelError, match=match):  # as arrays, as an M-step makes them
        FullGaussian(np.array(mean, dtype=float), np.array(cov, dtype=float))


@pytest.mark.parametrize("mean, cov, match", [
    ([0.0, 0.0], [[1.0, 2.0], [2.0, 1.0]], "positive definite"),
    ([0.0, np.nan], [[1.0, 0.0], [0.0, 1.0]], "finite"),
    ([0.0, 0.0], [[1.0, 0.0], [0.0, np.inf]], "finite"),
    ([0.0, 0.0, 0.0], [[1.0, 0.0], [0.0, 1.0]], "shape"),
], ids=["not-positive-definite", "nan-mean", "inf-cov", "shapes"])
def test_an_m_step_result_the_constructor_refuses_is_refused_alike(mean, cov, match):
    with pytest.raises(ModelError, match=match):
        FullGaussian._fitted(np.array(mean, dtype=float), np.array(cov, dtype=float))


def test_a_fitted_node_does_not_share_its_parameters_with_a_given_one():
    given = np.eye(2)
    node = FullGaussian(np.zeros(2), given)
    given[0, 0] = 5.0
    assert node.cov[0, 0] == 1.0
