"""Fit quality from templates alone: emgrid against scikit-learn, hmmlearn and mixle on real data.

Data sets (every fit starts from a structure without numbers and initializes from the data):

- ``iris``: 150 rows, 4 columns; a mixture of 3 full Gaussians. Labels: the species.
- ``wine``: 178 rows, 13 columns, 3 cultivars. Wine has no categorical column, so one is made:
  ``proline`` (column 12) is binned at its quartiles into 4 levels and *removed* from the
  numeric columns; the model is a mixture of 3 records (a full Gaussian over the other 12
  columns, a categorical over the 4 levels). The plain variant ``wine (13-D full)`` is a mixture
  of 3 full Gaussians over all 13 raw columns (no scaling: every library sees the same data).
- ``digits``: the first 360 of the 1797 8x8 images (about 36 per class: hmmlearn takes
  about 1.3 s per Baum-Welch iteration on all 1797 here, and emgrid 0.6 s, too slow for
  10 starts x 100 iterations in the time budget), each image's 64 pixel intensities (0..16,
  17 values) read row-major as one sequence; an HMM with 8 states and categorical emissions.
  Why 8: a row-major scan of an 8x8 image repeats every 8 positions (left margin, strokes,
  right margin), so 8 states can follow the position within a row; forward-backward is
  O(K^2) per position, so 8 keeps the run inside the budget. ARI is taken against the digit
  class with each image labelled by k-means (10 clusters) of its *state occupancy* (posterior
  mass per state over its 64 positions), the same for every library: a weak proxy, since an
  HMM's states are kinds of pixels (background, stroke edge, stroke), not digit classes. (Each
  image's single dominant state is the background state for every image: ARI 0.)
- ``earthquakes``: the 107 annual counts of major earthquakes, 1900-2006 (Zucchini and
  MacDonald; the data of hmmlearn's Poisson HMM tutorial, ``examples/earthquakes.csv``), one
  sequence; a Poisson HMM of 2, 3 and 4 states (three data sets). No labels: instead of ARI,
  the Viterbi path's agreement with hmmlearn's best fit's path (the share of the 107 years
  in the same state, up to a relabelling of the states, the best one by linear assignment).
- ``synthetic``: 3000 rows from a known emgrid model, a mixture of 3 records (a categorical of
  3 values, a 2-D full Gaussian, a Poisson sequence of mean length 6), fitted from its
  template; labels: the component that generated each row (``sample(latent=True)``); the
  generating model's log-likelihood is reported as a reference.

Libraries, each fitted end to end from the data with one BLAS thread:

- emgrid ``optimize(data, template, n_init=10, seed=0, max_iter=100)`` on one local worker
  (``Resources.uniform(1)``), ``init="auto"`` (greedy k-means++ and Lloyd iterations on the
  standardized float and vector columns for the Gaussian mixtures and the records, drawn again
  while a cluster holds fewer rows than its component needs; k-means of
  each position's context, the values 3 before and after it, for the HMM's categorical
  emissions, its transitions counted from that partition), each distinct start refined by
  ``init_iter=10`` EM iterations (starts that coincide, as k-means from several seeds often
  does on small data, are refined once), the best continued. Two rows per data set: with
  ``tol`` matched to the reference library's criterion (below) and with emgrid's default
  ``tol=1e-6``. n_init=10 matches scikit-learn's n_init=10 and the 10 seeds given to
  hmmlearn and mixle; it is not unfair to anyone: every library gets 10 starts.
  A third row, ``every start in full``, fits with the peers' protocol instead (scikit-learn's
  ``n_init`` and mixle's ``best_of`` run every start to the end and keep the best): each
  distinct start runs up to ``max_iter`` iterations at the matched tolerance
  (``init_iter=100``), and the best is kept after one more (``max_iter=1``, the least the
  API runs), so no start gets more iterations than the peers give theirs.
- scikit-learn ``GaussianMixture(3, covariance_type="full", n_init=10, random_state=0)``,
  defaults otherwise (k-means init, ``tol=1e-3``, ``max_iter=100``, ``reg_covar=1e-6``), on
  iris and plain wine (it has no records, sequences or categoricals).
- hmmlearn ``CategoricalHMM(8, n_iter=100, random_state=s)`` for s = 0, 1, 2 (3 restarts, not
  10: the time budget), its defaults otherwise (random emissions, ``tol=1e-2``), the best by
  ``score`` kept (restarts are how hmmlearn's documentation fits an HMM to avoid local
  optima); on digits. On the earthquakes, ``PoissonHMM(K, n_iter=100, random_state=s)`` for
  s = 0..9, the best by ``score`` kept, as its tutorial does (the tutorial runs ``n_iter=10``;
  100 iterations, emgrid's ``max_iter``, find a higher optimum: -327.394 against -328.021 for
  4 states).
- mixle ``best_of(rows, None, estimator, trials=10, max_its=100, init_p=0.1, delta=...,
  seed=0)`` (``init_p=0.1``, mixle's default elsewhere) with the matching estimators (``MixtureEstimator`` of ``MultivariateGaussianEstimator``
  / ``CompositeEstimator``; ``HiddenMarkovEstimator`` of ``CategoricalEstimator`` without a
  length model), where it applies; a library that fails is reported with its error. No ARI for
  mixle's HMM (its per-position posteriors are not wired up here).
- A Gaussian fit with a component of at most ``d`` rows (its covariance singular, held finite
  only by a ridge, its likelihood unbounded) is flagged *degenerate* and left out of the goals'
  "best of the others" (mixle lands there on both wine variants).

Convergence criteria (they differ; the matched emgrid row uses the tolerance equivalent to
the reference library's at that library's final log-likelihood ``LL`` over ``n`` rows):

- scikit-learn stops when the mean log-likelihood per row changes by less than ``tol=1e-3``:
  on totals ``|dLL| < 1e-3 n``, so emgrid's relative ``|dLL| <= tol |LL|`` gets
  ``tol = 1e-3 n / |LL|``; mixle is given ``delta = 1e-3 n`` (absolute on the total).
- hmmlearn stops when the total log-likelihood gains less than ``tol=1e-2``: emgrid gets
  ``tol = 1e-2 / |LL|``, mixle ``delta = 1e-2``.
- records and the synthetic nest (no scikit-learn): scikit-learn's rule, ``1e-3`` per row.

Both rules compare the log-likelihood of the model *before* an M-step with the previous one's and
then keep the model after that M-step, so the matched row stops where scikit-learn would. A gap
smaller than the tolerance's own slack (``1e-3 n`` on the total, 0.15 on iris) is where each stops
along its own path, not a worse optimum: the ``tol=1e-6`` row shows where emgrid's path ends.

Wine, 13 raw columns: k-means on the raw columns is decided by proline alone (values up to
1680, against under 10 for most columns), and the Gaussian optima reached from such partitions
trade likelihood against ARI: scikit-learn's own starts land in several basins (20 single
starts, ``random_state`` 0..19: 15 at -2916.9 with ARI 0.607, 4 at -2901.1 with ARI 0.462, one
at -2908.3 with 0.455), and emgrid on raw columns reached -2901.0 (ARI 0.462) from all 20
seeds. emgrid's k-means runs on standardized columns (a full Gaussian mixture fits the same
whatever the columns' units, so their units should not pick the start): over seeds 0..19 (tol
1e-6), 14 reach -2797.9 (ARI 0.947, smallest component 49 rows) and 6 reach -2813.2 (ARI
0.911). Standardized, k-means++ sometimes takes a few outliers for a cluster; a full Gaussian
started from fewer than d + 1 rows starts singular and stays at a degenerate optimum the
likelihood prefers (2 of the 20 seeds did: components of 4 and 5 rows, ARI 0.41 and 0.44), so
such a partition is drawn again (``models.init.KMEANS_DRAWS``).

Digits: emgrid's final log-likelihood depends on which start is best after its 10 refining
iterations, and an HMM's log-likelihood at 10 iterations ranks its starts poorly. Seeds 0..5
(matched tol): -37606.7, -37653.4, -37658.1, -37402.0, -37870.8, -37638.8 (the former init,
random per-state tilts of the histogram, seeds 0..3: -37705.6, -37674.1, -37818.1, -37886.1);
with ``init_iter=30``: -37584.5, -37651.2, -37610.7, -37402.0, -37600.2, -37635.7, in 6 to 8 s.
Some starts climb slowly: with seed 0 the start that ends best (-37429 after 110 iterations)
ranks 7th of 10 after 30 iterations and 5th after 50, so no early choice keeps it (keeping the
better half every 10 iterations, tried: -37584.4 but ARI 0.064). Every start in full (the
third row) keeps it: seeds 0..5 reach -37443.1, -37577.7, -37611.8, -37401.8, -37583.0,
-37451.7 (ARI 0.112, 0.101, 0.072, 0.126, 0.125, 0.102), above the default protocol on every
seed, in 14-16 s (hmmlearn's 3 restarts take 22-25 s, mixle's 10 about 23 s).

Times: wall seconds of the whole fit from the data (the library's own data conversion included,
imports and first-call compilation excluded by one tiny untimed fit per library first); for
the sub-second data sets (iris, wine) the fastest of 5 identical seeded runs per library, the
libraries' runs interleaved round by round (class ``Timed``), elsewhere one run.

Log-likelihoods are all totals over rows of the *final* fitted model, evaluated after the fit
(``score_samples(...).sum()``, ``score(X) * n``, hmmlearn's ``score(X, lengths)``, mixle's
``log_density`` summed), the same model family per data set. Differences that remain:
scikit-learn adds ``reg_covar=1e-6`` to every covariance diagonal (emgrid adds 0 by
default; mixle a relative ridge of 1e-6); an HMM's log-likelihood in emgrid, hmmlearn and
mixle (without ``len_estimator``) is ``log p(x_1..x_L)`` per sequence with no term for the
length, so the three are on the same scale (all sequences have length 64 anyway).

Goals (issue 12): emgrid's log-likelihood at least the best of the others on every data
set, ARI within 0.01 of the best, and never slower than scikit-learn end to end. Checked
for the matched-tolerance rows of both protocols; printed per data set. On the earthquakes
(issue 23), also for emgrid's defaults (``n_init=10``, ``tol=1e-6``, ``max_iter=100``):
the log-likelihood at least hmmlearn's best of 10 seeds, the time at most hmmlearn's, and
the Viterbi path the same as hmmlearn's (every year, up to relabelling) where the two reach
the same optimum (log-likelihoods within 0.01); a higher optimum may decode differently.

Usage::

    python bench/quality.py                 # all data sets, writes bench/results/quality.{json,md}
    python bench/quality.py --only iris,digits --no-mixle

Results: ``bench/results/quality.json`` and ``.md`` (``--out``).
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
             "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.em_speed import cpu_name  # noqa: E402

from emgrid import optimize  # noqa: E402
from emgrid.models import (Categorical, Composite, FullGaussian, Mixture, Poisson, Sequence,  # noqa: E402
                           from_spec)
from emgrid.planner import Resources  # noqa: E402

N_INIT = 10
MAX_ITER = 100
SK_TOL = 1e-3  # scikit-learn's default, on the mean log-likelihood per row
HMM_TOL = 1e-2  # hmmlearn's default, on the total log-likelihood
N_STATES = 8
N_DIGITS = 360  # the first 360 images (about 36 per class): hmmlearn takes ~1.3 s per iteration on all 1797
HMM_SEEDS = 3  # hmmlearn restarts: 3 x 100 iterations fit the time budget, 10 would not


def limit_threads():
    try:
        from threadpoolctl import threadpool_info, threadpool_limits
    except ImportError:
        return None, []
    limiter = threadpool_limits(limits=1)
    info = [{k: p.get(k) for k in ("internal_api", "version", "num_threads")} for p in threadpool_info()]
    return limiter, info


def ari(labels, truth):
    from sklearn.metrics import adjusted_rand_score

    return float(adjusted_rand_score(truth, labels))


def occupancy_labels(proba: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Per sequence, its state occupancy (posterior mass per state over its positions, divided
    by its length) clustered into 10 groups by k-means (scikit-learn, n_init=10, seed 0)."""
    from sklearn.cluster import KMeans

    occ = np.add.reduceat(proba, offsets[:-1], axis=0) / np.diff(offsets)[:, None]
    return KMeans(10, n_init=10, random_state=0).fit_predict(occ)


def degenerate(weights, n, dim):
    """Whether a Gaussian component holds no more rows than its dimension (its maximum-likelihood
    covariance is singular; the likelihood is unbounded there and only a ridge keeps it finite)."""
    return dim is not None and bool(np.min(np.asarray(weights, dtype=float)) * n < dim + 1)


# ---------------------------------------------------------------- data sets
def load_iris():
    from sklearn.datasets import load_iris as load

    x, y = load(return_X_y=True)
    template = from_spec({"family": "Mixture", "k": 3, "component": {"family": "FullGaussian", "dim": 4}})
    return {"name": "iris", "data": x, "x": x, "y": y, "template": template, "n": len(x), "kind": "gmm", "dim": 4,
            "about": "150 x 4, mixture of 3 full Gaussians"}


def load_wine_plain():
    from sklearn.datasets import load_wine

    x, y = load_wine(return_X_y=True)
    template = from_spec({"family": "Mixture", "k": 3, "component": {"family": "FullGaussian", "dim": 13}})
    return {"name": "wine (13-D full)", "data": x, "x": x, "y": y, "template": template, "n": len(x), "kind": "gmm", "dim": 13,
            "about": "178 x 13 raw columns, mixture of 3 full Gaussians"}


def load_wine_record():
    from sklearn.datasets import load_wine

    x, y = load_wine(return_X_y=True)
    proline = x[:, 12]
    edges = np.quantile(proline, [0.25, 0.5, 0.75])
    level = np.searchsorted(edges, proline, side="right").astype(np.int64)  # 0..3, quartiles
    numeric = np.ascontiguousarray(x[:, :12])
    template = from_spec({"family": "Mixture", "k": 3, "component": {"family": "Composite", "children": [
        {"family": "FullGaussian", "dim": 12}, {"family": "Categorical", "n_values": 4}]}})
    return {"name": "wine (record)", "data": (numeric, level), "x": numeric, "level": level, "y": y,
            "template": template, "n": len(x), "kind": "record", "dim": 12,
            "about": "178 rows: 12-D full Gaussian + categorical of proline's quartile (4 levels; proline "
                     "removed from the numeric columns), mixture of 3 records"}


def load_digits():
    from sklearn.datasets import load_digits as load

    x, y = load(return_X_y=True)
    seqs, y = x[:N_DIGITS].astype(np.int64), y[:N_DIGITS]  # (360, 64), values 0..16
    template = from_spec({"family": "HMM", "n_states": N_STATES,
                          "emission": {"family": "Categorical", "n_values": 17}})
    return {"name": "digits (HMM)", "data": [r for r in seqs], "seqs": seqs, "y": y, "template": template,
            "n": len(seqs), "kind": "hmm",
            "about": f"the first {N_DIGITS} images as sequences of 64 pixel intensities (0..16), HMM of {N_STATES} states, categorical emissions"}


EARTHQUAKE_STATES = (2, 3, 4)


def load_earthquakes():
    """The earthquake counts as one sequence, one case per number of states."""
    counts = np.loadtxt(ROOT / "examples" / "earthquakes.csv", delimiter=",", skiprows=1, dtype=np.int64)[:, 1]
    cases = []
    for k in EARTHQUAKE_STATES:
        template = from_spec({"family": "HMM", "n_states": k, "emission": {"family": "Poisson"}})
        cases.append({"name": f"earthquakes (HMM, {k} states)", "data": [counts], "seqs": counts[None, :],
                      "y": None, "template": template, "n": 1, "kind": "hmm", "emission": "poisson",
                      "n_states": k, "seeds": N_INIT,
                      "about": f"107 annual counts of major earthquakes 1900-2006, one sequence, Poisson HMM of {k} states"})
    return cases


def path_agreement(path, ref) -> float:
    """The share of positions where ``path`` equals ``ref`` after the relabelling of its
    states that matches the most positions (linear assignment on the contingency table)."""
    from scipy.optimize import linear_sum_assignment

    path, ref = np.asarray(path), np.asarray(ref)
    k = int(max(path.max(), ref.max())) + 1
    table = np.zeros((k, k))
    np.add.at(table, (path, ref), 1.0)
    rows, cols = linear_sum_assignment(-table)
    return float(table[rows, cols].sum() / path.size)


def synthetic_truth():
    def rec(p, mu, cov, lam):
        return Composite([Categorical(p), FullGaussian(mu, cov), Sequence(Poisson(lam), 6.0)])

    return Mixture([
        rec([0.6, 0.3, 0.1], [0.0, 0.0], [[1.0, 0.5], [0.5, 1.0]], 2.0),
        rec([0.2, 0.6, 0.2], [2.5, 0.5], [[1.0, -0.3], [-0.3, 0.6]], 4.0),
        rec([0.1, 0.2, 0.7], [0.5, 2.5], [[0.5, 0.0], [0.0, 1.5]], 3.0),
    ], [0.4, 0.35, 0.25])


def load_synthetic():
    truth = synthetic_truth()
    data, latent = truth.sample(3000, np.random.default_rng(7), latent=True)
    data = truth.prepare(data)
    template = from_spec({"family": "Mixture", "k": 3, "component": {"family": "Composite", "children": [
        {"family": "Categorical", "n_values": 3}, {"family": "FullGaussian", "dim": 2},
        {"family": "Sequence", "child": {"family": "Poisson"}}]}})
    return {"name": "synthetic nest", "data": data, "y": np.asarray(latent[""]), "template": template, "n": 3000,
            "kind": "nest", "dim": 2, "truth_ll": float(truth.score_samples(data).sum()),
            "truth_ari": ari(truth.predict(data), np.asarray(latent[""])),
            "about": "3000 rows from a known mixture of 3 records (categorical of 3, 2-D full Gaussian, "
                     "Poisson sequence of mean length 6)"}


# ---------------------------------------------------------------- libraries
def fit_emgrid(case, tol, every_start_in_full=False):
    """emgrid from the template: by default each start refined ``init_iter=10`` iterations and
    the best continued for ``max_iter``; ``every_start_in_full``: the peers' protocol (scikit-learn's
    ``n_init``, mixle's ``best_of``), each start run up to ``max_iter`` iterations
    (``init_iter=MAX_ITER``) and the best kept, with one more iteration (``max_iter=1``, the least
    the API runs) rather than another ``max_iter``."""
    from emgrid.models.errors import ConvergenceWarning

    t = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        res = optimize(case["data"], case["template"], resources=Resources.uniform(1), executor="local",
                       n_init=N_INIT, seed=0, tol=tol,
                       **(dict(init_iter=MAX_ITER, max_iter=1) if every_start_in_full else dict(max_iter=MAX_ITER)))
    wall = time.perf_counter() - t
    model = res.model
    data = model.prepare(case["data"])
    ll = float(model.score_samples(data).sum())
    extra = {}
    if case["kind"] == "hmm" and case.get("ref_path") is not None:
        extra["viterbi_agreement"] = path_agreement(np.asarray(model.viterbi(data).values), case["ref_path"])
    if case["y"] is None:
        labels = None
    elif case["kind"] == "hmm":
        post = model.posterior_states(data)
        labels = occupancy_labels(np.asarray(post.values), np.asarray(post.offsets))
    else:
        labels = np.asarray(model.predict(data))
    weights = model.weights if case["kind"] != "hmm" else None
    return {**extra, "degenerate": weights is not None and degenerate(weights, case["n"], case.get("dim")), "ll": ll,
            "ari": None if labels is None else ari(labels, case["y"]), "time_s": wall,
            "iterations": f"<={MAX_ITER} per start, +1" if every_start_in_full else res.iterations,
            "converged": "-" if every_start_in_full else bool(res.converged), "tol": tol, "init_s": res.init_s,
            "init_lls": res.init_log_likelihoods, "trace_last": res.log_likelihood[-1],
            "warnings": sorted({str(w.message) for w in caught})}


def fit_sklearn(case):
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.mixture import GaussianMixture

    x = case["x"]
    t = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        gm = GaussianMixture(3, covariance_type="full", n_init=N_INIT, random_state=0).fit(x)
    wall = time.perf_counter() - t
    return {"degenerate": degenerate(gm.weights_, len(x), x.shape[1]), "ll": float(gm.score(x) * len(x)), "ari": ari(gm.predict(x), case["y"]), "time_s": wall,
            "iterations": int(gm.n_iter_), "converged": bool(gm.converged_), "tol": gm.tol}


def fit_hmmlearn(case):
    from hmmlearn.hmm import CategoricalHMM, PoissonHMM

    seqs = case["seqs"]
    t = time.perf_counter()
    X = seqs.reshape(-1, 1)
    lengths = np.full(len(seqs), seqs.shape[1])
    best, best_ll, per_seed = None, -np.inf, []
    for s in range(case.get("seeds", HMM_SEEDS)):
        if case.get("emission") == "poisson":
            m = PoissonHMM(case["n_states"], n_iter=MAX_ITER, random_state=s)
        else:
            m = CategoricalHMM(N_STATES, n_iter=MAX_ITER, random_state=s)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # hmmlearn's notes on starts that end early
            m.fit(X, lengths)
        sc = float(m.score(X, lengths))
        per_seed.append(sc)
        if sc > best_ll:
            best, best_ll = m, sc
    wall = time.perf_counter() - t
    case["ref_path"] = best.predict(X, lengths)
    if case["y"] is None:
        score = None
    else:
        proba = best.predict_proba(X, lengths)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        score = ari(occupancy_labels(proba, offsets), case["y"])
    return {"ll": best_ll, "ari": score, "time_s": wall, "viterbi_agreement": 1.0,
            "iterations": int(best.monitor_.iter), "converged": bool(best.monitor_.converged),
            "tol": best.tol, "per_seed_ll": per_seed}


def mixle_rows_and_estimator(case):
    from mixle.stats.combinator.composite import CompositeEstimator
    from mixle.stats.combinator.sequence import SequenceEstimator
    from mixle.stats.latent.hidden_markov import HiddenMarkovEstimator
    from mixle.stats.latent.mixture import MixtureEstimator
    from mixle.stats.multivariate.multivariate_gaussian import MultivariateGaussianEstimator
    from mixle.stats.univariate.discrete.categorical import CategoricalEstimator
    from mixle.stats.univariate.discrete.poisson import PoissonEstimator

    kind = case["kind"]
    if kind == "gmm":
        return [r for r in case["x"]], MixtureEstimator([MultivariateGaussianEstimator() for _ in range(3)])
    if kind == "record":
        rows = [(r, int(c)) for r, c in zip(case["x"], case["level"])]
        return rows, MixtureEstimator([CompositeEstimator((MultivariateGaussianEstimator(), CategoricalEstimator()))
                                       for _ in range(3)])
    if kind == "hmm" and case.get("emission") == "poisson":
        return ([[int(v) for v in r] for r in case["seqs"]],
                HiddenMarkovEstimator([PoissonEstimator() for _ in range(case["n_states"])]))
    if kind == "hmm":
        return ([[int(v) for v in r] for r in case["seqs"]],
                HiddenMarkovEstimator([CategoricalEstimator() for _ in range(N_STATES)]))
    cat, vec, seq = case["data"]
    rows = [(int(cat[i]), vec[i], [int(v) for v in seq[i]]) for i in range(case["n"])]
    return rows, MixtureEstimator([CompositeEstimator((CategoricalEstimator(), MultivariateGaussianEstimator(),
                                                       SequenceEstimator(PoissonEstimator()))) for _ in range(3)])


def fit_mixle(case, delta):
    from mixle.inference.estimation import best_of

    t = time.perf_counter()
    rows, est = mixle_rows_and_estimator(case)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, m = best_of(rows, None, est, trials=N_INIT, max_its=MAX_ITER, init_p=0.1, delta=delta, seed=0)
    wall = time.perf_counter() - t
    ll = float(sum(m.log_density(r) for r in rows))
    out = {"ll": ll, "time_s": wall, "tol": delta, "ari": None}
    if case["kind"] != "hmm":
        out["degenerate"] = degenerate(m.w, case["n"], case.get("dim"))
    try:
        if case["kind"] == "hmm":
            raise NotImplementedError("no per-position state posterior wired for mixle's HMM here")
        else:
            labels = np.array([int(np.argmax(m.posterior(r))) for r in rows])
        out["ari"] = ari(labels, case["y"])
    except Exception as exc:  # the labels are a bonus; the log-likelihood is the comparison
        out["ari_error"] = f"{type(exc).__name__}: {exc}"
    return out


def warm_up(use_mixle):
    """One tiny untimed fit per library, so imports, first calls and JIT compilation
    (mixle's numba kernels) stay out of the timed fits."""
    rng = np.random.default_rng(0)
    tiny = {"kind": "gmm", "x": rng.normal(size=(60, 2)), "y": np.zeros(60, dtype=int), "n": 60, "dim": 2,
            "template": from_spec({"family": "Mixture", "k": 3, "component": {"family": "FullGaussian", "dim": 2}})}
    tiny["data"] = tiny["x"]
    seqs = rng.integers(0, 17, size=(20, 64))
    hmm = {"kind": "hmm", "seqs": seqs, "data": [r for r in seqs], "y": np.zeros(20, dtype=int), "n": 20,
           "template": from_spec({"family": "HMM", "n_states": N_STATES,
                                  "emission": {"family": "Categorical", "n_values": 17}})}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit_sklearn(tiny), fit_emgrid(tiny, 1e-3), fit_emgrid(hmm, 1e-3), fit_hmmlearn(hmm)
        quake = load_earthquakes()[0]
        fit_hmmlearn(quake), fit_emgrid(quake, 1e-3)
        if use_mixle:
            for case in (tiny, hmm):
                try:
                    fit_mixle(case, 1.0)
                except Exception:
                    pass


# ---------------------------------------------------------------- one data set
#: Runs per library on the sub-second data sets (iris, wine); one run elsewhere.
REPEATS = 5


class Timed:
    """Every library's fits of one data set, timed in interleaved rounds: the first run of
    each gives its result (and the tolerances that follow from it); later rounds run every
    library again in the same order, so a burst of other work on the shared machine slows
    all of them alike, and each reports its fastest run (every fit is seeded, so the
    results are identical)."""

    def __init__(self):
        self.rows, self.jobs = {}, {}

    def first(self, label, f, *a):
        r = f(*a)
        r["time_all_s"] = [r["time_s"]]
        self.rows[label], self.jobs[label] = r, (f, a)
        return r

    def rounds(self, n):
        for _ in range(n - 1):
            for label, (f, a) in self.jobs.items():
                self.rows[label]["time_all_s"].append(f(*a)["time_s"])
        for label, r in self.rows.items():
            if "time_all_s" in r:
                r["time_s"] = min(r["time_all_s"])
                print(f"  {label}: " + ", ".join(f"{t:.2f}" for t in r["time_all_s"]) + " s", flush=True)


def run_case(case, use_mixle):
    t = Timed()
    rows = t.rows
    kind, n = case["kind"], case["n"]
    if kind == "gmm":
        t.first("scikit-learn", fit_sklearn, case)
        ref = rows["scikit-learn"]
        matched_tol, mixle_delta = SK_TOL * n / abs(ref["ll"]), SK_TOL * n
        rule = "scikit-learn's tol=1e-3 per row"
    elif kind == "hmm":
        t.first("hmmlearn", fit_hmmlearn, case)
        ref = rows["hmmlearn"]
        matched_tol, mixle_delta = HMM_TOL / abs(ref["ll"]), HMM_TOL
        rule = "hmmlearn's tol=1e-2 on the total"
    else:
        matched_tol, mixle_delta = None, SK_TOL * n
        rule = "scikit-learn's rule, 1e-3 per row"
    if use_mixle:
        try:
            t.first("mixle", fit_mixle, case, mixle_delta)
        except Exception as exc:
            rows["mixle"] = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc(limit=3)}
    if matched_tol is None:  # no scikit-learn: match its rule at the best other fit, else at the start
        others = [r["ll"] for r in rows.values() if "ll" in r]
        scale = abs(max(others)) if others else abs(case.get("truth_ll", n))
        matched_tol = SK_TOL * n / scale
    t.first("emgrid (matched tol)", fit_emgrid, case, matched_tol)
    t.first("emgrid (tol=1e-6)", fit_emgrid, case, 1e-6)
    t.first(FULL, fit_emgrid, case, matched_tol, True)
    t.rounds(REPEATS if kind in ("gmm", "record") or case.get("emission") == "poisson" else 1)  # sub-second fits
    out = {"name": case["name"], "about": case["about"], "n": n, "tolerance_rule": rule, "rows": rows}
    if "truth_ll" in case:
        out["truth_ll"], out["truth_ari"] = case["truth_ll"], case["truth_ari"]
    out["goals"] = goals(rows)
    out["goals_every_start_in_full"] = goals(rows, FULL)
    if case.get("emission") == "poisson":
        out["goals_default"] = goals(rows, DEFAULT)
    return out


#: The emgrid row fitted with the peers' protocol (:func:`fit_emgrid`).
FULL = "emgrid (matched tol, every start in full)"
#: The emgrid row of its defaults (n_init=10, tol=1e-6, max_iter=100).
DEFAULT = "emgrid (tol=1e-6)"
#: Log-likelihoods this close are one optimum (the Viterbi goal applies there).
SAME_OPTIMUM = 0.01


def goals(rows, label="emgrid (matched tol)"):
    mine = rows[label]
    others = {k: r for k, r in rows.items()
              if not k.startswith("emgrid") and "ll" in r and not r.get("degenerate")}  # no singular optimum
    g = {}
    if others:
        best_ll = max(r["ll"] for r in others.values())
        g["ll_vs_best_other"] = mine["ll"] - best_ll
        g["ll_met"] = mine["ll"] >= best_ll - 1e-9 * abs(best_ll)
        aris = [r["ari"] for r in others.values() if r.get("ari") is not None]
        if aris:
            g["ari_vs_best_other"] = mine["ari"] - max(aris)
            g["ari_met"] = mine["ari"] >= max(aris) - 0.01
        if "hmmlearn" in others and mine.get("viterbi_agreement") is not None:
            g["viterbi_agreement"] = mine["viterbi_agreement"]
            if abs(mine["ll"] - others["hmmlearn"]["ll"]) <= SAME_OPTIMUM:
                g["viterbi_met"] = mine["viterbi_agreement"] == 1.0
    ref = next((k for k in ("scikit-learn", "hmmlearn") if k in rows and "time_s" in rows[k]), None)
    if ref is not None:
        g["time_vs"], g["time_ref"] = mine["time_s"] / rows[ref]["time_s"], ref
        g["time_met"] = mine["time_s"] <= rows[ref]["time_s"]
    return g


# ---------------------------------------------------------------- report
def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def table(report):
    lines = ["| data set | library | final log-lik. (total) | ARI | Viterbi agreement | time s (end to end) | iterations | "
             "converged | tol |", "|---|---|---|---|---|---|---|---|---|"]
    for c in report["results"]:
        for lib, r in c["rows"].items():
            if "error" in r:
                lines.append(f"| {c['name']} | {lib} | failed: {r['error'][:80]} | | | | | | |")
                continue
            flag = " (degenerate: a component of <= d rows)" if r.get("degenerate") else ""
            lines.append(f"| {c['name']} | {lib} | {r['ll']:.3f}{flag} | {fmt(r.get('ari'), '.4f')} | "
                         f"{fmt(r.get('viterbi_agreement'), '.3f')} | {r['time_s']:.3f} | "
                         f"{r.get('iterations', '-')} | {r.get('converged', '-')} | {fmt(r.get('tol'), '.3g')} |")
        if "truth_ll" in c:
            lines.append(f"| {c['name']} | (generating model) | {c['truth_ll']:.3f} | {c['truth_ari']:.4f} | | | | | |")
    return lines


def goal_lines(report):
    lines = ["| data set | emgrid protocol | emgrid log-lik. - best other | met | emgrid ARI - best other | met | "
             "Viterbi agreement with hmmlearn | met | emgrid time / reference | met |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for c in report["results"]:
        protocols = [("matched tol (init_iter=10)", "goals"), ("every start in full", "goals_every_start_in_full")]
        if "goals_default" in c:
            protocols.insert(0, ("defaults (tol=1e-6)", "goals_default"))
        for protocol, key in protocols:
            g = c.get(key, {})

            def yn(k):
                return "-" if k not in g else ("yes" if g[k] else "**no**")

            ref = f" ({g['time_ref']})" if "time_ref" in g else ""
            lines.append(f"| {c['name']} | {protocol} | {fmt(g.get('ll_vs_best_other'), '+.3f')} | {yn('ll_met')} | "
                         f"{fmt(g.get('ari_vs_best_other'), '+.4f')} | {yn('ari_met')} | "
                         f"{fmt(g.get('viterbi_agreement'), '.3f')} | {yn('viterbi_met')} | "
                         f"{fmt(g.get('time_vs'), '.2f')}{ref} | {yn('time_met')} |")
    return lines


def markdown(report):
    m = report["machine"]
    lines = ["# Fit quality from templates: emgrid vs scikit-learn, hmmlearn, mixle", "",
             f"Command: `{report['command']}`; machine: {m['cpu']}, {m['cores']} cores, shared with other work "
             f"(one BLAS thread; times: fastest of {REPEATS} interleaved runs on iris and wine, one run elsewhere); versions: " +
             ", ".join(f"{k} {v}" for k, v in m["versions"].items()) + f"; total {report['total_s']:.0f} s.", ""]
    for c in report["results"]:
        lines.append(f"- **{c['name']}**: {c['about']}; matched tolerance: {c['tolerance_rule']}.")
    lines += [""] + table(report) + ["", "Goals (emgrid against the others; 'matched tol': emgrid's protocol, each "
                                        "start refined 10 iterations and the best continued, at the tolerance matched "
                                        "to the reference library's; 'every start in full': the peers' protocol, each "
                                        "start run up to 100 iterations, the best kept; 'defaults' (earthquakes): "
                                        "emgrid as it ships, n_init=10, tol=1e-6):", ""]
    lines += goal_lines(report)
    lines += ["", "Method: see the docstring of `bench/quality.py` (every library fits from the data alone, 10 "
              "starts each, max 100 iterations; log-likelihoods are totals of the final model evaluated after "
              "the fit; emgrid's relative tol is set to the other library's criterion at its final "
              "log-likelihood). The digits ARI (k-means of each image's state occupancy vs digit class) is a weak proxy. Wine (13-D full): emgrid's k-means runs on standardized columns, scikit-learn's on the raw ones (where proline alone decides); other seeds of emgrid are in the docstring. Digits: other seeds, init_iter=30 and both protocols over seeds 0..5 are in the docstring. iris at the matched tolerance: a gap within the tolerance's slack (0.15 on the total) is where each library's path stops (the tol=1e-6 row). mixle on the synthetic nest: its sequence of Poissons without a length model is refused inside a mixture (the error above); with a length model its log-likelihood would carry a length term emgrid's has not, so it is left out. Earthquakes: 'defaults' is emgrid's `optimize(data, template, n_init=10)` as it ships (the tol=1e-6 row), against hmmlearn's best of 10 seeds at n_iter=100; the Viterbi agreement is the share of the 107 years decoded alike up to a relabelling of the states, a goal only where both reach one optimum (log-likelihoods within 0.01): a higher optimum decodes differently.", ""]
    return "\n".join(lines)


LOADERS = {"iris": load_iris, "wine": load_wine_plain, "wine-record": load_wine_record, "digits": load_digits,
           "earthquakes": load_earthquakes, "synthetic": load_synthetic}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default=",".join(LOADERS), help="comma list of " + ", ".join(LOADERS))
    ap.add_argument("--no-mixle", dest="mixle", action="store_false")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args(argv)
    names = [s.strip() for s in args.only.split(",") if s.strip()]
    for s in names:
        if s not in LOADERS:
            ap.error(f"--only takes {', '.join(LOADERS)}, got {s!r}")
    _limiter, pools = limit_threads()
    versions = {}
    for mod in ("numpy", "sklearn", "hmmlearn", "mixle"):
        try:
            versions[mod] = __import__(mod).__version__
        except Exception:
            versions[mod] = "absent"
    t0 = time.perf_counter()
    warm_up(args.mixle)
    results = []
    for s in names:
        print(f"{s} ...", flush=True)
        cases = LOADERS[s]()
        for case in cases if isinstance(cases, list) else [cases]:
            results.append(run_case(case, args.mixle))
    report = {"command": "python bench/quality.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "python": platform.python_version(),
                          "versions": versions, "blas_pools": pools},
              "n_init": N_INIT, "max_iter": MAX_ITER, "results": results, "total_s": time.perf_counter() - t0}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "quality.json").write_text(json.dumps(report, indent=2, default=float))
    md = markdown(report)
    (args.out / "quality.md").write_text(md)
    print()
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
