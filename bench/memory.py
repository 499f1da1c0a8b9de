"""Predicted against measured peak memory per worker (``python bench/memory.py``).

For each model and grid: the plan's ``per_worker[i].memory_bytes`` (and its terms: the
worker's rows of data, one block of working arrays, parameters and statistics) beside the
peak resident memory the worker measured above its baseline
(``FitResult.worker_peak_bytes``; ``executors/memory.py`` defines the baseline: the
worker process after its imports and a four-row warm-up E-step, before it maps its rows).
Workers are ``multiprocessing`` processes (``--executor mpi`` runs the same fits under
``mpiexec``, each rank mapping its rows from the same ``.npy`` files).

``--families`` adds a second table: per model family, the working bytes per row a worker
really holds (measured peak minus its data, over one block of rows) against the model's
``models.cost.block_bytes_per_row`` (the nodes' kept bytes plus the largest scratch), the
input the plan's working-array term multiplies.

``--dtype float32`` plans and fits every model with its rows and E-step in float32 (the
rows written to disk in float64, each worker reading its own into float32).

Writes ``bench/results/memory.{md,json}`` (``memory_mpi`` with ``--executor mpi``, a
``_float32`` suffix with ``--dtype float32``; ``--out`` to change).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]  # bench/planner.py is not the package
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from emgrid.executors import NpyDataset, get, optimize  # noqa: E402
from emgrid.models import (HMM, Categorical, Composite, DiagGaussian, Exponential, FullGaussian, Gaussian,  # noqa: E402
                    Mixture, Poisson, Sequence, from_spec)
from emgrid.models.cost import block_bytes_per_row, tree_costs  # noqa: E402
from emgrid.models.engine import block_rows  # noqa: E402
from emgrid.planner import Resources, balance_plan  # noqa: E402
from emgrid.planner.costing import (COUPLING_COPIES, fixed_bytes, leaf_shard_array, model_facts, mstep_peak_bytes,  # noqa: E402
                                    shard_sums)  # noqa: E402
from emgrid.planner.plan import BalancePlan  # noqa: E402

MiB = 2**20
TOLERANCE = 0.25


# ---------------------------------------------------------------- the models
def bench_models(scale: float = 1.0):
    """``(name, model, rows, grids)``: the five models of the issue, a parameter-heavy and a
    data-heavy one."""
    rng = np.random.default_rng(0)

    def n(x):
        return max(1000, int(x * scale))

    k, d = 8, 16
    yield ("diag mixture K=8 d=16", Mixture([DiagGaussian(rng.normal(size=d), np.ones(d)) for _ in range(k)],
                                            np.full(k, 1 / k)), n(200_000), [(2, 1), (1, 2)])
    k, d = 4, 8
    yield ("full-cov mixture K=4 d=8", Mixture([FullGaussian(rng.normal(size=d), np.eye(d)) for _ in range(k)],
                                               np.full(k, 1 / k)), n(100_000), [(2, 1)])
    k, d = 2, 24
    yield ("full-cov mixture K=2 d=24", Mixture([FullGaussian(rng.normal(size=d), np.eye(d)) for _ in range(k)],
                                                np.full(k, 1 / k)), n(50_000), [(2, 1)])
    yield ("categorical+gaussian+sequence", Composite([Categorical(np.full(20, 0.05)), Gaussian(0.0, 1.0),
                                                       Sequence(DiagGaussian(np.zeros(4), np.ones(4)), 10.0)]),
           n(100_000), [(2, 1), (1, 2)])
    k = 4
    yield ("HMM K=4 diag d=4 L=100", HMM([DiagGaussian(rng.normal(size=4), np.ones(4)) for _ in range(k)],
                                         np.full((k, k), 1 / k), np.full(k, 1 / k), 100.0), n(3_000), [(2, 1), (1, 2)])
    v, k = 50_000, 8
    yield ("categorical mixture V=50000 K=8", Mixture([Categorical(rng.dirichlet(np.ones(v))) for _ in range(k)],
                                                      np.full(k, 1 / k)), n(200_000), [(2, 1)])
    v, k = 200_000, 4
    # the case model parallelism is for: parameters split over two shards, each shard's
    # workers receiving only their part (executors.step.shard_model)
    yield ("2 categorical mixtures V=200000 K=4", Composite([
        Mixture([Categorical(rng.dirichlet(np.ones(v))) for _ in range(k)], np.full(k, 1 / k)) for _ in range(2)]),
        n(20_000), [(2, 1), (1, 2)])
    # full covariances of many dimensions, one component group per shard: what the M-step's
    # temporaries, the Cholesky caches and the batched kernels' slices hold beside the data
    for d, rows in ((64, 20_000), (128, 10_000)):
        k = 16
        yield (f"full-cov mixture K=16 d={d}", Mixture([FullGaussian(rng.normal(size=d), np.eye(d)) for _ in range(k)],
                                                      np.full(k, 1 / k)), n(rows), [(1, 4)])
    k, d = 8, 16
    yield ("diag mixture K=8 d=16, N=2e6", Mixture([DiagGaussian(rng.normal(size=d), np.ones(d)) for _ in range(k)],
                                                   np.full(k, 1 / k)), n(2_000_000), [(2, 1)])


def terms(model, plan: BalancePlan) -> list[dict]:
    """The plan's memory terms of every worker (bytes), as planner.costing computes them."""
    facts = model_facts(model, plan.dtype)
    m = plan.model_parallel
    sums = shard_sums(facts, leaf_shard_array(facts, plan.shard_of_leaf()), m)
    out = []
    for w in plan.per_worker:
        b = min(w.rows, facts.block_rows)
        couple = COUPLING_COPIES * sums.coupling_bytes_per_row * b if m > 1 else 0.0
        out.append({"worker": w.name, "replica": w.replica, "shard": w.shard, "rows": w.rows, "block_rows": b,
                    "data": sums.data[w.shard] * w.rows, "work": (sums.work[w.shard] + sums.scratch[w.shard]) * b + couple,
                    "params_stats": fixed_bytes(sums.param[w.shard], sums.stat[w.shard], sums.cache[w.shard],
                                                plan.data_parallel) + mstep_peak_bytes(facts, plan.data_parallel),
                    "predicted": w.memory_bytes})
    return out


def run_mpi(dataset_dir: str, model, plan: BalancePlan, iterations: int) -> dict[str, int]:
    """The same fit under ``mpiexec``; every rank maps its rows of ``dataset_dir``."""
    work = Path(tempfile.mkdtemp(prefix="emgrid-memory-mpi-"))
    try:
        (work / "model.json").write_text(json.dumps(model.to_spec()))
        (work / "plan.json").write_text(plan.to_json())
        mpiexec = Path(sys.executable).with_name("mpiexec")
        cmd = [str(mpiexec), "-n", str(plan.workers_used), sys.executable, __file__, "--mpi-rank", dataset_dir,
               str(work), str(iterations)]
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
        subprocess.run(cmd, check=True, timeout=1800, env=env)
        return {k: int(v) for k, v in json.loads((work / "peaks.json").read_text()).items()}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def mpi_rank(dataset_dir: str, work: str, iterations: int) -> None:
    from mpi4py import MPI

    model = from_spec(json.loads(Path(work, "model.json").read_text()))
    plan = BalancePlan.from_json(Path(work, "plan.json").read_text())
    res = optimize(NpyDataset(dataset_dir), model, plan=plan, executor="mpi", max_iter=iterations, tol=0.0,
                   dtype=plan.dtype)
    if MPI.COMM_WORLD.Get_rank() == 0:
        Path(work, "peaks.json").write_text(json.dumps(res.worker_peak_bytes))


def measure_models(executor: str, scale: float, iterations: int, only: str | None,
                   dtype: str = "float64") -> list[dict]:
    rows = []
    for name, model, n, grids in bench_models(scale):
        if only and only not in name:
            continue
        scratch = tempfile.mkdtemp(prefix="emgrid-memory-")
        try:
            t0 = time.perf_counter()
            data = model.prepare(model.sample(n, np.random.default_rng(1)))
            dataset = NpyDataset.write(data, scratch)
            del data
            for grid in grids:
                # under MPI the rank of cell (0, 0) also coordinates
                resources = Resources.uniform(max(2, grid[0] * grid[1])).model_copy(
                    update={"coordinator_in_grid": executor == "mpi"})
                plan = balance_plan(model, resources, n_data=n, grid=grid, dtype=dtype)
                if executor == "mpi":
                    peaks = run_mpi(scratch, model, plan, iterations)
                else:
                    res = optimize(dataset, model, plan=plan, executor=get("multiprocessing"), max_iter=iterations,
                                   tol=0.0, dtype=dtype)
                    peaks = res.worker_peak_bytes
                for t in terms(model, plan):
                    measured = peaks[t["worker"]]
                    ratio = measured / t["predicted"]
                    rows.append({"model": name, "grid": f"{grid[0]}x{grid[1]}", "n_data": n, **t, "measured": measured,
                                 "ratio": ratio, "within_25": abs(ratio - 1) <= TOLERANCE,
                                 "measured_minus_data": measured - t["data"]})
                    print(f"{name:34s} {grid[0]}x{grid[1]} {t['worker']:3s} predicted {t['predicted'] / MiB:8.2f} MiB"
                          f"  measured {measured / MiB:8.2f} MiB  ratio {ratio:5.2f}", flush=True)
            print(f"  ({time.perf_counter() - t0:.1f} s)", flush=True)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return rows


# ---------------------------------------------------------------- per family
def family_cases():
    rng = np.random.default_rng(0)

    def diag(d):
        return DiagGaussian(rng.normal(size=d), np.ones(d))

    def full(d):
        return FullGaussian(rng.normal(size=d), np.eye(d))

    def cat(v):
        return Categorical(rng.dirichlet(np.ones(v)))

    def mix(k, make):
        return Mixture([make() for _ in range(k)], np.full(k, 1 / k))

    def hmm(k, length, make):
        return HMM([make() for _ in range(k)], np.full((k, k), 1 / k), np.full(k, 1 / k), length)

    yield "Gaussian", Gaussian(0.0, 1.0)
    yield "Poisson", Poisson(3.0)
    yield "Exponential", Exponential(1.0)
    yield "Categorical V=200", cat(200)
    yield "DiagGaussian d=8", diag(8)
    yield "DiagGaussian d=32", diag(32)
    yield "FullGaussian d=8", full(8)
    yield "FullGaussian d=24", full(24)
    yield "Mixture K=8 of Gaussian", mix(8, lambda: Gaussian(float(rng.normal()), 1.0))
    yield "Mixture K=4 of DiagGaussian d=8", mix(4, lambda: diag(8))
    yield "Mixture K=16 of DiagGaussian d=8", mix(16, lambda: diag(8))
    yield "Mixture K=4 of FullGaussian d=8", mix(4, lambda: full(8))
    yield "Mixture K=2 of FullGaussian d=24", mix(2, lambda: full(24))
    yield "Mixture K=8 of Categorical V=20", mix(8, lambda: cat(20))
    yield "Mixture K=3 of Composite(Gaussian, Poisson)", mix(3, lambda: Composite([Gaussian(float(rng.normal()), 1.0),
                                                                                    Poisson(3.0)]))
    yield "Sequence L=20 of Gaussian", Sequence(Gaussian(0.0, 1.0), 20.0)
    yield "Sequence L=10 of DiagGaussian d=4", Sequence(diag(4), 10.0)
    yield "HMM K=4 L=10 of Gaussian", hmm(4, 10.0, lambda: Gaussian(float(rng.normal()), 1.0))
    yield "HMM K=4 L=10 of DiagGaussian d=4", hmm(4, 10.0, lambda: diag(4))
    yield "Composite(Gaussian, Poisson, Categorical)", Composite([Gaussian(0.0, 1.0), Poisson(2.0), cat(10)])


def measure_families(iterations: int) -> list[dict]:
    """One worker, two blocks of rows: (measured - data) / block rows against the model's figure."""
    rows = []
    for name, model in family_cases():
        b = block_rows(model)
        n = 2 * b
        facts = model_facts(model)
        data = model.prepare(model.sample(n, np.random.default_rng(1)))
        plan = balance_plan(model, Resources.uniform(1), n_data=n, grid=(1, 1))
        res = optimize(data, model, plan=plan, executor="multiprocessing", max_iter=iterations, tol=0.0)
        measured = res.worker_peak_bytes["w0"]
        held = (measured - facts.group_data.sum() * n - fixed_bytes(facts.param.sum(), facts.stat.sum(), facts.cache.sum(), 1)
                - mstep_peak_bytes(facts, 1))
        model_w = block_bytes_per_row(tree_costs(model))
        real = held / b
        rows.append({"family": name, "block_rows": b, "model_work_bytes_per_row": model_w,
                     "measured_work_bytes_per_row": real, "ratio": real / model_w})
        print(f"{name:44s} block {b:6d}  model {model_w:8.0f} B/row  measured {real:8.0f} B/row  "
              f"ratio {real / model_w:5.2f}", flush=True)
    return rows


# ---------------------------------------------------------------- report
def markdown(rows: list[dict], families: list[dict], meta: dict) -> str:
    lines = ["# Predicted against measured peak memory per worker", "",
             f"`python bench/memory.py` ({meta['executor']}, {meta.get('dtype', 'float64')}, "
             f"{meta['iterations']} iterations per fit, "
             f"{meta['date']}, {meta['machine']}).", "",
             "Predicted: the plan's `per_worker[i].memory_bytes` = data (the worker's rows of its columns) + "
             "work (one block of working arrays: block rows x (the kept bytes of the nodes it evaluates + their largest scratch), plus exchanged log "
             "densities) + params+stats: with several replicas 3 x (parameters + statistics), the model, the statistics, one more of either in transit; "
             "with one replica parameters + statistics + the kernels' caches, plus the model's largest single-node M-step "
             "(`planner.costing.fixed_bytes`, `mstep_peak_bytes`). Measured: the worker's peak RSS above its "
             "baseline (after imports and a 4-row warm-up E-step, before it maps its rows). MiB.", "",
             "| model | grid | worker | rows | data | work | params+stats | **predicted** | **measured** | "
             "measured/predicted | within 25% | measured - data |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|:---:|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['grid']} | {r['worker']} | {r['rows']} | {r['data'] / MiB:.2f} | "
                     f"{r['work'] / MiB:.2f} | {r['params_stats'] / MiB:.2f} | **{r['predicted'] / MiB:.2f}** | "
                     f"**{r['measured'] / MiB:.2f}** | {r['ratio']:.2f} | {'yes' if r['within_25'] else 'NO'} | "
                     f"{r['measured_minus_data'] / MiB:.2f} |")
    ok = sum(r["within_25"] for r in rows)
    lines += ["", f"{ok} of {len(rows)} workers within 25%; measured/predicted from "
              f"{min(r['ratio'] for r in rows):.2f} to {max(r['ratio'] for r in rows):.2f}." if rows else ""]
    if families:
        lines += ["", "## Working bytes per row, by family", "",
                  "One worker, two blocks of rows; measured = (peak - data - 3 x (params + stats)) / block "
                  "rows, against `block_bytes_per_row` (the nodes' kept bytes plus the largest scratch; "
                  "what the plan multiplies by the block rows). A ratio below 1: the plan over-predicts the working arrays.", "",
                  "| model | block rows | model's bytes/row | measured bytes/row | measured/model |",
                  "|---|---:|---:|---:|---:|"]
        for f in families:
            lines.append(f"| {f['family']} | {f['block_rows']} | {f['model_work_bytes_per_row']:.0f} | "
                         f"{f['measured_work_bytes_per_row']:.0f} | {f['ratio']:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--mpi-rank":
        mpi_rank(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--executor", choices=["multiprocessing", "mpi"], default="multiprocessing")
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--scale", type=float, default=1.0, help="multiply every model's rows")
    p.add_argument("--only", help="models whose name contains this")
    p.add_argument("--families", action="store_true", help="also the per-family table")
    p.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    p.add_argument("--out", help="where to write .md and .json (default: bench/results/memory, "
                                 "memory_mpi for --executor mpi)")
    args = p.parse_args()
    if args.out is None:
        args.out = str(HERE / "results" / (("memory_mpi" if args.executor == "mpi" else "memory")
                                           + ("_float32" if args.dtype == "float32" else "")))
    meta = {"executor": args.executor, "iterations": args.iterations, "scale": args.scale, "dtype": args.dtype,
            "date": time.strftime("%Y-%m-%d %H:%M"), "machine": f"{os.cpu_count()} cores"}
    rows = measure_models(args.executor, args.scale, args.iterations, args.only, args.dtype)
    families = measure_families(args.iterations) if args.families else []
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "workers": rows, "families": families}, indent=1,
                                                   default=float))
    out.with_suffix(".md").write_text(markdown(rows, families, meta))
    print(f"wrote {out.with_suffix('.md')} and {out.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
