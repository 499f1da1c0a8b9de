"""The estimators against their peers on the same data from the same starting parameters:
scikit-learn's GaussianMixture and hmmlearn's GaussianHMM and PoissonHMM give the same
log-likelihood at every iteration (relative 1e-8), stop at the same iteration for the same
``tol``, and answer alike (posteriors, scores, Viterbi paths, BIC and AIC)."""

import warnings

import numpy as np
import pytest

pytest.importorskip("sklearn")

from sklearn.datasets import load_iris, load_wine  # noqa: E402
from sklearn.exceptions import ConvergenceWarning  # noqa: E402
from sklearn.mixture import GaussianMixture as SkGaussianMixture  # noqa: E402

from emgrid.estimators import GaussianHMM, GaussianMixture, PoissonHMM  # noqa: E402

REL = 1e-8


def close(a, b, rel=REL):
    np.testing.assert_allclose(a, b, rtol=rel, atol=0)


def close_traces(ours, theirs):
    """Our trace and hmmlearn's monitor's history (which may keep only the last entries)."""
    history = list(theirs.monitor_.history)
    n = min(len(history), len(ours.fit_result_.log_likelihood))
    assert n >= min(2, ours.n_iter_)
    close(ours.fit_result_.log_likelihood[-n:], history[-n:])


def quiet_fit(est, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return est.fit(*args)


# ---------------------------------------------------------------- GaussianMixture
@pytest.mark.parametrize("load", [load_iris, load_wine], ids=["iris", "wine"])
@pytest.mark.parametrize("covariance_type", ["full", "diag"])
def test_gaussian_mixture_matches_scikit_learn_iteration_by_iteration(load, covariance_type):
    X = load().data
    seed = SkGaussianMixture(3, covariance_type=covariance_type, max_iter=1, random_state=1)
    quiet_fit(seed, X)
    start = dict(weights_init=seed.weights_, means_init=seed.means_, precisions_init=seed.precisions_)
    for k in (1, 2, 3, 5, 8):
        ours = quiet_fit(GaussianMixture(3, covariance_type=covariance_type, max_iter=k, tol=0, **start), X)
        theirs = quiet_fit(SkGaussianMixture(3, covariance_type=covariance_type, max_iter=k, tol=0, **start), X)
        close(ours.lower_bound_, theirs.lower_bound_)
        assert ours.n_iter_ == theirs.n_iter_ == k
        assert len(ours.lower_bounds_) == k
    # the default tol stops at the same iteration, with the same parameters and answers
    ours = quiet_fit(GaussianMixture(3, covariance_type=covariance_type, **start), X)
    theirs = quiet_fit(SkGaussianMixture(3, covariance_type=covariance_type, **start), X)
    assert (ours.n_iter_, ours.converged_) == (theirs.n_iter_, theirs.converged_)
    close(ours.lower_bound_, theirs.lower_bound_)
    for name in ("weights_", "means_", "covariances_", "precisions_", "precisions_cholesky_"):
        np.testing.assert_allclose(getattr(ours, name), getattr(theirs, name), rtol=1e-6, atol=1e-9, err_msg=name)
    close(ours.score_samples(X), theirs.score_samples(X))
    close(ours.score(X), theirs.score(X))
    np.testing.assert_allclose(ours.predict_proba(X), theirs.predict_proba(X), atol=1e-9)
    assert (ours.predict(X) == theirs.predict(X)).all()
    close(ours.bic(X), theirs.bic(X))
    close(ours.aic(X), theirs.aic(X))


def test_warm_start_continues_where_the_last_fit_stopped_as_scikit_learn_does():
    X = load_iris().data
    start = SkGaussianMixture(2, max_iter=1, random_state=3)
    quiet_fit(start, X)
    init = dict(weights_init=start.weights_, means_init=start.means_, precisions_init=start.precisions_)
    ours = GaussianMixture(2, max_iter=2, tol=0, warm_start=True, **init)
    theirs = SkGaussianMixture(2, max_iter=2, tol=0, warm_start=True, **init)
    for _ in range(3):
        quiet_fit(ours, X)
        quiet_fit(theirs, X)
        close(ours.lower_bound_, theirs.lower_bound_)
    ours.set_params(tol=1e-3, max_iter=100)
    theirs.set_params(tol=1e-3, max_iter=100)
    quiet_fit(ours, X), quiet_fit(theirs, X)
    assert (ours.n_iter_, ours.converged_) == (theirs.n_iter_, theirs.converged_)
    close(ours.lower_bound_, theirs.lower_bound_)


# ---------------------------------------------------------------- HMMs
hmm = pytest.importorskip("hmmlearn.hmm")


def _sequences(ref, n_seq=8, seed=0):
    rng = np.random.default_rng(seed)
    xs = [ref.sample(int(L), random_state=i)[0] for i, L in enumerate(rng.integers(20, 60, size=n_seq))]
    return np.concatenate(xs), [len(x) for x in xs]


def _gaussian_data():
    ref = hmm.GaussianHMM(3, covariance_type="diag")
    ref.startprob_ = np.array([0.6, 0.3, 0.1])
    ref.transmat_ = np.array([[0.8, 0.1, 0.1], [0.1, 0.8, 0.1], [0.1, 0.1, 0.8]])
    ref.means_ = np.array([[0.0, 0.0], [3.0, 3.0], [-3.0, 3.0]])
    ref.covars_ = np.ones((3, 2))
    return _sequences(ref)


def _set(est, start, names):
    for name in names:  # covars_ in the shape of its covariance_type, as both setters take it
        setattr(est, name, start._covars_ if name == "covars_" else getattr(start, name))
    return est


def _check_answers(ours, theirs, X, lengths):
    close(ours.score(X, lengths), theirs.score(X, lengths))
    np.testing.assert_allclose(ours.predict_proba(X, lengths), theirs.predict_proba(X, lengths), atol=1e-9)
    (lp_ours, path_ours), (lp_theirs, path_theirs) = ours.decode(X, lengths), theirs.decode(X, lengths)
    close(lp_ours, lp_theirs)
    assert (path_ours == path_theirs).all()
    assert (ours.predict(X, lengths) == theirs.predict(X, lengths)).all()
    # n counts positions and the parameters are hmmlearn's (models.inference)
    close(ours.bic(X, lengths), theirs.bic(X, lengths))
    close(ours.aic(X, lengths), theirs.aic(X, lengths))


@pytest.mark.parametrize("covariance_type", ["diag", "full"])
def test_gaussian_hmm_matches_hmmlearn_iteration_by_iteration(covariance_type):
    X, lengths = _gaussian_data()
    seed = hmm.GaussianHMM(3, covariance_type=covariance_type, n_iter=1, random_state=1).fit(X, lengths)
    names = ("startprob_", "transmat_", "means_", "covars_")
    # hmmlearn's covars_prior pulls variances by 1e-2 / occupancy; 0 is the plain M-step emgrid runs
    for k in (1, 2, 4, 8):
        theirs = _set(hmm.GaussianHMM(3, covariance_type=covariance_type, n_iter=k, init_params="", covars_prior=0.0),
                      seed, names).fit(X, lengths)
        ours = _set(GaussianHMM(3, covariance_type=covariance_type, n_iter=k, init_params="", min_covar=0.0),
                    seed, names).fit(X, lengths)
        close_traces(ours, theirs)
        assert ours.n_iter_ == theirs.monitor_.iter
    for name in names:
        np.testing.assert_allclose(getattr(ours, name), getattr(theirs, name), rtol=1e-6, atol=1e-9, err_msg=name)
    assert ours.covars_.shape == theirs.covars_.shape == (3, 2, 2)
    _check_answers(ours, theirs, X, lengths)


def test_gaussian_hmm_tol_stops_where_hmmlearn_stops():
    X, lengths = _gaussian_data()
    seed = hmm.GaussianHMM(3, n_iter=1, random_state=2).fit(X, lengths)
    names = ("startprob_", "transmat_", "means_", "covars_")
    theirs = _set(hmm.GaussianHMM(3, n_iter=200, tol=1e-3, init_params="", covars_prior=0.0), seed, names)
    ours = _set(GaussianHMM(3, n_iter=200, tol=1e-3, init_params="", min_covar=0.0), seed, names)
    theirs.fit(X, lengths), ours.fit(X, lengths)
    assert ours.converged_ and ours.n_iter_ == theirs.monitor_.iter < 200
    close(ours.fit_result_.log_likelihood[-1], theirs.monitor_.history[-1])


def test_poisson_hmm_matches_hmmlearn_iteration_by_iteration():
    ref = hmm.PoissonHMM(2)
    ref.startprob_, ref.transmat_ = np.array([0.5, 0.5]), np.array([[0.9, 0.1], [0.2, 0.8]])
    ref.lambdas_ = np.array([[1.0, 5.0], [6.0, 2.0]])
    X, lengths = _sequences(ref)
    seed = hmm.PoissonHMM(2, n_iter=1, random_state=1).fit(X, lengths)
    names = ("startprob_", "transmat_", "lambdas_")
    for k in (1, 3, 6):
        theirs = _set(hmm.PoissonHMM(2, n_iter=k, init_params=""), seed, names).fit(X, lengths)
        ours = _set(PoissonHMM(2, n_iter=k, init_params=""), seed, names).fit(X, lengths)
        close_traces(ours, theirs)
    np.testing.assert_allclose(ours.lambdas_, theirs.lambdas_, rtol=1e-6)
    _check_answers(ours, theirs, X, lengths)
