"""A small model whose E-step runs in several row blocks, so a fault can strike mid-exchange."""

from __future__ import annotations

import numpy as np

from emgrid.models import Composite, Gaussian, Mixture, Poisson, Sequence

ROWS = 1200  # three blocks of the model below (block_rows = 436)


def blocky_model():
    """A sequence of a 4-Gaussian mixture (mean length 300) beside a Poisson: 436-row blocks."""
    return Composite([Sequence(Mixture([Gaussian(float(k), 1.0) for k in range(4)], np.full(4, 0.25)), 300.0),
                      Poisson(2.0)])


def blocky_data(model, n: int = ROWS, seed: int = 3):
    return model.sample(n, np.random.default_rng(seed))
