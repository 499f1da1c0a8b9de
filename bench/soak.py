"""Soak: many consecutive fits of random nested models on all three executors (not a test).

``python bench/soak.py [--fits 200]``. Fit ``i`` fits random model ``i // 3`` (seeded,
``bench/random_models.py``) on executor ``i % 3`` (local, multiprocessing, mpi), so every
model runs on every executor in turn, on the same plan (a pinned 2x1 or 1x2 grid of two
workers) and the same data. The MPI fits of a chunk of models run in one ``mpiexec -n 2``
(this script in ``--mpi-batch`` mode) rather than one ``mpiexec`` per fit.

Counted and written to ``bench/results/soak.{md,json}``:

- failures: a fit that raised (must be 0), and traces that differ between executors for
  the same model by more than 1e-9 relative (the design's promise);
- the peak memory of every worker (``FitResult.worker_peak_bytes``) against the plan's
  ``per_worker[i].memory_bytes``: multiprocessing workers and MPI ranks map their rows
  from ``.npy`` files, so both sides count the same rows; the local executor's process
  (the caller's arrays are in its baseline) is listed but not compared;
- leaks after the run: child processes of this one still alive (the one
  ``multiprocessing`` resource tracker, which lives as long as its parent, is named and
  not counted), processes left by the run anywhere on the machine (spawned workers,
  ``mpiexec``/hydra, batch ranks), new files in ``/dev/shm``, new System V shared memory
  segments and new ``emgrid-*`` entries in ``/tmp`` (scratch copies, launcher records).

Faults (``--fault-share``, default 0.25): that share of the models is also fitted by the
command line, ``emgrid fit`` with ``checkpoint_every = 1``, and a fault strikes at a random
moment, in turn: the coordinator is killed (SIGKILL) or terminated (SIGTERM) on local or
multiprocessing, a worker kills itself (``EMGRID_FAULT``, multiprocessing or mpi), or the
launcher of an MPI fit is killed (SIGKILL). The fit is then resumed (``--resume``, or run
again when no checkpoint was written) and its trace compared with the uninterrupted local
one (1e-9 relative); its output folder must then hold only ``model.json``, ``report.json``
and ``checkpoint.json``. Counted: fault fits, faults injected (the fit did not finish
first), resumes equal to the uninterrupted runs, and what the faults left (in the leak
counts above, and ``output_leftovers``).

Exposure (``--exposure-rounds``, default 1): each round runs ``emgrid fit`` once to its end and
once killed (SIGKILL) on every executor that starts processes (multiprocessing, mpi through
emgrid's launcher, dask, ray), each with a private ``TMPDIR``, and counts
(``tests/executors/exposure_checks.py``): listeners of the fit's processes on a non-loopback
address (hydra's control port, which this hydra binds to every interface, is listed apart),
processes of the fit alive 30 s after it ended, entries left in its temporary folder, files
its processes mapped left in ``/dev/shm``, and Ray session folders left in ``/tmp/ray``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]  # bench/planner.py is not the package
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from bench.random_models import random_model  # noqa: E402
from emgrid.executors import NpyDataset, get, optimize  # noqa: E402
from emgrid.executors.faults import ENV as FAULT_ENV  # noqa: E402
from emgrid.models import from_spec  # noqa: E402
from emgrid.planner import Resources, balance_plan  # noqa: E402
from emgrid.planner.plan import BalancePlan  # noqa: E402
from tests.executors.exposure_checks import EXECUTORS as EXPOSED_EXECUTORS  # noqa: E402
from tests.executors.exposure_checks import available, leftovers, run_and_watch  # noqa: E402

EXECUTORS = ("local", "multiprocessing", "mpi")
MiB = 2**20
TOLERANCE = 0.25
TRACE_RTOL = 1e-9
BATCH_MARK = "--mpi-batch"


# ---------------------------------------------------------------- one model's job
def make_job(index: int, seed: int, data_mib: float, max_rows: int, folder: Path) -> dict:
    """Model ``index``: its start model, data on disk, and the pinned plan for two workers."""
    truth, start = random_model(seed + index)
    n_leaves = len(start.leaves())
    grid = (1, 2) if index % 2 == 1 and n_leaves >= 2 else (2, 1)
    from emgrid.planner.costing import model_facts

    per_row = max(float(model_facts(start).group_data.sum()), 8.0)
    n = int(min(max_rows, max(2000, data_mib * MiB / per_row)))
    raw = truth.sample(n, np.random.default_rng(seed + index))
    dataset = NpyDataset.write(raw, folder / f"model{index}", model=start)
    plan = balance_plan(start, Resources.uniform(2), n_data=n, grid=grid)
    return {"index": index, "seed": seed + index, "description": start.describe(), "leaves": n_leaves,
            "n_data": n, "grid": f"{grid[0]}x{grid[1]}", "dataset": str(dataset.directory),
            "model": start.to_spec(), "plan": plan.to_json()}


def fit_one(job: dict, executor: str, max_iter: int, timeout_s: float) -> dict:
    """One fit in this process (local or multiprocessing); never raises."""
    model = from_spec(job["model"])
    plan = BalancePlan.from_json(job["plan"])
    t0 = time.perf_counter()
    try:
        if executor == "local":
            data = NpyDataset(job["dataset"]).open()
            data = model.prepare(_load(data))  # in memory, as a caller of the local executor holds it
            ex = get("local")
        else:
            data = NpyDataset(job["dataset"])
            ex = get("multiprocessing", timeout_s=timeout_s)
        res = optimize(data, model, plan=plan, executor=ex, max_iter=max_iter, tol=0.0)
        return {"ok": True, "trace": res.log_likelihood, "peaks": res.worker_peak_bytes,
                "seconds": time.perf_counter() - t0}
    except Exception as e:  # noqa: BLE001 - counted as a failure
        return {"ok": False, "error": f"{type(e).__name__}: {e}", "trace": [], "peaks": {},
                "seconds": time.perf_counter() - t0, "traceback": traceback.format_exc()}


def _load(data):
    """Memory-mapped columns read into memory."""
    from emgrid.models import Ragged

    if data is None:
        return None
    if isinstance(data, tuple):
        return tuple(_load(d) for d in data)
    if isinstance(data, Ragged):
        return Ragged.unchecked(_load(data.values), np.array(data.offsets))
    return np.array(data)


# ---------------------------------------------------------------- MPI batches
def run_mpi_batch(jobs: list[dict], max_iter: int, timeout_s: float, folder: Path) -> list[dict]:
    """The MPI fits of ``jobs`` in one ``mpiexec -n 2``; a job the batch did not finish fails."""
    spec = folder / f"batch{jobs[0]['index']}.json"
    out = folder / f"batch{jobs[0]['index']}.out.json"
    spec.write_text(json.dumps({"jobs": jobs, "max_iter": max_iter, "out": str(out)}))
    mpiexec = Path(sys.executable).with_name("mpiexec")
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([str(mpiexec), "-n", "2", sys.executable, __file__, BATCH_MARK, str(spec)],
                              capture_output=True, text=True, timeout=timeout_s, env=env, cwd=str(ROOT))
        problem = None if proc.returncode == 0 else f"mpiexec exited {proc.returncode}: {proc.stderr[-2000:]}"
    except subprocess.TimeoutExpired:
        problem = f"mpiexec did not finish within {timeout_s:g} s"
    done = json.loads(out.read_text()) if out.exists() else {}
    results = []
    for job in jobs:
        got = done.get(str(job["index"]))
        if got is None:
            got = {"ok": False, "error": problem or "the batch ended before this fit", "trace": [], "peaks": {},
                   "seconds": time.perf_counter() - t0}
        results.append(got)
    return results


def mpi_batch(spec_path: str) -> int:
    """``--mpi-batch``: every rank runs every job of the batch; rank 0 records the results."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    spec = json.loads(Path(spec_path).read_text())
    results = {}
    for job in spec["jobs"]:
        model = from_spec(job["model"])
        plan = BalancePlan.from_json(job["plan"])
        t0 = time.perf_counter()
        try:
            res = optimize(NpyDataset(job["dataset"]), model, plan=plan, executor="mpi", max_iter=spec["max_iter"],
                           tol=0.0)
            got = {"ok": True, "trace": res.log_likelihood, "peaks": res.worker_peak_bytes}
        except Exception as e:  # noqa: BLE001 - a FitError is raised on every rank alike
            got = {"ok": False, "error": f"{type(e).__name__}: {e}", "trace": [], "peaks": {},
                   "traceback": traceback.format_exc()}
        got["seconds"] = time.perf_counter() - t0
        results[str(job["index"])] = got
        if comm.Get_rank() == 0:  # after every fit, so a crash keeps what finished
            Path(spec["out"]).write_text(json.dumps(results))
    return 0


# ---------------------------------------------------------------- leaks
def _processes() -> dict[int, tuple[int, str]]:
    """Every process: pid -> (parent pid, command line)."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            out[int(entry)] = (ppid, cmd)
        except (OSError, ValueError):
            continue
    return out


def _descendants(procs, root: int) -> list[int]:
    kids = {}
    for pid, (ppid, _) in procs.items():
        kids.setdefault(ppid, []).append(pid)
    out, todo = [], [root]
    while todo:
        for k in kids.get(todo.pop(), []):
            out.append(k)
            todo.append(k)
    return out


def _sysv_shm() -> set[str]:
    try:
        with open("/proc/sysvipc/shm") as f:
            return {line.split()[1] for line in f.readlines()[1:] if line.split()}
    except OSError:
        return set()


def snapshot() -> dict:
    shm = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    scratch = {p.name for p in Path(tempfile.gettempdir()).glob("emgrid-*") if not p.name.startswith("emgrid-soak-")}
    return {"pids": set(_processes()), "dev_shm": shm, "sysv_shm": _sysv_shm(), "scratch": scratch}


def leaks(before: dict) -> dict:
    """What the run left behind (a moment after its last fit)."""
    time.sleep(1.0)
    procs = _processes()
    me = os.getpid()
    children = []
    helpers = []
    for pid in _descendants(procs, me):
        cmd = procs[pid][1]
        (helpers if "resource_tracker" in cmd else children).append({"pid": pid, "cmd": cmd[:160]})
    markers = ("multiprocessing.spawn", "multiprocessing.forkserver", "mpiexec", "hydra_pmi_proxy", BATCH_MARK,
               "emgrid.cli.main")
    strays = [{"pid": pid, "ppid": ppid, "cmd": cmd[:160]} for pid, (ppid, cmd) in procs.items()
              if pid not in before["pids"] and pid != me and pid not in {c["pid"] for c in children + helpers}
              and any(m in cmd for m in markers)]
    after = snapshot()
    return {"child_processes": children, "helper_processes": helpers, "stray_processes": strays,
            "dev_shm_new": sorted(after["dev_shm"] - before["dev_shm"]),
            "sysv_shm_new": sorted(after["sysv_shm"] - before["sysv_shm"]),
            "scratch_new": sorted(after["scratch"] - before["scratch"])}


# ---------------------------------------------------------------- the run
def same_trace(a, b) -> bool:
    if len(a) != len(b) or not a:
        return False
    return all(abs(x - y) <= TRACE_RTOL * max(abs(x), abs(y), 1.0) for x, y in zip(a, b))


def memory_rows(job: dict, executor: str, peaks: dict) -> list[dict]:
    plan = BalancePlan.from_json(job["plan"])
    rows = []
    for w in plan.per_worker:
        if w.name not in peaks:
            continue
        rows.append({"model": job["index"], "executor": executor, "worker": w.name, "predicted": w.memory_bytes,
                     "measured": int(peaks[w.name]), "ratio": peaks[w.name] / max(w.memory_bytes, 1)})
    return rows


def soak(args) -> dict:
    os.environ.pop(FAULT_ENV, None)
    before = snapshot()
    folder = Path(tempfile.mkdtemp(prefix="emgrid-soak-"))
    n_models = math.ceil(args.fits / len(EXECUTORS))
    fits: list[dict] = []
    memory: list[dict] = []
    jobs: list[dict] = []
    faults: list[dict] = []
    rng = np.random.default_rng(args.seed)
    t_start = time.perf_counter()
    try:
        for chunk_start in range(0, n_models, args.chunk):
            chunk = [make_job(i, args.seed, args.data_mib, args.max_rows, folder)
                     for i in range(chunk_start, min(n_models, chunk_start + args.chunk))]
            jobs += chunk
            mpi_jobs = []
            for job in chunk:
                for k, executor in enumerate(EXECUTORS):
                    if job["index"] * len(EXECUTORS) + k >= args.fits:
                        continue
                    if executor == "mpi":
                        mpi_jobs.append(job)
                        continue
                    got = fit_one(job, executor, args.max_iter, args.timeout)
                    fits.append({"model": job["index"], "executor": executor, **got})
                    _progress(fits, args.fits, t_start)
            if mpi_jobs:
                for job, got in zip(mpi_jobs, run_mpi_batch(mpi_jobs, args.max_iter, args.batch_timeout, folder)):
                    fits.append({"model": job["index"], "executor": "mpi", **got})
                _progress(fits, args.fits, t_start)
            for job in chunk:
                if args.fault_share > 0 and rng.random() < args.fault_share:
                    local = next((f["trace"] for f in fits if f["model"] == job["index"] and f["executor"] == "local"
                                  and f["ok"]), None)
                    if local is not None:
                        faults.append(fault_fit(job, len(faults), rng, args.max_iter, folder, local))
                        print(f"  fault {len(faults)}: {faults[-1]['fault']} on {faults[-1]['executor']}, "
                              f"equal={faults[-1]['equal']}", file=sys.stderr)
            for job in chunk:  # every model's datasets can go once its fits are done
                shutil.rmtree(job["dataset"], ignore_errors=True)
        exposed = exposure(args.exposure_rounds, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    wall = time.perf_counter() - t_start
    by_job = {j["index"]: j for j in jobs}
    mismatches = []
    for i in by_job:
        traces = {f["executor"]: f["trace"] for f in fits if f["model"] == i and f["ok"]}
        if "local" in traces:
            for ex, tr in traces.items():
                if ex != "local" and not same_trace(tr, traces["local"]):
                    mismatches.append({"model": i, "executor": ex})
    for f in fits:
        if f["ok"] and f["executor"] != "local":
            memory += memory_rows(by_job[f["model"]], f["executor"], f["peaks"])
    return {"fits": fits, "jobs": [{k: v for k, v in j.items() if k not in ("model", "plan", "dataset")} for j in jobs],
            "memory": memory, "mismatches": mismatches, "faults": faults, "exposure": exposed, "leaks": leaks(before),
            "wall_s": wall}


def exposure(rounds: int, folder: Path) -> list[dict]:
    """Every executor that starts processes, ``rounds`` times, to the end and killed: what
    its fit listened on beyond loopback and what it left (see the module's docstring)."""
    out = []
    for r in range(rounds):
        for kind in EXPOSED_EXECUTORS:
            if not available(kind):
                continue
            for kill in (False, True):
                d = folder / f"exposure{r}-{kind}-{'kill' if kill else 'end'}"
                d.mkdir()
                tmp = Path(tempfile.mkdtemp(prefix="emx-", dir="/tmp"))  # short: Ray's socket paths
                t0 = time.perf_counter()
                try:
                    watch, proc, err = run_and_watch(kind, d, tmp, kill)
                    left = leftovers(watch, proc.pid, tmp)
                    row = {"executor": kind, "killed": kill, "status": proc.returncode, "processes": len(watch.procs),
                           "exposed": sorted(f"{a}:{p} {sorted(n)}" for (a, p), n in watch.exposed().items()),
                           "hydra_ports": sorted(watch.mpiexec_ports), **left, "error": ""}
                except Exception as e:  # noqa: BLE001 - counted
                    row = {"executor": kind, "killed": kill, "status": None, "processes": 0, "exposed": [],
                           "hydra_ports": [], "alive": [], "tmp": [], "dev_shm": [], "ray_sessions": [],
                           "error": f"{type(e).__name__}: {e}"[:300]}
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
                    shutil.rmtree(d, ignore_errors=True)
                row["seconds"] = time.perf_counter() - t0
                out.append(row)
                print(f"  exposure {kind} {'kill -9' if kill else 'end'}: exposed {len(row['exposed'])}, left "
                      f"{len(row['alive']) + len(row['tmp']) + len(row['dev_shm']) + len(row['ray_sessions'])}"
                      f"{', ' + row['error'] if row['error'] else ''}", file=sys.stderr)
    return out


def exposure_problems(row: dict) -> int:
    return (len(row["exposed"]) + len(row["alive"]) + len(row["tmp"]) + len(row["dev_shm"]) + len(row["ray_sessions"])
            + bool(row["error"]))


FAULT_KINDS = ("coordinator-kill", "worker", "coordinator-term", "launcher")


def fault_fit(job: dict, number: int, rng: np.random.Generator, max_iter: int, folder: Path, baseline: list) -> dict:
    """One command-line fit of ``job`` with a fault at a random moment, then its resume."""
    from emgrid.models.data import flatten

    kind = FAULT_KINDS[number % len(FAULT_KINDS)]
    executor = {"coordinator-kill": ("local", "multiprocessing")[number // 4 % 2], "worker": ("multiprocessing", "mpi")[number // 4 % 2],
                "coordinator-term": ("multiprocessing", "local")[number // 4 % 2], "launcher": "mpi"}[kind]
    d = folder / f"fault{number}"
    d.mkdir()
    (d / "model.json").write_text(json.dumps(job["model"]))
    np.savez(d / "data.npz", **flatten(_load(NpyDataset(job["dataset"]).open())))
    (d / "run.toml").write_text(f"""[model]\nspec = "model.json"\n[data]\npath = "data.npz"\n[resources]\nworkers = 2
latency_s = 1e-9\nbytes_per_s = 1e12\n[executor]\nkind = "{executor}"\n[fit]\nmax_iter = {max_iter}\ntol = 0.0
checkpoint_every = 1\noutput = "out"\n""")
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.pop(FAULT_ENV, None)
    if kind == "worker":
        env[FAULT_ENV] = f"kill:worker=0:iteration={int(rng.integers(1, max_iter + 1))}"
    cmd = [sys.executable, "-m", "emgrid.cli.main", "fit", "run.toml", "--quiet"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=d, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if kind != "worker":
        delay = float(rng.uniform(1.0, 6.0))  # start-up (imports, planning) takes 1-4 s: some faults strike before
        try:
            proc.wait(delay)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM if kind == "coordinator-term" else signal.SIGKILL)
    try:
        _, err = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    injected = proc.returncode not in (0, 1)
    expected = {"coordinator-kill": -signal.SIGKILL, "launcher": -signal.SIGKILL, "coordinator-term": 143, "worker": 3}[kind]
    time.sleep(0.5)  # a killed launcher's job dies with it
    out = d / "out"
    resume = (out / "checkpoint.json").exists()
    env.pop(FAULT_ENV, None)
    again = subprocess.run(cmd + (["--resume"] if resume else []), cwd=d, env=env, capture_output=True, text=True,
                           timeout=600)
    trace = []
    if (out / "report.json").exists():
        trace = json.loads((out / "report.json").read_text())["log_likelihood"]
    leftovers = sorted(p.name for p in out.iterdir() if p.name not in ("model.json", "report.json", "checkpoint.json")) \
        if out.exists() else []
    shutil.rmtree(d, ignore_errors=True)
    return {"model": job["index"], "fault": kind, "executor": executor, "injected": injected,
            "status": proc.returncode, "expected_status": expected, "fault_line": err.strip().splitlines()[-1:] if err else [],
            "resumed": resume, "resume_status": again.returncode, "resume_error": again.stderr.strip()[-300:],
            "equal": same_trace(trace, baseline), "leftovers": leftovers, "seconds": time.perf_counter() - t0}


def _progress(fits, total, t0):
    bad = sum(not f["ok"] for f in fits)
    print(f"\r{len(fits)}/{total} fits, {bad} failed, {time.perf_counter() - t0:.0f} s", end="", file=sys.stderr,
          flush=True)


# ---------------------------------------------------------------- report
def summarize(run: dict, args) -> dict:
    per_ex = {}
    for ex in EXECUTORS:
        fs = [f for f in run["fits"] if f["executor"] == ex]
        mem = [m for m in run["memory"] if m["executor"] == ex]
        ratios = sorted(m["ratio"] for m in mem)
        per_ex[ex] = {
            "fits": len(fs), "failures": sum(not f["ok"] for f in fs),
            "median_s": statistics.median([f["seconds"] for f in fs]) if fs else 0.0,
            "workers_compared": len(mem), "within_25": sum(abs(r - 1) <= TOLERANCE for r in ratios),
            "not_above_125": sum(r <= 1 + TOLERANCE for r in ratios),
            "ratio_min": ratios[0] if ratios else None, "ratio_median": statistics.median(ratios) if ratios else None,
            "ratio_max": ratios[-1] if ratios else None,
        }
    lk = run["leaks"]
    leaked = len(lk["child_processes"]) + len(lk["stray_processes"]) + len(lk["dev_shm_new"]) + \
        len(lk["sysv_shm_new"]) + len(lk["scratch_new"])
    fl = run.get("faults", [])
    faults = {"fault_fits": len(fl), "faults_injected": sum(f["injected"] for f in fl),
              "resumes_equal": sum(f["equal"] for f in fl), "resumes_differing": sum(not f["equal"] for f in fl),
              "unexpected_status": sum(f["injected"] and f["status"] != f["expected_status"] for f in fl),
              "output_leftovers": sum(len(f["leftovers"]) for f in fl)}
    leaked += faults["output_leftovers"]
    ex = run.get("exposure", [])
    exposure_summary = {"runs": len(ex), "exposed": sum(len(r["exposed"]) for r in ex),
                        "left": sum(exposure_problems(r) - len(r["exposed"]) for r in ex)}
    leaked += exposure_summary["exposed"] + exposure_summary["left"]
    return {"faults": faults, "exposure": exposure_summary, "fits": len(run["fits"]), "failures": sum(not f["ok"] for f in run["fits"]) + faults["resumes_differing"]
            + faults["unexpected_status"],
            "trace_mismatches": len(run["mismatches"]), "leaked": leaked, "per_executor": per_ex,
            "wall_s": run["wall_s"], "args": vars(args)}


def markdown(run: dict, s: dict) -> str:
    a = s["args"]
    lines = ["# Soak: consecutive fits of random nested models", "",
             f"`python bench/soak.py --fits {a['fits']}` (seed {a['seed']}, {a['max_iter']} EM iterations per fit, "
             f"~{a['data_mib']:g} MiB of data per model, at most {a['max_rows']} rows; models fitted on local, "
             f"multiprocessing and mpi in turn on one pinned two-worker plan; {time.strftime('%Y-%m-%d %H:%M')}, "
             f"{os.cpu_count()} cores, shared). Wall time {s['wall_s']:.0f} s.", "",
             f"**{s['fits']} fits, {s['failures']} failures, {s['trace_mismatches']} traces differing between "
             f"executors (> {TRACE_RTOL:g} relative), {s['leaked']} leaked processes / shared-memory segments / "
             f"scratch folders.**", "",
             "| executor | fits | failures | median s/fit | workers compared | within 25% of plan | "
             "not above plan + 25% | measured/predicted min / median / max |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for ex, p in s["per_executor"].items():
        rng = (f"{p['ratio_min']:.2f} / {p['ratio_median']:.2f} / {p['ratio_max']:.2f}" if p["ratio_min"] is not None
               else "not compared (the caller's data is in the baseline)")
        lines.append(f"| {ex} | {p['fits']} | {p['failures']} | {p['median_s']:.2f} | {p['workers_compared']} | "
                     f"{p['within_25']} | {p['not_above_125']} | {rng} |")
    fs = s["faults"]
    lines += ["", f"**Faults: {fs['fault_fits']} command-line fits with a fault at a random moment, "
              f"{fs['faults_injected']} struck before the fit finished, {fs['resumes_equal']} resumes equal to the "
              f"uninterrupted run, {fs['resumes_differing']} differing, {fs['unexpected_status']} with an unexpected "
              f"exit status, {fs['output_leftovers']} files left in output folders.**", ""]
    if run.get("faults"):
        lines += ["| fault | executor | fits | injected | resumed from a checkpoint | equal |", "|---|---|---:|---:|---:|---:|"]
        for kind in FAULT_KINDS:
            for ex in EXECUTORS:
                group = [f for f in run["faults"] if f["fault"] == kind and f["executor"] == ex]
                if group:
                    lines.append(f"| {kind} | {ex} | {len(group)} | {sum(f['injected'] for f in group)} | "
                                 f"{sum(f['resumed'] for f in group)} | {sum(f['equal'] for f in group)} |")
        bad = [f for f in run["faults"] if not f["equal"] or f["leftovers"]]
        lines += [f"- model {f['model']} ({f['fault']} on {f['executor']}): status {f['status']}, resume "
                  f"{f['resume_status']} {f['resume_error'][:200]!r}, leftovers {f['leftovers']}" for f in bad[:20]]
    ex = run.get("exposure", [])
    if ex:
        es = s["exposure"]
        lines += ["", f"**Exposure: {es['runs']} `emgrid fit` runs (to the end and killed with SIGKILL on every "
                  f"executor that starts processes): {es['exposed']} listeners beyond loopback, {es['left']} "
                  f"processes / temporary entries / `/dev/shm` files / Ray sessions left.**", "",
                  "| executor | end | processes seen | beyond loopback | hydra's control port | alive after | "
                  "left in TMPDIR | left in /dev/shm | Ray sessions | s |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in ex:
            lines.append(f"| {r['executor']} | {'kill -9' if r['killed'] else 'ended'} | {r['processes']} | "
                         f"{len(r['exposed'])} | {len(r['hydra_ports'])} | {len(r['alive'])} | {len(r['tmp'])} | "
                         f"{len(r['dev_shm'])} | {len(r['ray_sessions'])} | {r['seconds']:.1f} |")
        lines += [f"- {r['executor']} ({'kill -9' if r['killed'] else 'ended'}): {r['exposed']} {r['alive']} "
                  f"{r['tmp']} {r['dev_shm']} {r['ray_sessions']} {r['error']}" for r in ex if exposure_problems(r)]
    lines += ["", "Memory: each worker's peak RSS above its baseline (`FitResult.worker_peak_bytes`) against the "
              "plan's `per_worker[i].memory_bytes`; `bench/results/memory.md` breaks the prediction into its terms.",
              "", "## Leaks after the run", ""]
    lk = run["leaks"]
    for key, label in [("child_processes", "child processes still alive"),
                       ("stray_processes", "processes left by the run elsewhere"),
                       ("dev_shm_new", "new files in /dev/shm"), ("sysv_shm_new", "new System V segments"),
                       ("scratch_new", "new emgrid-* entries in /tmp")]:
        lines.append(f"- {label}: {len(lk[key])}" + (f" {lk[key]}" if lk[key] else ""))
    lines.append(f"- (not a leak) multiprocessing's resource tracker, alive as long as this process: "
                 f"{len(lk['helper_processes'])}")
    failed = [f for f in run["fits"] if not f["ok"]]
    if failed:
        lines += ["", "## Failures", ""] + [f"- model {f['model']} on {f['executor']}: {f['error'][:300]}"
                                            for f in failed[:30]]
    if run["mismatches"]:
        lines += ["", "## Trace mismatches", ""] + [f"- model {m['model']} on {m['executor']}"
                                                    for m in run["mismatches"][:30]]
    worst = sorted(run["memory"], key=lambda m: -abs(math.log(max(m["ratio"], 1e-9))))[:10]
    if worst:
        jobs = {j["index"]: j for j in run["jobs"]}
        lines += ["", "## Furthest from the plan", "", "| model | grid | executor | worker | predicted MiB | "
                  "measured MiB | ratio |", "|---|---|---|---|---:|---:|---:|"]
        for m in worst:
            j = jobs[m["model"]]
            lines.append(f"| {m['model']}: {j['description']} ({j['n_data']} rows) | {j['grid']} | {m['executor']} | "
                         f"{m['worker']} | {m['predicted'] / MiB:.2f} | {m['measured'] / MiB:.2f} | {m['ratio']:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == BATCH_MARK:
        return mpi_batch(sys.argv[2])
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--fits", type=int, default=200, help="fits in all (models x executors, in turn)")
    p.add_argument("--seed", type=int, default=1000)
    p.add_argument("--max-iter", type=int, default=3)
    p.add_argument("--data-mib", type=float, default=16.0, help="about this much data per model")
    p.add_argument("--max-rows", type=int, default=200_000)
    p.add_argument("--chunk", type=int, default=10, help="models per mpiexec batch")
    p.add_argument("--timeout", type=float, default=300.0, help="a multiprocessing worker's limit per iteration")
    p.add_argument("--batch-timeout", type=float, default=900.0, help="limit of one mpiexec batch")
    p.add_argument("--fault-share", type=float, default=0.25,
                   help="share of the models also fitted by `emgrid fit` with a fault, then resumed")
    p.add_argument("--exposure-rounds", type=int, default=1,
                   help="rounds of `emgrid fit` on every executor, to the end and killed, watched for listeners "
                        "beyond loopback and leftovers")
    p.add_argument("--out", default=str(HERE / "results" / "soak"))
    args = p.parse_args()
    run = soak(args)
    print(file=sys.stderr)
    s = summarize(run, args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"summary": s, **run}, indent=1, default=float))
    md = markdown(run, s)
    out.with_suffix(".md").write_text(md)
    print(md)
    return 0 if s["failures"] == 0 and s["leaked"] == 0 and s["trace_mismatches"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
