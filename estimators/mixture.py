"""``GaussianMixture``: scikit-learn's estimator of that name over ``Mixture`` of
``FullGaussian`` or ``DiagGaussian`` components and ``optimize``.

Parameters, defaults and fitted attributes are scikit-learn's; ``tol`` is on the per-row
mean log-likelihood and stops where scikit-learn's does (``estimators.fitting``), and
``reg_covar`` is emgrid's (added to every fitted variance and covariance diagonal, as
scikit-learn's). With ``weights_init``, ``means_init`` and ``precisions_init`` all given the
fit starts exactly there, as scikit-learn's does, and the two give the same trace; with
``means_init`` alone the weights and covariances come from the rows nearest each mean;
otherwise emgrid's own initialization (``init_params``: ``"kmeans"`` and ``"k-means++"``
run its k-means++, ``"random"`` and ``"random_from_data"`` its random partition).
"""

from __future__ import annotations

from numbers import Integral, Real

import numpy as np
from scipy.linalg import solve_triangular
from sklearn.base import BaseEstimator, DensityMixin
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted

from emgrid.models import DiagGaussian, FullGaussian, Mixture

from .fitting import RowAnswers, Stop, as_float64, fit_em, seed_of, validate_data

#: scikit-learn's ``init_params`` -> ``optimize``'s ``init``
INIT = {"kmeans": "kmeans", "k-means++": "kmeans", "random": "random", "random_from_data": "random"}
#: covariance types with an emgrid family
LEAVES = {"full": FullGaussian, "diag": DiagGaussian}


def _check_shape(value, shape: tuple[int, ...], name: str) -> np.ndarray:
    a = np.asarray(value, dtype=np.float64)
    if a.shape != shape:
        raise ValueError(f"The parameter '{name}' should have the shape of {shape}, but got {a.shape}")
    return a


class GaussianMixture(RowAnswers, DensityMixin, BaseEstimator):
    """A Gaussian mixture fitted by emgrid's EM, with scikit-learn's interface.

    Beyond scikit-learn's parameters: ``executor`` (``"local"``, ``"multiprocessing"``,
    ``"mpi"``, ``"dask"``, ``"ray"`` or an executor), ``resources`` (a
    ``planner.Resources``; None: what the executor has at hand) and ``dtype``
    (``"float32"`` holds the rows and runs the E-step in float32, statistics in float64). Fitted, beyond
    scikit-learn's attributes: ``model_`` (the emgrid ``Mixture``), ``plan_`` (the plan it
    ran) and ``fit_result_`` (the ``FitResult``: trace, timings, bytes moved).
    ``covariance_type`` ``"tied"`` and ``"spherical"`` have no emgrid family and are refused.
    """

    _parameter_constraints: dict = {
        "n_components": [Interval(Integral, 1, None, closed="left")],
        "covariance_type": [StrOptions({"full", "tied", "diag", "spherical"})],
        "tol": [Interval(Real, 0.0, None, closed="left")],
        "reg_covar": [Interval(Real, 0.0, None, closed="left")],
        "max_iter": [Interval(Integral, 1, None, closed="left")],
        "n_init": [Interval(Integral, 1, None, closed="left")],
        "init_params": [StrOptions(set(INIT))],
        "weights_init": ["array-like", None],
        "means_init": ["array-like", None],
        "precisions_init": ["array-like", None],
        "random_state": ["random_state"],
        "warm_start": ["boolean"],
        "verbose": ["verbose"],
        "verbose_interval": [Interval(Integral, 1, None, closed="left")],
        "executor": "no_validation",
        "resources": "no_validation",
        "dtype": [StrOptions({"float64", "float32"})],
    }

    def __init__(self, n_components=1, *, covariance_type="full", tol=1e-3, reg_covar=1e-6, max_iter=100, n_init=1,
                 init_params="kmeans", weights_init=None, means_init=None, precisions_init=None, random_state=None,
                 warm_start=False, verbose=0, verbose_interval=10, executor="local", resources=None,
                 dtype="float64"):
        self.n_components = n_components
        self.covariance_type = covariance_type
        self.tol = tol
        self.reg_covar = reg_covar
        self.max_iter = max_iter
        self.n_init = n_init
        self.init_params = init_params
        self.weights_init = weights_init
        self.means_init = means_init
        self.precisions_init = precisions_init
        self.random_state = random_state
        self.warm_start = warm_start
        self.verbose = verbose
        self.verbose_interval = verbose_interval
        self.executor = executor
        self.resources = resources
        self.dtype = dtype

    # ------------------------------------------------------------------ fit
    def fit(self, X, y=None):
        """Estimates the parameters by EM (``n_init`` starts, the best kept); returns self."""
        self._fit(X)
        return self

    def fit_predict(self, X, y=None):
        """Fits, then returns the most probable component of every row of ``X``."""
        return self._fit(X).predict(X)

    def _fit(self, X) -> "GaussianMixture":
        self._validate_params()
        if self.covariance_type not in LEAVES:
            raise ValueError(f"covariance_type={self.covariance_type!r} needs a {self.covariance_type} Gaussian family, "
                             f"which emgrid does not have; use 'full' or 'diag'")
        warm = self.warm_start and hasattr(self, "model_")
        X = as_float64(validate_data(self, X, dtype=[np.float64, np.float32], ensure_min_samples=2, reset=not warm))
        n = X.shape[0]
        if n < self.n_components:
            raise ValueError(f"Expected n_samples >= n_components but got n_components = {self.n_components}, "
                             f"n_samples = {n}")
        start = self.model_ if warm else self._start(X)
        stop = Stop(self.tol, per_row=True, previous=self.lower_bound_ if warm else None,
                    verbose=self.verbose, interval=self.verbose_interval, name=type(self).__name__)
        result = fit_em(X, start, stop=stop, max_iter=self.max_iter, n_init=1 if warm else self.n_init,
                        random_state=self.random_state, init=INIT[self.init_params], executor=self.executor,
                        resources=self.resources, reg_covar=self.reg_covar, dtype=self.dtype)
        self._set_fitted(result, n)
        return self

    def _start(self, X: np.ndarray) -> Mixture:
        """The template, or the complete model the ``*_init`` parameters give."""
        k, d = self.n_components, X.shape[1]
        leaf = LEAVES[self.covariance_type]
        inits = (self.weights_init, self.means_init, self.precisions_init)
        if all(v is None for v in inits):
            return Mixture([leaf(dim=d) for _ in range(k)])
        if self.means_init is None:
            raise ValueError("weights_init or precisions_init needs means_init too: emgrid starts either from given "
                             "means or from its own initialization")
        means = _check_shape(self.means_init, (k, d), "means")
        near = ((X[:, None, :] - means[None, :, :]) ** 2).sum(axis=2).argmin(axis=1)
        if self.weights_init is not None:
            weights = _check_shape(self.weights_init, (k,), "weights")
        else:
            counts = np.maximum(np.bincount(near, minlength=k), 1)  # no component starts at weight 0
            weights = counts / counts.sum()
        if self.precisions_init is not None:
            shape = (k, d, d) if self.covariance_type == "full" else (k, d)
            prec = _check_shape(self.precisions_init, shape, "precisions")
            covs = np.linalg.inv(prec) if self.covariance_type == "full" else 1.0 / prec
        else:
            covs = np.array([_scatter(X[near == j] if (near == j).sum() > 1 else X, self.covariance_type)
                             for j in range(k)]) + self._reg(d)
        return Mixture([leaf(means[j], covs[j]) for j in range(k)], weights)

    def _reg(self, d: int) -> np.ndarray:
        return self.reg_covar * (np.eye(d) if self.covariance_type == "full" else np.ones(d))

    def _set_fitted(self, result, n: int) -> None:
        model = result.model
        self.model_, self.fit_result_, self.plan_ = model, result, result.plan
        self.weights_ = np.array(model.weights, dtype=np.float64)
        self.means_ = np.array([c.mean for c in model.components], dtype=np.float64)
        if self.covariance_type == "full":
            self.covariances_ = np.array([c.cov for c in model.components], dtype=np.float64)
            eye = np.eye(self.means_.shape[1])
            self.precisions_cholesky_ = np.array([solve_triangular(np.linalg.cholesky(c), eye, lower=True).T
                                                  for c in self.covariances_])
            self.precisions_ = np.einsum("kij,klj->kil", self.precisions_cholesky_, self.precisions_cholesky_)
        else:
            self.covariances_ = np.array([c.var for c in model.components], dtype=np.float64)
            self.precisions_cholesky_ = 1.0 / np.sqrt(self.covariances_)
            self.precisions_ = 1.0 / self.covariances_
        self.lower_bounds_ = [ll / n for ll in result.log_likelihood]
        self.lower_bound_ = self.lower_bounds_[-1]
        self.n_iter_ = result.iterations
        self.converged_ = result.converged

    # ------------------------------------------------------------------ answers
    def _checked(self, X) -> np.ndarray:
        check_is_fitted(self)
        return as_float64(validate_data(self, X, dtype=[np.float64, np.float32], reset=False))

    def sample(self, n_samples=1):
        """``(X, y)``: ``n_samples`` rows drawn from the fitted mixture and their components."""
        check_is_fitted(self)
        if isinstance(n_samples, bool) or not isinstance(n_samples, Integral) or n_samples < 1:
            raise ValueError(f"Invalid value for 'n_samples': {n_samples} . The sampling requires at least one sample.")
        X, labels = self.model_.sample(int(n_samples), np.random.default_rng(seed_of(self.random_state)), latent=True)
        return X, labels[""]


def _scatter(X: np.ndarray, covariance_type: str) -> np.ndarray:
    """The rows' covariance (``"full"``) or variances (``"diag"``), by ``1/n``."""
    centred = X - X.mean(axis=0)
    if covariance_type == "full":
        return centred.T @ centred / X.shape[0]
    return (centred ** 2).mean(axis=0)
