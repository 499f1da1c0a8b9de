"""Fits from templates: seeded starts on the plan's grid, best of n_init, and the warnings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from emgrid.executors import optimize
from emgrid.executors.api import DEFAULT_INIT_ITER
from emgrid.executors.datafiles import NpyDataset
from emgrid.models import HMM, Categorical, Gaussian, Mixture, Poisson, complete_shapes, from_spec, initialize
from emgrid.models.errors import ConfigError, ConvergenceWarning
from emgrid.models.starts import start_key

from .plans import assert_same_trace, grid_plan
from .template_models import N, template, template_data



@pytest.fixture(scope="module")
def hetero():
    return template(), template_data()


def _fit(template, data, d=1, m=1, executor="local", max_iter=4, **kw):
    rows = data.open() if isinstance(data, NpyDataset) else data
    plan = grid_plan(complete_shapes(template, rows), N, d, m)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return optimize(data, template, plan=plan, executor=executor, max_iter=max_iter, tol=0.0, **kw)


def _flat(model):
    return np.concatenate([np.ravel(v) for _, n in model.nodes() for v in n.params().values()])


def test_a_template_fit_is_identical_on_every_executor_and_grid(hetero):
    template, data = hetero
    ref = _fit(template, data, n_init=2, seed=3, init_iter=2)
    assert len(ref.init_log_likelihoods) == 2 and ref.init_best in (0, 1)
    for d, m, ex in [(2, 1, "local"), (1, 2, "local"), (2, 1, "multiprocessing"), (1, 2, "multiprocessing")]:
        other = _fit(template, data, d, m, ex, n_init=2, seed=3, init_iter=2)
        assert_same_trace(other.init_log_likelihoods, ref.init_log_likelihoods)
        assert other.init_best == ref.init_best
        assert_same_trace(other.log_likelihood, ref.log_likelihood)
        np.testing.assert_allclose(_flat(other.model), _flat(ref.model), rtol=1e-7, atol=1e-9)


def test_the_same_seed_gives_the_same_fit_and_another_seed_another_start(hetero):
    template, data = hetero
    a, b = _fit(template, data, seed=11), _fit(template, data, seed=11)
    assert a.log_likelihood == b.log_likelihood and np.array_equal(_flat(a.model), _flat(b.model))
    # the fit runs EM from the seeded start ``initialize`` gives ...
    shaped = complete_shapes(template, data)
    start_11 = initialize(shaped, data, N, seed=11)
    warm = _fit(start_11, data, max_iter=DEFAULT_INIT_ITER + 4)
    assert_same_trace(warm.log_likelihood[DEFAULT_INIT_ITER:], a.log_likelihood)
    # ... and another seed seeds another start (EM may still take both to one optimum)
    start_12 = initialize(shaped, data, N, seed=12)
    assert start_key(start_12) != start_key(start_11)
    assert not np.allclose(_flat(start_12), _flat(start_11))


def test_n_init_keeps_the_best_start_and_continues_from_it(hetero):
    template, data = hetero
    res = _fit(template, data, n_init=4, seed=0)
    lls = res.init_log_likelihoods
    # four distinct seeded starts (where EM takes them may coincide on some CPUs)
    shaped = complete_shapes(template, data)
    assert len(lls) == 4 and len({start_key(initialize(shaped, data, N, seed=0, start=s)) for s in range(4)}) == 4
    assert res.init_best == int(np.argmax(lls)) and lls[res.init_best] == max(lls)
    # the continued model is the best start's after its last M-step: EM does not go down
    assert res.log_likelihood[0] >= max(lls) - 1e-9 * abs(max(lls))
    assert res.init_s > res.init_seeding_s > 0


def test_a_template_on_disk_starts_where_the_same_rows_in_memory_do(hetero, tmp_path):
    template, data = hetero
    ds = NpyDataset.write(data, tmp_path / "ds")
    a, b = _fit(template, data, seed=2), _fit(template, ds, seed=2)
    assert_same_trace(b.init_log_likelihoods, a.init_log_likelihoods)
    assert_same_trace(b.log_likelihood, a.log_likelihood)


def _ari(a: np.ndarray, b: np.ndarray) -> float:
    """Adjusted Rand index of two labelings (Hubert and Arabie), computed from the contingency table."""
    _, ai = np.unique(a, return_inverse=True)
    _, bi = np.unique(b, return_inverse=True)
    table = np.zeros((ai.max() + 1, bi.max() + 1))
    np.add.at(table, (ai, bi), 1)

    def pairs(x):
        return float((x * (x - 1) / 2).sum())

    index, rows, cols, total = pairs(table), pairs(table.sum(1)), pairs(table.sum(0)), pairs(np.array([a.size]))
    expected = rows * cols / total
    return (index - expected) / (0.5 * (rows + cols) - expected)


def test_a_fit_from_a_template_recovers_well_separated_clusters():
    means = np.array([[0.0, 0.0, 0.0, 0.0], [6.0, 0.0, 6.0, 0.0], [0.0, 7.0, 0.0, -6.0]])
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, size=1500)
    x = means[labels] + rng.normal(size=(1500, 4)) @ np.diag([1.0, 0.5, 1.5, 0.8])
    template = from_spec({"family": "Mixture", "k": 3, "component": {"family": "FullGaussian", "dim": 4}})
    res = optimize(x, template, n_init=3, seed=0, max_iter=200, tol=1e-8)
    m = res.model
    scores = np.stack([np.log(w) + c.log_density(x) for w, c in zip(m.weights, m.children)])
    assert _ari(scores.argmax(axis=0), labels) >= 0.95
    assert np.all(np.sort(m.weights) > 0.25)


def test_an_hmm_of_categoricals_from_a_template_fits_sequences():
    truth = HMM([Categorical([0.8, 0.1, 0.05, 0.05]), Categorical([0.05, 0.05, 0.1, 0.8])],
                [[0.9, 0.1], [0.2, 0.8]], [0.5, 0.5], 12.0)
    data = truth.prepare(truth.sample(400, np.random.default_rng(1)))
    template = from_spec({"family": "HMM", "n_states": 2, "emission": {"family": "Categorical"}})
    res = optimize(data, template, n_init=2, seed=0, max_iter=100, tol=1e-8)
    assert res.log_likelihood[-1] >= float(truth.log_density(data).sum()) - 5.0
    assert res.model.children[0].n_values == 4 and float(res.model.mean_length) == pytest.approx(
        data.offsets[-1] / 400)


def test_a_complete_model_is_a_warm_start():
    m = Mixture([Gaussian(0.0, 1.0), Gaussian(3.0, 1.0)], [0.5, 0.5])
    x = m.prepare(m.sample(300, np.random.default_rng(0)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        a = optimize(x, m, max_iter=3, tol=0.0, n_init=5, seed=9)
        b = optimize(x, m, max_iter=3, tol=0.0)
    assert a.log_likelihood == b.log_likelihood and a.init_log_likelihoods == [] and a.init_best is None


@pytest.mark.parametrize(("kw", "words"), [
    ({"n_init": 0}, "n_init must be an integer >= 1, got 0"),
    ({"n_init": 1.5}, "n_init"),
    ({"seed": -1}, "seed must be an integer >= 0, got -1"),
    ({"init": "kmeans++"}, "init must be one of auto, kmeans, random, got 'kmeans++'"),
    ({"init_iter": 0}, "init_iter"),
])
def test_bad_initialization_options_are_config_errors(kw, words):
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace("+", r"\+")):
        optimize(np.zeros(3), Gaussian(), **kw)


def test_kmeans_on_counts_is_refused_before_any_work():
    with pytest.raises(ConfigError, match="init='kmeans'"):
        optimize(np.arange(10), Mixture([Poisson(), Poisson()]), init="kmeans")


def test_warnings_name_the_unconverged_fit_and_the_collapsed_component():
    x = np.concatenate([np.random.default_rng(0).normal(size=400), np.full(3, 50.0)])
    start = Mixture([Gaussian(0.0, 1.0), Gaussian(50.0, 1.0), Gaussian(100.0, 1.0)], [0.4, 0.3, 0.3])
    with pytest.warns(ConvergenceWarning) as record:
        optimize(x, start, max_iter=3, tol=0.0)
    text = [str(w.message) for w in record]
    assert any("Mixture at path '<root>': component 2" in t and "collapsed" in t for t in text)
    assert any("Gaussian at path '1'" in t and "floor" in t for t in text)
    y = np.random.default_rng(1).normal(size=500)
    with pytest.warns(ConvergenceWarning, match=r"not converged after max_iter=2 iterations \(tol=1e-06; the last change"):
        optimize(y, Mixture([Gaussian(-0.1, 1.0), Gaussian(0.1, 1.0)], [0.5, 0.5]), max_iter=2)


@pytest.mark.skipif(not Path(sys.executable).with_name("mpiexec").exists(), reason="no mpiexec next to python")
@pytest.mark.parametrize("grid", [(2, 1), (1, 2)])
def test_mpiexec_starts_from_the_same_model_as_local(tmp_path, hetero, grid):
    pytest.importorskip("mpi4py")
    from .mpi_init_script import INIT_ITER, MAX_ITER, N_INIT, SEED

    here = Path(__file__).resolve().parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(here.parents[1]), os.environ.get("PYTHONPATH")])),
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    out = tmp_path / "r.json"
    cmd = [str(Path(sys.executable).with_name("mpiexec")), "-n", "2", sys.executable, str(here / "mpi_init_script.py"),
           str(grid[0]), str(grid[1]), str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = json.loads(out.read_text())
    template_, data = hetero
    local = _fit(template_, data, *grid, n_init=N_INIT, seed=SEED, init_iter=INIT_ITER)
    assert got["same_on_all_ranks"] and got["best"] == local.init_best
    assert_same_trace(got["init"], local.init_log_likelihoods)
    assert_same_trace(got["trace"], local.log_likelihood)
    assert len(got["trace"]) == len(local.log_likelihood) <= MAX_ITER


def test_the_hand_adjusted_rand_index_is_scikit_learns():
    metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(4)
    a, b = rng.integers(0, 3, size=200), rng.integers(0, 4, size=200)
    assert _ari(a, b) == pytest.approx(metrics.adjusted_rand_score(a, b), abs=1e-12)
    assert _ari(a, a) == pytest.approx(1.0)


def test_real_iris_from_a_template_reaches_scikit_learns_likelihood():
    datasets = pytest.importorskip("sklearn.datasets")
    mixture = pytest.importorskip("sklearn.mixture")
    x, y = datasets.load_iris(return_X_y=True)
    template = from_spec({"family": "Mixture", "k": 3, "component": {"family": "FullGaussian", "dim": 4}})
    ours = optimize(x, template, n_init=10, seed=0, max_iter=500, tol=1e-10)
    theirs = mixture.GaussianMixture(3, covariance_type="full", n_init=10, random_state=0, tol=1e-10,
                                     max_iter=500).fit(x)
    assert ours.log_likelihood[-1] >= theirs.score(x) * len(x) - 0.01
    m = ours.model
    labels = np.stack([np.log(w) + c.log_density(x) for w, c in zip(m.weights, m.children)]).argmax(axis=0)
    assert _ari(labels, y) >= 0.9


def test_every_start_runs_on_one_grid_started_once(hetero):
    from emgrid.executors.local import LocalExecutor

    class Counting(LocalExecutor):
        runs = 0

        def run(self, job):
            Counting.runs += 1
            return super().run(job)

    template_, data = hetero
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        res = optimize(data, template_, plan=grid_plan(complete_shapes(template_, data), N), executor=Counting(),
                       n_init=3, max_iter=2, init_iter=2)
    assert Counting.runs == 1 and len(res.init_log_likelihoods) == 3


def _digit_like_sequences(n: int = 120, length: int = 24):
    """Sequences of codes 0..5 from a 3-state HMM: long runs of a background code, strokes."""
    truth = HMM([Categorical([0.85, 0.05, 0.04, 0.03, 0.02, 0.01]), Categorical([0.05, 0.1, 0.5, 0.3, 0.03, 0.02]),
                 Categorical([0.02, 0.03, 0.05, 0.1, 0.3, 0.5])],
                [[0.8, 0.15, 0.05], [0.2, 0.6, 0.2], [0.1, 0.3, 0.6]], [0.6, 0.2, 0.2], float(length))
    rows = truth.sample(n, np.random.default_rng(8))
    return truth.prepare([r[:length] for r in rows if len(r) >= 2])


def _hmm_template(k: int = 3):
    return from_spec({"family": "HMM", "n_states": k, "emission": {"family": "Categorical"}})


def _state_distances(model) -> np.ndarray:
    """Total-variation distances between the emission distributions of every pair of states."""
    P = np.stack([c.probs for c in model.children])
    tv = 0.5 * np.abs(P[:, None, :] - P[None, :, :]).sum(axis=2)
    return tv[np.triu_indices(len(P), 1)]


def test_an_hmm_of_categoricals_starts_from_states_that_differ_beyond_sampling_noise():
    from emgrid.models.init import initialize

    data = _digit_like_sequences(300)
    template = complete_shapes(_hmm_template(4), data)
    n = len(data.offsets) - 1
    for start in range(3):
        contexts = initialize(template, data, n, seed=0, start=start)
        partitioned = initialize(template, data, n, seed=0, start=start, init="random")
        # a random partition of thousands of positions: every state is the overall histogram
        # up to sampling noise; partitioned by their contexts, the states differ
        assert _state_distances(partitioned).max() < 0.05
        assert _state_distances(contexts).min() > 0.05
        assert initialize(template, data, n, seed=0, start=start).children[0].probs.tolist() == \
            contexts.children[0].probs.tolist()


def test_an_hmm_template_fit_is_identical_on_every_executor_and_grid():
    data = _digit_like_sequences()
    template = _hmm_template()
    n = len(data.offsets) - 1

    def fit(d, m, ex):
        plan = grid_plan(complete_shapes(template, data), n, d, m)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            return optimize(data, template, plan=plan, executor=ex, max_iter=3, tol=0.0, n_init=2, seed=5, init_iter=2)

    ref = fit(1, 1, "local")
    for d, m, ex in [(2, 1, "local"), (1, 2, "local"), (2, 1, "multiprocessing")]:
        other = fit(d, m, ex)
        assert_same_trace(other.init_log_likelihoods, ref.init_log_likelihoods)
        assert other.init_best == ref.init_best
        assert_same_trace(other.log_likelihood, ref.log_likelihood)
        np.testing.assert_allclose(_flat(other.model), _flat(ref.model), rtol=1e-7, atol=1e-9)


def test_a_start_that_repeats_an_earlier_one_is_refined_once():
    from emgrid.executors.local import LocalExecutor

    class Recording(LocalExecutor):
        starts: list[int] = []

        def run(self, job):
            Recording.starts.append(len(job.starts))
            return super().run(job)

    rng = np.random.default_rng(0)
    centres = np.array([[0.0, 0.0], [8.0, 0.0], [0.0, 8.0]])
    x = np.vstack([c + rng.normal(size=(200, 2)) for c in centres])
    template = from_spec({"family": "Mixture", "k": 3, "component": {"family": "FullGaussian", "dim": 2}})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        many = optimize(x, template, executor=Recording(), n_init=6, seed=0, max_iter=5, init_iter=2, tol=0.0)
        one = optimize(x, template, n_init=1, seed=0, max_iter=5, init_iter=2, tol=0.0)
    # k-means of three clear clusters lands on one partition from every seed: one start to refine
    assert Recording.starts == [1]
    assert len(many.init_log_likelihoods) == 6 and len(set(many.init_log_likelihoods)) == 1
    assert many.init_best == 0
    assert_same_trace(many.log_likelihood, one.log_likelihood)
