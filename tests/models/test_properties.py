"""Properties every model tree keeps, over random trees from ``strategies.models()``."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
from hypothesis import given, note
from hypothesis import strategies as st

from emgrid import models
from emgrid.models import (HMM, Categorical, Composite, DiagGaussian, Exponential, Gaussian, Mixture, Node,
                    Poisson, Ragged, Sequence, n_rows, take_rows)
from emgrid.models.data import column_major
from emgrid.models.engine import e_step, em_step

from tests import strategies as S


def show(model: Node) -> None:
    """Puts the drawn model's spec in a failing example's report (its repr is terse)."""
    note(json.dumps(model.to_spec()))


def assert_stats_close(a, b, rtol=1e-8, atol=1e-9):
    assert set(a) == set(b), (sorted(a), sorted(b))
    for path in a:
        assert len(a[path]) == len(b[path]), path
        for i, (x, y) in enumerate(zip(a[path], b[path])):
            np.testing.assert_allclose(x, y, rtol=rtol, atol=atol, err_msg=f"node {path!r} entry {i}")


def total_ll(model: Node, data, w=None) -> float:
    ld = model.log_density(data)
    return float(ld.sum() if w is None else w @ ld)


# ---------------------------------------------------------------- statistics add
@given(md=S.models_with_data(min_rows=2), frac=st.floats(0.0, 1.0))
def test_statistics_of_two_row_ranges_add_up(md, frac):
    m, x = md
    show(m)
    n = n_rows(x)
    k = min(n - 1, max(1, int(frac * n)))
    whole = m.accumulate(x)
    parts = m.accumulate(take_rows(x, 0, k)) + m.accumulate(take_rows(x, k, n))
    assert_stats_close(parts, whole)


@given(md=S.models_with_data(min_rows=2), seed=S.seeds())
def test_weighted_statistics_add_up(md, seed):
    m, x = md
    show(m)
    n = n_rows(x)
    w = np.random.default_rng(seed).uniform(0.5, 2.0, n)
    k = n // 2
    parts = m.accumulate(take_rows(x, 0, k), w[:k]) + m.accumulate(take_rows(x, k, n), w[k:])
    assert_stats_close(parts, m.accumulate(x, w))


@given(md=S.models_with_data(), seed=S.seeds())
def test_doubling_every_weight_doubles_the_statistics(md, seed):
    m, x = md
    show(m)
    w = np.random.default_rng(seed).uniform(0.5, 2.0, n_rows(x))
    one, two = m.accumulate(x, w), m.accumulate(x, 2 * w)
    assert_stats_close(one + one, two)


# ---------------------------------------------------------------- engine block size
@given(md=S.models_with_data(min_rows=1), block=st.integers(1, 70), seed=S.seeds())
def test_e_step_does_not_depend_on_block_size(md, block, seed):
    m, x = md
    show(m)
    data = m.prepare(x)
    w = np.random.default_rng(seed).uniform(0.0, 2.0, n_rows(data))
    ref_stats, ref_ll = e_step(m, data, w, rows_per_block=10**6)
    stats, ll = e_step(m, data, w, rows_per_block=block)
    assert_stats_close(stats, ref_stats)
    assert ll == pytest.approx(ref_ll, rel=1e-9, abs=1e-9)
    assert ref_ll == pytest.approx(total_ll(m, x, w), rel=1e-9, abs=1e-9)


# ---------------------------------------------------------------- memory order of the rows
def row_major(data):
    if isinstance(data, tuple):
        return tuple(row_major(c) for c in data)
    if isinstance(data, Ragged):
        return Ragged.unchecked(row_major(data.values), data.offsets)
    return np.ascontiguousarray(data)


@given(md=S.models_with_data(min_rows=1), block=st.integers(1, 70), seed=S.seeds())
def test_no_bit_depends_on_the_rows_memory_order(md, block, seed):
    """Vectors stored column-major (as emgrid writes them) or row-major (as callers pass
    them) give the same statistics, log-likelihood and log densities to the last bit."""
    m, x = md
    show(m)
    data = m.prepare(x)
    w = np.random.default_rng(seed).uniform(0.0, 2.0, n_rows(data))
    runs = [e_step(m, layout(data), w, rows_per_block=block) for layout in (row_major, column_major)]
    assert pickle.dumps(runs[0]) == pickle.dumps(runs[1])
    assert np.array_equal(m.log_density(row_major(data)), m.log_density(column_major(data)))


# ---------------------------------------------------------------- spec round trip
@given(md=S.models_with_data())
def test_spec_round_trip_keeps_the_density(md):
    m, x = md
    spec = m.to_spec()
    again = Node.from_spec(json.loads(json.dumps(spec)))
    show(m)
    assert type(again) is type(m)
    assert again.to_spec() == spec
    assert again.data_type() == m.data_type()
    assert [p for p, _ in again.leaves()] == [p for p, _ in m.leaves()]
    np.testing.assert_allclose(again.log_density(x), m.log_density(x), rtol=1e-13, atol=1e-13)


def test_save_and_load_model(tmp_path):
    m = Composite([Mixture([Gaussian(0, 1), Gaussian(3, 2)], [0.4, 0.6]),
                   HMM([Poisson(1.0), Poisson(5.0)], [[0.9, 0.1], [0.2, 0.8]], [0.5, 0.5], 4.0)])
    models.save_model(m, tmp_path / "m.json")
    again = models.load_model(tmp_path / "m.json")
    x = m.sample(20, 0)
    np.testing.assert_array_equal(again.log_density(x), m.log_density(x))


# ---------------------------------------------------------------- EM
@given(md=S.models_with_data(min_rows=5))
def test_em_step_never_lowers_the_log_likelihood(md):
    m, x = md
    show(m)
    data = m.prepare(x)
    before = total_ll(m, x)
    new, ll = em_step(m, data)
    assert ll == pytest.approx(before, rel=1e-9, abs=1e-9)
    after = total_ll(new, x)
    assert after >= before - 1e-9 * max(1.0, abs(before)), (before, after)
    assert type(new) is type(m)
    assert new.data_type() == m.data_type()


def fit(model: Node, x, iters: int) -> Node:
    data = model.prepare(x)
    for _ in range(iters):
        model, _ = em_step(model, data)
    return model


def test_fit_recovers_a_two_component_gaussian_mixture():
    truth = Mixture([Gaussian(-4.0, 1.0), Gaussian(5.0, 0.5)], [0.3, 0.7])
    x = truth.sample(4000, 1)
    got = fit(Mixture([Gaussian(-1.0, 3.0), Gaussian(1.0, 3.0)], [0.5, 0.5]), x, 60)
    np.testing.assert_allclose(got.weights, [0.3, 0.7], atol=0.03)
    np.testing.assert_allclose([float(c.mean) for c in got.components], [-4.0, 5.0], atol=0.1)
    np.testing.assert_allclose([float(c.var) for c in got.components], [1.0, 0.5], rtol=0.1)


def test_fit_recovers_a_categorical_and_a_poisson():
    cat, poi = Categorical([0.1, 0.6, 0.3]), Poisson(7.5)
    xc, xp = cat.sample(5000, 2), poi.sample(5000, 3)
    np.testing.assert_allclose(fit(Categorical([1 / 3] * 3), xc, 1).probs, cat.probs, atol=0.02)
    assert float(fit(Poisson(1.0), xp, 1).rate) == pytest.approx(7.5, rel=0.02)


def test_fit_recovers_an_hmm_with_separated_gaussian_emissions():
    truth = HMM([Gaussian(-3.0, 0.5), Gaussian(3.0, 0.5)], [[0.9, 0.1], [0.2, 0.8]], [0.7, 0.3], 30.0)
    x = truth.sample(300, 4)
    got = fit(HMM([Gaussian(-1.0, 2.0), Gaussian(1.0, 2.0)], [[0.5, 0.5], [0.5, 0.5]], [0.5, 0.5], 5.0), x, 40)
    np.testing.assert_allclose(got.transitions, truth.transitions, atol=0.04)
    np.testing.assert_allclose(got.initial, truth.initial, atol=0.1)
    np.testing.assert_allclose([float(e.mean) for e in got.emissions], [-3.0, 3.0], atol=0.1)
    assert float(got.mean_length) == pytest.approx(float(np.mean(x.lengths)), rel=1e-9)


def test_fit_recovers_a_composite():
    truth = Composite([DiagGaussian([1.0, -2.0], [0.5, 2.0]), Exponential(0.25), Categorical([0.5, 0.25, 0.25]),
                       Sequence(Poisson(3.0), 4.0)])
    x = truth.sample(5000, 5)
    start = Composite([DiagGaussian([0.0, 0.0], [1.0, 1.0]), Exponential(1.0), Categorical([1 / 3] * 3),
                       Sequence(Poisson(1.0), 1.0)])
    got = fit(start, x, 1)
    dg, ex, ca, sq = got.children
    np.testing.assert_allclose(dg.mean, [1.0, -2.0], atol=0.06)
    np.testing.assert_allclose(dg.var, [0.5, 2.0], rtol=0.06)
    assert float(ex.rate) == pytest.approx(0.25, rel=0.05)
    np.testing.assert_allclose(ca.probs, [0.5, 0.25, 0.25], atol=0.02)
    assert float(sq.child.rate) == pytest.approx(3.0, rel=0.03)
    assert float(sq.mean_length) == pytest.approx(4.0, rel=0.03)


# ---------------------------------------------------------------- tree structure
def preorder_leaves(node: Node, path: str = "") -> list[tuple[str, Node]]:
    if not node.children:
        return [(path, node)]
    out = []
    for i, c in enumerate(node.children):
        out += preorder_leaves(c, f"{path}.{i}" if path else str(i))
    return out


@given(m=S.models())
def test_leaf_paths_are_preorder_and_resolve_with_node_at(m):
    show(m)
    got = m.leaves()
    want = preorder_leaves(m)
    assert [p for p, _ in got] == [p for p, _ in want]
    for (path, leaf), (_, expected) in zip(got, want):
        assert leaf is expected
        assert m.node_at(path) is leaf
        assert leaf.is_leaf and leaf.children == ()
    assert m.node_at("") is m
    assert len(got) <= S.MAX_LEAVES


@given(m=S.models())
def test_node_at_rejects_paths_that_do_not_exist(m):
    bad = f"{len(m.children)}" if m.children else "0"
    with pytest.raises(models.ModelError, match="does not exist"):
        m.node_at(bad)


@given(md=S.models_with_data(min_rows=0, max_rows=30))
def test_sample_returns_n_rows_of_the_models_data(md):
    m, x = md
    show(m)
    n = n_rows(x)
    if n == 0:
        return
    ld = m.log_density(x)
    assert ld.shape == (n,)
    assert np.all(np.isfinite(ld))
    if isinstance(m, (Sequence, HMM)):
        assert isinstance(x, Ragged)
    if isinstance(m, Composite):
        assert isinstance(x, tuple) and len(x) == len(m.children)
