"""The estimator protocol where users meet it: clone, params, pickling, errors before fit,
input checks with scikit-learn's messages, DataFrames, a record mixture in a pipeline and a
search over its template, the plan and trace kept, and the lazy scikit-learn import."""

import pickle
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

pytest.importorskip("sklearn")

import pandas as pd  # noqa: E402
from sklearn.base import clone  # noqa: E402
from sklearn.compose import ColumnTransformer  # noqa: E402
from sklearn.datasets import load_iris  # noqa: E402
from sklearn.exceptions import NotFittedError  # noqa: E402
from sklearn.model_selection import GridSearchCV  # noqa: E402
from sklearn.pipeline import Pipeline  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402

import emgrid  # noqa: E402
from emgrid.estimators import CategoricalHMM, EMEstimator, GaussianHMM, GaussianMixture, PoissonHMM  # noqa: E402
from emgrid.models import Mixture  # noqa: E402
from emgrid.planner import BalancePlan  # noqa: E402

X = load_iris().data


def run_fresh(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)


def test_import_emgrid_does_not_load_scikit_learn_and_the_facade_reexports_the_estimators():
    done = run_fresh("""
        import sys, emgrid
        from emgrid import *
        print('sklearn' in sys.modules)
        emgrid.GaussianMixture
        print('sklearn' in sys.modules)
    """)
    assert done.returncode == 0 and done.stdout.split() == ["False", "True"], done.stderr
    assert emgrid.GaussianMixture is GaussianMixture and emgrid.EMEstimator is EMEstimator


def test_a_users_own_estimators_module_does_not_shadow_emgrids(tmp_path):
    (tmp_path / "estimators.py").write_text("raise ImportError('the working folder\'s estimators.py was imported')\n")
    done = subprocess.run([sys.executable, "-c", "from emgrid.estimators import GaussianMixture; "
                           "print(GaussianMixture.__module__)"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "emgrid.estimators.mixture", done.stderr


def test_without_scikit_learn_the_estimators_say_which_extra_to_install():
    done = run_fresh("""
        import sys
        sys.modules['sklearn'] = None  # as if it were not installed
        import emgrid
        emgrid.GaussianMixture
    """)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode != 0
    assert last == 'ImportError: emgrid.estimators needs scikit-learn: pip install "emgrid[sklearn]"', last


def test_fitted_attributes_plan_and_trace():
    gm = GaussianMixture(3, random_state=0).fit(X)
    assert isinstance(gm.plan_, BalancePlan) and gm.plan_.n_data == 150
    assert isinstance(gm.model_, Mixture)
    trace = gm.fit_result_.log_likelihood
    assert len(trace) == gm.n_iter_ and np.all(np.diff(trace) > -1e-9)
    assert gm.lower_bound_ == pytest.approx(trace[-1] / 150, rel=1e-12)
    assert gm.weights_.shape == (3,) and gm.means_.shape == (3, 4) and gm.covariances_.shape == (3, 4, 4)
    np.testing.assert_allclose(gm.precisions_ @ gm.covariances_, np.broadcast_to(np.eye(4), (3, 4, 4)), atol=1e-8)
    assert gm.n_features_in_ == 4 and gm.converged_
    assert (gm.fit_predict(X) == gm.predict(X)).all()
    Xs, ys = gm.sample(50)
    assert Xs.shape == (50, 4) and ys.shape == (50,) and set(ys) <= {0, 1, 2}


def test_clone_params_and_pickle():
    gm = GaussianMixture(2, covariance_type="diag", random_state=0, executor="multiprocessing")
    copy = clone(gm)
    assert copy.get_params() == gm.get_params() and not hasattr(copy, "model_")
    gm.set_params(n_components=3, executor="local").fit(X)
    again = pickle.loads(pickle.dumps(gm))
    np.testing.assert_array_equal(again.predict_proba(X), gm.predict_proba(X))
    assert again.plan_ == gm.plan_


@pytest.mark.parametrize("est", [GaussianMixture(), EMEstimator({"family": "Mixture", "k": 2,
                                                                 "component": {"family": "DiagGaussian"}}),
                                 GaussianHMM(), PoissonHMM(), CategoricalHMM()],
                         ids=lambda e: type(e).__name__)
def test_answers_before_fit_raise_not_fitted(est):
    with pytest.raises(NotFittedError, match="not fitted yet"):
        est.score(X.astype(int) if isinstance(est, (PoissonHMM, CategoricalHMM)) else X)


def test_input_checks_speak_scikit_learn():
    gm = GaussianMixture(2, random_state=0).fit(X)
    with pytest.raises(ValueError, match="X has 3 features, but GaussianMixture is expecting 4 features as input"):
        gm.predict(X[:, :3])
    with pytest.raises(ValueError, match="Input X contains NaN"):
        GaussianMixture().fit(np.where(X > 7, np.nan, X))
    with pytest.raises(ValueError, match="Expected n_samples >= n_components but got n_components = 5, n_samples = 4"):
        GaussianMixture(5).fit(X[:4])
    with pytest.raises(ValueError, match="The 'n_components' parameter of GaussianMixture must be an int in the range"):
        GaussianMixture(0).fit(X)
    for kind in ("tied", "spherical"):
        with pytest.raises(ValueError, match=f"covariance_type='{kind}' needs a {kind} Gaussian family"):
            GaussianMixture(2, covariance_type=kind).fit(X)
    with pytest.raises(ValueError, match=r"The parameter 'means' should have the shape of \(2, 4\), but got \(3, 4\)"):
        GaussianMixture(2, means_init=X[:3]).fit(X)
    with pytest.raises(ValueError, match="lengths array .* doesn't sum to 150 samples"):
        GaussianHMM(2).fit(X, [100, 40])
    with pytest.raises(ValueError, match="init_params='' starts from the parameters set on the estimator, but "
                                         "startprob_, transmat_, means_, covars_ are not set"):
        GaussianHMM(2, init_params="").fit(X)


def test_feature_names_from_a_dataframe():
    df = pd.DataFrame(X, columns=load_iris().feature_names)
    gm = GaussianMixture(2, random_state=0).fit(df)
    assert list(gm.feature_names_in_) == load_iris().feature_names
    with pytest.warns(UserWarning, match="X does not have valid feature names"):
        np.testing.assert_allclose(gm.score_samples(df), gm.score_samples(X))


def test_means_init_alone_starts_from_the_rows_nearest_each_mean():
    gm = GaussianMixture(3, means_init=X[[0, 60, 120]], max_iter=1, tol=0).fit(X)
    assert gm.n_iter_ == 1 and np.isfinite(gm.lower_bound_)


def _records(n=300, seed=0):
    rng = np.random.default_rng(seed)
    z = rng.integers(0, 2, n)
    return pd.DataFrame({"x": rng.normal(4 * z, 1), "y": rng.normal(-3 * z, 1),
                         "color": np.where(rng.random(n) < np.where(z == 1, 0.9, 0.2), "red", "blue"),
                         "visits": rng.poisson(np.where(z == 1, 2, 7))}), z


def _record_spec(k: int) -> dict:
    record = {"family": "Composite", "children": [{"family": "DiagGaussian", "dim": 2}, {"family": "Categorical"},
                                                  {"family": "Poisson"}],
              "fields": ["pos", "color", "visits"], "columns": {"pos": ["x", "y"]}}
    return {"family": "Mixture", "k": k, "component": record}


def test_a_record_mixture_of_a_dataframe_in_a_pipeline_and_a_search_over_its_template():
    df, z = _records()
    scale = ColumnTransformer([("num", StandardScaler(), ["x", "y"])], remainder="passthrough",
                              verbose_feature_names_out=False).set_output(transform="pandas")
    pipe = Pipeline([("prep", scale), ("em", EMEstimator(_record_spec(2), random_state=0))])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        search = GridSearchCV(pipe, {"em__template": [_record_spec(k) for k in (1, 2, 3)]}, cv=3).fit(df)
    assert search.best_params_["em__template"]["k"] == 2
    labels = search.predict(df)
    agree = (labels == z).mean()
    assert max(agree, 1 - agree) > 0.95
    fitted = search.best_estimator_[-1]
    assert list(fitted.feature_names_in_) == ["x", "y", "color", "visits"]
    assert fitted.model_.to_spec()["components"][0]["fields"] == ["pos", "color", "visits"]


def test_categorical_hmm_fits_symbols():
    rng = np.random.default_rng(0)
    states = np.repeat(rng.integers(0, 2, 40), 10)
    symbols = np.where(states == 0, rng.integers(0, 2, 400), rng.integers(2, 4, 400))[:, None]
    est = CategoricalHMM(2, n_iter=50, random_state=0).fit(symbols, [100] * 4)
    assert est.emissionprob_.shape == (2, 4) and est.transmat_.shape == (2, 2)
    agree = (est.predict(symbols, [100] * 4) == states).mean()
    assert max(agree, 1 - agree) > 0.9
    sample, path = est.sample(30, random_state=1)
    assert sample.shape == (30, 1) and path.shape == (30,)
