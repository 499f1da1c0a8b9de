"""Log-likelihood traces of the soak's random models on every executor and grid, to compare
two versions of the code (a refactor must leave them equal).

``python bench/trace_baseline.py --out traces.json`` records; ``--compare traces.json``
records again and reports, per model and run, the largest relative difference (it exits 1
when one exceeds ``--rtol``, default 1e-12, or a run fails or plans differently).

Runs per model (seeded, ``bench/random_models.py``): local on grids 1x1, 2x1 and 1x2 (the
last for models of two or more leaves), multiprocessing on 2x1 and 1x2, and MPI on the same
two grids, the MPI fits of every model in one ``mpiexec -n 2``. Every run is ``--iters`` EM
iterations with ``tol = 0``, on plans pinned to the grid for two uniform workers.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from bench.random_models import random_model  # noqa: E402
from emgrid.executors import optimize  # noqa: E402
from emgrid.planner import Resources, balance_plan  # noqa: E402

MPI_MARK = "--mpi-runs"


def grids(model) -> list[tuple[int, int]]:
    return [(2, 1), (1, 2)] if len(model.leaves()) >= 2 else [(2, 1)]


def one_model(index: int, seed: int, rows: int):
    truth, start = random_model(seed + index)
    data = start.prepare(truth.sample(rows, np.random.default_rng(seed + index)))
    return start, data


def plan_for(model, rows: int, grid):
    return balance_plan(model, Resources.uniform(2), n_data=rows, grid=grid)


def run(executor: str, model, data, plan, iters: int) -> list[float]:
    return list(optimize(data, model, plan=plan, executor=executor, max_iter=iters, tol=0.0).log_likelihood)


def record(args) -> dict:
    out = {}
    for i in range(args.models):
        model, data = one_model(i, args.seed, args.rows)
        runs = {}
        for grid in [(1, 1)] + grids(model):
            plan = plan_for(model, args.rows, grid)
            shards = plan.shard_of_leaf()
            for ex in ["local"] + ([] if grid == (1, 1) else ["multiprocessing"]):
                key = f"{ex} {grid[0]}x{grid[1]}"
                try:
                    runs[key] = {"trace": run(ex, model, data, plan, args.iters), "shards": shards}
                except Exception as e:  # noqa: BLE001 - reported as a failed run
                    runs[key] = {"error": f"{type(e).__name__}: {e}"}
        out[str(i)] = {"model": model.describe(), "runs": runs}
        print(f"model {i}: {model.describe()} ({len(model.leaves())} leaves)", flush=True)
    mpi = mpi_traces(args)
    for i, runs in mpi.items():
        out[i]["runs"].update(runs)
    return out


def mpi_traces(args) -> dict:
    mpiexec = Path(sys.executable).with_name("mpiexec")
    spec = json.dumps({"models": args.models, "seed": args.seed, "rows": args.rows, "iters": args.iters})
    proc = subprocess.run([str(mpiexec), "-n", "2", sys.executable, __file__, MPI_MARK, spec],
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"mpiexec exited {proc.returncode}: {proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def mpi_runs(spec: dict) -> None:
    from mpi4py import MPI

    out = {}
    for i in range(spec["models"]):
        model, data = one_model(i, spec["seed"], spec["rows"])
        runs = {}
        for grid in grids(model):
            key = f"mpi {grid[0]}x{grid[1]}"
            try:
                runs[key] = {"trace": run("mpi", model, data, plan_for(model, spec["rows"], grid), spec["iters"])}
            except Exception as e:  # noqa: BLE001 - reported as a failed run
                runs[key] = {"error": f"{type(e).__name__}: {e}"}
        out[str(i)] = runs
    if MPI.COMM_WORLD.Get_rank() == 0:
        print(json.dumps(out), flush=True)


def compare(before: dict, now: dict, rtol: float) -> int:
    bad, worst = 0, 0.0
    for i, entry in before.items():
        for key, old in entry["runs"].items():
            new = now.get(i, {}).get("runs", {}).get(key)
            if new is None or "error" in new or "error" in old:
                print(f"model {i} {key}: before {old.get('error', 'ok')}, now {None if new is None else new.get('error', 'ok')}")
                bad += int(new is None or "error" in new) if "error" not in old else int(new is None or "error" not in new)
                continue
            if old.get("shards") is not None and new.get("shards") != old["shards"]:
                print(f"model {i} {key}: planned differently: {old['shards']} -> {new['shards']}")
                bad += 1
            a, b = np.array(old["trace"]), np.array(new["trace"])
            if a.shape != b.shape:
                print(f"model {i} {key}: {a.size} iterations before, {b.size} now")
                bad += 1
                continue
            rel = float(np.max(np.abs(a - b) / np.maximum(np.abs(a), 1e-300))) if a.size else 0.0
            worst = max(worst, rel)
            if rel > rtol:
                print(f"model {i} {key}: relative difference {rel:.3g}")
                bad += 1
    n = sum(len(e["runs"]) for e in before.values())
    print(f"{n} runs of {len(before)} models compared; {bad} differ; largest relative difference {worst:.3g}")
    return 1 if bad else 0


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == MPI_MARK:
        mpi_runs(json.loads(sys.argv[2]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--compare", type=Path)
    ap.add_argument("--models", type=int, default=24)
    ap.add_argument("--rows", type=int, default=1500)
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--seed", type=int, default=7000)
    ap.add_argument("--rtol", type=float, default=1e-12)
    args = ap.parse_args()
    if args.compare is not None:
        before = json.loads(args.compare.read_text())
        args.models = len(before)
    now = record(args)
    if args.out is not None:
        args.out.write_text(json.dumps(now))
    return compare(before, now, args.rtol) if args.compare is not None else 0


if __name__ == "__main__":
    sys.exit(main())
