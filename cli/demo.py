"""The built-in heterogeneous example ``emgrid demo`` runs end to end."""

from __future__ import annotations

import numpy as np

from emgrid.models import Categorical, Composite, Exponential, FullGaussian, Mixture, Poisson, Sequence


def _record(probs, mean, cov, count_rate, wait_rate):
    return Composite([
        Categorical(probs),
        FullGaussian(mean, cov),
        Sequence(Poisson(count_rate), mean_length=6.0),
        Exponential(wait_rate),
    ])


def demo_truth() -> Mixture:
    """Two kinds of customer record: a category, a 3-d measurement, a run of counts, a wait."""
    cov_a = np.array([[1.0, 0.5, 0.0], [0.5, 1.0, 0.3], [0.0, 0.3, 1.0]])
    cov_b = np.array([[0.5, 0.0, 0.0], [0.0, 2.0, -0.4], [0.0, -0.4, 1.0]])
    return Mixture([
        _record([0.7, 0.2, 0.1], [0.0, 0.0, 0.0], cov_a, 2.0, 1.0),
        _record([0.1, 0.3, 0.6], [4.0, 3.0, 5.0], cov_b, 8.0, 5.0),
    ], [0.45, 0.55])


def demo_start() -> Mixture:
    """A deliberately rough starting point with the same structure."""
    eye = np.eye(3)
    return Mixture([
        _record([1 / 3] * 3, [1.0, 1.0, 1.0], 2 * eye, 4.0, 2.0),
        _record([1 / 3] * 3, [3.0, 2.0, 3.0], 2 * eye, 5.0, 3.0),
    ], [0.5, 0.5])
