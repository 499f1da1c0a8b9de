"""Answers out of a fitted model, held against independent oracles: brute-force enumeration
of HMM state paths, scikit-learn's GaussianMixture, the E-step's own log-likelihood, and the
labels that generated the data."""

from __future__ import annotations

import hashlib
import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from emgrid.models import (HMM, Categorical, Composite, DiagGaussian, FullGaussian, Gaussian, Mixture, ModelError,
                           Poisson, Ragged, Sequence, e_step)
from emgrid.models.data import concat_rows, flatten
from emgrid.models.inference import answer_blocks, choice_paths, hmm_paths
from tests.strategies import data_for, models, seeds, simplex, stochastic_matrices


def flat(x):
    """The innermost values of an answer (its rows end to end)."""
    while isinstance(x, Ragged):
        x = x.values
    return np.asarray(x)


def innermost(x: Ragged) -> Ragged:
    """The innermost ``Ragged`` level of an answer."""
    while isinstance(x.values, Ragged):
        x = x.values
    return x


def parent_of(path: str) -> tuple[str, int]:
    head, _, last = path.rpartition(".")
    return head, int(last)


# ---------------------------------------------------------------- predict_proba and predict
def test_nested_mixture_rows_sum_to_the_parents_responsibility():
    inner = Mixture([Gaussian(-4.0, 1.0), Gaussian(-1.0, 0.5)], [0.3, 0.7])
    model = Mixture([inner, Gaussian(3.0, 2.0)], [0.6, 0.4])
    data = model.sample(500, np.random.default_rng(0))
    outer = model.predict_proba(data)
    nested = model.predict_proba(data, at="0")
    assert outer.shape == nested.shape == (500, 2)
    np.testing.assert_allclose(outer.sum(axis=1), 1.0, rtol=1e-12)
    np.testing.assert_allclose(nested.sum(axis=1), outer[:, 0], rtol=1e-10, atol=1e-300)
    # the nested weights are the parent's responsibility times the inner mixture's own posterior
    own = inner.predict_proba(data)
    np.testing.assert_allclose(nested, own * outer[:, :1], rtol=1e-10, atol=1e-300)


def test_mixture_under_a_sequence_answers_one_row_per_position():
    model = Sequence(Mixture([Poisson(1.0), Poisson(8.0)], [0.5, 0.5]), 3.0)
    data = model.prepare(model.sample(40, np.random.default_rng(1)))
    proba = model.predict_proba(data, at="0")
    assert isinstance(proba, Ragged) and len(proba) == 40
    np.testing.assert_array_equal(proba.offsets, data.offsets)
    assert proba.values.shape == (int(data.offsets[-1]), 2)
    np.testing.assert_allclose(proba.values.sum(axis=1), 1.0, rtol=1e-12)


@given(st.data())
def test_rows_sum_to_the_weight_reaching_the_node(draw):
    model = draw.draw(models())
    data = model.prepare(draw.draw(data_for(model, 1, 12)))
    for p in choice_paths(model):
        sums = flat(model.predict_proba(data, p)).sum(axis=1)
        parent, i = parent_of(p) if p else ("", 0)
        if p and parent in choice_paths(model):
            reach = flat(model.predict_proba(data, parent))[:, i]
            if p in hmm_paths(model):  # the HMM's children read the positions of its rows
                reach = np.repeat(reach, innermost(model.predict_proba(data, p)).lengths)
            np.testing.assert_allclose(sums, reach, rtol=1e-9, atol=1e-250)
        elif not any(a in choice_paths(model) for a in _ancestors(p)):
            np.testing.assert_allclose(sums, 1.0, rtol=1e-9)
        else:
            assert np.all(sums <= 1.0 + 1e-9)


def _ancestors(path: str) -> list[str]:
    parts = path.split(".") if path else []
    return [".".join(parts[:j]) for j in range(len(parts))]


@given(st.data())
def test_predict_is_the_argmax_of_predict_proba_block_by_block(draw):
    model = draw.draw(models())
    data = model.prepare(draw.draw(data_for(model, 1, 12)))
    for p in choice_paths(model):
        proba, labels = model.predict_proba(data, p), model.predict(data, p)
        np.testing.assert_array_equal(flat(labels), flat(proba).argmax(axis=1))
        assert flat(labels).dtype == np.int64
        small = list(answer_blocks(model, data, p, rows_per_block=7, with_viterbi=False))
        np.testing.assert_allclose(np.concatenate([flat(b.proba) for b in small]), flat(proba), rtol=1e-9, atol=1e-300)
        top = np.sort(flat(proba), axis=1)
        clear = top[:, -1] - (top[:, -2] if top.shape[1] > 1 else 0.0) > 1e-9  # no near-tie rounding can flip
        np.testing.assert_array_equal(np.concatenate([flat(b.label) for b in small])[clear], flat(labels)[clear])


# ---------------------------------------------------------------- HMMs against enumeration
def _emission_states(k: int):
    """Tiny HMMs of ``k`` states whose emissions are one family (leaves and a mixture)."""
    fams = [
        st.lists(st.floats(-3, 3), min_size=k, max_size=k).map(lambda ms: [Gaussian(m, 1.0) for m in ms]),
        st.lists(simplex(3), min_size=k, max_size=k).map(lambda ps: [Categorical(p) for p in ps]),
        st.lists(st.floats(0.5, 8), min_size=k, max_size=k).map(lambda rs: [Poisson(r) for r in rs]),
        st.lists(st.floats(-2, 2), min_size=k, max_size=k).map(
            lambda ms: [DiagGaussian([m, -m], [1.0, 0.5]) for m in ms]),
        st.lists(st.floats(0.5, 6), min_size=k, max_size=k).map(
            lambda rs: [Mixture([Poisson(r), Poisson(r + 3.0)], [0.4, 0.6]) for r in rs]),
    ]
    return st.one_of(fams)


@st.composite
def tiny_hmms(draw):
    k = draw(st.integers(2, 3))
    return HMM(draw(_emission_states(k)), draw(stochastic_matrices(k)), draw(simplex(k)), 3.0)


def _enumerate(hmm: HMM, row) -> tuple[np.ndarray, np.ndarray]:
    """Every state path's joint log-probability with ``row``, and the paths."""
    k, L = hmm.n_states, row_len(row)
    logB = np.stack([e.log_density(row) for e in hmm.emissions], axis=1)  # (L, K)
    paths = np.array(list(itertools.product(range(k), repeat=L)), dtype=np.int64).reshape(-1, L)
    score = np.log(hmm.initial)[paths[:, 0]] + logB[0, paths[:, 0]]
    for t in range(1, L):
        score = score + np.log(hmm.transitions)[paths[:, t - 1], paths[:, t]] + logB[t, paths[:, t]]
    return score, paths


def row_len(row) -> int:
    return int(np.asarray(row).shape[0])


@given(tiny_hmms(), st.lists(st.integers(1, 5), min_size=1, max_size=6), seeds())
def test_viterbi_and_posteriors_equal_brute_force(hmm, lengths, seed):
    rng = np.random.default_rng(seed)
    k = hmm.n_states
    data = hmm.prepare([concat_rows([hmm.emissions[rng.integers(k)]._sample(1, rng) for _ in range(L)])
                        for L in lengths])
    path, post = hmm.viterbi(data), hmm.posterior_states(data)
    np.testing.assert_array_equal(path.offsets, data.offsets)
    for i in range(len(data)):
        row = data[i]
        score, paths = _enumerate(hmm, row)
        mine = np.flatnonzero((paths == path[i]).all(axis=1))[0]
        np.testing.assert_allclose(score[mine], score.max(), rtol=1e-10, atol=1e-10)
        p = np.exp(score - score.max())
        p /= p.sum()
        marginal = np.stack([np.bincount(paths[:, t], weights=p, minlength=hmm.n_states) for t in range(row_len(row))])
        np.testing.assert_allclose(post[i], marginal, rtol=1e-7, atol=1e-10)
        np.testing.assert_allclose(post[i].sum(axis=1), 1.0, rtol=1e-12)
    np.testing.assert_array_equal(flat(hmm.predict(data)), flat(post).argmax(axis=1))


def test_nested_hmm_posteriors_are_given_that_the_hmm_generated_the_row():
    a = HMM([Poisson(1.0), Poisson(6.0)], [[0.8, 0.2], [0.3, 0.7]], [0.5, 0.5], 4.0)
    b = HMM([Poisson(2.0), Poisson(12.0)], [[0.5, 0.5], [0.5, 0.5]], [0.9, 0.1], 4.0)
    model = Mixture([a, b], [0.5, 0.5])
    data = model.prepare(model.sample(50, np.random.default_rng(3)))
    assert hmm_paths(model) == ["0", "1"]
    np.testing.assert_allclose(flat(model.posterior_states(data, "1")), flat(b.posterior_states(data)), rtol=1e-12)
    np.testing.assert_array_equal(flat(model.viterbi(data, "0")), flat(a.viterbi(data)))
    reach = np.repeat(model.predict_proba(data)[:, 1], data.lengths)
    np.testing.assert_allclose(flat(model.predict_proba(data, "1")).sum(axis=1), reach, rtol=1e-9, atol=1e-250)


# ---------------------------------------------------------------- log-likelihood and criteria
@given(st.data())
def test_score_samples_sums_to_the_e_step_log_likelihood(draw):
    model = draw.draw(models())
    data = model.prepare(draw.draw(data_for(model, 1, 40)))
    scores = model.score_samples(data)
    assert scores.shape == (len(model.log_density(data)),)
    _, ll = e_step(model, data)
    np.testing.assert_allclose(scores.sum(), ll, rtol=1e-10, atol=1e-9)
    np.testing.assert_allclose(scores, model.log_density(data), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", ["full", "diag", "spherical"])
def test_bic_aic_and_counts_equal_scikit_learn(kind):
    mixture = pytest.importorskip("sklearn.mixture")
    rng = np.random.default_rng(4)
    d = 1 if kind == "spherical" else 3  # a spherical covariance is representable in one dimension
    X = np.concatenate([rng.normal(0, 1, (300, d)), rng.normal(4, 0.5, (200, d)), rng.normal(-3, 2, (100, d))])
    gm = mixture.GaussianMixture(3, covariance_type=kind, random_state=0).fit(X)
    if kind == "full":
        comps = [FullGaussian(m, c) for m, c in zip(gm.means_, gm.covariances_)]
        data = X
    elif kind == "diag":
        comps = [DiagGaussian(m, c) for m, c in zip(gm.means_, gm.covariances_)]
        data = X
    else:
        comps = [Gaussian(float(m[0]), float(c)) for m, c in zip(gm.means_, gm.covariances_)]
        data = X[:, 0]
    model = Mixture(comps, gm.weights_ / gm.weights_.sum())
    assert model.n_parameters() == gm._n_parameters()
    np.testing.assert_allclose(model.score_samples(data), gm.score_samples(X), rtol=1e-9)
    np.testing.assert_allclose(model.bic(data), gm.bic(X), rtol=1e-9)
    np.testing.assert_allclose(model.aic(data), gm.aic(X), rtol=1e-9)
    np.testing.assert_allclose(model.predict_proba(data), gm.predict_proba(X), atol=1e-8)
    np.testing.assert_array_equal(model.predict(data), gm.predict(X))


def test_hmm_counts_its_free_parameters():
    hmm = HMM([DiagGaussian([0.0, 1.0], [1.0, 1.0])] * 3, np.full((3, 3), 1 / 3), np.full(3, 1 / 3), 5.0)
    # emissions 3 * (2 means + 2 variances), transitions 3 * 2, initial 2; lengths are given
    assert hmm.n_parameters() == 12 + 6 + 2


# ---------------------------------------------------------------- latent sampling
SEPARATED = [
    Mixture([Composite([FullGaussian([0.0, 0.0], np.eye(2)), Categorical([0.9, 0.1])]),
             Composite([FullGaussian([12.0, 12.0], np.eye(2)), Categorical([0.1, 0.9])]),
             Composite([FullGaussian([-12.0, 12.0], np.eye(2)), Categorical([0.5, 0.5])])], [0.3, 0.3, 0.4]),
    HMM([Gaussian(-10.0, 1.0), Gaussian(0.0, 1.0), Gaussian(10.0, 1.0)],
        [[0.8, 0.1, 0.1], [0.1, 0.8, 0.1], [0.1, 0.1, 0.8]], [0.3, 0.3, 0.4], 6.0),
    Mixture([Mixture([Gaussian(-20.0, 1.0), Gaussian(-10.0, 1.0)], [0.5, 0.5]),
             Mixture([Gaussian(10.0, 1.0), Gaussian(20.0, 1.0)], [0.3, 0.7])], [0.5, 0.5]),
    Composite([Sequence(Mixture([Poisson(1.0), Poisson(60.0)], [0.4, 0.6]), 4.0), Gaussian(0.0, 1.0)]),
]


@pytest.mark.parametrize("model", SEPARATED, ids=["records", "hmm", "nested", "sequence"])
def test_latent_labels_agree_with_predict_on_separated_models(model):
    data, labels = model.sample(3000, np.random.default_rng(5), latent=True)
    assert list(labels) == choice_paths(model)
    for p, truth in labels.items():
        guess, truth = flat(model.predict(data, p)), flat(truth)
        assert guess.shape == truth.shape
        seen = truth >= 0
        assert seen.mean() > 0.3
        assert np.mean(guess[seen] == truth[seen]) >= 0.99, p
    for p in hmm_paths(model):
        assert np.mean(flat(model.viterbi(data, p)) == flat(labels[p])) >= 0.99


def _fingerprint(data) -> str:
    h = hashlib.sha256()
    for k, v in sorted(flatten(data).items()):
        h.update(k.encode())
        h.update(np.ascontiguousarray(v).tobytes())
    return h.hexdigest()[:16]


FIXED = [
    (Mixture([Composite([Gaussian(0.0, 1.0), Sequence(Categorical([0.2, 0.8]), 3.0)]),
              Composite([Gaussian(3.0, 1.0), Sequence(Categorical([0.7, 0.3]), 2.0)])], [0.4, 0.6]), "dd2f2b7b653505f2"),
    (HMM([Mixture([Poisson(1.0), Poisson(5.0)], [0.5, 0.5]), Poisson(9.0)], [[0.9, 0.1], [0.2, 0.8]], [0.5, 0.5], 4.0),
     "d5273345b72838fd"),
    (Sequence(Mixture([DiagGaussian([0.0, 0.0], [1.0, 1.0]), DiagGaussian([4.0, 4.0], [1.0, 2.0])], [0.3, 0.7]), 3.0),
     "f729ba06f97f0a3b"),
]


@pytest.mark.parametrize("model,expected", FIXED, ids=["records", "hmm", "sequence"])
def test_sampling_without_labels_draws_the_same_rows_as_before(model, expected):
    assert _fingerprint(model.sample(200, np.random.default_rng(7))) == expected
    data, _ = model.sample(200, np.random.default_rng(7), latent=True)
    assert _fingerprint(data) == expected


@given(st.data())
def test_latent_sampling_draws_the_same_rows_and_labels_every_answer(draw):
    model = draw.draw(models())
    n, seed = draw.draw(st.integers(0, 25)), draw.draw(seeds())
    plain = model.sample(n, np.random.default_rng(seed))
    data, labels = model.sample(n, np.random.default_rng(seed), latent=True)
    assert _fingerprint(data) == _fingerprint(plain)
    assert list(labels) == choice_paths(model)
    if n == 0:
        return
    for p, lab in labels.items():
        values = flat(lab)
        assert values.dtype == np.int64
        assert np.all((values >= -1) & (values < len(model.node_at(p).children)))
        assert flat(model.predict(data, p)).shape == values.shape
        if not any(a in choice_paths(model) for a in _ancestors(p)):
            assert np.all(values >= 0)


# ---------------------------------------------------------------- errors
def test_errors_name_the_path_and_where_the_answers_are():
    model = Mixture([Composite([Gaussian(0.0, 1.0), Gaussian(1.0, 1.0)]),
                     Composite([Gaussian(2.0, 1.0), Gaussian(3.0, 1.0)])], [0.5, 0.5])
    data = model.sample(10, np.random.default_rng(0))
    with pytest.raises(ModelError, match=r"node '0.1' is a Gaussian; predict needs a Mixture or HMM, which are at: ''"):
        model.predict(data, at="0.1")
    with pytest.raises(ModelError, match=r"path '5' does not exist"):
        model.predict_proba(data, at="5")
    with pytest.raises(ModelError, match=r"path 'x.y' does not exist"):
        model.predict_proba(data, at="x.y")
    with pytest.raises(ModelError, match=r"viterbi needs an HMM, which are at: none in this model"):
        model.viterbi(data)
