"""Scaling of the executors on this machine: speedup, model parallelism, prediction, overhead.

Four measurements, all in one run (the MPI runs are this script started again under
``mpiexec``, reading the same ``.npy`` dataset memory-mapped by row range):

1. **Speedup** on a compute-bound model (a mixture of full-covariance Gaussians, N about
   1e6): ``local`` (one worker) against 2 workers with ``multiprocessing``, ``mpi``,
   ``dask``, ``ray`` and ``spark`` (each engine's run starts a local cluster of its own, outside the
   timed iterations); per-iteration time is the median over iterations after the first.
2. **Model parallelism**: a composite of two full-covariance mixtures on a ``1x2`` plan
   (one mixture per shard) gives the ``1x1`` trace, and the coupling bytes measured equal
   the planner's prediction (``n * plan.extra["coupling_bytes_per_row"]``).
3. **Prediction**: for every run, the planner's predicted iteration time (its objective)
   against the measured one. The FLOP rate is ``bench/cost_model.py``'s calibration run
   (quickly) just before each timed section: this shared machine's speed drifts by up to
   1.4x within an hour, all runs alike, which is not the cost model's error. The ratio at
   the stored calibration (``bench/results/calibration.json``) is printed beside it. The
   ``local`` executor runs the cells of its grid one after another, so its prediction is
   the sum of the workers' predicted compute and the M-step term.
4. **Fixed overhead** per iteration of each executor (a tiny model, many iterations), which
   turns the seed's "when to distribute" rule into numbers for this machine; and, for the
   runs of 1 and 2, the reduce and broadcast bytes per worker against the plan's
   ``extra.reduce_bytes`` and ``extra.broadcast_bytes``.

BLAS is limited to one thread per process (here and in every worker), so ``local`` is one
core and ``W`` workers are ``W`` cores.

Usage::

    python bench/scaling.py                 # writes bench/results/scaling.{json,md}
    python bench/scaling.py --quick         # N = 2e5, fewer iterations (a smoke run)
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
             "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import pickle  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from emgrid.cli.advise import free_cores  # noqa: E402  (the probe emgrid advise runs)
from emgrid.executors import NpyDataset, optimize  # noqa: E402
from emgrid.models import Composite, DiagGaussian, FullGaussian, Gaussian, Mixture  # noqa: E402
from emgrid.planner import Network, Resources, plan_from_assignment  # noqa: E402
from emgrid.planner.costing import model_facts  # noqa: E402
from emgrid.planner.plan import BalancePlan  # noqa: E402
from emgrid.planner.resources import (DASK_ACTORS, DEFAULT_FLOPS_PER_S, PIPES, RAY_ACTORS,  # noqa: E402
                                     SHARED_MEMORY_MPI, SPARK_TASKS)

RESULTS = ROOT / "bench" / "results"
MPIEXEC = Path(sys.executable).with_name("mpiexec")
#: Networks the plans are priced with: those of ``Resources.local`` and ``Resources.from_mpi``.
SHARED_MEMORY = SHARED_MEMORY_MPI
#: The cluster engines, run where their extra is installed: executor -> (import, network).
ENGINES = {"dask": ("distributed", DASK_ACTORS), "ray": ("ray", RAY_ACTORS), "spark": ("pyspark", SPARK_TASKS)}


def engine_specs(d: int, m: int, split=None, suffix: str = "") -> dict:
    """The runs of the cluster engines installed here, as ``RunSpec`` by name."""
    import importlib.util

    return {f"{name}{suffix}": (name, d, m, network, split) for name, (module, network) in ENGINES.items()
            if importlib.util.find_spec(module) is not None}


# ---------------------------------------------------------------- models and data
def full_mixture(k: int, d: int, rng: np.random.Generator, spread: float = 3.0) -> Mixture:
    comps = []
    for _ in range(k):
        a = rng.standard_normal((d, d))
        comps.append(FullGaussian(rng.normal(0.0, spread, d), a @ a.T / d + np.eye(d)))
    return Mixture(comps, np.full(k, 1.0 / k))


def speedup_case(n: int, d: int, k: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    truth, start = full_mixture(k, d, rng), full_mixture(k, d, rng)
    return start, truth.sample(n, rng)


def model_parallel_case(n: int, d: int, k: int, seed: int = 1):
    rng = np.random.default_rng(seed)
    truth = Composite([full_mixture(k, d, rng), full_mixture(k, d, rng)])
    start = Composite([full_mixture(k, d, rng), full_mixture(k, d, rng)])
    return start, truth.sample(n, rng)


def calibrated_rate() -> tuple[float, str]:
    path = RESULTS / "calibration.json"
    try:
        return float(json.loads(path.read_text())["flops_per_s"]), str(path.relative_to(ROOT))
    except (OSError, KeyError, ValueError):
        return DEFAULT_FLOPS_PER_S, f"default {DEFAULT_FLOPS_PER_S:.3g} (no {path.relative_to(ROOT)})"


def make_plan(model, n: int, d: int, m: int, rate: float, network: Network, shard_of_leaf=None) -> BalancePlan:
    sol = shard_of_leaf or {p: 0 for p, _ in model.leaves()}
    return plan_from_assignment(model, Resources.uniform(d * m, flops_per_s=rate, network=network), n,
                                data_parallel=d, model_parallel=m, shard_of_leaf=sol)


# ---------------------------------------------------------------- how many cores are free


# ---------------------------------------------------------------- running
def write_dataset(data, directory: Path, model) -> NpyDataset:
    """Writes the rows, flushes them to disk and reads them once, so no run pays for the
    writeback of dirty pages or the first read from disk."""
    dataset = NpyDataset.write(data, directory, model=model)
    os.sync()
    for path in sorted(directory.glob("*.npy")):
        with open(path, "rb") as f:
            while f.read(1 << 24):
                pass
    return dataset


def stolen_cpu_s() -> float:
    """CPU seconds the hypervisor gave other guests while this machine's cores wanted to run
    (the ``steal`` column of ``/proc/stat``; 0 where there is none)."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def best_of(rounds: int, runs: dict) -> dict[str, dict]:
    """Each run ``rounds`` times, interleaved (a noisy neighbour slows all of them alike);
    the fastest round of each counts, with the share of a core stolen from this machine
    while it ran (``stolen``)."""
    best: dict[str, dict] = {}
    for _ in range(rounds):
        for name, run in runs.items():
            t0, s0 = time.perf_counter(), stolen_cpu_s()
            r = run()
            r["stolen"] = (stolen_cpu_s() - s0) / (time.perf_counter() - t0)
            if name not in best or r["iteration_s"] < best[name]["iteration_s"]:
                best[name] = r
    return best


def per_iteration(timings: list[dict]) -> float:
    """Median iteration time, the first iteration (warm-up: page faults, imports) left out."""
    rows = timings[1:] if len(timings) > 1 else timings
    return statistics.median(t["total"] for t in rows)


def run_here(executor: str, dataset: NpyDataset, model, plan: BalancePlan, iters: int) -> dict:
    t0 = time.perf_counter()
    res = optimize(dataset, model, plan=plan, executor=executor, max_iter=iters, tol=0.0)
    return summarize(res, time.perf_counter() - t0)


def predicted_s(plan: BalancePlan, executor: str) -> float:
    """The plan's iteration time as the executor runs it: ``local`` runs the grid's cells one
    after another, then the M-step."""
    if executor == "local":
        return sum(w.compute_s for w in plan.per_worker) + plan.breakdown.mstep_s
    return plan.predicted_iteration_s


def summarize(res, wall_s: float) -> dict:
    phases = {k: statistics.median(t[k] for t in (res.timings[1:] or res.timings)) for k in res.timings[0]}
    predicted = predicted_s(res.plan, res.executor)
    return {"executor": res.executor, "grid": f"{res.plan.data_parallel}x{res.plan.model_parallel}",
            "trace": res.log_likelihood, "iteration_s": per_iteration(res.timings), "phases_s": phases,
            "bytes": res.bytes_moved[-1], "predicted_s": predicted, "workers": res.plan.workers_used,
            "predicted_bytes": {"reduce": res.plan.extra["reduce_bytes"], "broadcast": res.plan.extra["broadcast_bytes"]},
            "predicted_breakdown": res.plan.breakdown.model_dump(), "wall_s": wall_s}


def run_mpi(dataset: NpyDataset, model, plan: BalancePlan, iters: int, work: Path) -> dict:
    """This script under ``mpiexec -n workers_used``; rank 0 writes the summary."""
    job = work / f"mpi-{time.monotonic_ns()}"
    job.mkdir()
    (job / "model.pkl").write_bytes(pickle.dumps(model))
    (job / "plan.json").write_text(plan.to_json())
    cmd = [str(MPIEXEC), "-n", str(plan.workers_used), sys.executable, str(Path(__file__).resolve()),
           "--mpi-child", str(job), "--dataset", str(dataset.directory), "--iters", str(iters)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"mpiexec failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    out = json.loads((job / "result.json").read_text())
    out["launch_wall_s"] = time.perf_counter() - t0
    return out


def mpi_child(job: Path, dataset_dir: str, iters: int) -> None:
    from mpi4py import MPI

    model = pickle.loads((job / "model.pkl").read_bytes())
    plan = BalancePlan.from_json((job / "plan.json").read_text())
    MPI.COMM_WORLD.Barrier()
    t0 = time.perf_counter()
    res = optimize(NpyDataset(dataset_dir), model, plan=plan, executor="mpi", max_iter=iters, tol=0.0)
    wall = time.perf_counter() - t0
    if MPI.COMM_WORLD.Get_rank() == 0:
        (job / "result.json").write_text(json.dumps(summarize(res, wall)))


# ---------------------------------------------------------------- the four measurements
#: A run: (executor, D, M, the network its plan is priced with, placement of the leaves or
#: None for one shard).
RunSpec = tuple[str, int, int, Network, dict | None]


def timed_runs(specs: dict[str, RunSpec], dataset: NpyDataset, model, rate: float, iters: int,
               work: Path) -> dict:
    """One callable per run (MPI runs only where ``mpiexec`` is), each planning at ``rate``."""
    def run(spec: RunSpec):
        executor, d, m, network, split = spec
        plan = make_plan(model, dataset.n_rows, d, m, rate, network, split)
        if executor == "mpi":
            return run_mpi(dataset, model, plan, iters, work)
        return run_here(executor, dataset, model, plan, iters)

    return {name: (lambda spec=spec: run(spec)) for name, spec in specs.items()
            if spec[0] != "mpi" or MPIEXEC.exists()}


def rate_now() -> float:
    """The cost model's FLOP rate on this machine as it is now: ``bench/cost_model.py``'s
    calibration, quick (0.1 s per family, best of 3; about 10 s)."""
    from bench.cost_model import measure

    return measure(0.1, 3)[0]


def with_stored_rate(runs: dict, specs: dict[str, RunSpec], model, n: int, stored: float) -> None:
    """Each run's prediction also at the stored calibration's rate (``predicted_stored_s``)."""
    for name, r in runs.items():
        executor, d, m, network, split = specs[name]
        r["predicted_stored_s"] = predicted_s(make_plan(model, n, d, m, stored, network, split), executor)


def measure_speedup(args, stored: float, work: Path) -> dict:
    model, data = speedup_case(args.n, args.d, args.k)
    dataset = write_dataset(data, work / "speedup", model)
    del data
    n = dataset.n_rows
    specs: dict[str, RunSpec] = {"local": ("local", 1, 1, PIPES, None),
                                 "multiprocessing": ("multiprocessing", 2, 1, PIPES, None),
                                 "mpi": ("mpi", 2, 1, SHARED_MEMORY, None), **engine_specs(2, 1)}
    rate = rate_now()
    best = best_of(args.rounds, timed_runs(specs, dataset, model, rate, args.iters, work))
    with_stored_rate(best, specs, model, n, stored)
    base = best["local"]["iteration_s"]
    for r in best.values():
        r["implied_flops_per_s"] = r["predicted_breakdown"]["compute_s"] * rate / r["phases_s"]["compute"]
        r["speedup"] = base / r["iteration_s"]
        r["trace_rel_diff"] = rel_diff(r["trace"], best["local"]["trace"])
    return {"model": f"Mixture of {args.k} FullGaussian d={args.d}", "n": n, "flops_per_s": rate, "runs": best}


def measure_model_parallel(args, stored: float, work: Path) -> dict:
    n = max(2, args.n // 5)
    model, data = model_parallel_case(n, args.d, args.k // 2 or 1)
    dataset = write_dataset(data, work / "model_parallel", model)
    del data
    split = {p: int(p.split(".")[0]) for p, _ in model.leaves()}  # one mixture per shard
    specs: dict[str, RunSpec] = {"local 1x1": ("local", 1, 1, PIPES, None),
                                 "local 1x2": ("local", 1, 2, PIPES, split),
                                 "multiprocessing 1x2": ("multiprocessing", 1, 2, PIPES, split),
                                 "mpi 1x2": ("mpi", 1, 2, SHARED_MEMORY, split), **engine_specs(1, 2, split, " 1x2")}
    rate = rate_now()
    # a fifth of the speedup case's rows, so three times its rounds: the shards of a 1x2 run
    # meet at every block, so a neighbour busy on either core stalls both
    rounds = 3 * args.rounds
    runs = best_of(rounds, timed_runs(specs, dataset, model, rate, args.iters, work))
    with_stored_rate(runs, specs, model, n, stored)
    plan = make_plan(model, n, 1, 2, rate, PIPES, split)
    predicted_bytes = n * plan.extra["coupling_bytes_per_row"]
    for r in runs.values():
        r["trace_rel_diff"] = rel_diff(r["trace"], runs["local 1x1"]["trace"])
        r["coupling_bytes_predicted"] = predicted_bytes if r["grid"] == "1x2" else 0
        r["coupling_bytes_measured"] = r["bytes"]["coupling"]
    return {"model": f"Composite of 2 x Mixture of {args.k // 2 or 1} FullGaussian d={args.d}", "n": n,
            "rounds": rounds, "flops_per_s": rate, "runs": runs}


def measure_overhead(args, rate: float, work: Path) -> dict:
    model = Gaussian(0.0, 1.0)
    data = Gaussian(0.5, 2.0).sample(1000, np.random.default_rng(2))
    dataset = write_dataset(data, work / "tiny", model)
    specs: dict[str, RunSpec] = {"local 1x1": ("local", 1, 1, PIPES, None),
                                 "multiprocessing 2x1": ("multiprocessing", 2, 1, PIPES, None),
                                 "mpi 2x1": ("mpi", 2, 1, SHARED_MEMORY, None), **engine_specs(2, 1, suffix=" 2x1")}
    runs = best_of(args.rounds, timed_runs(specs, dataset, model, rate, args.tiny_iters, work))
    return {"model": "Gaussian", "n": dataset.n_rows, "iterations": args.tiny_iters, "runs": runs}


def rel_diff(a, b) -> float:
    a, b = np.asarray(a), np.asarray(b)
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1.0)))


# ---------------------------------------------------------------- report
def report(out: dict) -> str:
    lines = [f"# Executor scaling on this machine ({out['cores']} cores)", "",
             f"FLOP rate for predictions: measured just before each timed section by `bench/cost_model.py`'s "
             f"calibration (quick: 0.1 s per family, best of 3): {out['speedup']['flops_per_s']:.3g} and "
             f"{out['model_parallel']['flops_per_s']:.3g} FLOP/s for sections 1 and 2, so that the machine's "
             f"speed drifting between calibration and run (up to 1.4x here) is not put down to the cost model; "
             f"the last ratio column prices at the stored calibration, {out['flops_per_s']:.3g} FLOP/s "
             f"({out['rate_source']}).",
             f"Load average (1 min) before / after: {out['load_average_before']:.2f} / "
             f"{out['load_average_after']:.2f}; free cores measured before / after (two single-thread probes "
             f"at once against one alone): {out['free_cores_before']:.2f} / {out['free_cores_after']:.2f}. "
             "Other processes on these cores slow the parallel runs; results below 2 free cores understate "
             "the speedups.", "",
             "Command: `" + out["command"] + "`", "",
             "s/iteration is a run's median iteration (the first left out); each run is repeated in "
             "interleaved rounds and its fastest round counts. Core stolen: the share of a core the "
             "hypervisor gave other guests during that round (`/proc/stat`).", ""]
    sp = out["speedup"]
    lines += [f"## 1. Speedup: {sp['model']}, N={sp['n']}, best of {out['rounds']} rounds", "",
              "| executor | grid | s/iteration | speedup vs local (target >= 1.7x) | predicted s | "
              "measured/predicted (target 0.7-1.3) | trace diff | core stolen | at the stored rate |",
              "|---|---|---|---|---|---|---|---|---|"]
    for name, r in sp["runs"].items():
        lines.append(f"| {name} | {r['grid']} | {r['iteration_s']:.4f} | {r['speedup']:.2f}x | {r['predicted_s']:.4f} "
                     f"| {ratio(r)} | {r['trace_rel_diff']:.1e} | {r['stolen']:.2f} | {stored_ratio(r)} |")
    implied = [r["implied_flops_per_s"] for r in sp["runs"].values()]
    lines += ["", "FLOP rate at which the predicted compute term equals the measured compute phase, per run: "
              + ", ".join(f"{x:.3g}" for x in implied) + " FLOP/s."]
    mp = out["model_parallel"]
    lines += ["", f"## 2. Model parallel: {mp['model']}, N={mp['n']}, best of {mp['rounds']} rounds", "",
              "| run | s/iteration | predicted s | measured/predicted | trace diff vs 1x1 | coupling bytes measured "
              "| predicted | core stolen | at the stored rate |", "|---|---|---|---|---|---|---|---|---|"]
    for name, r in mp["runs"].items():
        lines.append(f"| {name} | {r['iteration_s']:.4f} | {r['predicted_s']:.4f} | "
                     f"{ratio(r)} | {r['trace_rel_diff']:.1e} | "
                     f"{r['coupling_bytes_measured']} | {r['coupling_bytes_predicted']:.0f} | {r['stolen']:.2f} | "
                     f"{stored_ratio(r)} |")
    ov = out["overhead"]
    lines += ["", f"## 3. Fixed overhead per iteration: {ov['model']}, N={ov['n']}, {ov['iterations']} iterations", "",
              "| run | s/iteration | predicted | broadcast | compute | reduce | M-step |", "|---|---|---|---|---|---|---|"]
    for name, r in ov["runs"].items():
        ph = r["phases_s"]
        lines.append(f"| {name} | {r['iteration_s'] * 1e6:.0f} us | {r['predicted_s'] * 1e6:.0f} us | "
                     f"{ph['broadcast'] * 1e6:.0f} us | "
                     f"{ph['compute'] * 1e6:.0f} us | {ph['reduce'] * 1e6:.0f} us | {ph['mstep'] * 1e6:.0f} us |")
    lines += ["", "## 4. Reduce and broadcast bytes per iteration, measured against the plan", "",
              "The last iteration's `bytes_moved` (pickled, so with pickle's framing) against the plan's "
              "`extra.reduce_bytes` and `extra.broadcast_bytes` (the numbers the sharded M-step moves: each "
              "column's tree reduce, the heads' reports, the update), per worker of the grid.", "",
              "| run | grid | reduce measured | predicted | broadcast measured | predicted | "
              "(reduce + broadcast) measured/predicted |", "|---|---|---|---|---|---|---|"]
    for section in ("speedup", "model_parallel"):
        for name, r in out[section]["runs"].items():
            w = r["workers"]
            got = {k: r["bytes"][k] / w for k in ("reduce", "broadcast")}
            want = {k: r["predicted_bytes"][k] / w for k in ("reduce", "broadcast")}
            total = sum(want.values())
            q = f"{sum(got.values()) / total:.3f}" if total else "-"
            lines.append(f"| {name} | {r['grid']} | {got['reduce']:.0f} | {want['reduce']:.0f} | {got['broadcast']:.0f} "
                         f"| {want['broadcast']:.0f} | {q} |")
    lines += ["", "## When to distribute, on this machine", "", out["rule"], ""]
    return "\n".join(lines)


def ratio(r: dict) -> str:
    q = r["iteration_s"] / r["predicted_s"]
    return f"{q:.2f}" + ("" if 0.7 <= q <= 1.3 else " (outside 30%)")


def stored_ratio(r: dict) -> str:
    return f"{r['iteration_s'] / r['predicted_stored_s']:.2f}"


def distribution_rule(out: dict) -> str:
    ov = out["overhead"]["runs"]
    local = ov["local 1x1"]["iteration_s"]
    parts = []
    for name in ("multiprocessing 2x1", "mpi 2x1", "dask 2x1", "ray 2x1", "spark 2x1"):
        if name in ov:
            extra = max(0.0, ov[name]["iteration_s"] - local)
            # W workers save T * (1 - 1/W) of compute per iteration; distribute when that beats the extra overhead
            need = 2.0 * extra
            parts.append(f"- **{name.split()[0]}** (2 workers): fixed cost {extra * 1e6:.0f} us per iteration beyond "
                         f"local, so two workers pay off once one worker's E-step takes more than about "
                         f"{need * 1e3:.2f} ms per iteration (`T_1 * (1 - 1/W) > overhead`).")
    rate = out["flops_per_s"]
    lines = [f"Per-iteration fixed cost of `local` is {local * 1e6:.0f} us."] + parts
    if parts:
        need = 2.0 * max(0.0, ov.get("mpi 2x1", ov["multiprocessing 2x1"])["iteration_s"] - local)
        example = Mixture([DiagGaussian(np.zeros(16), np.ones(16)) for _ in range(16)], np.full(16, 1 / 16))
        per_row = float(model_facts(example).flops.sum())
        lines.append(f"At {rate:.3g} FLOP/s per core that is N * flops_per_row above about {need * rate:.3g} "
                     f"FLOPs per iteration: e.g. a diagonal Gaussian mixture (K=16, d=16, {per_row:.3g} FLOPs/row "
                     f"in the cost model) needs N above ~{need * rate / per_row:.2g} rows.")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=1_000_000)
    p.add_argument("--d", type=int, default=16)
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--iters", type=int, default=6)
    p.add_argument("--tiny-iters", type=int, default=300)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="N=2e5, 4 iterations, 1 round")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--mpi-child", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--dataset", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.mpi_child:
        mpi_child(args.mpi_child, args.dataset, args.iters)
        return
    if args.quick:
        args.n, args.iters, args.tiny_iters, args.rounds = 200_000, 4, 100, 1
    rate, source = calibrated_rate()
    work = Path(tempfile.mkdtemp(prefix="emgrid-scaling-"))
    try:
        out = {"cores": len(os.sched_getaffinity(0)), "flops_per_s": rate, "rate_source": source,
               "command": " ".join(["python bench/scaling.py", *sys.argv[1:]]),
               "rounds": args.rounds,
               "load_average_before": os.getloadavg()[0], "free_cores_before": free_cores()}
        out["speedup"] = measure_speedup(args, rate, work)
        out["model_parallel"] = measure_model_parallel(args, rate, work)
        out["overhead"] = measure_overhead(args, out["model_parallel"]["flops_per_s"], work)
        out["rule"] = distribution_rule(out)
        out["load_average_after"] = os.getloadavg()[0]
        out["free_cores_after"] = free_cores()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for section in ("speedup", "model_parallel", "overhead"):
        for r in out[section]["runs"].values():
            r.pop("trace", None)
    text = report(out)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "scaling.json").write_text(json.dumps(out, indent=1))
    (args.out / "scaling.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
