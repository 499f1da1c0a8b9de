"""The largest model the planner fits on 4 workers of a given memory (``python bench/largest_model.py``).

For each model shape (a record of ``k`` full Gaussians of dimension 64; a record of ``k``
categoricals of 20,000 values; a mixture of ``k`` diagonal Gaussians of dimension 256) and
each worker memory, the largest ``k`` for which ``balance_plan`` on ``Resources.uniform(4,
memory_bytes=...)`` with the coordinator in the grid (as under MPI) finds a plan, found by
doubling then bisection, with the model's parameter bytes and the grid chosen.

``--label before|after`` names the code being measured; each run adds its rows to
``bench/results/largest_model.json`` under that label, and the table
(``largest_model.md``) shows every label side by side. To measure an older version, run
this script with that version's ``emgrid`` first on ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]

import numpy as np  # noqa: E402

from emgrid.models import Categorical, Composite, DiagGaussian, FullGaussian, Mixture  # noqa: E402
from emgrid.planner import InfeasiblePlanError, Resources, SolverConfig, balance_plan  # noqa: E402

MiB = 2**20
N_DATA = 2_000
SOLVER = SolverConfig(time_limit_s=5.0)


def shapes():
    return {
        "record of k FullGaussian d=64": lambda k: Composite([FullGaussian(np.zeros(64), np.eye(64)) for _ in range(k)]),
        "record of k Categorical V=20000": lambda k: Composite([Categorical(np.full(20_000, 1 / 20_000)) for _ in range(k)]),
        "mixture of k DiagGaussian d=256": lambda k: Mixture([DiagGaussian(np.zeros(256), np.ones(256)) for _ in range(k)],
                                                             np.full(k, 1 / k)),
    }


def param_bytes(model) -> int:
    return sum(a.nbytes for _, node in model.nodes() for a in node.params().values())


def plans(make, k: int, memory: int):
    res = Resources.uniform(4, memory_bytes=memory).model_copy(update={"coordinator_in_grid": True})
    try:
        return balance_plan(make(k), res, n_data=N_DATA, solver=SOLVER)
    except InfeasiblePlanError:
        return None


K_MAX = 16384  # the search stops here: a row showing it fits at least that


def largest(make, memory: int, k_max: int = K_MAX):
    """The largest k that plans (0 when even k = 1 does not), and its plan."""
    if plans(make, 1, memory) is None:
        return 0, None
    lo, hi = 1, 2
    while hi <= k_max and plans(make, hi, memory) is not None:
        lo, hi = hi, hi * 2
    hi = min(hi, k_max + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if plans(make, mid, memory) is not None:
            lo = mid
        else:
            hi = mid
    return lo, plans(make, lo, memory)


def table(results: dict) -> str:
    labels = list(results)
    rows = {}
    for label in labels:
        for r in results[label]:
            rows.setdefault((r["shape"], r["memory_mib"]), {})[label] = r
    head = "| model | worker memory | " + " | ".join(f"{lb}: largest k, parameters, grid" for lb in labels) + " |"
    out = [head, "|---|---|" + "---|" * len(labels)]
    for (shape, mem), by in rows.items():
        cells = []
        for lb in labels:
            r = by.get(lb)
            at_cap = r is not None and r["k"] >= K_MAX
            cells.append("-" if r is None else f"{'>= ' if at_cap else ''}{r['k']}, {r['param_mib']:.1f} MiB, {r['grid']}")
        out.append(f"| {shape} | {mem} MiB | " + " | ".join(cells) + " |")
    return "\n".join(out)


def markdown(results: dict) -> str:
    return (f"# The largest model on 4 workers, coordinator in the grid\n\n`python bench/largest_model.py --label LABEL` "
            f"(n_data = {N_DATA:,}, solver time limit {SOLVER.time_limit_s} s; parameters = the model's parameter bytes; "
            f"the search stops at k = {K_MAX}). `before` is the code before the sharded M-step (commit 9f2c9a5), whose "
            "plans charged the coordinator's cell 2.5 copies of the whole model; `after` charges it the internal nodes "
            "only; `one-replica` (commit c5c17ef) plans a worker of a one-replica grid for what it holds once: its "
            "parameters, statistics and the kernels' caches, and one node's M-step (`planner.costing.fixed_bytes`), "
            "where `after` charged every worker three copies of its parameters and statistics.\n\n" + table(results) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--label", default="after")
    ap.add_argument("--memory-mib", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--out", type=Path, default=HERE / "results" / "largest_model")
    ap.add_argument("--render", action="store_true", help="only rewrite the table from the stored results")
    args = ap.parse_args()
    if args.render:
        results = json.loads(args.out.with_suffix(".json").read_text())
        args.out.with_suffix(".md").write_text(markdown(results))
        print(table(results))
        return 0
    rows = []
    for name, make in shapes().items():
        for mem in args.memory_mib:
            k, plan = largest(make, mem * MiB)
            grid = "-" if plan is None else f"{plan.data_parallel}x{plan.model_parallel}"
            pb = param_bytes(make(k)) / MiB if k else 0.0
            rows.append({"shape": name, "memory_mib": mem, "k": k, "param_mib": pb, "grid": grid})
            print(f"{args.label}: {name}, {mem} MiB workers: k = {k} ({pb:.1f} MiB of parameters), grid {grid}", flush=True)
    path = args.out.with_suffix(".json")
    results = json.loads(path.read_text()) if path.exists() else {}
    results[args.label] = rows
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1))
    args.out.with_suffix(".md").write_text(markdown(results))
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
