"""``Pipeline([StandardScaler(), GaussianMixture()])`` in ``GridSearchCV`` over
``n_components`` and ``covariance_type``: it runs on the local and multiprocessing executors,
and picks what scikit-learn's own GaussianMixture picks on iris, wine and breast cancer."""

import warnings

import numpy as np
import pytest

pytest.importorskip("sklearn")

from sklearn.datasets import load_breast_cancer, load_iris, load_wine  # noqa: E402
from sklearn.exceptions import ConvergenceWarning  # noqa: E402
from sklearn.mixture import GaussianMixture as SkGaussianMixture  # noqa: E402
from sklearn.model_selection import GridSearchCV, KFold  # noqa: E402
from sklearn.pipeline import Pipeline  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402

from emgrid.estimators import GaussianMixture  # noqa: E402

GRID = {"gm__n_components": [1, 2, 3], "gm__covariance_type": ["full", "diag"]}
LOADERS = [load_iris, load_wine, load_breast_cancer]


def search(gm, X, folds: int) -> GridSearchCV:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        cv = KFold(folds, shuffle=True, random_state=0)
        return GridSearchCV(Pipeline([("scale", StandardScaler()), ("gm", gm)]), GRID, cv=cv).fit(X)


@pytest.mark.parametrize("load", LOADERS, ids=lambda f: f.__name__[5:])
def test_grid_search_picks_what_scikit_learn_picks(load):
    X = load().data
    theirs = search(SkGaussianMixture(random_state=0), X, folds=3)
    ours = search(GaussianMixture(random_state=0), X, folds=3)
    assert ours.best_params_ == theirs.best_params_
    assert isinstance(ours.best_estimator_[-1], GaussianMixture)
    assert ours.best_estimator_[-1].plan_.n_data == X.shape[0]


def test_grid_search_on_multiprocessing_scores_as_local_does():
    """The executor is a parameter like any other: a search spread over workers scores every
    candidate as the local one does (one data set: the search itself is checked on all three
    above)."""
    X = load_wine().data
    local = search(GaussianMixture(random_state=0), X, folds=2)
    spread = search(GaussianMixture(random_state=0, executor="multiprocessing"), X, folds=2)
    theirs = search(SkGaussianMixture(random_state=0), X, folds=2)
    np.testing.assert_allclose(spread.cv_results_["mean_test_score"], local.cv_results_["mean_test_score"], rtol=1e-9)
    assert spread.best_params_ == local.best_params_ == theirs.best_params_
    assert spread.best_estimator_[-1].fit_result_.executor == "multiprocessing"
