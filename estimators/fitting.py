"""What every estimator's fit shares: scikit-learn's input checks, the seed a
``random_state`` gives, the peer library's stopping rule, and the one call to ``optimize``.

**Stopping.** ``optimize``'s own rule is relative (``|ll_t - ll_{t-1}| <= tol * |ll_t|``),
scikit-learn's is absolute on the per-row mean (``|mean_t - mean_{t-1}| < tol``) and
hmmlearn's is signed on the total (``ll_t - ll_{t-1} < tol``): no constant turns one into
another, since ``|ll_t|`` moves during the fit. So the estimators run ``optimize`` with
``tol=0`` and a :class:`Stop` callback that applies the peer's rule to the same trace and
marks the result converged, which ends the loop after that iteration (``executors.loop``
reads ``result.converged`` after the callback). The same ``tol`` therefore stops at the same
iteration as the peer's.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import check_random_state

from emgrid.executors import FitResult, optimize
from emgrid.executors.api import DEFAULT_INIT_ITER
from emgrid.models import Node

try:
    from sklearn.utils.validation import validate_data
except ImportError:  # scikit-learn < 1.6: the same checks were a method of BaseEstimator
    def validate_data(estimator, X="no_validation", y="no_validation", reset=True, skip_check_array=False, **kw):
        if skip_check_array:
            estimator._check_n_features(X, reset=reset)
            estimator._check_feature_names(X, reset=reset)
            return X
        return estimator._validate_data(X, y, reset=reset, **kw)

__all__ = ["Stop", "fit_em", "seed_of", "validate_data", "as_float64"]


def seed_of(random_state) -> int:
    """The ``seed`` of ``optimize`` for scikit-learn's ``random_state`` (None, an int or a
    ``RandomState``): an int gives the same seed every time, None a fresh one."""
    return int(check_random_state(random_state).randint(np.iinfo(np.int32).max))


def as_float64(X) -> np.ndarray:
    """A C-contiguous float64 copy-if-needed of a validated array (emgrid's encoding)."""
    return np.ascontiguousarray(X, dtype=np.float64)


@dataclass
class Stop:
    """The peer's stopping rule as an ``optimize`` callback (see the module docstring).

    ``per_row``: the rule reads the per-row mean log-likelihood (scikit-learn's; the rows are
    the plan's ``n_data``), else the total (hmmlearn's); ``signed`` stops on ``ll_t - ll_{t-1} < tol``
    (hmmlearn: a decrease stops too) instead of ``|ll_t - ll_{t-1}| < tol``; ``previous`` is
    the value before the first iteration (a warm start's last), in the rule's units.
    """

    tol: float
    per_row: bool
    signed: bool = False
    previous: float | None = None
    #: print every ``interval``-th iteration when ``verbose`` (scikit-learn's ``verbose_interval``)
    verbose: int = 0
    interval: int = 1
    name: str = ""

    def __call__(self, iteration: int, log_likelihood: float, result: FitResult) -> None:
        value = log_likelihood / result.plan.n_data if self.per_row else log_likelihood
        change = None if self.previous is None else value - self.previous
        if change is not None:
            result.converged = bool((change if self.signed else abs(change)) < self.tol)
        if self.verbose and iteration % self.interval == 0:
            shown = "" if change is None else f"  change {change:+.6g}"
            print(f"{self.name} iteration {iteration}: log-likelihood {value:.8g}{shown}")
        self.previous = value


def fit_em(data, model: Node, *, stop: Stop, max_iter: int, n_init: int, random_state, init: str,
           executor, resources, reg_covar: float = 0.0, pseudo_count: float = 0.0,
           warn_unconverged: bool = True, dtype: str = "float64") -> FitResult:
    """``optimize`` with the peer's stopping rule; the result without its grid handle
    (``shards``), so it pickles. A template's ``n_init`` starts are each refined by
    ``init_iter`` EM iterations (1 for a single start, else ``min(10, max_iter)``) before
    the best runs for at most ``max_iter``; a complete model is a warm start."""
    init_iter = 1 if n_init == 1 else min(DEFAULT_INIT_ITER, max_iter)
    # with tol=0 optimize never warns "not converged": the peer's rule decides below
    result = optimize(data, model, executor=executor, resources=resources, max_iter=max_iter, tol=0.0,
                      callback=stop, n_init=n_init, seed=seed_of(random_state), init=init, init_iter=init_iter,
                      reg_covar=reg_covar, pseudo_count=pseudo_count, dtype=dtype)
    if warn_unconverged and not result.converged and stop.tol > 0:
        warnings.warn(f"{stop.name}: the best initialization did not converge within max_iter={max_iter} "
                      f"iterations (tol={stop.tol:g}); increase max_iter or tol", ConvergenceWarning, stacklevel=3)
    return replace(result, shards=None)


class RowAnswers:
    """The answers of an estimator whose fitted ``model_`` scores rows: each checks the
    estimator is fitted and ``X`` as it was (the class's ``_checked``), then asks the model."""

    def _checked(self, X):
        raise NotImplementedError

    def predict(self, X):
        """The most probable child of the root Mixture (or HMM) per row, ``(n,)`` int64."""
        data = self._checked(X)  # NotFittedError before the model is looked at
        return self.model_.predict(data)

    def predict_proba(self, X):
        """The posterior weight of each child of the root Mixture (or HMM) per row."""
        data = self._checked(X)
        return self.model_.predict_proba(data)

    def score_samples(self, X):
        """The log-likelihood of every row, ``(n,)``."""
        data = self._checked(X)
        return self.model_.score_samples(data)

    def score(self, X, y=None):
        """The mean log-likelihood per row (higher is better)."""
        return float(self.score_samples(X).mean())

    def bic(self, X):
        """Bayesian information criterion on ``X`` (lower is better; scikit-learn's count of
        parameters)."""
        data = self._checked(X)
        return self.model_.bic(data)

    def aic(self, X):
        """Akaike information criterion on ``X`` (lower is better)."""
        data = self._checked(X)
        return self.model_.aic(data)
