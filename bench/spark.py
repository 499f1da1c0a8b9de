"""emgrid on Spark against MLlib's GaussianMixture: the same session, the same DataFrame.

Each row fits mixtures of K full-covariance Gaussians (d=16) to N rows drawn from a mixture
of K well separated components, held in one Spark DataFrame of ``2 * cores`` partitions
(cached and counted before any fit), with

- MLlib: ``pyspark.ml.clustering.GaussianMixture(k=K, maxIter, tol, seed=0)`` on the
  DataFrame's columns assembled into a vector (its own random start: MLlib takes no start);
- emgrid: ``optimize(df, template, executor=get("spark", session=session))``, a template of
  K full Gaussians over the same columns, seeded from a sample (k-means), on the plan the
  planner makes for the session (``Resources.from_spark``).

Two fits each: ``--iters`` iterations exactly (tol 0), whose time per iteration is the
iterations' alone: emgrid's ``mean_timings()["total"]`` (its start-up, the tasks' rows and
the seeding are reported apart as ``startup s``), MLlib's the difference between that fit's
wall time and a one-iteration fit's, over the iterations between; and a fit to convergence (``tol=1e-6``: for emgrid the change of the
log-likelihood relative to it, for MLlib its own ``tol``, an absolute change of the total
log-likelihood, so MLlib's test is the stricter one here), whose wall time from the DataFrame
to the fitted model is ``converge s`` and whose final log-likelihood per row sits beside it.
BLAS is limited to one thread in every process (the driver and Spark's Python workers, via
the environment before the session starts; MLlib's JVM BLAS is single-threaded).

Run: ``OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python bench/spark.py`` (writes
``bench/results/spark.md`` and ``.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import warnings
from pathlib import Path
from time import perf_counter

import numpy as np

for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")

D = 16


def make_frame(session, n: int, k: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    means = rng.normal(scale=4.0, size=(k, D))
    labels = rng.integers(k, size=n)
    x = means[labels] + rng.normal(size=(n, D)) @ np.diag(rng.uniform(0.5, 1.5, D))
    import pandas as pd

    pdf = pd.DataFrame(x, columns=[f"f{j}" for j in range(D)])
    parts = 2 * session.sparkContext.defaultParallelism
    df = session.createDataFrame(pdf).repartition(parts).cache()
    df.count()
    return df


def mllib(df, k: int, iters: int, tol: float):
    from pyspark.ml.clustering import GaussianMixture
    from pyspark.ml.feature import VectorAssembler

    vec = VectorAssembler(inputCols=df.columns, outputCol="features").transform(df).select("features").cache()
    n = vec.count()
    t0 = perf_counter()
    model = GaussianMixture(k=k, maxIter=iters, tol=tol, seed=0).fit(vec)
    wall = perf_counter() - t0
    summary = model.summary
    vec.unpersist()
    return {"wall_s": wall, "iters": summary.numIter, "ll_per_row": summary.logLikelihood / n}


def emgrid_fit(df, k: int, iters: int, tol: float, session):
    from emgrid.executors import get, optimize
    from emgrid.models import FullGaussian, Mixture

    template = Mixture([FullGaussian(columns=list(df.columns))] * k)
    t0 = perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = optimize(df, template, executor=get("spark", session=session), max_iter=iters, tol=tol, init="kmeans")
    wall = perf_counter() - t0
    n = df.count()
    per_iter = res.mean_timings()["total"]
    refined = sum(len(t) for t in (res.init_traces or []))  # the start's refinement counts too
    return {"wall_s": wall, "iters": refined + len(res.log_likelihood), "per_iter_s": per_iter,
            "startup_s": wall - per_iter * (refined + len(res.log_likelihood)), "ll_per_row": res.log_likelihood[-1] / n,
            "grid": f"{res.plan.data_parallel}x{res.plan.model_parallel}"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="100000:4,100000:16,1000000:4", help="N:K,...")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--converge-max-iter", type=int, default=100, help="the fits to convergence stop here at most")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "spark"))
    args = ap.parse_args(argv)
    from emgrid.executors.spark_session import start_session, stop_session

    session = start_session(args.master)
    rows = []
    try:
        for case in args.cases.split(","):
            n, k = (int(v) for v in case.split(":"))
            df = make_frame(session, n, k)
            em_fixed = emgrid_fit(df, k, args.iters, 0.0, session)
            ml_fixed = mllib(df, k, args.iters, 0.0)
            ml_one = mllib(df, k, 1, 0.0)  # its start and one iteration: taken off the fit's time
            em_conv = emgrid_fit(df, k, args.converge_max_iter, 1e-6, session)
            ml_conv = mllib(df, k, args.converge_max_iter, 1e-6)
            df.unpersist()
            row = {"n": n, "k": k, "grid": em_fixed["grid"],
                   "emgrid_s_per_iter": em_fixed["per_iter_s"], "mllib_s_per_iter": (ml_fixed["wall_s"] - ml_one["wall_s"]) / max(1, ml_fixed["iters"] - 1),
                   "emgrid_startup_s": em_fixed["startup_s"],
                   "emgrid_converge_s": em_conv["wall_s"], "emgrid_iters": em_conv["iters"],
                   "emgrid_ll": em_conv["ll_per_row"],
                   "mllib_converge_s": ml_conv["wall_s"], "mllib_iters": ml_conv["iters"], "mllib_ll": ml_conv["ll_per_row"]}
            row["per_iter_ratio"] = row["mllib_s_per_iter"] / row["emgrid_s_per_iter"]
            row["converge_ratio"] = row["mllib_converge_s"] / row["emgrid_converge_s"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        stop_session(session)
    head = ("| N | K | grid | emgrid s/iter | MLlib s/iter | MLlib / emgrid | emgrid startup s | emgrid converge s (iters) "
            "| MLlib converge s (iters) | MLlib / emgrid | emgrid ll/row | MLlib ll/row |")
    lines = [f"# emgrid on Spark vs MLlib GaussianMixture ({args.master}, d={D}, full covariance)", "",
             f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {sys.version.split()[0]}; "
             "BLAS one thread per process. `python bench/spark.py`", "", head,
             "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        lines.append(f"| {r['n']:,} | {r['k']} | {r['grid']} | {r['emgrid_s_per_iter']:.4f} | {r['mllib_s_per_iter']:.3f} | "
                     f"{r['per_iter_ratio']:.1f}x | {r['emgrid_startup_s']:.1f} | {r['emgrid_converge_s']:.1f} "
                     f"({r['emgrid_iters']}) | {r['mllib_converge_s']:.1f} ({r['mllib_iters']}) | "
                     f"{r['converge_ratio']:.1f}x | {r['emgrid_ll']:.4f} | {r['mllib_ll']:.4f} |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
