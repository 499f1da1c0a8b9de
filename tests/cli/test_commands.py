"""Every command run as a user runs it: a subprocess, a real config file, a temporary folder."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def emgrid(*args, cwd=None, timeout=300):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "emgrid.cli.main", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, timeout=timeout, env=env)


MIXTURE = """
[model]
inline = {{ family = "Mixture", weights = [0.5, 0.5], components = [
  {{ family = "Gaussian", mean = -1.0, var = 1.0 }}, {{ family = "Gaussian", mean = 1.0, var = 1.0 }} ] }}
[data]
synthetic = 4000
truth = {{ family = "Mixture", weights = [0.3, 0.7], components = [
  {{ family = "Gaussian", mean = -3.0, var = 1.0 }}, {{ family = "Gaussian", mean = 2.0, var = 0.5 }} ] }}
[resources]
workers = 2
[executor]
kind = "{kind}"
[fit]
max_iter = {max_iter}
tol = {tol}
checkpoint_every = {every}
output = "out"
"""


def config(tmp_path, *, kind="local", max_iter=40, tol=1e-10, every=0, name="run.toml"):
    p = tmp_path / name
    p.write_text(MIXTURE.format(kind=kind, max_iter=max_iter, tol=tol, every=every))
    return p


def test_demo_runs_end_to_end():
    r = emgrid("demo", "--rows", 3000)
    assert r.returncode == 0, r.stderr
    assert "grid" in r.stdout and "converged" in r.stdout
    assert "Traceback" not in r.stderr


def test_plan_prints_table_and_json(tmp_path):
    cfg = config(tmp_path)
    r = emgrid("plan", cfg)
    assert r.returncode == 0, r.stderr
    assert "grid" in r.stdout and "why:" in r.stdout
    r = emgrid("plan", cfg, "--json", "--workers", 3, "--memory", "1GiB")
    assert r.returncode == 0, r.stderr
    from emgrid.planner import BalancePlan

    plan = BalancePlan.from_json(r.stdout)
    assert plan.workers_total == 3
    assert plan.data_parallel * plan.model_parallel <= 3


def test_fit_writes_model_and_report(tmp_path):
    r = emgrid("fit", config(tmp_path), "--quiet", cwd=tmp_path)
    assert r.returncode in (0, 1), r.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    trace = report["log_likelihood"]
    assert len(trace) == report["iterations"] >= 2
    assert all(b >= a - 1e-9 * abs(a) for a, b in zip(trace, trace[1:]))
    from emgrid.models import load_model

    fitted = load_model(tmp_path / "out" / "model.json")
    means = sorted(float(c.mean) for c in fitted.children)
    assert abs(means[0] + 3) < 0.2 and abs(means[1] - 2) < 0.2


def test_not_converged_exits_1_with_a_note(tmp_path):
    r = emgrid("fit", config(tmp_path, max_iter=2, tol=0.0), "--quiet", cwd=tmp_path)
    assert r.returncode == 1
    assert "not converged" in r.stderr


@pytest.mark.parametrize("edit, words", [
    (lambda t: t.replace("workers = 2", "workers = 0"), "resources.workers"),
    (lambda t: t.replace("max_iter", "maxiter"), "unknown key"),
    (lambda t: t.replace('family = "Gaussian", mean = -1.0, var = 1.0', 'family = "Gaussian", mean = -1.0, var = -1.0'), "var"),
    (lambda t: t.replace('family = "Gaussian", mean = -1.0', 'family = "Gausian", mean = -1.0'), "unknown model family"),
], ids=["zero-workers", "unknown-key", "negative-variance", "unknown-family"])
def test_bad_input_exits_2_with_one_line(tmp_path, edit, words):
    p = config(tmp_path)
    p.write_text(edit(p.read_text()))
    r = emgrid("fit", p, "--quiet", cwd=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) <= 2
    assert words in r.stderr


def test_missing_data_file_exits_2(tmp_path):
    p = config(tmp_path)
    p.write_text(p.read_text().replace("synthetic = 4000", 'path = "nope.npy"'))
    r = emgrid("plan", p)
    assert r.returncode == 2 and "nope.npy" in r.stderr


def test_data_from_npy_file(tmp_path):
    x = np.random.default_rng(0).normal(size=500)
    np.save(tmp_path / "x.npy", x)
    p = config(tmp_path, max_iter=5)
    p.write_text(p.read_text().replace("synthetic = 4000", 'path = "x.npy"'))
    r = emgrid("fit", p, "--quiet", cwd=tmp_path)
    assert r.returncode in (0, 1), r.stderr


def test_resume_equals_uninterrupted(tmp_path):
    whole = tmp_path / "whole"
    whole.mkdir()
    r = emgrid("fit", config(whole, max_iter=8, tol=0.0), "--quiet", cwd=whole)
    assert r.returncode == 1, r.stderr
    full = json.loads((whole / "out" / "report.json").read_text())["log_likelihood"]

    part = tmp_path / "part"
    part.mkdir()
    r = emgrid("fit", config(part, max_iter=5, tol=0.0, every=5), "--quiet", cwd=part)
    assert r.returncode == 1, r.stderr
    cfg = config(part, max_iter=8, tol=0.0, every=5)
    r = emgrid("fit", cfg, "--quiet", "--resume", cwd=part)
    assert r.returncode == 1, r.stderr
    resumed = json.loads((part / "out" / "report.json").read_text())["log_likelihood"]
    assert len(resumed) == len(full) == 8
    np.testing.assert_allclose(resumed, full, rtol=1e-12)


def _write_forever(folder):
    from emgrid.cli.checkpoint import write_checkpoint
    from emgrid.models import DiagGaussian

    i = 0
    while True:
        i += 1
        write_checkpoint(Path(folder), i, DiagGaussian(np.full(20000, float(i)), np.ones(20000)), [float(i)] * i)


def test_kill_during_checkpoint_write_leaves_previous_readable(tmp_path):
    from emgrid.cli.checkpoint import read_checkpoint

    ctx = mp.get_context("spawn")
    for n, delay in enumerate((0.05, 0.2, 0.45)):
        folder = tmp_path / f"kill{n}"
        p = ctx.Process(target=_write_forever, args=(str(folder),))
        p.start()
        # kill it a while after its first checkpoint is in place (however long the spawn took),
        # so there always is a previous checkpoint to leave readable
        end = time.monotonic() + 60
        while not (folder / "checkpoint.json").exists():
            assert p.is_alive() and time.monotonic() < end, "the writer wrote no checkpoint"
            time.sleep(0.01)
        time.sleep(delay)
        os.kill(p.pid, signal.SIGKILL)
        p.join()
        it, model, trace = read_checkpoint(folder)
        assert float(model.mean[0]) == it and trace == [float(it)] * it


def test_executor_swap_is_one_word(tmp_path):
    traces = {}
    for kind in ("local", "multiprocessing"):
        d = tmp_path / kind
        d.mkdir()
        r = emgrid("fit", config(d, kind=kind, max_iter=6, tol=0.0), "--quiet", cwd=d)
        assert r.returncode == 1, r.stderr
        traces[kind] = json.loads((d / "out" / "report.json").read_text())["log_likelihood"]
    np.testing.assert_allclose(traces["multiprocessing"], traces["local"], rtol=1e-9)


def test_fit_under_mpi_launches_mpiexec_itself(tmp_path):
    r = emgrid("fit", config(tmp_path, kind="mpi", max_iter=4, tol=0.0), "--quiet", cwd=tmp_path)
    assert r.returncode == 1, (r.stdout, r.stderr)
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert len(report["log_likelihood"]) == 4


def test_advise_says_what_helps(tmp_path):
    """Each executor asked for is measured (a cluster engine on a local cluster of its own),
    the others are not; the README runs it on every executor that can run here."""
    pytest.importorskip("distributed")
    r = emgrid("advise", config(tmp_path), "--measure", "dask,multiprocessing")
    assert r.returncode == 0, r.stderr
    assert "advice:" in r.stdout and "local" in r.stdout
    assert "free cores" in r.stdout  # measured, not assumed
    rows = {line.split()[0] for line in r.stdout.splitlines() if line[:1].isalpha()}
    assert {"multiprocessing", "dask"} <= rows and not rows & {"mpi", "ray", "spark"}, r.stdout
    measured = [line for line in r.stdout.splitlines() if line.startswith(("multiprocessing", "dask"))]
    assert all(" ms " in line for line in measured), r.stdout  # an overhead each, not "unavailable"


def test_advise_refuses_an_executor_it_cannot_measure(tmp_path):
    r = emgrid("advise", config(tmp_path), "--measure", "multiprocessing,yarn")
    assert r.returncode == 2
    assert "--measure" in r.stderr and "'multiprocessing,yarn'" in r.stderr
