"""BLAS threads per worker under load: local and MPI fits beside another CPU-bound process.

Each case runs one fit (a mixture of full-covariance Gaussians, whose E-step and M-step are
BLAS calls) while a busy loop (a second Python process spinning) holds one of the cores:
``local`` and ``mpi`` (``mpiexec -n 2``, this script started again), each with the default
limit (``blas_threads=1``: one BLAS thread per worker) and without it (``blas_threads=None``:
the BLAS's own pool, one thread per core). No thread variable reaches any process, so
"without" is what a user gets from a plain ``pip install``. Seconds per iteration are the
median over the iterations after the first; the rounds alternate the cases' order.

Usage::

    python bench/threads.py              # writes bench/results/threads.{json,md}
    python bench/threads.py --quick      # smaller N, one round
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
             "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ.pop(_var, None)

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
MPIEXEC = Path(sys.executable).with_name("mpiexec")
K, DIM = 8, 16


def _model_and_data(n: int):
    from emgrid.models import FullGaussian, Mixture

    rng = np.random.default_rng(0)
    truth = Mixture([FullGaussian(rng.normal(0, 3, DIM), np.eye(DIM)) for _ in range(K)], [1 / K] * K)
    start = Mixture([FullGaussian(rng.normal(0, 3, DIM), 2 * np.eye(DIM)) for _ in range(K)], [1 / K] * K)
    return start, truth.prepare(truth.sample(n, np.random.default_rng(1)))


def _fit(executor: str, limit: str, n: int, iterations: int, comm=None) -> dict:
    from emgrid.executors import get, optimize
    from emgrid.planner import Resources, balance_plan

    model, data = _model_and_data(n)
    workers = 1 if comm is None else comm.Get_size()
    plan = balance_plan(model, Resources.uniform(workers), n_data=n, grid=(workers, 1))
    ex = get(executor, blas_threads=None if limit == "none" else int(limit))
    t0 = time.perf_counter()
    result = optimize(data, model, plan=plan, executor=ex, max_iter=iterations, tol=0.0)
    per_iter = [t["total"] for t in result.timings[1:]]
    return {"s_per_iter": statistics.median(per_iter), "wall_s": time.perf_counter() - t0,
            "final_loglik": result.log_likelihood[-1]}


def _run_mpi(limit: str, n: int, iterations: int) -> dict:
    out = RESULTS / f".threads-mpi-{os.getpid()}.json"
    cmd = [str(MPIEXEC) if MPIEXEC.exists() else "mpiexec", "-n", "2", sys.executable, __file__,
           "--mpi-child", str(out), "--limit", limit, "--n", str(n), "--iterations", str(iterations)]
    try:
        subprocess.run(cmd, check=True, timeout=600, cwd=str(ROOT))
        return json.loads(out.read_text())
    finally:
        out.unlink(missing_ok=True)


def _busy() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def run(n: int, iterations: int, rounds: int) -> dict:
    cases = [("local", "1"), ("local", "none"), ("mpi", "1"), ("mpi", "none")]
    got: dict[str, list[dict]] = {f"{e}/{lim}": [] for e, lim in cases}
    for r in range(rounds):
        for executor, limit in (cases if r % 2 == 0 else cases[::-1]):
            busy = _busy()
            try:
                time.sleep(0.2)
                out = _fit(executor, limit, n, iterations) if executor == "local" else _run_mpi(limit, n, iterations)
            finally:
                busy.kill()
                busy.wait()
            got[f"{executor}/{limit}"].append(out)
            print(f"round {r + 1}: {executor:<6} blas_threads={limit:<5} {out['s_per_iter']:.4f} s/iter", flush=True)
    summary = {}
    for key, runs in got.items():
        executor, limit = key.split("/")
        summary[key] = {"executor": executor, "blas_threads": None if limit == "none" else int(limit),
                        "s_per_iter": statistics.median(r["s_per_iter"] for r in runs),
                        "runs": [r["s_per_iter"] for r in runs]}
    for executor in ("local", "mpi"):
        with_limit, without = summary[f"{executor}/1"], summary[f"{executor}/none"]
        without["slower_than_limited"] = without["s_per_iter"] / with_limit["s_per_iter"]
    return {"n": n, "k": K, "dim": DIM, "iterations": iterations, "rounds": rounds,
            "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "cases": summary}


def table(res: dict) -> str:
    lines = [f"Mixture of {res['k']} full-covariance Gaussians, d={res['dim']}, N={res['n']}, "
             f"{res['iterations']} iterations, {res['rounds']} round(s), {res['cores']} cores, "
             "one other CPU-bound process running", "",
             "| executor | workers | BLAS threads per worker | s/iter (median) | runs | vs limited |",
             "|---|---|---|---|---|---|"]
    for c in res["cases"].values():
        threads = "1 (default)" if c["blas_threads"] == 1 else "unlimited (library default)"
        ratio = f"{c['slower_than_limited']:.2f}x" if "slower_than_limited" in c else "1"
        runs = ", ".join(f"{x:.3f}" for x in c["runs"])
        workers = 1 if c["executor"] == "local" else 2
        lines.append(f"| {c['executor']} | {workers} | {threads} | {c['s_per_iter']:.4f} | {runs} | {ratio} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--n", type=int, default=None)
    p.add_argument("--iterations", type=int, default=6)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--mpi-child", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--limit", default="1", help=argparse.SUPPRESS)
    args = p.parse_args()
    n = args.n or (20_000 if args.quick else 50_000)
    if args.mpi_child:
        from mpi4py import MPI

        out = _fit("mpi", args.limit, n, args.iterations, MPI.COMM_WORLD)
        if MPI.COMM_WORLD.Get_rank() == 0:
            args.mpi_child.write_text(json.dumps(out))
        return
    res = run(n, args.iterations, 1 if args.quick else args.rounds)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "threads.json").write_text(json.dumps(res, indent=1))
    text = table(res)
    (RESULTS / "threads.md").write_text(text + "\n")
    print("\n" + text)


if __name__ == "__main__":
    main()
