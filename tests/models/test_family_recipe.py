"""The README's recipe for adding a family, followed: two small families defined here, in
this module (which is all the recipe needs besides the line that imports it), and every
part of the system taking them up with no other change.

- ``Bernoulli(p)``: an integer in {0, 1}; its counts take ``pseudo_count``, a probability
  at the floor is its warning.
- ``Gamma(shape, rate)``: a float > 0; its M-step needs two distinct rows (one gives an
  unbounded shape), which template initialization honours through its ``rows_needed``.

Defining a class with ``family`` set registers it (``emgrid.models.FAMILIES``); a model
holding one pickles the class by reference, so spawned workers import this module
(``tests.models.test_family_recipe``, as ``tests`` is a package on their path) and
register the families there too. The test strategies draw them only where asked
(``families=[...]``), so the rest of the suite draws what it always has.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import optimize as sopt
from scipy import special, stats

import emgrid
from emgrid.executors import optimize
from emgrid.models import FAMILIES, Composite, Gaussian, Leaf, Mixture, Poisson, fit_warnings, from_spec
from emgrid.models import base as base_module
from emgrid.models import init as init_module
from emgrid.models.columns import float_column, int_column
from emgrid.models.cost import NodeCost, stat_bytes
from emgrid.models.errors import ConvergenceWarning, DataError, ModelError
from emgrid.models.floors import MIN_WEIGHT, PROB_FLOOR
from emgrid.models.regularize import Regularization, regularize
from emgrid.models.schema import POSITIVE, Param
from emgrid.models.support import Interval
from emgrid.models.units import MATMUL_FLOPS, SLOW_FLOPS
from emgrid.planner import Resources, balance_plan, validate_plan

from tests import strategies as S
from tests.executors.plans import assert_same_trace, grid_plan
from tests.models.test_oracles import check_estimate, check_log_density

#: A Gamma's largest shape: rows of one value have no spread, and their MLE no finite shape.
SHAPE_CAP = 1e6


# ---------------------------------------------------------------- the families
class Bernoulli(Leaf):
    """``P(x = 1) = p`` for ``x`` in {0, 1}."""

    family = "Bernoulli"
    schema = (Param("p", 0),)
    support = Interval(0, 1)

    def __init__(self, p: float | None = None):
        self._init_fields(p=p)
        if self.p is not None and not 0.0 <= float(self.p) <= 1.0:
            raise ModelError(f"Bernoulli.p must be within [0, 1], got {float(self.p)}")

    def data_type(self):
        return "int"

    def _prepare(self, data, where):
        x = int_column(data, where, self.family)
        if x.size and (x.min() < 0 or x.max() > 1):
            raise DataError(f"{where}: Bernoulli data must be 0 or 1")
        return x

    def _log_density(self, x):
        assert x.size == 0 or (x.min() >= 0 and x.max() <= 1), "a row outside the support reached the kernel"
        with np.errstate(divide="ignore"):
            return np.where(x == 1, np.log(self.p), np.log1p(-self.p))

    def _accumulate(self, x, w):
        assert x.size == 0 or (x.min() >= 0 and x.max() <= 1), "a row outside the support reached the kernel"
        return (float(w.sum()), float(w @ x))

    def _estimate(self, own, children):
        sw, ones = own
        if sw < MIN_WEIGHT:
            return self
        return Bernoulli(min(max(ones / sw, PROB_FLOOR), 1.0 - PROB_FLOOR))

    def _regularize(self, own, reg):
        """``pseudo_count`` more of each outcome."""
        if reg.pseudo_count > 0 and own[0] >= MIN_WEIGHT:
            return (own[0] + 2 * reg.pseudo_count, own[1] + reg.pseudo_count)
        return own

    def _fit_warnings(self, at, rows):
        if self.p is not None and min(float(self.p), 1.0 - float(self.p)) <= 2 * PROB_FLOOR:
            return [f"{at}: p = {float(self.p):.3g} is at the floor: its rows all hold one value"]
        return []

    def _sample(self, n, rng):
        return (rng.random(n) < float(self.p)).astype(np.int64)

    def cost(self):
        return NodeCost(flops_per_row=6 + 2 * MATMUL_FLOPS, param_bytes=8, stat_bytes=stat_bytes(scalars=2),
                        data_bytes_per_row=8.0, coupling_bytes_per_row=0.0, work_bytes_per_row=8.0,
                        scratch_bytes_per_row=8.0)

    @classmethod
    def strategy(cls, st, like=None):
        return st.builds(Bernoulli, st.floats(0.05, 0.95))

    def oracle_log_density(self, x):
        return stats.bernoulli.logpmf(x, float(self.p))

    def oracle_estimate(self, x, w):
        return {"p": np.sum(w * x) / np.sum(w)}


def gamma_shape(s: float) -> float:
    """The shape ``k`` solving ``log k - digamma(k) = s`` (``s`` = log of the mean minus the
    mean log), by Newton's method from Minka's start; ``SHAPE_CAP`` for ``s <= 0``."""
    if not s > 0:
        return SHAPE_CAP
    k = (3.0 - s + math.sqrt((s - 3.0) ** 2 + 24.0 * s)) / (12.0 * s)
    for _ in range(100):
        step = (math.log(k) - special.digamma(k) - s) / (1.0 / k - special.polygamma(1, k))
        k_next = k - step if k - step > 0 else k / 2
        if abs(k_next - k) <= 1e-15 * k:
            return min(k_next, SHAPE_CAP)
        k = k_next
    return min(k, SHAPE_CAP)


class Gamma(Leaf):
    """``x**(shape - 1) exp(-rate x) rate**shape / Gamma(shape)`` for ``x > 0``."""

    family = "Gamma"
    schema = (Param("shape", 0, POSITIVE), Param("rate", 0, POSITIVE))
    support = Interval(0.0, open_low=True)

    def __init__(self, shape: float | None = None, rate: float | None = None):
        self._init_fields(shape=shape, rate=rate)

    def data_type(self):
        return "float"

    def _prepare(self, data, where):
        x = float_column(data, where, self.family)
        if x.size and x.min() <= 0:
            raise DataError(f"{where}: Gamma data must be > 0, got {float(x.min())}")
        return x

    def _log_density(self, x):
        assert x.size == 0 or x.min() > 0, "a row outside the support reached the kernel"
        k, r = float(self.shape), float(self.rate)
        return (k - 1.0) * np.log(x) - r * x + (k * math.log(r) - math.lgamma(k))

    def _accumulate(self, x, w):
        assert x.size == 0 or x.min() > 0, "a row outside the support reached the kernel"
        return (float(w.sum()), float(w @ x), float(w @ np.log(x)))

    def _estimate(self, own, children):
        sw, sx, slog = own
        if sw < MIN_WEIGHT:
            return self
        mean = sx / sw
        k = gamma_shape(math.log(mean) - slog / sw)
        return Gamma(k, k / mean)

    def rows_needed(self):
        return 2

    def _fit_warnings(self, at, rows):
        if self.shape is not None and float(self.shape) >= SHAPE_CAP:
            return [f"{at}: the shape is at its cap ({SHAPE_CAP:g}): its rows hold one distinct value"]
        return []

    def _sample(self, n, rng):
        return rng.gamma(float(self.shape), 1.0 / float(self.rate), size=n)

    def cost(self):
        return NodeCost(flops_per_row=8 + 2 * SLOW_FLOPS + 3 * MATMUL_FLOPS, param_bytes=16,
                        stat_bytes=stat_bytes(scalars=3), data_bytes_per_row=8.0, coupling_bytes_per_row=0.0,
                        work_bytes_per_row=8.0, scratch_bytes_per_row=16.0)

    @classmethod
    def strategy(cls, st, like=None):
        return st.builds(Gamma, st.floats(0.5, 5.0), st.floats(0.2, 3.0))

    def oracle_log_density(self, x):
        x = np.asarray(x, dtype=np.float64)
        with np.errstate(divide="ignore"):
            ld = stats.gamma.logpdf(np.where(x > 0, x, 1.0), float(self.shape), scale=1.0 / float(self.rate))
        return np.where(x > 0, ld, -np.inf)

    def oracle_estimate(self, x, w):
        mean = np.sum(w * x) / np.sum(w)
        s = np.log(mean) - np.sum(w * np.log(x)) / np.sum(w)
        k = sopt.brentq(lambda k: np.log(k) - special.digamma(k) - s, 1e-8, 1e8, xtol=1e-300, rtol=1e-15)
        return {"shape": k, "rate": k / mean}


NEW = [Bernoulli, Gamma]


def counts_and_times(n: int, seed: int):
    """A record of Bernoulli flags and Gamma waiting times from two groups."""
    model = Composite([Mixture([Gamma(2.0, 2.0), Gamma(9.0, 1.0)], [0.4, 0.6]),
                       Mixture([Bernoulli(0.2), Bernoulli(0.85)], [0.5, 0.5])])
    return model, model.sample(n, np.random.default_rng(seed))


# ---------------------------------------------------------------- registered once
def test_defining_the_class_registers_it_for_specs_and_the_facade():
    for cls in NEW:
        assert FAMILIES[cls.family] is cls
    for name, cls in FAMILIES.items():  # every registered family, from the facade
        space: dict = {}
        exec(f"from emgrid import {name}", space)
        assert space[name] is cls and getattr(emgrid, name) is cls
    assert {"Bernoulli", "Gamma"} <= set(emgrid.__all__) and "Gamma" in dir(emgrid)


def test_the_package_families_import_from_a_fresh_facade():
    """``import emgrid`` loads no model module; the first family asked for loads the registry."""
    code = ("import sys, emgrid; before = 'emgrid.models' in sys.modules; from emgrid import Gaussian; "
            "from emgrid.models import FAMILIES; "
            "print(before, all(getattr(emgrid, n) is c for n, c in FAMILIES.items()), 'Gaussian' in FAMILIES)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.split() == ["False", "True", "True"], done.stderr


def test_it_samples_and_prepares_its_own_rows():
    model, (times, flags) = counts_and_times(200, 0)
    assert flags.dtype == np.int64 and set(np.unique(flags)) <= {0, 1}
    assert times.dtype == np.float64 and times.min() > 0
    assert np.isfinite(model.log_density((times, flags))).all()
    with pytest.raises(DataError, match="Bernoulli data must be 0 or 1"):
        Bernoulli(0.5).log_density(np.array([0, 2]))


def test_its_spec_round_trips():
    model, _ = counts_and_times(10, 0)
    text = json.dumps(model.to_spec())
    assert json.dumps(from_spec(json.loads(text)).to_spec()) == text
    spec = {"family": "Mixture", "k": 2, "component": {"family": "Gamma"}}
    template = from_spec(spec)
    assert template.is_template and template.to_spec() == spec
    assert model.n_parameters() == (1 + 2 * 2) + (1 + 2 * 1)


@given(m=S.models(families=NEW))
def test_every_tree_of_the_new_families_survives_its_spec(m):
    text = json.dumps(m.to_spec())
    assert json.dumps(from_spec(json.loads(text)).to_spec()) == text


@given(leaf=S.leaves(NEW), seed=S.seeds(), n=st.integers(20, 200))
def test_its_estimate_is_its_oracles_weighted_mle(leaf, seed, n):
    check_estimate(leaf, seed, n)


@given(leaf=S.leaves(NEW), seed=S.seeds(), n=st.integers(1, 50))
def test_its_log_density_is_its_oracles(leaf, seed, n):
    check_log_density(leaf, seed, n)


def test_the_strategies_draw_a_family_from_its_hook_and_name_one_without(monkeypatch):
    drawn = S.package_families()
    assert Gamma not in drawn and Bernoulli not in drawn
    assert {"Gaussian", "DiagGaussian", "FullGaussian", "Categorical", "Poisson", "Exponential"} <= {
        c.family for c in drawn}
    monkeypatch.setattr(base_module, "FAMILIES", {})  # keeps the class below out of the registry

    class Silent(Leaf):
        family = "Silent"

    with pytest.raises(TypeError, match="'Silent'.*defines no strategy"):
        S.leaf_strategy(Silent)


@given(again=S.like(Composite([Mixture([Gamma(1.0, 1.0), Gamma(2.0, 1.0)], [0.5, 0.5]), Bernoulli(0.5)])))
def test_like_draws_its_structure_again(again):
    assert [type(c) for _, c in again.leaves()] == [Gamma, Gamma, Bernoulli]


# ---------------------------------------------------------------- the support rule
def test_rows_outside_its_support_get_no_density_and_no_weight():
    # a zero-inflated count: the Bernoulli sees counts above 1 from its sibling; a Gamma
    # beside a Gaussian sees values <= 0 (its kernels assert they never do)
    x = np.array([0, 1, 0, 3, 7, 1, 0, 2])
    m = Mixture([Bernoulli(0.3), Poisson(2.0)], [0.4, 0.6])
    want = np.log(0.4 * np.where(x <= 1, np.where(x == 1, 0.3, 0.7), 0.0) + 0.6 * stats.poisson.pmf(x, 2.0))
    np.testing.assert_allclose(m.log_density(x), want, rtol=1e-12)
    stats_ = m.accumulate(x)
    resp = m.predict_proba(x)[:, 0]
    assert stats_["0"][0] == pytest.approx(resp[x <= 1].sum(), rel=1e-12)
    y = np.array([-2.0, 0.0, 0.5, 3.0, -0.1])
    g = Mixture([Gaussian(0.0, 2.0), Gamma(2.0, 1.0), Gamma(3.0, 2.0)], [0.5, 0.25, 0.25])
    new = g.estimate(g.accumulate(y))
    assert np.isfinite(new.log_density(y)).all() and new.log_density(y).sum() >= g.log_density(y).sum() - 1e-9


# ---------------------------------------------------------------- EM, the planner, the executors
def test_em_increases_its_log_likelihood():
    model, data = counts_and_times(400, 1)
    start = Composite([Mixture([Gamma(1.0, 1.0), Gamma(5.0, 1.0)], [0.5, 0.5]),
                       Mixture([Bernoulli(0.4), Bernoulli(0.6)], [0.5, 0.5])])
    res = optimize(data, start, max_iter=25, tol=0.0)
    ll = np.asarray(res.log_likelihood)
    assert np.all(np.diff(ll) >= -1e-9 * np.abs(ll[1:]))
    assert ll[-1] > ll[0]


def test_the_planner_plans_it():
    model, _ = counts_and_times(10, 0)
    res = Resources.uniform(2)
    plan = balance_plan(model, res, n_data=5000)
    validate_plan(plan, model, res, 5000)
    split = balance_plan(model, res, n_data=5000, grid=(1, 2))
    validate_plan(split, model, res, 5000)
    assert split.model_parallel == 2 and sorted(p for c in split.model_cuts for p in c.leaves) == \
        sorted(p for p, _ in model.leaves())


def test_a_multiprocessing_1x2_fit_gives_the_local_trace():
    model, data = counts_and_times(300, 2)
    plan = grid_plan(model, 300, 1, 2)
    local = optimize(data, model, plan=plan, max_iter=4, tol=0.0)
    spawned = optimize(data, model, plan=plan, executor="multiprocessing", max_iter=4, tol=0.0)
    assert_same_trace(spawned.log_likelihood, local.log_likelihood)
    assert json.dumps(spawned.model.to_spec()) == json.dumps(local.model.to_spec())


# ---------------------------------------------------------------- regularization, warnings, initialization
def test_pseudo_count_reaches_its_counts():
    x = np.ones(50, dtype=np.int64)
    b = Bernoulli(0.5)
    stats_ = b.accumulate(x)
    assert regularize(b, stats_, Regularization(pseudo_count=1.0))[""] == (52.0, 51.0)
    fit = optimize(x, b, max_iter=3, tol=0.0, pseudo_count=1.0)
    assert float(fit.model.p) == pytest.approx(51.0 / 52.0, rel=1e-12)


def test_its_warnings_are_reported():
    x = np.ones(30, dtype=np.int64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        res = optimize(x, Bernoulli(0.5), max_iter=3, tol=0.0)
    lines = [str(w.message) for w in caught if issubclass(w.category, ConvergenceWarning)]
    assert any("Bernoulli at path '<root>': p = 1 is at the floor" in line for line in lines), lines
    assert fit_warnings(Mixture([Gamma(SHAPE_CAP, 1.0), Gamma(1.0, 1.0)], [0.5, 0.5])) == [
        "Gamma at path '0': the shape is at its cap (1e+06): its rows hold one distinct value"]
    assert res.model.p > 0.99


def test_template_initialization_redraws_a_partition_until_each_part_has_the_rows_it_needs(monkeypatch):
    template = Mixture([Gamma(), Gamma()])
    assert template.rows_needed() == 2 and Composite([Gamma(), Bernoulli()]).rows_needed() == 2
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.gamma(2.0, 1.0, 150), rng.gamma(20.0, 1.0, 150)])
    data = template.prepare(x)
    real, calls = init_module.kmeans_labels, []

    def first_with_a_lone_row(X, w, k, rng):
        calls.append(1)
        if len(calls) == 1:  # one part of a single row: too few for a Gamma's first M-step
            labels = np.ones(X.shape[0], dtype=np.int64)
            labels[0] = 0
            return labels
        return real(X, w, k, rng)

    def start():
        calls.clear()
        return init_module.initialize(init_module.complete_shapes(template, data), data, len(x), seed=0)

    monkeypatch.setattr(init_module, "kmeans_labels", first_with_a_lone_row)
    first = start()
    assert len(calls) == 2  # drawn again: the lone row's part needed 2
    assert all(0 < float(c.shape) < SHAPE_CAP for c in first.children)
    monkeypatch.setattr(Gamma, "rows_needed", lambda self: 1)
    start()
    assert len(calls) == 1  # a family needing one row keeps the first draw
    monkeypatch.undo()
    res = optimize(x, template, max_iter=20)
    assert sorted(float(c.shape) for c in res.model.children)[0] == pytest.approx(2.0, rel=0.5)
