"""How starts are made: distinct starts, k-means on standardized columns that shuns outliers,
an HMM partitioned by the contexts of its positions, and a Poisson HMM from drawn rates."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from emgrid.executors import optimize
from emgrid.models import HMM, Categorical, Gaussian, Mixture, Poisson, complete_shapes, from_spec, initialize
from emgrid.models.errors import ConvergenceWarning
from emgrid.models.context import MAX_VALUES, context_labels
from emgrid.models.kmeans import kmeans_labels
from emgrid.models.starts import distinct_starts, per_start, start_key


def test_mixtures_that_differ_only_in_the_order_of_their_components_are_one_start():
    a = Mixture([Gaussian(0.0, 1.0), Gaussian(3.0, 2.0)], [0.3, 0.7])
    b = Mixture([Gaussian(3.0, 2.0), Gaussian(0.0, 1.0)], [0.7, 0.3])
    c = Mixture([Gaussian(3.0, 2.0), Gaussian(0.0, 1.0)], [0.3, 0.7])  # the weights swapped between components
    assert start_key(a) == start_key(b) != start_key(c)
    kept, index = distinct_starts([a, c, b, a])
    assert len(kept) == 2 and kept[0] is a and kept[1] is c and index == [0, 1, 0, 0]


def test_an_hmm_relabelled_is_another_start():
    e = [Categorical([0.9, 0.1]), Categorical([0.2, 0.8])]
    a = HMM(e, [[0.9, 0.1], [0.3, 0.7]], [0.5, 0.5])
    b = HMM(e[::-1], [[0.7, 0.3], [0.1, 0.9]], [0.5, 0.5])  # the same chain, its states renamed
    assert start_key(a) != start_key(b)
    assert start_key(a) == start_key(HMM(list(e), [[0.9, 0.1], [0.3, 0.7]], [0.5, 0.5]))


def test_what_the_kept_starts_report_is_spread_over_every_start():
    values, best = per_start([-3.0, -1.0], 1, [0, 1, 0, 1])
    assert values == [-3.0, -1.0, -3.0, -1.0] and best == 1
    assert per_start([-3.0], None, [0, 0]) == ([-3.0, -3.0], None)


def test_kmeans_starts_do_not_depend_on_the_unit_of_a_column():
    rng = np.random.default_rng(0)
    n = 400
    side = rng.integers(0, 2, size=n)
    # two clusters along a column in small units; pure noise in large units beside it
    x = np.column_stack([np.where(side == 1, 1.0, -1.0) + 0.1 * rng.normal(size=n), 1000.0 * rng.normal(size=n)])
    template = complete_shapes(from_spec({"family": "Mixture", "k": 2,
                                          "component": {"family": "FullGaussian", "dim": 2}}), x)
    for seed in range(3):
        start = initialize(template, x, n, seed=seed)
        np.testing.assert_allclose(sorted(c.mean[0] for c in start.children), [-1.0, 1.0], atol=0.05)


def test_a_far_outlier_is_not_a_cluster_of_its_own():
    rng = np.random.default_rng(1)
    centres = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    X = np.vstack([c + rng.normal(size=(100, 2)) for c in centres] + [np.array([[30.0, 30.0]])])
    for seed in range(20):
        labels = kmeans_labels(X, np.ones(len(X)), 3, np.random.default_rng(seed))
        assert np.bincount(labels, minlength=3).min() >= 90


def _runs_then_alternation(n: int = 40):
    """Each sequence: twelve 0s, then 1 0 1 0 ... (twelve positions): the value 0 in two contexts."""
    row = np.array([0] * 12 + [1, 0] * 6)
    values = np.tile(row, n)
    offsets = np.arange(n + 1, dtype=np.int64) * row.size
    return values, offsets


def test_a_value_seen_in_two_contexts_falls_in_two_parts():
    values, offsets = _runs_then_alternation()
    labels = context_labels(values, offsets, np.ones(values.size), 3, np.random.default_rng(0))
    within = np.arange(values.size) % 24
    in_runs = labels[(within >= 3) & (within <= 8)]  # 0s with 0s all around
    alternating = labels[(within >= 15) & (within <= 20) & (values == 0)]  # 0s between 1s
    assert np.unique(in_runs).size == 1 and np.unique(alternating).size == 1 and in_runs[0] != alternating[0]


def test_no_context_partition_for_floats_or_many_distinct_values():
    offsets = np.array([0, 50, 100])
    rng = np.random.default_rng(0)
    assert context_labels(rng.normal(size=100), offsets, np.ones(100), 2, rng) is None
    assert context_labels(np.arange(100) % (MAX_VALUES + 1), offsets, np.ones(100), 2, rng) is None


def test_an_hmm_starts_with_transitions_that_follow_the_order_of_its_parts():
    values, offsets = _runs_then_alternation()
    from emgrid.models import Ragged

    data = Ragged(values, offsets)
    template = complete_shapes(from_spec({"family": "HMM", "n_states": 3, "emission": {"family": "Categorical"}}),
                               data)
    for seed in range(3):
        start = initialize(template, data, len(offsets) - 1, seed=seed)
        # the parts: 0s in runs, 0s between 1s, 1s; in the data each has a near-certain successor
        assert start.transitions.max(axis=1).min() > 0.8
        assert start.initial.max() > 0.9  # every sequence begins in the runs
        assert np.array_equal(initialize(template, data, len(offsets) - 1, seed=seed).transitions, start.transitions)


def test_an_hmm_over_many_distinct_values_starts_from_tilted_states():
    rng = np.random.default_rng(2)
    values = rng.integers(0, 3 * MAX_VALUES, size=4000)
    from emgrid.models import Ragged

    data = Ragged(values, np.arange(0, 4001, 40, dtype=np.int64))
    template = complete_shapes(from_spec({"family": "HMM", "n_states": 3, "emission": {"family": "Categorical"}}),
                               data)
    start = initialize(template, data, 100, seed=0)
    P = np.stack([c.probs for c in start.children])
    tv = 0.5 * np.abs(P[:, None, :] - P[None, :, :]).sum(axis=2)[np.triu_indices(3, 1)]
    assert tv.min() > 0.2  # each state its own random tilt of the histogram, not the histogram itself


def test_no_full_gaussian_starts_from_fewer_rows_than_it_has_dimensions():
    rng = np.random.default_rng(3)
    d = 6
    clusters = [rng.normal(size=(60, d)) + 6.0 * np.eye(d)[i] for i in range(3)]
    outliers = 12.0 * rng.normal(size=(4, d))  # far apart: k-means++ likes to take them as centres
    x = np.vstack(clusters + [outliers])
    template = complete_shapes(from_spec({"family": "Mixture", "k": 3,
                                          "component": {"family": "FullGaussian", "dim": d}}), x)
    for start in range(20):
        m = initialize(template, x, len(x), seed=0, start=start)
        assert np.asarray(m.weights).min() * len(x) >= d + 1 - 1e-9


# ---------------------------------------------------------------- Poisson HMMs
EARTHQUAKES = Path(__file__).resolve().parents[2] / "examples" / "earthquakes.csv"
#: hmmlearn 0.3.3's best ``score`` over ``PoissonHMM(K, n_iter=100, random_state=s)``, s = 0..9,
#: on the earthquake counts (bench/quality.py runs it live)
HMMLEARN_BEST_OF_10 = {2: -341.879, 3: -328.528, 4: -327.394}


def _earthquakes() -> np.ndarray:
    return np.loadtxt(EARTHQUAKES, delimiter=",", skiprows=1, dtype=np.int64)[:, 1]


def test_a_poisson_hmm_starts_from_drawn_rates_around_the_counts_with_states_that_persist():
    from emgrid.models.init import STAY

    counts = _earthquakes()
    shape = from_spec({"family": "HMM", "n_states": 3, "emission": {"family": "Poisson"}})
    data = shape.prepare([counts])
    template = complete_shapes(shape, data)
    starts = [initialize(template, data, 1, seed=0, start=s) for s in range(20)]
    rates = np.array([[float(c.rate) for c in m.children] for m in starts])
    assert (np.diff(rates, axis=1) >= 0).all()  # the states in increasing order of their rates
    assert len({r.tobytes() for r in rates}) == 20  # every start its own draw
    assert abs(rates.mean() - counts.mean()) < 0.15 * counts.mean()  # drawn around the counts' mean ...
    assert rates.std() > 0.5 * counts.std()  # ... and spread like them
    for m in starts:
        np.testing.assert_allclose(np.diag(m.transitions), STAY)
        np.testing.assert_allclose(m.initial, 1.0 / 3)
    again = initialize(template, data, 1, seed=0, start=7)
    assert start_key(again) == start_key(starts[7])
    # given probabilities are kept
    given = HMM([Poisson(), Poisson()], transitions=[[0.5, 0.5], [0.2, 0.8]])
    m = initialize(complete_shapes(given, given.prepare([counts])), given.prepare([counts]), 1, seed=0)
    np.testing.assert_array_equal(m.transitions, [[0.5, 0.5], [0.2, 0.8]])


def test_the_defaults_find_at_least_what_hmmlearn_finds_on_the_earthquake_counts():
    counts = _earthquakes()
    for k, peer in HMMLEARN_BEST_OF_10.items():
        template = from_spec({"family": "HMM", "n_states": k, "emission": {"family": "Poisson"}})
        with warnings.catch_warnings():
            warnings.simplefilter("error", ConvergenceWarning)  # and converges within max_iter
            fit = optimize([counts], template, n_init=10, seed=0)
        assert fit.converged
        assert float(fit.model.score_samples([counts]).sum()) >= peer - 1e-3, k


def test_the_defaults_find_at_least_hmmlearns_best_of_ten_seeds_live():
    hmm = pytest.importorskip("hmmlearn.hmm")
    counts = _earthquakes()
    for k in (2, 3, 4):
        best = -np.inf
        for s in range(10):
            peer = hmm.PoissonHMM(k, n_iter=100, random_state=s)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                peer.fit(counts[:, None])
            best = max(best, peer.score(counts[:, None]))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            fit = optimize([counts], from_spec({"family": "HMM", "n_states": k, "emission": {"family": "Poisson"}}),
                           n_init=10, seed=0)
        assert float(fit.model.score_samples([counts]).sum()) >= best - 1e-6, k
