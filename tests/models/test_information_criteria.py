"""BIC, AIC and parameter counts against the peers on the same fitted parameters.

An HMM's ``n`` is its number of positions (hmmlearn's ``len(X)`` in ``bic(X, lengths)``),
not its number of sequences; its free parameters are hmmlearn's
``_get_n_fit_scalars_per_param``: ``K - 1`` initial, ``K (K - 1)`` transition, and each
state's emission (``d`` means and ``d`` variances, ``d (d + 1) / 2`` covariance entries,
one rate per count, ``V - 1`` probabilities). A ``Sequence`` counts its positions too (the
innermost sequence level), which makes it scikit-learn's mixture on the positions; a record
counts its rows.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from emgrid.executors import optimize
from emgrid.models import (HMM, Categorical, Composite, DiagGaussian, FullGaussian, Gaussian, Mixture, Poisson,
                           Ragged, Sequence, from_spec)
from emgrid.models.errors import ConvergenceWarning, DataError

hmm = pytest.importorskip("hmmlearn.hmm")

RTOL = 1e-9
TRANSITIONS = [[0.85, 0.1, 0.05], [0.1, 0.8, 0.1], [0.05, 0.15, 0.8]]
INITIAL = [0.5, 0.3, 0.2]


def _truth(family: str) -> HMM:
    emissions = {
        "diag": [DiagGaussian([0.0, 0.0], [1.0, 0.5]), DiagGaussian([4.0, -2.0], [0.5, 1.0]),
                 DiagGaussian([-3.0, 3.0], [2.0, 1.0])],
        "full": [FullGaussian([0.0, 0.0], [[1.0, 0.5], [0.5, 1.0]]), FullGaussian([4.0, -2.0], [[0.5, -0.2], [-0.2, 1.0]]),
                 FullGaussian([-3.0, 3.0], [[2.0, 0.0], [0.0, 0.3]])],
        "scalar": [Gaussian(0.0, 1.0), Gaussian(4.0, 0.5), Gaussian(-3.0, 2.0)],
        "poisson": [Poisson(1.0), Poisson(6.0), Poisson(15.0)],
        "categorical": [Categorical([0.7, 0.1, 0.1, 0.1]), Categorical([0.1, 0.6, 0.2, 0.1]),
                        Categorical([0.05, 0.05, 0.2, 0.7])],
    }[family]
    return HMM(emissions, TRANSITIONS, INITIAL, 80.0)


def _emission_spec(family: str) -> dict:
    return {"diag": {"family": "DiagGaussian", "dim": 2}, "full": {"family": "FullGaussian", "dim": 2},
            "scalar": {"family": "Gaussian"}, "poisson": {"family": "Poisson"},
            "categorical": {"family": "Categorical"}}[family]


def _peer(model: HMM, family: str):
    """The hmmlearn model holding ``model``'s parameters."""
    e = model.children
    if family in ("diag", "full", "scalar"):
        peer = hmm.GaussianHMM(model.n_states, covariance_type="full" if family == "full" else "diag")
        if family == "scalar":
            peer.means_ = np.array([[float(c.mean)] for c in e])
            peer.covars_ = np.array([[float(c.var)] for c in e])
        else:
            peer.means_ = np.array([c.mean for c in e])
            peer.covars_ = np.array([c.cov if family == "full" else c.var for c in e])
    elif family == "poisson":
        peer = hmm.PoissonHMM(model.n_states)
        peer.lambdas_ = np.array([[float(c.rate)] for c in e])
    else:
        peer = hmm.CategoricalHMM(model.n_states, n_features=e[0].n_values)
        peer.emissionprob_ = np.array([c.probs for c in e])
    peer.n_features = (peer.means_ if family in ("diag", "full", "scalar") else
                       peer.lambdas_ if family == "poisson" else peer.emissionprob_).shape[1]
    peer.startprob_ = np.asarray(model.initial)
    peer.transmat_ = np.asarray(model.transitions)
    return peer


def _positions(values: np.ndarray) -> np.ndarray:
    """hmmlearn's ``X``: one row per position."""
    return values.reshape(len(values), -1)


def _fit(data, template):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return optimize(data, template, seed=0, max_iter=30).model


@pytest.mark.parametrize("n_sequences", [1, 12], ids=["one-sequence", "many-sequences"])
@pytest.mark.parametrize("family", ["diag", "full", "scalar", "poisson", "categorical"])
def test_hmm_bic_aic_and_counts_equal_hmmlearn(family, n_sequences):
    truth = _truth(family)
    data = truth.prepare(truth.sample(n_sequences, np.random.default_rng(3)))
    assert data.offsets[-1] > 10 * n_sequences
    model = _fit(data, from_spec({"family": "HMM", "n_states": 3, "emission": _emission_spec(family)}))
    peer = _peer(model, family)
    X, lengths = _positions(data.values), data.lengths
    assert model.n_parameters() == sum(peer._get_n_fit_scalars_per_param().values())
    assert model.n_observations(data) == len(X)
    np.testing.assert_allclose(model.score_samples(data).sum(), peer.score(X, lengths), rtol=RTOL)
    np.testing.assert_allclose(model.bic(data), peer.bic(X, lengths), rtol=RTOL)
    np.testing.assert_allclose(model.aic(data), peer.aic(X, lengths), rtol=RTOL)


def test_states_emitting_records_of_counts_are_hmmlearns_poisson_hmm_with_features():
    model = HMM([Composite([Poisson(1.0), Poisson(4.0)]), Composite([Poisson(7.0), Poisson(0.5)])],
                [[0.9, 0.1], [0.2, 0.8]], [0.6, 0.4], 50.0)
    data = model.prepare(model.sample(4, np.random.default_rng(0)))
    peer = hmm.PoissonHMM(2)
    peer.n_features = 2
    peer.lambdas_ = np.array([[float(c.rate) for c in state.children] for state in model.children])
    peer.startprob_, peer.transmat_ = np.asarray(model.initial), np.asarray(model.transitions)
    X, lengths = np.column_stack(data.values), data.lengths  # positions x features
    assert model.n_parameters() == sum(peer._get_n_fit_scalars_per_param().values())
    assert model.n_observations(data) == len(X)
    np.testing.assert_allclose(model.bic(data), peer.bic(X, lengths), rtol=RTOL)
    np.testing.assert_allclose(model.aic(data), peer.aic(X, lengths), rtol=RTOL)


def test_a_long_series_pays_for_states_that_add_nothing():
    """One series of 2000 positions, scored by the truth and by the same chain with every
    state split into two copies (half the initial and transition probabilities each): the
    likelihood is the same, so BIC must rise by the extra parameters times ``log 2000`` (with
    ``n`` = 1 sequence it would not rise at all, and BIC would not tell the two apart)."""
    truth = _truth("poisson")
    data = truth.prepare([truth.sample(40, np.random.default_rng(1)).values[:2000]])
    k = truth.n_states
    doubled = HMM([c for c in truth.children for _ in range(2)],
                  np.repeat(np.repeat(np.asarray(truth.transitions), 2, axis=0), 2, axis=1) / 2,
                  np.repeat(np.asarray(truth.initial), 2) / 2, 80.0)
    np.testing.assert_allclose(doubled.score_samples(data), truth.score_samples(data), rtol=RTOL)
    def count(k):  # initial, transitions, one rate per state
        return (k - 1) + k * (k - 1) + k

    assert truth.n_parameters() == count(k) and doubled.n_parameters() == count(2 * k)
    extra = doubled.n_parameters() - truth.n_parameters()
    assert doubled.n_observations(data) == 2000
    assert doubled.bic(data) - truth.bic(data) == pytest.approx(extra * np.log(2000), rel=1e-6)
    assert doubled.aic(data) - truth.aic(data) == pytest.approx(2 * extra, rel=1e-6)


def test_a_sequence_of_hmms_counts_every_inner_position_as_hmmlearn_over_all_its_sequences():
    inner = _truth("scalar")
    counts = [3, 1, 4]  # each row a group of sequences
    sequences = inner.sample(sum(counts), np.random.default_rng(6))
    model = Sequence(inner, 8.0 / 3.0)
    data = model.prepare(Ragged(sequences, np.concatenate([[0], np.cumsum(counts)])))
    peer = _peer(inner, "scalar")
    flat = data.values  # the inner sequences, one Ragged
    X, lengths = _positions(flat.values), flat.lengths
    assert model.n_parameters() == sum(peer._get_n_fit_scalars_per_param().values())
    assert model.n_observations(data) == len(X)
    np.testing.assert_allclose(model.bic(data), peer.bic(X, lengths), rtol=RTOL)
    np.testing.assert_allclose(model.aic(data), peer.aic(X, lengths), rtol=RTOL)


def test_a_sequence_of_a_mixture_is_scikit_learns_mixture_on_the_positions():
    mixture = pytest.importorskip("sklearn.mixture")
    rng = np.random.default_rng(4)
    X = np.concatenate([rng.normal(0, 1, (300, 2)), rng.normal(4, 0.5, (200, 2))])
    rng.shuffle(X)
    gm = mixture.GaussianMixture(2, covariance_type="diag", random_state=0).fit(X)
    model = Sequence(Mixture([DiagGaussian(m, c) for m, c in zip(gm.means_, gm.covariances_)],
                             gm.weights_ / gm.weights_.sum()), 50.0)
    rows = np.split(X, [40, 41, 140, 300])  # five sequences of 40, 1, 99, 160 and 200 positions
    assert model.n_parameters() == gm._n_parameters()
    assert model.n_observations(rows) == len(X)
    np.testing.assert_allclose(model.bic(rows), gm.bic(X), rtol=RTOL)
    np.testing.assert_allclose(model.aic(rows), gm.aic(X), rtol=RTOL)


def test_a_mixture_of_hmms_counts_positions_and_a_record_counts_rows():
    a, b = _truth("poisson"), HMM([Poisson(2.0), Poisson(9.0), Poisson(30.0)], TRANSITIONS, INITIAL, 80.0)
    mix = Mixture([a, b], [0.4, 0.6])
    data = mix.prepare(mix.sample(6, np.random.default_rng(2)))
    n = int(data.offsets[-1])
    ll = float(mix.score_samples(data).sum())
    assert mix.n_observations(data) == n
    assert mix.bic(data) == pytest.approx(-2 * ll + mix.n_parameters() * np.log(n), rel=RTOL)
    record = Composite([Gaussian(0.0, 1.0), a])
    rows = record.prepare(record.sample(7, np.random.default_rng(5)))
    ll = float(record.score_samples(rows).sum())
    assert record.n_observations(rows) == 7
    assert record.bic(rows) == pytest.approx(-2 * ll + record.n_parameters() * np.log(7), rel=RTOL)


def test_sequences_that_are_all_empty_have_no_bic():
    model = Sequence(Gaussian(0.0, 1.0), 2.0)
    with pytest.raises(DataError, match="no observations"):
        model.bic([np.zeros(0), np.zeros(0)])
