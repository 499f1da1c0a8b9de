"""emgrid: exact CP-SAT planning and model-parallel EM for nested probabilistic models.

The names a user needs first, importable from here; each loads its layer on first use, so
``import emgrid`` is cheap and loads neither OR-Tools nor MPI::

    from emgrid import Mixture, FullGaussian, Resources, balance_plan, optimize

The layers themselves are ``emgrid.models`` (the model tree), ``emgrid.planner`` (the exact
balance plan), ``emgrid.executors`` (the EM engines) and ``emgrid.estimators`` (scikit-learn
and hmmlearn estimators over them), imported one way:
models <- planner <- executors <- estimators, cli. The estimators need scikit-learn
(``pip install "emgrid[sklearn]"``), which ``import emgrid`` never loads; they stay out of
``__all__`` so ``from emgrid import *`` works without it.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

#: public name -> the subpackage that defines it
_EXPORTS: dict[str, str] = {
    **{name: "emgrid.models" for name in (
        "Gaussian", "DiagGaussian", "FullGaussian", "Categorical", "Poisson", "Exponential",
        "Composite", "Mixture", "HMM", "Sequence", "Ragged", "from_spec", "load_model", "save_model",
        "EmgridError", "ModelError", "SpecError", "DataError")},
    **{name: "emgrid.planner" for name in (
        "Resources", "Worker", "Network", "SolverConfig", "balance_plan", "validate_plan",
        "plan_from_assignment", "BalancePlan", "ModelCut", "PlanError", "InfeasiblePlanError")},
    **{name: "emgrid.executors" for name in ("optimize", "get", "FitResult")},
}
#: the scikit-learn-style estimators, loaded (with scikit-learn) on first use
_ESTIMATORS = ("GaussianMixture", "GaussianHMM", "PoissonHMM", "CategoricalHMM", "EMEstimator")

__all__ = sorted(_EXPORTS)
_EXPORTS.update({name: "emgrid.estimators" for name in _ESTIMATORS})


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'emgrid' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
