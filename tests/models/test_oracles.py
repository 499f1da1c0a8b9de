"""Every family against an independent oracle: each leaf family's own closed-form weighted
MLE and log density (its ``oracle_estimate`` and ``oracle_log_density`` hooks, written
plainly beside its class), those oracles against scipy.stats where scipy has the family, an
explicit log-sum-exp for mixtures, brute-force enumeration of state paths for HMMs and a
per-row loop for sequences. The leaf families are every registered one
(``tests.strategies.leaves``), so a new family is held to its oracle without a line here."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import special, stats

from emgrid.models import (FAMILIES, HMM, Categorical, Exponential, FullGaussian, Gaussian, Mixture, Poisson,
                           Ragged, Sequence)

from tests import strategies as S

RTOL = 1e-9


def weighted(leaf, seed, n):
    rng = np.random.default_rng(seed)
    x = leaf.sample(n, rng)
    w = rng.uniform(0.0, 3.0, size=n)
    w[rng.random(n) < 0.2] = 0.0  # some rows carry no weight at all
    w[0] = 0.5
    return x, w


# ---------------------------------------------------------------- closed-form weighted MLEs
@given(leaf=S.leaves(), seed=S.seeds(), n=st.integers(20, 200))
def test_estimate_is_the_weighted_mle(leaf, seed, n):
    check_estimate(leaf, seed, n)


def check_estimate(leaf, seed, n):
    """``estimate(accumulate(x, w))`` gives the family's closed-form weighted MLE (where a
    floor binds, as for a categorical value no weighted row holds, within 1e-12 of it)."""
    x, w = weighted(leaf, seed, n)
    fitted = leaf.estimate(leaf.accumulate(x, w))
    assert type(fitted) is type(leaf)
    want = leaf.oracle_estimate(x, w)
    got = fitted.params()
    assert set(got) == set(want)
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=RTOL, atol=1e-12, err_msg=name)


def test_estimate_ignores_rows_of_weight_zero():
    x = np.array([1.0, 2.0, 3.0, 100.0])
    fitted = Gaussian(0, 1).estimate(Gaussian(0, 1).accumulate(x, np.array([1.0, 1.0, 1.0, 0.0])))
    assert float(fitted.mean) == pytest.approx(2.0)
    assert float(fitted.var) == pytest.approx(2.0 / 3.0)


def test_unit_weights_equal_no_weights():
    leaf = FullGaussian([0.0, 1.0], [[2.0, 0.3], [0.3, 1.0]])
    x = leaf.sample(50, 1)
    a = leaf.estimate(leaf.accumulate(x)).params()
    b = leaf.estimate(leaf.accumulate(x, np.ones(50))).params()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])


# ---------------------------------------------------------------- densities against their oracles
@given(leaf=S.leaves(), seed=S.seeds(), n=st.integers(1, 50))
def test_log_density_matches_the_familys_oracle(leaf, seed, n):
    check_log_density(leaf, seed, n)


def check_log_density(leaf, seed, n):
    x = leaf.sample(n, seed)
    ld = leaf.log_density(x)
    assert ld.shape == (n,)
    np.testing.assert_allclose(ld, leaf.oracle_log_density(x), rtol=1e-10, atol=1e-10)


#: scipy's log density of the families scipy has, by family: a second, outside check of
#: their oracles (a family scipy lacks is held to its own oracle alone)
SCIPY = {
    "Gaussian": lambda p, x: stats.norm.logpdf(x, float(p["mean"]), np.sqrt(float(p["var"]))),
    "DiagGaussian": lambda p, x: stats.multivariate_normal(p["mean"], np.diag(p["var"])).logpdf(x).reshape(-1),
    "FullGaussian": lambda p, x: stats.multivariate_normal(p["mean"], p["cov"]).logpdf(x).reshape(-1),
    "Categorical": lambda p, x: np.log(p["probs"])[x],
    "Poisson": lambda p, x: stats.poisson.logpmf(x, float(p["rate"])),
    "Exponential": lambda p, x: stats.expon.logpdf(x, scale=1.0 / float(p["rate"])),
}


@given(leaf=S.leaves([FAMILIES[f] for f in SCIPY]), seed=S.seeds(), n=st.integers(1, 50))
def test_log_density_matches_scipy(leaf, seed, n):
    x = leaf.sample(n, seed)
    want = SCIPY[leaf.family](leaf.params(), x)
    np.testing.assert_allclose(leaf.log_density(x), want, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(leaf.oracle_log_density(x), want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("rate", [0.5, 900.0, 3000.0])
def test_poisson_log_density_matches_scipy_for_large_counts(rate):
    # Counts past the log-factorial table (1024) use Stirling's series.
    x = np.array([0, 1, 5, 1023, 1024, 1025, 2500, 3000, 100_000])
    np.testing.assert_allclose(Poisson(rate).log_density(x), stats.poisson.logpmf(x, rate), rtol=1e-12)


def test_exponential_log_density_at_zero():
    np.testing.assert_allclose(Exponential(2.5).log_density(np.array([0.0])), [np.log(2.5)])


# ---------------------------------------------------------------- mixtures
def assert_own_stats(got, leaf, x, w):
    """``got`` equals the leaf's own statistics of ``x`` under row weights ``w``."""
    if not np.any(w > 0):  # every weight underflowed: the statistics are (near) zero
        for a in got:
            np.testing.assert_allclose(a, 0.0, atol=1e-200)
        return
    for a, b in zip(got, leaf.accumulate(x, w)[""], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-10)


def test_gaussian_mixture_against_scipy_logsumexp():
    w = np.array([0.2, 0.5, 0.3])
    means, vars_ = [-2.0, 0.5, 4.0], [0.5, 1.5, 0.3]
    m = Mixture([Gaussian(a, b) for a, b in zip(means, vars_)], w)
    x = np.linspace(-6, 8, 57)
    per = np.stack([stats.norm.logpdf(x, a, np.sqrt(b)) for a, b in zip(means, vars_)])
    np.testing.assert_allclose(m.log_density(x), special.logsumexp(per + np.log(w)[:, None], axis=0), rtol=1e-12)


@given(m=S.mixture_of(S.models()), seed=S.seeds(), n=st.integers(1, 40))
def test_mixture_log_density_is_logsumexp_of_components(m, seed, n):
    x = m.sample(n, seed)
    per = np.stack([c.log_density(x) for c in m.components])
    want = special.logsumexp(per + np.log(m.weights)[:, None], axis=0)
    np.testing.assert_allclose(m.log_density(x), want, rtol=1e-10, atol=1e-10)


@given(m=S.mixture_of(S.leaves()), seed=S.seeds(), n=st.integers(2, 60))
def test_mixture_statistics_are_responsibility_weighted(m, seed, n):
    x = m.sample(n, seed)
    w = np.random.default_rng(seed).uniform(0.1, 2.0, n)
    per = np.stack([c.log_density(x) for c in m.components]) + np.log(m.weights)[:, None]
    resp = np.exp(per - special.logsumexp(per, axis=0))
    st_ = m.accumulate(x, w)
    np.testing.assert_allclose(st_[""][0], resp @ w, rtol=1e-9)
    for k, c in enumerate(m.components):
        assert_own_stats(st_[str(k)], c, x, resp[k] * w)


# ---------------------------------------------------------------- components with different supports
def density(leaf, x):
    """A leaf's density by its family's oracle, 0 outside its support."""
    with np.errstate(under="ignore"):
        return np.exp(leaf.oracle_log_density(x))


# (narrow support, wide support, data in the wide support only partly covered by the narrow one)
NESTED_SUPPORTS = [
    pytest.param(Categorical([1.0]), Poisson(2.0), np.array([0, 0, 1, 3, 7, 0]), id="zero-inflated-poisson"),
    pytest.param(Categorical([0.5, 0.5]), Categorical([0.2, 0.3, 0.5]), np.array([0, 1, 2, 2]), id="categoricals"),
    pytest.param(Exponential(1.5), Gaussian(0.5, 2.0), np.array([-2.0, 0.0, 0.3, 4.0, -0.1]), id="exponential-gaussian"),
]


@pytest.mark.parametrize("narrow_first", [False, True],
                         ids=["wide-first", "narrow-first"])
@pytest.mark.parametrize(("narrow", "wide", "x"), NESTED_SUPPORTS)
def test_mixture_of_components_with_nested_supports(narrow, wide, x, narrow_first):
    comps, w = ([narrow, wide], np.array([0.3, 0.7])) if narrow_first else ([wide, narrow], np.array([0.7, 0.3]))
    m = Mixture(comps, w)
    want = np.log(0.3 * density(narrow, x) + 0.7 * density(wide, x))
    np.testing.assert_allclose(m.log_density(x), want, rtol=1e-10)
    # Rows outside the narrow support give it no weight: its statistics are those of the rest.
    k = comps.index(narrow)
    stats_ = m.accumulate(x)
    per = np.log(w)[:, None] + np.log(np.stack([density(c, x) for c in comps]) + 1e-300)
    resp = np.exp(per - special.logsumexp(per, axis=0))
    inside = density(narrow, x) > 0
    assert_own_stats(stats_[str(k)], narrow, x[inside], resp[k][inside])
    new = m.estimate(stats_)
    assert np.all(np.isfinite(new.log_density(x)))
    assert new.log_density(x).sum() >= m.log_density(x).sum() - 1e-9


@pytest.mark.parametrize("narrow_first", [False, True], ids=["wide-first", "narrow-first"])
@pytest.mark.parametrize(("narrow", "wide", "x"), NESTED_SUPPORTS)
def test_hmm_with_emissions_of_nested_supports(narrow, wide, x, narrow_first):
    ems = [narrow, wide] if narrow_first else [wide, narrow]
    hmm = HMM(ems, [[0.8, 0.2], [0.4, 0.6]], [0.5, 0.5], 3.0)
    rows = [x[:3], x[3:], x[:0]]
    want = [ll for ll, _, _ in brute_force_hmm(hmm, rows, density=density)]
    np.testing.assert_allclose(hmm.log_density(rows), want, rtol=1e-10)
    new = hmm.estimate(hmm.accumulate(rows))
    assert np.all(np.isfinite(new.log_density(rows)))


# ---------------------------------------------------------------- HMMs by brute force
def brute_force_hmm(hmm, rows, density=None):
    """Per row: log p(x), state posteriors gamma (L, K) and pair posteriors xi (L-1, K, K),
    by enumerating every state path. Emission log densities come from each emission's own
    ``log_density``, or from ``density(emission, x)`` when given."""
    k = hmm.n_states
    A, pi = hmm.transitions, hmm.initial
    out = []
    for x in rows:
        L = len(x)
        if L == 0:
            out.append((0.0, np.zeros((0, k)), np.zeros((0, k, k))))
            continue
        if density is None:
            em = np.stack([e.log_density(x) for e in hmm.emissions], axis=1)  # (L, K)
        else:
            with np.errstate(divide="ignore"):
                em = np.log(np.stack([density(e, x) for e in hmm.emissions], axis=1))
        paths = list(itertools.product(range(k), repeat=L))
        logp = np.array([
            np.log(pi[z[0]]) + sum(np.log(A[z[t - 1], z[t]]) for t in range(1, L)) + sum(em[t, z[t]] for t in range(L))
            for z in paths
        ])
        ll = special.logsumexp(logp)
        post = np.exp(logp - ll)
        gamma = np.zeros((L, k))
        xi = np.zeros((max(L - 1, 0), k, k))
        for z, p in zip(paths, post):
            for t in range(L):
                gamma[t, z[t]] += p
            for t in range(1, L):
                xi[t - 1, z[t - 1], z[t]] += p
        out.append((ll, gamma, xi))
    return out


@st.composite
def tiny_hmm_cases(draw):
    """An HMM with 2..3 states of one leaf family and 1..6 rows of length 0..4."""
    first = draw(S.leaves())
    k = draw(st.integers(2, 3))
    ems = [first] + [draw(S.like(first)) for _ in range(k - 1)]
    hmm = HMM(ems, draw(S.stochastic_matrices(k)), draw(S.simplex(k)), draw(S.mean_lengths()))
    lengths = draw(st.lists(st.integers(0, 4), min_size=1, max_size=6))
    seed = draw(S.seeds())
    rows = [first.sample(L, np.random.default_rng([seed, i])) for i, L in enumerate(lengths)]
    w = np.array(draw(st.lists(st.floats(0.1, 2.0), min_size=len(rows), max_size=len(rows))))
    return hmm, rows, w


@given(tiny_hmm_cases())
def test_hmm_log_density_equals_enumeration_over_paths(case):
    hmm, rows, _ = case
    want = [ll for ll, _, _ in brute_force_hmm(hmm, rows)]
    np.testing.assert_allclose(hmm.log_density(rows), want, rtol=1e-10, atol=1e-10)


@given(tiny_hmm_cases())
def test_hmm_statistics_equal_brute_force_posteriors(case):
    hmm, rows, w = case
    k = hmm.n_states
    brute = brute_force_hmm(hmm, rows)
    init = sum(wi * g[0] for wi, (_, g, _) in zip(w, brute) if len(g))
    xi = sum((wi * x.sum(axis=0) for wi, (_, _, x) in zip(w, brute)), np.zeros((k, k)))
    stats_ = hmm.accumulate(rows, w)
    got_init, got_xi, got_sw, got_slen = stats_[""]
    np.testing.assert_allclose(got_init, init if np.ndim(init) else np.zeros(k), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(got_xi, xi, rtol=1e-9, atol=1e-12)
    assert got_sw == pytest.approx(w.sum(), rel=1e-12)
    assert got_slen == pytest.approx(sum(wi * len(r) for wi, r in zip(w, rows)), rel=1e-12)
    # Each emission's statistics are its own accumulate under the posterior position weights.
    positions = [r for r in rows if len(r)]
    if not positions:
        return
    x_all = np.concatenate(positions, axis=0)
    gamma_w = np.concatenate([wi * g for wi, (_, g, _), r in zip(w, brute, rows) if len(r)], axis=0)
    for j, e in enumerate(hmm.emissions):
        assert_own_stats(stats_[str(j)], e, x_all, gamma_w[:, j])


def test_hmm_with_one_state_is_a_sequence():
    hmm = HMM([Gaussian(1.0, 2.0)], [[1.0]], [1.0], 3.0)
    seq = Sequence(Gaussian(1.0, 2.0), 3.0)
    rows = [np.array([0.1, 2.0]), np.array([]), np.array([5.0, -1.0, 0.3])]
    np.testing.assert_allclose(hmm.log_density(rows), seq.log_density(rows), rtol=1e-12)


# ---------------------------------------------------------------- sequences
@given(m=S.sequence_of(S.models()).filter(lambda m: isinstance(m, Sequence)), seed=S.seeds(), n=st.integers(1, 20))
def test_sequence_log_density_is_sum_over_positions(m, seed, n):
    data = m.sample(n, seed)
    assert isinstance(data, Ragged)
    want = [m.child.log_density(data[i]).sum() if data.lengths[i] else 0.0 for i in range(n)]
    np.testing.assert_allclose(m.log_density(data), want, rtol=1e-10, atol=1e-10)


def test_sequence_accepts_a_list_of_rows_like_its_ragged():
    m = Sequence(Poisson(2.0), 2.0)
    rows = [np.array([1, 2]), np.array([], dtype=np.int64), np.array([0, 0, 7])]
    ragged = Ragged(np.array([1, 2, 0, 0, 7]), np.array([0, 2, 2, 5]))
    np.testing.assert_array_equal(m.log_density(rows), m.log_density(ragged))
    want = [stats.poisson.logpmf(r, 2.0).sum() for r in rows]
    np.testing.assert_allclose(m.log_density(rows), want, rtol=1e-12)
