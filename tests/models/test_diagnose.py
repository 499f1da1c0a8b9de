"""The variance-floor warning names the cause the data shows: too few distinct values, or
features on very different scales."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from emgrid.executors import optimize
from emgrid.models import (Composite, DiagGaussian, FullGaussian, Gaussian, Mixture, Poisson, Sequence,
                           fit_warnings)
from emgrid.models.errors import ConvergenceWarning
from emgrid.models.floors import VAR_FLOOR

SCALES = "very different scales"
FEW = "too few distinct values"


def _fit(x, model):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        res = optimize(x, model, max_iter=50)
    return res.model, [str(w.message) for w in caught if issubclass(w.category, ConvergenceWarning)]


def _tiny_feature(n=500):
    """Two clusters in feature 0; feature 1 in tiny units (standard deviation 3e-4)."""
    rng = np.random.default_rng(0)
    x = np.column_stack([rng.normal(0, 1, n), rng.normal(0, 3e-4, n)])
    x[: n // 2, 0] += 5.0
    return x


@pytest.mark.parametrize("family", ["diag", "full"])
def test_a_feature_on_a_tiny_scale_is_named_as_a_scale_problem(family):
    x = _tiny_feature()
    comp = (lambda m: DiagGaussian(m, [1.0, 1.0])) if family == "diag" else (lambda m: FullGaussian(m, np.eye(2)))
    model, warned = _fit(x, Mixture([comp([0.0, 0.0]), comp([5.0, 0.0])], [0.5, 0.5]))
    lines = fit_warnings(model, data=x)
    assert len(lines) == 2 and all("at the floor" in t and SCALES in t and "standardize" in t and "reg_covar" in t
                                   and FEW not in t for t in lines), lines
    if family == "diag":
        assert all("in dimension 1:" in t for t in lines)
    # optimize has no data to look at: its warning names both causes
    assert warned and all(SCALES in t and FEW in t for t in warned)
    # the advice works: standardized, the same fit keeps every variance off the floor
    z = (x - x.mean(axis=0)) / x.std(axis=0)
    again, warned = _fit(z, Mixture([comp([0.0, 0.0]), comp([1.0, 0.0])], [0.5, 0.5]))
    assert fit_warnings(again, data=z) == [] and warned == []


def test_a_component_on_repeated_values_is_named_as_too_few_distinct_values():
    # the column has hundreds of distinct values, but the component sits on 20 copies of one
    rng = np.random.default_rng(1)
    y = np.concatenate([rng.normal(0, 1, 300), np.full(20, 7.0)])
    model, _ = _fit(y, Mixture([Gaussian(0.0, 1.0), Gaussian(7.0, 1.0)], [0.9, 0.1]))
    assert float(model.children[1].var) <= VAR_FLOOR * 1.01
    (line,) = fit_warnings(model, data=y)
    assert line.startswith("Gaussian at path '1': a variance is at the floor") and f"{FEW} (1 near its mean)" in line
    assert SCALES not in line


def test_a_constant_feature_in_a_component_is_too_few_distinct_values_in_diag_and_full():
    rng = np.random.default_rng(2)
    x = np.column_stack([rng.normal(0, 1, 400), np.repeat([0.0, 1.0], 200)])  # a 0/1 indicator
    x[200:, 0] += 6.0
    for comp in (lambda m: DiagGaussian(m, [1.0, VAR_FLOOR]), lambda m: FullGaussian(m, np.diag([1.0, VAR_FLOOR]))):
        model = Mixture([comp([float(x[:200, 0].mean()), 0.0]), comp([float(x[200:, 0].mean()), 1.0])], [0.5, 0.5])
        lines = fit_warnings(model, data=x)
        assert len(lines) == 2 and all(FEW in t and SCALES not in t for t in lines), lines


def test_the_rows_under_a_sequence_and_a_shard_part_are_read_at_their_path():
    rng = np.random.default_rng(3)
    rows = [np.concatenate([rng.normal(0, 1, 30), np.full(3, 9.0)]) for _ in range(5)]
    counts = [rng.poisson(2.0, 4) for _ in range(5)]
    seq = Sequence(Mixture([Gaussian(0.0, 1.0), Gaussian(9.0, VAR_FLOOR)], [0.9, 0.1]), 33.0)
    model = Composite([Poisson(2.0), seq])
    data = (np.array([int(c[0]) for c in counts]), rows)
    (line,) = fit_warnings(model, data=data)
    assert line.startswith("Gaussian at path '1.0.1'") and FEW in line
    # a shard part: the subtree at '1' with its own rows gives the same line
    assert fit_warnings(seq, "1", data=rows) == [line]
    tiny = [r * 1e-4 for r in rows]
    spread = Sequence(Gaussian(float(np.concatenate(tiny).mean()), VAR_FLOOR), 33.0)
    (line,) = fit_warnings(spread, data=tiny)
    assert SCALES in line
