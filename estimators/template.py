"""``EMEstimator``: any emgrid template (a spec dict or a model) as a scikit-learn estimator.

What ``fit`` reads follows the template: a template whose rows are vectors (a mixture of
``DiagGaussian`` or ``FullGaussian``) reads a 2-D float array, checked as scikit-learn checks
it, and a vector leaf of a spec dict without ``dim`` takes the array's number of columns; a
``Gaussian`` or ``Exponential`` root reads one column; any other template (a record, a
sequence, integer leaves) reads what ``optimize`` reads (a DataFrame by column name, a dict of
columns, a ``Ragged``), so a record mixture of a DataFrame fits inside a ``Pipeline`` and a
``GridSearchCV`` whose grid may search ``template`` itself (e.g. over ``k``).
"""

from __future__ import annotations

import copy
from numbers import Integral, Real

import numpy as np
from sklearn.base import BaseEstimator, DensityMixin
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted

from emgrid.models import Node, from_spec
from emgrid.models.init import INIT_METHODS

from .fitting import RowAnswers, Stop, as_float64, fit_em, seed_of, validate_data

#: leaf families of a spec whose ``dim`` the data's columns give
VECTOR_FAMILIES = ("DiagGaussian", "FullGaussian")


def _with_dims(spec, d: int):
    """A copy of ``spec`` with ``dim = d`` on every vector leaf that has neither ``dim`` nor a mean."""
    if isinstance(spec, list):
        return [_with_dims(s, d) for s in spec]
    if not isinstance(spec, dict):
        return spec
    out = {k: _with_dims(v, d) for k, v in spec.items()}
    if out.get("family") in VECTOR_FAMILIES and "dim" not in out and "mean" not in out:
        out["dim"] = d
    return out


def _reads(template) -> str:
    """``"vectors"``, ``"floats"`` or ``"other"``: the rows the template's root reads."""
    if isinstance(template, dict):
        template = from_spec(_with_dims(template, 1))
    kind = template.data_type()
    return "vectors" if kind.startswith("vec[") else "floats" if kind == "float" else "other"


class EMEstimator(RowAnswers, DensityMixin, BaseEstimator):
    """Fits ``template`` by emgrid's EM; the answers are the fitted model's.

    ``tol`` is on the per-row mean log-likelihood, as scikit-learn's mixtures' (see
    ``estimators.fitting``); ``init``, ``reg_covar`` and ``pseudo_count`` are
    ``optimize``'s, and so is ``dtype`` (``"float32"``: rows and E-step in float32, statistics
    in float64). Fitted: ``model_`` (the emgrid model), ``plan_``, ``fit_result_``,
    ``n_iter_``, ``converged_``, ``lower_bound_`` (the last per-row mean log-likelihood),
    ``n_features_in_`` (and ``feature_names_in_`` from a DataFrame). ``predict`` and
    ``predict_proba`` answer about the Mixture or HMM at the root.
    """

    _parameter_constraints: dict = {
        "template": [dict, Node],
        "n_init": [Interval(Integral, 1, None, closed="left")],
        "tol": [Interval(Real, 0.0, None, closed="left")],
        "max_iter": [Interval(Integral, 1, None, closed="left")],
        "random_state": ["random_state"],
        "init": [StrOptions(set(INIT_METHODS))],
        "reg_covar": [Interval(Real, 0.0, None, closed="left")],
        "pseudo_count": [Interval(Real, 0.0, None, closed="left")],
        "executor": "no_validation",
        "resources": "no_validation",
        "dtype": [StrOptions({"float64", "float32"})],
        "verbose": ["verbose"],
    }

    def __init__(self, template, *, n_init=1, tol=1e-3, max_iter=100, random_state=None, init="auto",
                 reg_covar=0.0, pseudo_count=0.0, executor="local", resources=None, verbose=0, dtype="float64"):
        self.template = template
        self.n_init = n_init
        self.tol = tol
        self.max_iter = max_iter
        self.random_state = random_state
        self.init = init
        self.reg_covar = reg_covar
        self.pseudo_count = pseudo_count
        self.executor = executor
        self.resources = resources
        self.dtype = dtype
        self.verbose = verbose

    def _data(self, X, reset: bool):
        reads = _reads(self.template)
        if reads == "other":
            validate_data(self, X, skip_check_array=True, reset=reset)
            return X
        X = as_float64(validate_data(self, X, dtype=[np.float64, np.float32], ensure_min_samples=2 if reset else 1,
                                     reset=reset))
        if reads == "floats":
            if X.shape[1] != 1:
                raise ValueError(f"the template's root reads one float per row, so X must have 1 column, "
                                 f"got {X.shape[1]}")
            return X[:, 0]
        return X

    def _model(self, X) -> Node:
        t = self.template
        if isinstance(t, dict):
            return from_spec(_with_dims(t, X.shape[1]) if _reads(t) == "vectors" else copy.deepcopy(t))
        return t

    def fit(self, X, y=None):
        """Fits the template to ``X`` (``n_init`` starts, the best kept); returns self."""
        self._validate_params()
        X = self._data(X, reset=True)
        model = self._model(X)
        stop = Stop(self.tol, per_row=True, verbose=self.verbose, name=type(self).__name__)
        result = fit_em(X, model, stop=stop, max_iter=self.max_iter, n_init=self.n_init, random_state=self.random_state,
                        init=self.init, executor=self.executor, resources=self.resources, reg_covar=self.reg_covar,
                        pseudo_count=self.pseudo_count, dtype=self.dtype)
        self.model_, self.fit_result_, self.plan_ = result.model, result, result.plan
        self.n_iter_, self.converged_ = result.iterations, result.converged
        self.lower_bound_ = result.log_likelihood[-1] / result.plan.n_data
        return self

    def _checked(self, X):
        check_is_fitted(self)
        return self._data(X, reset=False)

    def sample(self, n_samples=1):
        """``n_samples`` rows drawn from the fitted model, in emgrid's encoding."""
        check_is_fitted(self)
        return self.model_.sample(int(n_samples), np.random.default_rng(seed_of(self.random_state)))

