"""Calibrates the analytic cost model: measured E-step time per row against ``cost()`` FLOPs.

For every family, one model of that family (its children where it has some) is timed on
sampled data through ``models.engine.e_step`` (the upward and downward passes over row
blocks, statistics folded) and compared with the analytic ``flops_per_row`` of the planner
(``planner.costing.model_facts``: the nodes' FLOPs per row and their per-block visits). Each family's *implied rate* is predicted
FLOPs per row over measured seconds per row; one global rate is fitted to them all (the
geometric mean, which minimizes the squared log error of the predicted times).

The analytic counts are what the planner balances with, so what matters is that one rate
predicts every family: the spread (max / min) of the implied rates must stay within 3x.
The counts are in the units of ``models.units`` (one elementwise float64 operation; matrix
products, exp/log, gathers and running sums weighted by their relative time), so the rate
is "elementwise operations per second", about 2e9 on one core of the reference machine.

One thread (BLAS pools limited before numpy loads). Each family is timed ``--repeats`` times,
interleaved with the others so that a noisy neighbour hits all of them alike; the fastest
run counts. Rows per family are chosen so that one E-step takes about ``--seconds``.

Usage::

    python bench/cost_model.py                  # writes bench/results/calibration.json
    python bench/cost_model.py --seconds 0.1 --repeats 3 --out /tmp/cal   # quick

On another machine: run it there and plan with the printed rate, e.g.
``[resources] flops_per_s = ...`` in the config, ``emgrid plan CONFIG --flops ...``, or
``Resources.local(flops_per_s=...)``.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
             "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from emgrid.models import (HMM, Categorical, Composite, DiagGaussian, Exponential, FullGaussian,  # noqa: E402
                    Gaussian, Mixture, Poisson, Sequence)
from emgrid.models import units as cost_units  # noqa: E402
from emgrid.models.data import n_rows  # noqa: E402
from emgrid.models.engine import e_step  # noqa: E402
from emgrid.planner.costing import block_counts, model_facts  # noqa: E402

#: Largest accepted max / min of the per-family implied rates.
MAX_SPREAD = 3.0


def families(seed: int = 0) -> dict:
    """One model per family, at the sizes the issue names."""
    rng = np.random.default_rng(seed)
    d = 16

    def diag():
        return DiagGaussian(rng.normal(0, 2, d), rng.uniform(0.5, 2.0, d))

    a = rng.standard_normal((d, d))
    cov = a @ a.T / d + np.eye(d)
    trans = np.full((4, 4), 0.1) + 0.6 * np.eye(4)
    return {
        "Gaussian": Gaussian(0.5, 2.0),
        "DiagGaussian": diag(),
        "FullGaussian": FullGaussian(rng.normal(0, 1, d), cov),
        "Categorical": Categorical(rng.dirichlet(np.ones(50))),
        "Poisson": Poisson(4.0),
        "Exponential": Exponential(1.5),
        "Mixture": Mixture([diag() for _ in range(8)], np.full(8, 1 / 8)),
        "Mixture (full)": Mixture([FullGaussian(rng.normal(0, 1, d), cov) for _ in range(4)], np.full(4, 1 / 4)),
        "Composite": Composite([Gaussian(0.0, 1.0), Categorical(rng.dirichlet(np.ones(50))), Poisson(3.0),
                                Exponential(2.0)]),
        "Sequence": Sequence(Gaussian(1.0, 2.0), 20.0),
        "HMM": HMM([Gaussian(2.0 * k, 1.0) for k in range(4)], trans / trans.sum(axis=1, keepdims=True),
                   np.full(4, 0.25), 20.0),
    }


def flops_per_row(model) -> float:
    return float(model_facts(model).flops.sum())


def visits_s(model, n: int) -> float:
    """The interpreter time the planner charges an E-step over ``n`` rows beside its FLOPs:
    every node's visits of every block (``planner.costing.price``), which the implied rate
    leaves out."""
    facts = model_facts(model)
    return float(block_counts(n, facts.block_rows)) * float(facts.calls.sum()) * cost_units.NODE_CALL_S


def timed(model, data) -> float:
    t = time.perf_counter()
    e_step(model, data)
    return time.perf_counter() - t


def sized_data(model, seconds: float, seed: int, max_rows: int):
    """Sampled, prepared data with about ``seconds`` of E-step work (and a warm-up done)."""
    n = 2000
    while True:
        data = model.prepare(model.sample(n, seed))
        dt = min(timed(model, data) for _ in range(2))
        if dt >= 0.5 * seconds or n >= max_rows:
            break
        n = min(max_rows, int(n * min(20.0, 1.2 * seconds / max(dt, 1e-6))))
    want = min(max_rows, max(n, int(n * seconds / max(dt, 1e-9))))
    if want > 1.2 * n:
        data = model.prepare(model.sample(want, seed))
        timed(model, data)
    return data


def measure(seconds: float, repeats: int, max_rows: int = 4_000_000, seed: int = 0,
            log=lambda *a, **k: None) -> tuple[float, float, dict]:
    """The global rate (FLOP/s), the spread of the families' implied rates, and per family
    its rows, measured seconds and FLOPs per row and implied rate."""
    models = families(seed)
    data = {}
    for name, m in models.items():
        data[name] = sized_data(m, seconds, seed, max_rows)
        log(f"  sized {name}: {n_rows(data[name])} rows", flush=True)
    best = {name: math.inf for name in models}
    for _ in range(repeats):
        for name, m in models.items():
            best[name] = min(best[name], timed(m, data[name]))

    rows = {}
    for name, m in models.items():
        n = n_rows(data[name])
        spr = max(best[name] - visits_s(m, n), 0.1 * best[name]) / n
        fl = flops_per_row(m)
        rows[name] = {"rows": n, "seconds_per_row": spr, "flops_per_row": fl, "flops_per_s": fl / spr,
                      "description": m.describe()}
    rates = np.array([r["flops_per_s"] for r in rows.values()])
    return float(np.exp(np.mean(np.log(rates)))), float(rates.max() / rates.min()), rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=0.5, help="target seconds per timed E-step")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--max-rows", type=int, default=4_000_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args(argv)

    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=1)
    except ImportError:
        pass

    global_rate, spread, rows = measure(args.seconds, args.repeats, args.max_rows, args.seed, log=print)
    print()
    print(f"{'family':14s} {'rows':>9s} {'FLOPs/row':>11s} {'measured s/row':>15s} {'predicted s/row':>16s} "
          f"{'pred/meas':>9s} {'implied GFLOP/s':>16s}")
    for name, r in rows.items():
        pred = r["flops_per_row"] / global_rate
        r["predicted_seconds_per_row"] = pred
        print(f"{name:14s} {r['rows']:9d} {r['flops_per_row']:11.1f} {r['seconds_per_row']:15.3e} {pred:16.3e} "
              f"{pred / r['seconds_per_row']:9.2f} {r['flops_per_s'] / 1e9:16.2f}")
    print("(measured s/row: the E-step's time less the per-block node visits the planner charges apart)")
    print(f"\nglobal rate {global_rate / 1e9:.2f} GFLOP/s (geometric mean); spread of implied rates "
          f"{spread:.2f}x (limit {MAX_SPREAD:.0f}x): {'ok' if spread <= MAX_SPREAD else 'TOO WIDE'}")

    args.out.mkdir(parents=True, exist_ok=True)
    units = {k: getattr(cost_units, k) for k in ("MATMUL_FLOPS", "GEMM_FLOPS", "SLOW_FLOPS", "VECTOR_FLOPS", "SCAN_FLOPS",
                                            "ROW_ACCESS_FLOPS")}
    out = {"flops_per_s": global_rate, "per_family": {k: v["flops_per_s"] for k, v in rows.items()},
           "spread": spread, "units": units, "details": rows,
           "command": "python bench/cost_model.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    path = args.out / "calibration.json"
    path.write_text(json.dumps(out, indent=2))
    print(f"wrote {path}")
    print("\nTo calibrate another machine: run `python bench/cost_model.py` there (one thread per worker, as the\n"
          "executors run), then plan with its rate: `[resources] flops_per_s = "
          f"{global_rate:.3g}` in the config,\n`emgrid plan CONFIG --flops {global_rate:.3g}`, or "
          f"`Resources.local(flops_per_s={global_rate:.3g})`.")
    return 0 if spread <= MAX_SPREAD else 1


if __name__ == "__main__":
    sys.exit(main())
