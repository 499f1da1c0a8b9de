"""A heterogeneous template and data from its truth, shared by the initialization tests and
the MPI script they start."""

from __future__ import annotations

import numpy as np

from emgrid.models import Categorical, Composite, DiagGaussian, Mixture, Poisson, Sequence, from_spec

N = 2500  # more rows than the initialization sample (2000)


def truth():
    return Composite([
        Mixture([DiagGaussian([0.0, 0.0], [1.0, 1.0]), DiagGaussian([6.0, 0.0], [1.0, 0.5]),
                 DiagGaussian([0.0, 6.0], [0.5, 1.0])], [0.3, 0.3, 0.4]),
        Sequence(Mixture([Categorical([0.7, 0.2, 0.1]), Categorical([0.1, 0.1, 0.8])], [0.5, 0.5]), 4.0),
        Poisson(3.0),
    ])


def template():
    return from_spec({"family": "Composite", "children": [
        {"family": "Mixture", "k": 3, "component": {"family": "DiagGaussian", "dim": 2}},
        {"family": "Sequence", "child": {"family": "Mixture", "k": 2, "component": {"family": "Categorical"}}},
        {"family": "Poisson"},
    ]})


def template_data():
    t = truth()
    return t.prepare(t.sample(N, np.random.default_rng(5)))
