"""hmmlearn's ``GaussianHMM``, ``PoissonHMM`` and ``CategoricalHMM`` over emgrid's ``HMM``.

hmmlearn's conventions: ``fit(X, lengths)`` reads every sequence end to end in ``X`` (one row
per position) with their ``lengths`` (None: one sequence), which is emgrid's ``Ragged``;
``tol`` is on the total log-likelihood and a change below it (a decrease too) stops the fit,
as hmmlearn's monitor does; ``n_iter`` bounds the iterations. ``init_params`` containing
every letter (the default) starts from emgrid's initialization; ``init_params=""`` starts
exactly from the ``startprob_``, ``transmat_`` and emission parameters set on the estimator
(hmmlearn's way to start where you choose, and to continue a fit).
"""

from __future__ import annotations

from numbers import Integral, Real

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted

from emgrid.models import HMM, Categorical, Composite, DiagGaussian, FullGaussian, Node, Poisson, Ragged

from .fitting import Stop, as_float64, fit_em, seed_of, validate_data


class _HMMEstimator(BaseEstimator):
    """What the three share: sequences, the fit, decoding, scores, sampling."""

    #: hmmlearn's letters of the parameters ``init_params`` names
    _letters = "st"
    #: the fitted attributes of the emissions, set from ``model_``
    _emission_attrs: tuple[str, ...] = ()

    _parameter_constraints: dict = {
        "n_components": [Interval(Integral, 1, None, closed="left")],
        "algorithm": [StrOptions({"viterbi"})],
        "random_state": ["random_state"],
        "n_iter": [Interval(Integral, 1, None, closed="left")],
        "tol": [Real],
        "verbose": ["verbose"],
        "init_params": [str],
        "n_init": [Interval(Integral, 1, None, closed="left")],
        "executor": "no_validation",
        "resources": "no_validation",
    }

    # ------------------------------------------------------------------ data
    def _ragged(self, X, lengths, reset: bool) -> Ragged:
        X = self._rows(validate_data(self, X, reset=reset, **self._check_args))
        n = X.shape[0]
        if lengths is None:
            lengths = np.array([n])
        lengths = np.asarray(lengths)
        if lengths.ndim != 1 or not np.issubdtype(lengths.dtype, np.integer) or (lengths < 0).any():
            raise ValueError(f"lengths must be a 1-D array of non-negative integers, got {lengths!r}")
        if lengths.sum() != n:
            raise ValueError(f"lengths array {lengths} doesn't sum to {n} samples")
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        return Ragged(self._values(X), offsets)

    _check_args: dict = {"dtype": [np.float64, np.float32]}

    def _rows(self, X: np.ndarray) -> np.ndarray:
        return as_float64(X)

    def _values(self, X: np.ndarray):
        """The emissions' data for every position."""
        return X

    # ------------------------------------------------------------------ fit
    def fit(self, X, lengths=None):
        """Estimates the parameters by EM on the sequences of ``X``; returns self."""
        self._validate_params()
        data = self._ragged(X, lengths, reset=True)
        start = self._start(data)
        stop = Stop(self.tol, per_row=False, signed=True, verbose=self.verbose, name=type(self).__name__)
        result = fit_em(data, start, stop=stop, max_iter=self.n_iter, n_init=self.n_init,
                        random_state=self.random_state, init="auto", executor=self.executor,
                        resources=self.resources, reg_covar=self._reg_covar(), warn_unconverged=False)
        model = result.model
        self.model_, self.fit_result_, self.plan_ = model, result, result.plan
        self.n_iter_, self.converged_ = result.iterations, result.converged
        self.startprob_ = np.array(model.initial, dtype=np.float64)
        self.transmat_ = np.array(model.transitions, dtype=np.float64)
        self._set_emissions(model.emissions)
        return self

    def _reg_covar(self) -> float:
        return 0.0

    def _start(self, data: Ragged) -> HMM:
        letters = set(self.init_params)
        if letters >= set(self._letters):
            return HMM([self._emission_template(data) for _ in range(self.n_components)])
        if letters:
            raise ValueError(f"init_params={self.init_params!r}: emgrid starts from every parameter set on the "
                             f"estimator (init_params='') or from none (init_params={self._letters!r})")
        missing = [a for a in ("startprob_", "transmat_", *self._emission_attrs) if not hasattr(self, a)]
        if missing:
            raise ValueError(f"init_params='' starts from the parameters set on the estimator, but "
                             f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set")
        length = data.offsets[-1] / max(1, data.offsets.size - 1)
        return HMM(self._emissions_given(), self.transmat_, self.startprob_, max(float(length), 1.0))

    # ------------------------------------------------------------------ answers
    def _checked(self, X, lengths) -> Ragged:
        check_is_fitted(self)
        return self._ragged(X, lengths, reset=False)

    def score(self, X, lengths=None) -> float:
        """The log-likelihood of the sequences of ``X``, summed."""
        data = self._checked(X, lengths)
        return float(self.model_.score_samples(data).sum())

    def score_samples(self, X, lengths=None):
        """``(log-likelihood, posteriors)``: the summed log-likelihood and each position's
        state probabilities, ``(n_samples, n_components)``."""
        data = self._checked(X, lengths)
        return float(self.model_.score_samples(data).sum()), self.model_.posterior_states(data).values

    def predict_proba(self, X, lengths=None):
        """Each position's state probabilities, ``(n_samples, n_components)``."""
        data = self._checked(X, lengths)
        return self.model_.posterior_states(data).values

    def decode(self, X, lengths=None, algorithm=None):
        """``(log_prob, states)``: the most probable state path of every sequence (Viterbi)
        and its joint log-probability with ``X``, summed over the sequences."""
        if algorithm not in (None, "viterbi"):
            raise ValueError(f"algorithm must be 'viterbi' (emgrid decodes by Viterbi only), got {algorithm!r}")
        data = self._checked(X, lengths)
        states = self.model_.viterbi(data).values
        return path_log_prob(self.model_, data, states), states

    def predict(self, X, lengths=None):
        """The Viterbi states of every position, ``(n_samples,)``."""
        return self.decode(X, lengths)[1]

    def bic(self, X, lengths=None) -> float:
        """Bayesian information criterion on the sequences of ``X`` (lower is better)."""
        data = self._checked(X, lengths)
        return self.model_.bic(data)

    def aic(self, X, lengths=None) -> float:
        """Akaike information criterion on the sequences of ``X`` (lower is better)."""
        data = self._checked(X, lengths)
        return self.model_.aic(data)

    def sample(self, n_samples=1, random_state=None, currstate=None):
        """``(X, states)``: one sequence of ``n_samples`` positions drawn from the fitted HMM."""
        check_is_fitted(self)
        rng = np.random.default_rng(seed_of(self.random_state if random_state is None else random_state))
        k, n = self.n_components, int(n_samples)
        cum_start, cum_trans = np.cumsum(self.startprob_), np.cumsum(self.transmat_, axis=1)
        states = np.empty(n, dtype=np.int64)
        u = rng.random(n)
        for t in range(n):
            if t == 0 and currstate is not None:
                states[0] = int(currstate)
                continue
            cum = cum_start if t == 0 else cum_trans[states[t - 1]]
            states[t] = min(int(np.searchsorted(cum, u[t], side="right")), k - 1)
        parts = [None] * k
        for j, emission in enumerate(self.model_.emissions):
            parts[j] = self._as_rows(emission.sample(int((states == j).sum()), rng))
        X = np.empty((n, parts[0].shape[1]), dtype=parts[0].dtype)
        for j in range(k):
            X[states == j] = parts[j]
        return X, states

    def _as_rows(self, sample) -> np.ndarray:
        if isinstance(sample, tuple):
            return np.column_stack(sample)
        return sample if sample.ndim == 2 else sample[:, None]


def path_log_prob(model: HMM, data: Ragged, states: np.ndarray) -> float:
    """``log p(X, states)`` of state paths: initial, transition and emission log-probabilities
    of the fitted model, summed over every position of every sequence."""
    pos = np.arange(states.size)
    emission = np.array([e.log_density(data.values) for e in model.emissions])  # (K, positions)
    starts = np.zeros(states.size, dtype=bool)
    starts[data.offsets[:-1][data.lengths > 0]] = True
    inner = pos[~starts]
    with np.errstate(divide="ignore"):
        return float(emission[states, pos].sum() + np.log(model.initial[states[starts]]).sum()
                     + np.log(model.transitions[states[inner - 1], states[inner]]).sum())


class GaussianHMM(_HMMEstimator):
    """hmmlearn's ``GaussianHMM``: Gaussian emissions, ``covariance_type`` ``"diag"`` (the
    default) or ``"full"`` (``"spherical"`` and ``"tied"`` have no emgrid family and are
    refused). ``min_covar`` is added to every fitted variance (emgrid's ``reg_covar``);
    hmmlearn uses it at initialization and regularizes by ``covars_prior`` instead.
    Fitted: ``startprob_``, ``transmat_``, ``means_``, ``covars_`` (hmmlearn's: full
    matrices, ``(n_components, n_features, n_features)``, whatever the type).
    """

    _letters = "stmc"
    _emission_attrs = ("means_", "covars_")
    _parameter_constraints = {**_HMMEstimator._parameter_constraints,
                              "covariance_type": [StrOptions({"spherical", "diag", "full", "tied"})],
                              "min_covar": [Interval(Real, 0.0, None, closed="left")]}

    def __init__(self, n_components=1, covariance_type="diag", min_covar=1e-3, algorithm="viterbi", random_state=None,
                 n_iter=10, tol=1e-2, verbose=False, init_params="stmc", n_init=1, executor="local", resources=None):
        self.n_components = n_components
        self.covariance_type = covariance_type
        self.min_covar = min_covar
        self.algorithm = algorithm
        self.random_state = random_state
        self.n_iter = n_iter
        self.tol = tol
        self.verbose = verbose
        self.init_params = init_params
        self.n_init = n_init
        self.executor = executor
        self.resources = resources

    @property
    def covars_(self) -> np.ndarray:
        """Each state's covariance matrix, ``(n_components, n_features, n_features)``."""
        c = self._covars_
        return np.array([np.diag(v) for v in c]) if self.covariance_type == "diag" else c

    @covars_.setter
    def covars_(self, value) -> None:
        """Takes hmmlearn's shape of ``covariance_type``: ``(K, d)`` for "diag", ``(K, d, d)`` for "full"."""
        c = np.array(value, dtype=np.float64)
        if self.covariance_type == "diag" and c.ndim == 3:
            c = np.array([np.diag(m) for m in c])
        self._covars_ = c

    def _leaf(self):
        if self.covariance_type not in ("diag", "full"):
            raise ValueError(f"covariance_type={self.covariance_type!r} needs a {self.covariance_type} Gaussian "
                             f"family, which emgrid does not have; use 'diag' or 'full'")
        return DiagGaussian if self.covariance_type == "diag" else FullGaussian

    def _reg_covar(self) -> float:
        return float(self.min_covar)

    def _emission_template(self, data: Ragged) -> Node:
        return self._leaf()(dim=data.values.shape[1])

    def _emissions_given(self) -> list[Node]:
        leaf = self._leaf()
        return [leaf(m, c) for m, c in zip(np.asarray(self.means_, dtype=np.float64), self._covars_)]

    def _set_emissions(self, emissions) -> None:
        self.means_ = np.array([e.mean for e in emissions], dtype=np.float64)
        self._covars_ = np.array([e.var if self.covariance_type == "diag" else e.cov for e in emissions])


def _integers(X: np.ndarray, who: str) -> np.ndarray:
    if not np.issubdtype(X.dtype, np.integer):
        if not np.all(np.isfinite(X)) or not np.all(X == np.round(X)):
            raise ValueError(f"{who} expects non-negative integers, got values such as {X[X != np.round(X)][:1]}")
        X = X.astype(np.int64)
    if (X < 0).any():
        raise ValueError(f"{who} expects non-negative integers, got {int(X.min())}")
    return np.ascontiguousarray(X, dtype=np.int64)


class PoissonHMM(_HMMEstimator):
    """hmmlearn's ``PoissonHMM``: each state emits independent Poisson counts, one per
    column of ``X``. Fitted: ``startprob_``, ``transmat_``, ``lambdas_`` ``(n_components, n_features)``."""

    _letters = "stl"
    _emission_attrs = ("lambdas_",)
    _check_args = {"dtype": None}

    def __init__(self, n_components=1, algorithm="viterbi", random_state=None, n_iter=10, tol=1e-2, verbose=False,
                 init_params="stl", n_init=1, executor="local", resources=None):
        self.n_components = n_components
        self.algorithm = algorithm
        self.random_state = random_state
        self.n_iter = n_iter
        self.tol = tol
        self.verbose = verbose
        self.init_params = init_params
        self.n_init = n_init
        self.executor = executor
        self.resources = resources

    def _rows(self, X):
        return _integers(X, type(self).__name__)

    def _values(self, X):
        return X[:, 0].copy() if X.shape[1] == 1 else tuple(X[:, j].copy() for j in range(X.shape[1]))

    @staticmethod
    def _emission(rates) -> Node:
        return Poisson(rates[0]) if len(rates) == 1 else Composite([Poisson(r) for r in rates])

    def _emission_template(self, data: Ragged) -> Node:
        d = 1 if not isinstance(data.values, tuple) else len(data.values)
        return Poisson() if d == 1 else Composite([Poisson() for _ in range(d)])

    def _emissions_given(self) -> list[Node]:
        return [self._emission(list(r)) for r in np.asarray(self.lambdas_, dtype=np.float64)]

    def _set_emissions(self, emissions) -> None:
        self.lambdas_ = np.array([[e.rate] if isinstance(e, Poisson) else [c.rate for c in e.children]
                                  for e in emissions], dtype=np.float64)


class CategoricalHMM(_HMMEstimator):
    """hmmlearn's ``CategoricalHMM``: each position is one symbol ``0..n_features-1`` (``X``
    of one column; ``n_features`` None: the largest symbol + 1). Fitted: ``startprob_``,
    ``transmat_``, ``emissionprob_`` ``(n_components, n_features)``."""

    _letters = "ste"
    _emission_attrs = ("emissionprob_",)
    _check_args = {"dtype": None}
    _parameter_constraints = {**_HMMEstimator._parameter_constraints,
                              "n_features": [Interval(Integral, 1, None, closed="left"), None]}

    def __init__(self, n_components=1, n_features=None, algorithm="viterbi", random_state=None, n_iter=10, tol=1e-2,
                 verbose=False, init_params="ste", n_init=1, executor="local", resources=None):
        self.n_components = n_components
        self.n_features = n_features
        self.algorithm = algorithm
        self.random_state = random_state
        self.n_iter = n_iter
        self.tol = tol
        self.verbose = verbose
        self.init_params = init_params
        self.n_init = n_init
        self.executor = executor
        self.resources = resources

    def _rows(self, X):
        X = _integers(X, type(self).__name__)
        if X.shape[1] != 1:
            raise ValueError(f"CategoricalHMM expects X of one column of symbols, got {X.shape[1]} columns")
        return X

    def _values(self, X):
        return X[:, 0].copy()

    def _emission_template(self, data: Ragged) -> Node:
        return Categorical(n_values=self.n_features)

    def _emissions_given(self) -> list[Node]:
        return [Categorical(p) for p in np.asarray(self.emissionprob_, dtype=np.float64)]

    def _set_emissions(self, emissions) -> None:
        self.emissionprob_ = np.array([e.probs for e in emissions], dtype=np.float64)
