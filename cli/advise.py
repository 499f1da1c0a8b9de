"""``emgrid advise``: does distributing this fit help on this machine?

Measures the model's compute per row here, with BLAS at the threads per worker the fit
will run (``[executor] blas_threads``, default 1), and each executor's fixed cost per
iteration (a tiny model, many iterations), then predicts seconds per iteration for local
and for each worker count: ``rows * seconds_per_row / max(1, min(workers, cores /
blas_threads, free cores)) + fixed overhead``. Workers beyond this machine's cores (those
this process may run on) share them and compute no faster, so no count above ``cores /
blas_threads`` is advised; and cores that other processes keep busy are not free: they are
measured (:func:`free_cores`, before and after the overheads), and a prediction made while
other processes hold cores, or while their load changed, says it is not to be trusted.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import numpy as np

from emgrid.models import Gaussian, e_step, n_rows, take_rows


def machine_cores() -> int:
    """The cores this process may run on (its CPU affinity), else the machine's count."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def probe_seconds(_=None) -> float:
    """Seconds of a fixed single-thread matrix workload (about 0.25 s on one free core)."""
    from emgrid.executors.threads import limited

    a = np.random.default_rng(0).standard_normal((256, 256))
    with limited(1):
        t0 = time.perf_counter()
        for _ in range(400):
            a = np.tanh(a @ a.T / 256.0)
        return time.perf_counter() - t0


def free_cores(workers: int = 2) -> float:
    """How many of ``workers`` processes compute at full speed here now: ``workers`` copies
    of :func:`probe_seconds` at once against one alone (about ``workers`` on an idle machine
    with that many cores, less when other processes share them)."""
    import multiprocessing as mp

    if workers < 2:
        return 1.0
    alone = min(probe_seconds() for _ in range(2))
    with mp.get_context("spawn").Pool(workers) as pool:
        pool.map(probe_seconds, range(workers))  # start-up
        together = max(pool.map(probe_seconds, range(workers)))
    return workers * alone / together


def trust_notes(before: float, after: float, parallel: int) -> list[str]:
    """Why the predictions may not hold: other processes hold cores the workers would run on,
    or their load changed while the free cores were measured (``before`` and ``after``)."""
    notes = []
    least = min(before, after)
    if least < parallel - 0.25:
        notes.append(f"not to be trusted as it stands: other processes keep about {parallel - least:.1f} of the "
                     f"{parallel} cores busy that the workers would run on; the predictions assume they go on "
                     "doing so. Run advise again when the machine is quieter.")
    if abs(before - after) > 0.25 * max(before, after):
        notes.append(f"not to be trusted: the load changed while advise measured (free cores {before:.2f}, then "
                     f"{after:.2f}).")
    return notes


def seconds_per_row(model, data, *, budget_rows: int = 20000, repeats: int = 3,
                    blas_threads: int | None = 1) -> float:
    """Best of ``repeats`` E-steps on up to ``budget_rows`` rows, with BLAS at ``blas_threads``."""
    from emgrid.executors.threads import limited

    rows = min(n_rows(data), budget_rows)
    block = take_rows(data, 0, rows)
    best = float("inf")
    with limited(blas_threads):
        for _ in range(repeats):
            t0 = time.perf_counter()
            e_step(model, block)
            best = min(best, time.perf_counter() - t0)
    return best / rows


def worker_counts(configured: int, cores: int, blas_threads: int | None) -> tuple[list[int], int]:
    """The worker counts worth measuring here, and how many workers the cores run at once.

    ``configured``: the run's worker count; every worker runs ``blas_threads`` threads
    (``None``: one per core, as the BLAS does unlimited), so ``cores // blas_threads`` of them
    (at least 1) run at once. Counts from 2 up to that, at most the configured count when it
    is larger than 2.
    """
    per_worker = cores if blas_threads is None else blas_threads
    parallel = max(1, cores // per_worker)
    top = min(max(2, configured), parallel)
    return sorted({p for p in (2, top) if 2 <= p <= parallel}), parallel


def installed_engines() -> list[str]:
    """The cluster engines whose executor can run here (``emgrid[dask]``, ``emgrid[ray]``,
    ``emgrid[spark]`` with a Java runtime): each is measured on a local cluster it starts for
    the measurement."""
    import importlib.util
    import shutil

    found = [kind for kind, module in (("dask", "distributed"), ("ray", "ray"), ("spark", "pyspark"))
             if importlib.util.find_spec(module)]
    return [k for k in found if k != "spark" or shutil.which("java")]


def executor_overhead(kind: str, workers: int, iterations: int = 30) -> float | None:
    """Seconds per iteration of a tiny fit (a Gaussian on 64 rows) with ``workers`` workers."""
    from emgrid.executors import optimize
    from emgrid.planner import Resources, balance_plan

    if kind == "mpi":
        return _mpi_overhead(workers, iterations)
    model = Gaussian(0.0, 1.0)
    data = model.prepare(model.sample(64, np.random.default_rng(0)))
    res = Resources.uniform(workers)
    plan = balance_plan(model, res, n_data=64, grid=(workers, 1))
    try:
        result = optimize(data, model, plan=plan, executor=kind, max_iter=iterations, tol=0.0)
    except Exception:  # noqa: BLE001 - an executor that cannot run here is reported as such
        return None
    return result.mean_timings()["total"]  # per iteration, worker start-up excluded


_MPI_SCRIPT = textwrap.dedent("""
    import time, numpy as np
    from emgrid.models import Gaussian
    from emgrid.planner import Resources, balance_plan
    from emgrid.executors import optimize
    m = Gaussian(0.0, 1.0); d = m.prepare(m.sample(64, np.random.default_rng(0)))
    from mpi4py import MPI
    n = MPI.COMM_WORLD.Get_size()
    plan = balance_plan(m, Resources.uniform(n), n_data=64, grid=(n, 1))
    r = optimize(d, m, plan=plan, executor="mpi", max_iter={it}, tol=0.0)
    if MPI.COMM_WORLD.Get_rank() == 0: print(r.mean_timings()["total"])
""")


def _mpi_overhead(workers: int, iterations: int) -> float | None:
    from pathlib import Path

    mpiexec = Path(sys.executable).with_name("mpiexec")
    cmd = [str(mpiexec) if mpiexec.exists() else "mpiexec", "-n", str(workers), sys.executable, "-c",
           _MPI_SCRIPT.replace("{it}", str(iterations))]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        return float(out.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError, OSError):
        return None


def advise(cfg, executors: list[str] | None = None) -> str:
    """The report: ``executors`` those measured beside local (default: each one that can
    run here; a cluster engine asked for but not installed is said to be unavailable)."""
    from .session import build_data, build_model, build_resources

    from emgrid.models import complete_shapes, initialize

    model = build_model(cfg)
    data = build_data(cfg, model)
    n = n_rows(data)
    if model.is_template:  # its first start: what one iteration of the fit computes
        model = initialize(complete_shapes(model, data), data, n, seed=cfg.fit.seed, init=cfg.fit.init)
    threads = cfg.executor.executor_options()["blas_threads"]
    per_row = seconds_per_row(model, data, blas_threads=threads)
    local = n * per_row
    cores = machine_cores()
    configured = build_resources(cfg).n_workers
    counts, parallel = worker_counts(configured, cores, threads)
    free_before = free_cores(parallel) if counts else 1.0
    each = "as many as the cores" if threads is None else str(threads)
    lines = [f"model: {model.describe()}, {n} rows; compute here {per_row * 1e6:.3f} us/row "
             f"-> local {local:.4g} s/iter",
             f"machine: {cores} core(s) for this process; BLAS threads per worker: {each}, so {parallel} "
             f"worker(s) compute at once" + (f" (the config's {configured} workers would share them)"
                                             if configured > parallel else ""), "",
             f"{'executor':<16} {'workers':>7} {'overhead/iter':>14} {'predicted s/iter':>17} {'speed-up':>9}"]
    lines.append(f"{'local':<16} {1:>7} {'-':>14} {local:>17.4g} {1.0:>9.2f}")
    best = ("local", 1, local)
    measured = []
    for kind in executors or ("multiprocessing", "mpi", *installed_engines()):
        if not counts:
            lines.append(f"{kind:<16} skipped: these cores run one worker at a time")
        for p in counts:
            measured.append((kind, p, executor_overhead(kind, p)))
    free_after = free_cores(parallel) if counts else 1.0
    free = min(free_before, free_after)
    for kind, p, over in measured:
        if over is None:
            lines.append(f"{kind:<16} {p:>7} {'unavailable':>14}")
            continue
        pred = local / max(1.0, min(p, parallel, free)) + over
        lines.append(f"{kind:<16} {p:>7} {over * 1e3:>11.3f} ms {pred:>17.4g} {local / pred:>9.2f}")
        if pred < best[2]:
            best = (kind, p, pred)
    lines.append("")
    if counts:
        lines.append(f"free cores ({parallel} single-thread probes at once against one alone): {free_before:.2f} "
                     f"before the overheads were measured, {free_after:.2f} after; the speed-ups above count at "
                     f"most {free:.2f}.")
    if best[0] == "local":
        lines.append("advice: stay local; the per-iteration overhead of every executor outweighs the compute it saves.")
    else:
        lines.append(f"advice: distribute with {best[0]} on {best[1]} workers: predicted {best[2]:.4g} s/iter "
                     f"against {local:.4g} s/iter locally ({local / best[2]:.2f}x).")
    if counts:
        lines.extend(trust_notes(free_before, free_after, parallel))
    return "\n".join(lines)
