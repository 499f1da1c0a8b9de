"""Small fixed models shared by the executor tests and the scripts they start."""

from __future__ import annotations

import numpy as np

from emgrid.models import HMM, Categorical, Composite, DiagGaussian, Gaussian, Mixture, Poisson, Sequence


def nested_model():
    """Every internal family, nested: a composite of a mixture, a sequence and an HMM."""
    return Composite([
        Mixture([Gaussian(0.0, 1.0), Gaussian(3.0, 2.0), Gaussian(-2.0, 0.5)],
                [0.3, 0.3, 0.4]),
        Sequence(Mixture([Categorical([0.2, 0.3, 0.5]), Categorical([0.6, 0.2, 0.2])], [0.5, 0.5]), 5.0),
        HMM([DiagGaussian([0.0, 0.0], [1.0, 1.0]), DiagGaussian([2.0, 2.0], [1.0, 2.0])],
            [[0.9, 0.1], [0.2, 0.8]], [0.5, 0.5], 4.0),
        Poisson(3.0),
    ])


def nested_data(model, n: int = 600, seed: int = 7):
    """Rows drawn from a perturbed copy of ``model``, so EM has something to fit."""
    truth = Composite([
        Mixture([Gaussian(0.5, 1.0), Gaussian(4.0, 1.0), Gaussian(-1.0, 0.3)], [0.5, 0.2, 0.3]),
        Sequence(Mixture([Categorical([0.1, 0.1, 0.8]), Categorical([0.7, 0.2, 0.1])], [0.3, 0.7]), 6.0),
        HMM([DiagGaussian([0.0, 1.0], [1.0, 1.0]), DiagGaussian([3.0, 2.0], [1.0, 0.5])],
            [[0.8, 0.2], [0.3, 0.7]], [0.4, 0.6], 5.0),
        Poisson(2.0),
    ])
    return truth.sample(n, np.random.default_rng(seed))
