"""emgrid: exact CP-SAT planning and model-parallel EM for nested probabilistic models.

The names a user needs first, importable from here; each loads its layer on first use, so
``import emgrid`` is cheap and loads neither OR-Tools nor MPI::

    from emgrid import Mixture, FullGaussian, Resources, balance_plan, optimize

Every model family registered in ``emgrid.models.FAMILIES`` is importable from here by its
name (``from emgrid import Gaussian``), a new family as soon as its module has been loaded:
the facade reads the registry, it lists no family itself.

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

#: public name -> the subpackage that defines it (the model families besides: see ``_families``)
_EXPORTS: dict[str, str] = {
    **{name: "emgrid.models" for name in (
        "Ragged", "from_spec", "load_model", "save_model", "EmgridError", "ModelError", "SpecError", "DataError")},
    **{name: "emgrid.planner" for name in (
        "Resources", "Worker", "Network", "SolverConfig", "balance_plan", "validate_plan",
        "plan_from_assignment", "BalancePlan", "ModelCut", "PlanError", "InfeasiblePlanError")},
    **{name: "emgrid.executors" for name in ("optimize", "get", "FitResult")},
}
#: the scikit-learn-style estimators, loaded (with scikit-learn) on first use
_ESTIMATORS = ("GaussianMixture", "GaussianHMM", "PoissonHMM", "CategoricalHMM", "EMEstimator")
_STAR = tuple(_EXPORTS)
_EXPORTS.update({name: "emgrid.estimators" for name in _ESTIMATORS})


def _families() -> dict[str, type]:
    """The registry of model families by name (loads ``emgrid.models``)."""
    return importlib.import_module("emgrid.models").FAMILIES


def __getattr__(name: str):
    if name == "__all__":  # what ``from emgrid import *`` takes: computed, as families may register later
        return sorted({*_STAR, *_families()})
    if name.startswith("_"):
        raise AttributeError(f"module 'emgrid' has no attribute {name!r}")
    module = _EXPORTS.get(name)
    value = getattr(importlib.import_module(module), name) if module is not None else _families().get(name)
    if value is None:
        raise AttributeError(f"module 'emgrid' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS) | set(_families()))
