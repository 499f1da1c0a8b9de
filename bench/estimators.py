"""The estimators' time against scikit-learn's and hmmlearn's, fitted from scratch in one run.

Each row fits the same data with emgrid's estimator and the peer's of the same name and the
same parameters (``n_init`` equal, ``random_state=0``, the peer's defaults otherwise: ``tol``,
``max_iter``/``n_iter``, ``reg_covar``), from a new estimator each time, so the time includes
the initialization (and for emgrid the plan). Every number comes from this one process with
BLAS at one thread (threadpoolctl), after one warm-up fit of each library; each time is the
median of ``--repeats`` fits. ``ratio`` is emgrid's time over the peer's (below 1: emgrid is
faster). Beside the time, each library's final log-likelihood per row (``score``: the mean
for scikit-learn, the total over positions for hmmlearn, divided here by the positions) and
its iterations, so a time is read next to what it bought (emgrid's count is the chosen
start's run after its ``init_iter`` refinement: with ``n_init=5`` each start first runs 10
iterations). The GaussianHMM rows differ in log-likelihood by design: hmmlearn regularizes
each variance by ``covars_prior / occupancy`` (1e-2), emgrid adds ``min_covar`` (1e-3), and
many digit pixels are almost constant within a state (README, Estimators).

Data sets:

- ``iris`` (150 x 4) and ``wine`` (178 x 13, raw columns): ``GaussianMixture(3)``, full.
- ``digits`` (1797 x 64): ``GaussianMixture(10, covariance_type="diag")``; and as sequences,
  each image's 8 rows of 8 pixels one sequence of 8 positions, ``GaussianHMM(4)`` (diag),
  and the first 360 images' 64 pixel intensities (0..16) row-major, ``CategoricalHMM(8)``.

Run: ``OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python bench/estimators.py`` (writes
``bench/results/estimators.md`` and ``.json``).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import warnings
from pathlib import Path
from time import perf_counter

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _rows():
    """``(data set, estimator name, params, emgrid factory, peer factory, data, fit args)``."""
    from hmmlearn import hmm
    from sklearn.datasets import load_digits, load_iris, load_wine
    from sklearn.mixture import GaussianMixture as SkGM

    import emgrid.estimators as eg

    digits = load_digits().data
    pixel_rows = digits.reshape(-1, 8)  # every image: 8 positions of 8 pixels
    symbols = digits[:360].reshape(-1, 1).astype(np.int64)
    out = []
    for name, X, k, cov in (("iris", load_iris().data, 3, "full"), ("wine", load_wine().data, 3, "full"),
                            ("digits", digits, 10, "diag")):
        for n_init in (1, 5):
            params = dict(n_components=k, covariance_type=cov, n_init=n_init, random_state=0)
            out.append((name, "GaussianMixture", params, lambda p=params: eg.GaussianMixture(**p),
                        lambda p=params: SkGM(**p), (X,)))
    params = dict(n_components=4, covariance_type="diag", random_state=0)
    out.append(("digits (8 rows x 8 pixels)", "GaussianHMM", params, lambda p=params: eg.GaussianHMM(**p),
                lambda p=params: hmm.GaussianHMM(**p), (pixel_rows, [8] * len(digits))))
    params = dict(n_components=8, random_state=0)
    out.append(("digits (360 x 64 pixels)", "CategoricalHMM", params, lambda p=params: eg.CategoricalHMM(**p),
                lambda p=params: hmm.CategoricalHMM(**p), (symbols, [64] * 360)))
    return out


def _fit(factory, args):
    est = factory()
    t = perf_counter()
    est.fit(*args)
    return perf_counter() - t, est


def _per_row(est, args) -> float:
    X = args[0]
    score = est.score(*args)
    return float(score) if len(args) == 1 else float(score) / X.shape[0]


def _iterations(est) -> int:
    return int(est.n_iter_) if hasattr(est, "n_iter_") else int(est.monitor_.iter)


def run(repeats: int) -> dict:
    from threadpoolctl import threadpool_info, threadpool_limits

    import hmmlearn
    import sklearn

    limiter = threadpool_limits(limits=1)
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for data, estimator, params, ours, theirs, args in _rows():
            _fit(ours, args), _fit(theirs, args)  # warm-up: imports, first calls of the kernels
            t_ours, t_theirs = [], []
            for _ in range(repeats):
                t, e_ours = _fit(ours, args)
                t_ours.append(t)
                t, e_theirs = _fit(theirs, args)
                t_theirs.append(t)
            a, b = statistics.median(t_ours), statistics.median(t_theirs)
            rows.append({"data": data, "estimator": estimator, "params": {k: v for k, v in params.items()
                                                                         if k != "random_state"},
                         "emgrid_s": a, "peer_s": b, "ratio": a / b,
                         "emgrid_ll_per_row": _per_row(e_ours, args), "peer_ll_per_row": _per_row(e_theirs, args),
                         "emgrid_iterations": _iterations(e_ours), "peer_iterations": _iterations(e_theirs)})
            print(f"{data:28s} {estimator:16s} {rows[-1]['params']}  emgrid {a:.4f} s  peer {b:.4f} s  "
                  f"ratio {a / b:.2f}", flush=True)
    threads = [{k: p.get(k) for k in ("internal_api", "version", "num_threads")} for p in threadpool_info()]
    limiter.restore_original_limits()
    return {"repeats": repeats, "python": sys.version.split()[0], "machine": platform.machine(),
            "scikit-learn": sklearn.__version__, "hmmlearn": hmmlearn.__version__, "blas": threads, "rows": rows}


def markdown(report: dict) -> str:
    lines = ["# emgrid's estimators against scikit-learn's and hmmlearn's", "",
             f"`python bench/estimators.py` (median of {report['repeats']} fits from scratch each, one process, "
             f"BLAS at one thread; scikit-learn {report['scikit-learn']}, hmmlearn {report['hmmlearn']}). "
             "ratio = emgrid's time / the peer's (below 1: emgrid is faster); log-likelihood per row (per "
             "position for the HMMs) and iterations of each fit beside it (emgrid's: the chosen start's run "
             "after its refinement). The GaussianHMM fits differ by their regularization of near-constant "
             "pixels (hmmlearn's covars_prior, emgrid's min_covar).", "",
             "| data | estimator | parameters | emgrid s | peer s | ratio | emgrid ll/row | peer ll/row "
             "| iterations (emgrid / peer) |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in report["rows"]:
        params = ", ".join(f"{k}={v}" for k, v in r["params"].items())
        lines.append(f"| {r['data']} | {r['estimator']} | {params} | {r['emgrid_s']:.4f} | {r['peer_s']:.4f} "
                     f"| {r['ratio']:.2f} | {r['emgrid_ll_per_row']:.4f} | {r['peer_ll_per_row']:.4f} "
                     f"| {r['emgrid_iterations']} / {r['peer_iterations']} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args(argv)
    report = run(args.repeats)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "estimators.json").write_text(json.dumps(report, indent=2, default=float))
    md = markdown(report)
    (args.out / "estimators.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
