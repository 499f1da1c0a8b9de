"""A Mixture made by an M-step (``Mixture._fitted``, without the constructor's checks) is the
node its children and weights build: the same fields in the same order, the same pickle."""

from __future__ import annotations

import pickle

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from emgrid.models import Categorical, Gaussian, Mixture
from emgrid.models.engine import em_step


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 6), st.integers(0, 2**32 - 1), st.sampled_from([1.0, 1e-30, 1e8]))
def test_an_m_steps_mixture_equals_the_one_its_fields_build(k, seed, scale):
    rng = np.random.default_rng(seed)
    start = Mixture([Gaussian(float(rng.normal()), 1.0 + rng.random()) for _ in range(k)], rng.dirichlet(np.ones(k)))
    x = rng.normal(size=50) * 3
    fitted, _ = em_step(start, start.prepare(x), np.full(50, scale))
    built = Mixture(fitted.children, fitted.weights.copy())
    assert list(fitted.__dict__) == list(built.__dict__)
    assert np.array_equal(fitted.weights, built.weights) and np.array_equal(fitted._logw, built._logw)
    assert not fitted.weights.flags.writeable
    assert pickle.dumps(fitted) == pickle.dumps(built)


def test_a_mixture_of_records_and_categoricals_fits_alike():
    rng = np.random.default_rng(3)
    start = Mixture([Categorical(rng.dirichlet(np.ones(4))) for _ in range(3)], [0.2, 0.3, 0.5])
    x = rng.integers(0, 4, size=200)
    fitted, _ = em_step(start, start.prepare(x))
    built = Mixture(fitted.children, fitted.weights.copy())
    assert pickle.dumps(fitted) == pickle.dumps(built)
