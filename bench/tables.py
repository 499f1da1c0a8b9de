"""One fit from the same table stored as Parquet, as CSV and as ``.npy`` columns, side by side.

``python bench/tables.py [--rows 1000000] [--iters 5]``. The table has 4 float columns, a
string column and a count column; the model is a template, a mixture of 4 named records
(``DiagGaussian`` over the floats, ``Categorical`` over the strings, ``Poisson`` over the
counts), fitted with the multiprocessing executor on two workers (each reads only its rows),
``n_init = 1``, ``init_iter = 0``-like short refinement, ``tol = 0``.

Per format: the seconds from the call to the first EM iteration (reading the metadata,
binding the categorical values, the seeding sample, planning, starting the workers and
their first read of their rows: what the format costs), the median seconds per EM
iteration after that, and the trace's agreement with the ``.npy`` fit (it must be equal).
BLAS is limited to one thread per process. Writes ``bench/results/tables.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

HERE = Path(__file__).resolve().parent

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.csv as pacsv  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from emgrid import Categorical, Composite, DiagGaussian, Mixture, Poisson, Resources, optimize  # noqa: E402
from emgrid.executors import NpyDataset  # noqa: E402
from emgrid.models.tables import bind  # noqa: E402

COLORS = np.array(["red", "green", "blue", "amber", "violet"])


def make_table(n: int, rng: np.random.Generator) -> pa.Table:
    label = rng.integers(0, 4, n)
    centres = rng.normal(0.0, 3.0, (4, 4))
    x = centres[label] + rng.normal(0.0, 1.0, (n, 4))
    color = COLORS[(label + rng.integers(0, 2, n)) % COLORS.size]
    count = rng.poisson(1.0 + 2.0 * label)
    return pa.table({"a": x[:, 0], "b": x[:, 1], "c": x[:, 2], "d": x[:, 3], "color": color, "count": count})


def template():
    record = lambda: Composite({"pos": DiagGaussian(dim=4), "color": Categorical(), "count": Poisson()},  # noqa: E731
                               columns={"pos": ["a", "b", "c", "d"]})
    return Mixture([record() for _ in range(4)])


def timed_fit(data, model, iters: int) -> dict:
    t0 = time.perf_counter()
    first = []
    res = optimize(data, model, executor="multiprocessing", resources=Resources.uniform(2), max_iter=iters,
                   tol=0.0, n_init=1, seed=0, init_iter=1,
                   callback=lambda i, ll, r: first.append(time.perf_counter()) if not first else None)
    per_iter = [t["total"] for t in res.timings][1:] or [t["total"] for t in res.timings]
    return {"to_first_iteration_s": first[0] - t0 if first else float("nan"),
            "s_per_iter": statistics.median(per_iter), "trace": list(res.log_likelihood)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    table = make_table(args.rows, rng)
    rows = []
    with tempfile.TemporaryDirectory(prefix="emgrid-bench-tables-") as tmp:
        tmp = Path(tmp)
        pq.write_table(table, tmp / "t.parquet", row_group_size=65_536)
        pacsv.write_csv(table, tmp / "t.csv")
        model = bind(template(), table)  # the same value lists for every format
        t0 = time.perf_counter()
        npy = NpyDataset.write(model.prepare(table), tmp / "npy", model=model)
        write_npy = time.perf_counter() - t0
        sources = {"parquet": str(tmp / "t.parquet"), "csv": str(tmp / "t.csv"), "npy": npy}
        sizes = {"parquet": (tmp / "t.parquet").stat().st_size, "csv": (tmp / "t.csv").stat().st_size,
                 "npy": sum(p.stat().st_size for p in (tmp / "npy").rglob("*") if p.is_file())}
        fits = {name: timed_fit(src, model, args.iters) for name, src in sources.items()}
    ref = np.array(fits["npy"]["trace"])
    for name, f in fits.items():
        t = np.array(f["trace"])
        rel = float(np.max(np.abs(t - ref) / np.abs(ref))) if t.shape == ref.shape else float("inf")
        rows.append({"format": name, "file_mib": sizes[name] / 2**20, **{k: v for k, v in f.items() if k != "trace"},
                     "trace_rel_diff_vs_npy": rel})
    head = (f"{args.rows:,} rows (4 floats, a string, a count), a template mixture of 4 named records, multiprocessing on "
            f"2 workers, {args.iters} iterations, one BLAS thread; writing the .npy columns took {write_npy:.2f} s "
            f"(not counted below); machine: 2 shared cores.")
    lines = [head, "", "| format | file MiB | call to first iteration s | s/iter (median) | trace vs .npy |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['format']} | {r['file_mib']:.1f} | {r['to_first_iteration_s']:.2f} | {r['s_per_iter']:.3f} | "
              f"{r['trace_rel_diff_vs_npy']:.1e} |" for r in rows]
    text = "\n".join(lines)
    print(text)
    args.out.mkdir(exist_ok=True)
    (args.out / "tables.json").write_text(json.dumps({"rows": args.rows, "iters": args.iters, "results": rows}, indent=1))
    (args.out / "tables.md").write_text("# Tables: Parquet, CSV and .npy\n\nCommand: `python bench/tables.py`\n\n"
                                        + text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
