"""EM speed of emgrid's HMM against hmmlearn's ``GaussianHMM`` (diagonal), one thread, same data and start.

Rows (``--rows``, comma list of names):

- ``long``: S = 8 states, d = 4, 4,000 sequences of 100 steps (issue 28's case, target 10x);
- ``short``: S = 8, d = 4, 20,000 sequences of 10 steps (target: no slower than hmmlearn);
- ``ragged``: S = 8, d = 4, 4,000 sequences of Poisson(100) steps (no target);
- ``wide``: S = 32, d = 4, 1,000 sequences of 100 steps (no target).

Method
    Both run in this process with every BLAS/OpenMP pool at one thread (the variables are
    set before numpy is imported; threadpoolctl enforces it). Each *round* times, back to back:

    - emgrid: ``iters + 1`` calls of ``models.em_step`` (E-step over row blocks plus the
      M-step) from the start model; the first call is a warm-up, the figure is the mean of
      the others;
    - hmmlearn: ``GaussianHMM(n_iter=1)`` and ``GaussianHMM(n_iter=1 + iters)`` from the same
      start (``init_params=""``, the start's ``startprob_``, ``transmat_``, ``means_``,
      ``covars_``), ``tol=-inf`` (every iteration runs) and ``covars_prior=0`` (the maximum
      likelihood M-step, emgrid's); per iteration ``(T(1 + iters) - T(1)) / iters``, which
      cancels the checks and set-up of ``fit``. hmmlearn's default ``implementation="log"``
      (``--implementation scaling`` for its other forward-backward).

    Wall and CPU seconds are both recorded (the machine is shared: CPU time is less
    sensitive to other processes); the ratio is taken per round, the table shows medians.

Oracle
    hmmlearn's ``monitor_.history`` (the log-likelihood of each iteration's E-step) must equal
    emgrid's trace (``em_step`` returns the log-likelihood of the model its E-step used)
    iteration by iteration: the same model from the same start, so they agree to rounding.
    ``loglik_max_rel_diff`` above 1e-8 fails the run.

Usage::

    python bench/hmm_speed.py                          # every row, writes bench/results/
    python bench/hmm_speed.py --rows long --rounds 1   # quick
    python bench/hmm_speed.py --emgrid-root /tmp/old --out /tmp/r   # another checkout's emgrid

Results: ``bench/results/hmm_speed.json`` and ``.md`` (``--out``).
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
             "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

#: name -> (states, dim, sequences, steps, ragged lengths, target ratio or None)
ROWS = {
    "long": (8, 4, 4000, 100, False, 10.0),
    "short": (8, 4, 20000, 10, False, 1.0),
    "ragged": (8, 4, 4000, 100, True, None),
    "wide": (32, 4, 1000, 100, False, None),
}
MAX_REL_DIFF = 1e-8


def use_checkout(root: Path) -> None:
    """Import ``emgrid`` from the checkout at ``root`` instead of the installed one: its facade
    from ``src/emgrid``, its subpackages (``models``, ...) from the top of the checkout."""
    spec = importlib.util.spec_from_file_location("emgrid", root / "src" / "emgrid" / "__init__.py",
                                                  submodule_search_locations=[str(root / "src" / "emgrid"), str(root)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["emgrid"] = module
    spec.loader.exec_module(module)


def limit_threads():
    try:
        from threadpoolctl import threadpool_info, threadpool_limits
    except ImportError:
        return None, []
    limiter = threadpool_limits(limits=1)
    info = [{k: p.get(k) for k in ("internal_api", "version", "num_threads")} for p in threadpool_info()]
    return limiter, info


def make_data(s, d, n, t, ragged, seed):
    """Sequences from a random Gaussian HMM (sticky transitions, means N(0, 3^2), standard
    deviations 0.5-1.5) and a start: means at S random positions, the data's variances,
    transitions half on the diagonal, uniform initial probabilities."""
    rng = np.random.default_rng(seed)
    means = rng.normal(0.0, 3.0, size=(s, d))
    scales = rng.uniform(0.5, 1.5, size=(s, d))
    trans = 0.8 * np.eye(s) + 0.2 * rng.dirichlet(np.ones(s), size=s)
    lengths = np.maximum(rng.poisson(t, size=n), 1) if ragged else np.full(n, t)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    states = np.empty(int(offsets[-1]), dtype=np.int64)
    cum = np.cumsum(trans, axis=1)
    for step in range(int(lengths.max())):
        live = np.flatnonzero(lengths > step)
        at = offsets[live] + step
        if step == 0:
            states[at] = rng.integers(0, s, size=live.size)
        else:
            u = rng.random(live.size)
            states[at] = np.minimum((u[:, None] >= cum[states[at - 1]]).sum(axis=1), s - 1)
    x = means[states] + rng.standard_normal((states.size, d)) * scales[states]
    start = {"means": x[rng.choice(x.shape[0], size=s, replace=False)],
             "vars": np.tile(x.var(axis=0), (s, 1)),
             "trans": 0.5 * np.eye(s) + 0.5 / s, "init": np.full(s, 1.0 / s)}
    return np.ascontiguousarray(x), offsets, lengths, start


def emgrid_model(start, mean_length):
    from emgrid.models import HMM, DiagGaussian

    return HMM([DiagGaussian(m, v) for m, v in zip(start["means"], start["vars"])], start["trans"], start["init"],
               float(mean_length))


def time_emgrid(model, data, iters):
    from emgrid.models import em_step

    wall, cpu, trace = [], [], []
    for _ in range(iters + 1):
        t, c = time.perf_counter(), time.process_time()
        model, ll = em_step(model, data)
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
        trace.append(ll)
    return wall, cpu, trace


def hmmlearn_fit(start, x, lengths, n_iter, implementation):
    from hmmlearn import hmm

    s = start["means"].shape[0]
    peer = hmm.GaussianHMM(s, covariance_type="diag", n_iter=n_iter, tol=-np.inf, init_params="", params="stmc",
                           covars_prior=0.0, implementation=implementation)
    peer.startprob_, peer.transmat_ = start["init"], start["trans"]
    peer.means_, peer.covars_ = start["means"], start["vars"]
    t, c = time.perf_counter(), time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        peer.fit(x, lengths)
    return time.perf_counter() - t, time.process_time() - c, peer


def run_row(name, args):
    from emgrid.models import Ragged
    from emgrid.models.engine import block_rows

    s, d, n, t, ragged, target = ROWS[name]
    x, offsets, lengths, start = make_data(s, d, n, t, ragged, args.seed)
    model = emgrid_model(start, lengths.mean())
    data = model.prepare(Ragged(x, offsets))
    rounds = []
    for r in range(args.rounds):
        wall, cpu, trace = time_emgrid(model, data, args.iters)
        t1, c1, _ = hmmlearn_fit(start, x, lengths, 1, args.implementation)
        tm, cm, peer = hmmlearn_fit(start, x, lengths, 1 + args.iters, args.implementation)
        row = {"emgrid_s": statistics.fmean(wall[1:]), "emgrid_cpu_s": statistics.fmean(cpu[1:]),
               "emgrid_all_s": wall, "hmmlearn_s": (tm - t1) / args.iters, "hmmlearn_cpu_s": (cm - c1) / args.iters,
               "hmmlearn_fit1_s": t1, "hmmlearn_fit_s": tm}
        row["ratio"] = row["hmmlearn_s"] / row["emgrid_s"]
        row["ratio_cpu"] = row["hmmlearn_cpu_s"] / row["emgrid_cpu_s"]
        rounds.append(row)
        print(f"  {name} round {r + 1}: emgrid {row['emgrid_s']:.4f} s/iter (CPU {row['emgrid_cpu_s']:.4f}), "
              f"hmmlearn {row['hmmlearn_s']:.4f} (CPU {row['hmmlearn_cpu_s']:.4f}), "
              f"ratio {row['ratio']:.2f}x (CPU {row['ratio_cpu']:.2f}x)", flush=True)
    peer_trace = [float(v) for v in peer.monitor_.history]
    m = min(len(peer_trace), len(trace))
    rel = max(abs(a - b) / abs(b) for a, b in zip(trace[:m], peer_trace[:m]))
    med = lambda key: statistics.median(r[key] for r in rounds)  # noqa: E731
    out = {"row": name, "states": s, "dim": d, "sequences": n, "steps": t, "ragged": ragged,
           "positions": int(offsets[-1]), "block_rows": block_rows(model), "rounds": rounds,
           "emgrid_s_per_iter": med("emgrid_s"), "hmmlearn_s_per_iter": med("hmmlearn_s"),
           "emgrid_cpu_s_per_iter": med("emgrid_cpu_s"), "hmmlearn_cpu_s_per_iter": med("hmmlearn_cpu_s"),
           "ratio_median_of_rounds": med("ratio"), "ratio_cpu_median_of_rounds": med("ratio_cpu"),
           "target_ratio": target, "loglik_emgrid": trace, "loglik_hmmlearn": peer_trace,
           "loglik_max_rel_diff": rel, "oracle_agrees": rel <= MAX_REL_DIFF}
    out["meets_target"] = target is None or out["ratio_cpu_median_of_rounds"] >= target
    print(f"  {name}: log-likelihood traces agree within {rel:.1e}", flush=True)
    return out


def markdown(report):
    lines = [
        "# HMM EM speed: emgrid vs hmmlearn's GaussianHMM (diagonal, one thread)", "",
        f"{report['rounds']} rounds of {report['iters']} timed iterations per row; hmmlearn {report['hmmlearn']} "
        f"(implementation={report['implementation']!r}), numpy {report['machine']['numpy']}; machine: "
        f"{report['machine']['cpu']}, {report['machine']['cores']} cores (shared).",
        f"Command: `{report['command']}`", "",
        "| row | S | d | sequences x steps | emgrid s/iter | hmmlearn s/iter | ratio | emgrid CPU s/iter "
        "| hmmlearn CPU s/iter | ratio (CPU) | target (CPU) | log-lik. max rel. diff |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in report["results"]:
        shape = f"{r['sequences']} x {'Poisson(' + str(r['steps']) + ')' if r['ragged'] else r['steps']}"
        goal = "-" if r["target_ratio"] is None else f"{r['target_ratio']:g}x ({'met' if r['meets_target'] else 'MISSED'})"
        lines.append(
            f"| {r['row']} | {r['states']} | {r['dim']} | {shape} | {r['emgrid_s_per_iter']:.4f} | "
            f"{r['hmmlearn_s_per_iter']:.4f} | {r['ratio_median_of_rounds']:.2f}x | {r['emgrid_cpu_s_per_iter']:.4f} | "
            f"{r['hmmlearn_cpu_s_per_iter']:.4f} | {r['ratio_cpu_median_of_rounds']:.2f}x | {goal} | "
            f"{r['loglik_max_rel_diff']:.1e} |")
    lines += ["", "Ratios are hmmlearn's time over emgrid's, per round, median of rounds. Method and oracle: the "
              "docstring of `bench/hmm_speed.py` (hmmlearn per iteration = (T(n_iter=1+iters) - T(n_iter=1)) / iters, "
              "same start, tol=-inf, covars_prior=0).", ""]
    return "\n".join(lines)


def cpu_name():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default=",".join(ROWS), help=f"comma list of {', '.join(ROWS)}")
    ap.add_argument("--iters", type=int, default=5, help="timed iterations per run (default 5)")
    ap.add_argument("--rounds", type=int, default=3, help="repetitions of the emgrid/hmmlearn pair")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--implementation", default="log", choices=("log", "scaling"),
                    help="hmmlearn's forward-backward (default its own default, log)")
    ap.add_argument("--emgrid-root", type=Path, default=None,
                    help="time the emgrid of another checkout (e.g. a git worktree of an older commit)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args(argv)
    names = [r.strip() for r in args.rows.split(",") if r.strip()]
    for name in names:
        if name not in ROWS:
            ap.error(f"--rows takes {', '.join(ROWS)}, got {name!r}")
    if args.emgrid_root is not None:
        use_checkout(args.emgrid_root.resolve())
    _limiter, pools = limit_threads()
    import hmmlearn

    results = [run_row(name, args) for name in names]
    report = {
        "command": "python bench/hmm_speed.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "iters": args.iters, "rounds": args.rounds, "seed": args.seed, "implementation": args.implementation,
        "hmmlearn": hmmlearn.__version__, "emgrid_root": str(args.emgrid_root or ROOT),
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "python": platform.python_version(),
                    "numpy": np.__version__, "blas_pools": pools},
        "results": results,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "hmm_speed.json").write_text(json.dumps(report, indent=2))
    md = markdown(report)
    (args.out / "hmm_speed.md").write_text(md)
    print()
    print(md)
    ok = all(r["meets_target"] and r["oracle_agrees"] for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
