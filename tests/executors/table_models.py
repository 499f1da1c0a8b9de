"""The record model the table tests fit (shared with ``mpi_table_script.py``)."""

from __future__ import annotations

from emgrid.models import Categorical, Composite, DiagGaussian, Gaussian, Mixture

COLORS = ["red", "green", "blue"]
N = 600


def record(mean, probs):
    return Composite({"x": Gaussian(mean, 1.0), "color": Categorical(probs, values=COLORS),
                      "pos": DiagGaussian([mean, 0.0], [1.0, 1.0])}, columns={"pos": ["px", "py"]})


def table_model() -> Mixture:
    return Mixture([record(-1.0, [0.6, 0.3, 0.1]), record(2.0, [0.1, 0.3, 0.6])], [0.4, 0.6])
