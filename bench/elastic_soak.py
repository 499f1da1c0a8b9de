"""Elastic soak: fits that lose one to three workers at random moments, re-planned each time.

``python bench/elastic_soak.py [--fits 30]``. Fit ``i`` fits random model ``i``
(``bench/random_models.py``, seeded) on multiprocessing, planned for four uniform workers on a
pinned grid (4x1, 2x2 or 1x4 in turn, as the model's leaves allow), with
``on_worker_loss="replan"``; its callback kills (SIGKILL) the process of a random cell after
random iterations, one to three times. Each fit is compared with the same fit uninterrupted
(local executor, same plan): the trace and every parameter within 1e-9 relative, or it counts
as a wrong model. Counted and written to ``bench/results/elastic_soak.{md,json}``: fits, losses
injected, re-plans, wrong models, failed fits, processes of the fits left alive afterwards, and
the seconds each re-plan cost (from the loss noticed to the new grid started).
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from random_models import random_model  # noqa: E402

from emgrid.executors import get, optimize  # noqa: E402
from emgrid.executors.mpi_link import ended  # noqa: E402
from emgrid.planner import Resources, balance_plan  # noqa: E402

GRIDS = [(4, 1), (2, 2), (1, 4)]


def alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie does not)."""
    return not ended(pid)


def close(a, b, rtol: float = 1e-9) -> bool:
    """The same fit within ``rtol``. With ``tol=0`` a run stops when its log-likelihood repeats
    exactly (a collapsed model), which rounding decides: runs of different lengths agree when
    their common iterations do and the shorter stopped so."""
    n = min(len(a.log_likelihood), len(b.log_likelihood))
    if not np.allclose(a.log_likelihood[:n], b.log_likelihood[:n], rtol=rtol, atol=0):
        return False
    if len(a.log_likelihood) != len(b.log_likelihood):
        return (a if len(a.log_likelihood) == n else b).converged
    for (_, x), (_, y) in zip(a.model.nodes(), b.model.nodes()):
        for name, value in x.params().items():
            if not np.allclose(value, y.params()[name], rtol=rtol, atol=1e-12):
                return False
    return True


def one(i: int, seed: int, rows: int, max_iter: int) -> dict:
    rng = np.random.default_rng(seed + i)
    truth, start = random_model(seed + i)
    grid = GRIDS[i % 3]
    if len(start.leaves()) < grid[1]:
        grid = (4, 1)
    data = start.prepare(truth.sample(rows, rng))
    resources = Resources.uniform(4)
    plan = balance_plan(start, resources, n_data=rows, grid=grid)
    want = optimize(data, start, plan=plan, max_iter=max_iter, tol=0.0)
    losses = int(rng.integers(1, 4))
    at = sorted(int(a) for a in rng.choice(np.arange(1, max_iter - 1), size=losses, replace=False))
    ex = get("multiprocessing")
    pids: set[int] = set()
    killed = []

    def callback(it, ll, result):
        pids.update(ex.worker_pids)
        if at and it == at[0] and len(killed) == len(result.replans):
            at.pop(0)
            victim = ex.worker_pids[int(rng.integers(len(ex.worker_pids)))]
            killed.append(victim)
            os.kill(victim, signal.SIGKILL)

    row = {"fit": i, "model": start.describe(), "grid": f"{grid[0]}x{grid[1]}", "losses": 0, "replans": [],
           "ok": False, "right": False, "left_alive": 0}
    t0 = time.perf_counter()
    try:
        got = optimize(data, start, plan=plan, resources=resources, executor=ex, max_iter=max_iter, tol=0.0,
                       callback=callback, on_worker_loss="replan", max_replans=3)
        row.update(ok=True, right=close(got, want), replans=got.replans)
    except Exception as e:  # noqa: BLE001 - counted
        row["error"] = f"{type(e).__name__}: {e}"
        row["traceback"] = traceback.format_exc()
    row["losses"] = len(killed)
    row["seconds"] = time.perf_counter() - t0
    end = time.monotonic() + 30
    while time.monotonic() < end and any(alive(p) for p in pids):
        time.sleep(0.1)
    row["left_alive"] = sum(alive(p) for p in pids)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fits", type=int, default=30)
    ap.add_argument("--seed", type=int, default=2000)
    ap.add_argument("--rows", type=int, default=3000)
    ap.add_argument("--max-iter", type=int, default=8)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "elastic_soak"))
    args = ap.parse_args()
    rows = []
    for i in range(args.fits):
        r = one(i, args.seed, args.rows, args.max_iter)
        rows.append(r)
        print(json.dumps({k: v for k, v in r.items() if k not in ("traceback", "replans")}), flush=True)
    lost = [p["seconds_lost"] for r in rows for p in r["replans"]]
    summary = {"fits": len(rows), "losses": sum(r["losses"] for r in rows),
               "replans": sum(len(r["replans"]) for r in rows), "failed": sum(not r["ok"] for r in rows),
               "wrong_models": sum(r["ok"] and not r["right"] for r in rows),
               "left_alive": sum(r["left_alive"] for r in rows),
               "seconds_lost_median": statistics.median(lost) if lost else None,
               "seconds_lost_max": max(lost) if lost else None}
    md = ["# Elastic soak (multiprocessing, 4 workers planned, 1-3 losses per fit)", "",
          "`python bench/elastic_soak.py`: " + ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                                                         for k, v in summary.items()), "",
          "| fit | model | grid | losses | re-plans (new grids) | right | seconds |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        grids = ", ".join(f"{p['new_grid'][0]}x{p['new_grid'][1]}" for p in r["replans"])
        md.append(f"| {r['fit']} | {r['model'][:60]} | {r['grid']} | {r['losses']} | {len(r['replans'])} ({grids}) | "
                  f"{'yes' if r['right'] else 'NO: ' + r.get('error', 'differs')[:80]} | {r['seconds']:.1f} |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text("\n".join(md) + "\n")
    out.with_suffix(".json").write_text(json.dumps({"summary": summary, "fits": rows}, indent=1, default=str))
    print("\n".join(md[:3]))
    return 0 if summary["failed"] == summary["wrong_models"] == summary["left_alive"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
