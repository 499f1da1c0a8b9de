"""What users reach for on the command line: [fit] flags, a quiet broken pipe, the demo under
MPI, a progress line of the EM loop alone, the picture's file named, the worker count's two
spellings agreeing, and BLAS threads per worker from the config."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from emgrid.cli.advise import trust_notes, worker_counts
from emgrid.cli.config import load_config
from emgrid.cli.progress import Progress
from emgrid.models.errors import ConfigError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MPIEXEC = Path(sys.executable).with_name("mpiexec")

MIXTURE = """
[model]
inline = { family = "Mixture", weights = [0.5, 0.5], components = [
  { family = "Gaussian", mean = -1.0, var = 1.0 }, { family = "Gaussian", mean = 1.0, var = 1.0 } ] }
[data]
synthetic = 4000
truth = { family = "Mixture", weights = [0.3, 0.7], components = [
  { family = "Gaussian", mean = -3.0, var = 1.0 }, { family = "Gaussian", mean = 2.0, var = 0.5 } ] }
[resources]
workers = 2
[executor]
kind = "KIND"
[fit]
max_iter = MAX_ITER
tol = TOL
output = "out"
"""


def emgrid(*args, cwd=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "emgrid.cli.main", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, timeout=timeout, env=dict(os.environ))


def config(tmp_path, *, kind="local", max_iter=40, tol=1e-10) -> Path:
    p = tmp_path / "run.toml"
    p.write_text(MIXTURE.replace("KIND", kind).replace("MAX_ITER", str(max_iter)).replace("TOL", str(tol)))
    return p


def test_fit_flags_override_the_config(tmp_path):
    cfg = config(tmp_path, max_iter=40, tol=1e-10)  # [fit] output = "out", beside the config
    work = tmp_path / "elsewhere"
    work.mkdir()
    r = emgrid("fit", cfg, "--max-iter", 3, "--tol", 0, "--output", "mine", "--quiet", cwd=work)
    assert r.returncode == 1, r.stderr  # not converged within the 3 iterations asked for
    report = json.loads((work / "mine" / "report.json").read_text())  # relative to the current folder
    assert report["iterations"] == 3
    assert "max_iter=3" in r.stderr and "tol=0.0" in r.stderr
    assert not (tmp_path / "out").exists()


def test_the_seed_flag_overrides_the_configs_seed(tmp_path):
    inits = {}
    for tag, seed, flag in [("config", 1, []), ("flag", 0, ["--seed", 1]), ("other", 0, [])]:
        d = tmp_path / tag
        d.mkdir()
        shutil.copy(EXAMPLES / "iris_truth.json", d)
        head, fit = (EXAMPLES / "iris.toml").read_text().split("[fit]")
        # one refining iteration: each start's reported log-likelihood is the start's own
        # (more may take two starts to one optimum, bit for bit on some CPUs)
        fit = [f"seed = {seed}" if line.startswith("seed =") else
               "n_init = 2\ninit_iter = 1" if line.startswith("n_init =") else
               "max_iter = 3" if line.startswith("max_iter =") else line for line in fit.splitlines()]
        (d / "iris.toml").write_text(head + "[fit]" + "\n".join(fit) + "\n")
        r = emgrid("fit", d / "iris.toml", "--quiet", *flag)
        assert r.returncode in (0, 1), r.stderr
        inits[tag] = json.loads((d / "out" / "iris" / "report.json").read_text())["init"]["log_likelihoods"]
    assert inits["flag"] == inits["config"] != inits["other"]


@pytest.mark.parametrize("flag,value", [("--max-iter", 0), ("--tol", -1), ("--seed", -3)])
def test_a_bad_flag_value_exits_2_naming_the_flag_and_value(tmp_path, flag, value):
    r = emgrid("fit", config(tmp_path), flag, value, "--quiet")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert flag in r.stderr and str(value) in r.stderr


def test_plan_into_a_closed_pipe_stops_quietly(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "emgrid.cli.main", "plan", str(config(tmp_path)), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before the command writes
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert err == ""


def test_plan_piped_to_head_prints_no_traceback(tmp_path):
    cmd = f"{sys.executable} -m emgrid.cli.main plan {config(tmp_path)} --json | head -c 10"
    r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120)
    assert r.stdout == '{\n "data_p' and r.stderr == "", r.stderr


@pytest.mark.skipif(not MPIEXEC.exists(), reason=f"no mpiexec next to {sys.executable}")
def test_demo_under_mpi_starts_mpiexec_itself():
    r = emgrid("demo", "--rows", 2000, "--executor", "mpi", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("grid ") == 1 and "converged=True" in r.stdout  # rank 0 alone prints
    assert "Traceback" not in r.stderr


def test_the_progress_line_shows_the_loops_seconds_per_iteration_and_start_up_apart():
    out = io.StringIO()
    t0 = time.perf_counter()
    progress = Progress(10, stream=out)
    time.sleep(0.3)  # starting workers, loading rows
    progress.update(1, -100.0, iteration_s=0.01)
    first = time.perf_counter() - t0  # at least 0.3 s; more on a loaded machine
    time.sleep(0.03)
    progress.update(2, -90.0, iteration_s=0.03)
    lines = out.getvalue().splitlines()
    startup = float(lines[0].split()[1])
    # the time to the first update less the iteration's own 0.01 s (printed to 0.01 s)
    assert lines[0].startswith("start-up") and 0.29 - 0.005 <= startup <= first - 0.01 + 0.005, (startup, first)
    assert lines[1].endswith("0.01 s/iter") and lines[2].endswith("0.02 s/iter"), lines


def test_fit_prints_start_up_and_seconds_per_iteration(tmp_path):
    r = emgrid("fit", config(tmp_path, kind="multiprocessing", max_iter=5, tol=0.0))
    assert r.returncode == 1, r.stderr
    lines = r.stderr.splitlines()
    assert any(line.startswith("start-up ") for line in lines), r.stderr
    assert sum(line.startswith("iter ") and line.endswith(" s/iter") for line in lines) == 5, r.stderr


def test_picture_names_the_file_it_wrote(tmp_path):
    pytest.importorskip("matplotlib")
    r = emgrid("plan", config(tmp_path), "--picture", "plan.png", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "plan.png").stat().st_size > 0
    assert f"wrote the plan's picture to {tmp_path / 'plan.png'}" in r.stderr


def test_picture_into_a_missing_folder_exits_2_naming_it(tmp_path):
    r = emgrid("plan", config(tmp_path), "--picture", "nowhere/plan.png", cwd=tmp_path)
    assert r.returncode == 2 and "--picture 'nowhere/plan.png'" in r.stderr, r.stderr


def _with(tmp_path, executor: str = "", resources: str = "workers = 2") -> Path:
    text = config(tmp_path).read_text().replace("[resources]\nworkers = 2\n", f"[resources]\n{resources}\n")
    text = text.replace('[executor]\nkind = "local"\n', f'[executor]\nkind = "local"\n{executor}\n')
    path = tmp_path / "edited.toml"
    path.write_text(text)
    return path


def test_processes_that_disagree_with_workers_exit_2_naming_both(tmp_path):
    path = _with(tmp_path, "processes = 3")
    r = emgrid("plan", path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "[executor] processes = 3" in r.stderr and "[resources] workers = 2" in r.stderr


@pytest.mark.parametrize("executor,resources,ok", [
    ("processes = 2", "workers = 2", True), ("processes = 2", "", True),
    ("processes = 2", 'detect = "mpi"', False), ("processes = 2", 'file = "res.json"', False),
])
def test_processes_with_resources_that_count_the_workers_themselves(tmp_path, executor, resources, ok):
    path = _with(tmp_path, executor, resources)
    if ok:
        assert load_config(path).executor.processes == 2
    else:
        with pytest.raises(ConfigError, match=r"\[executor\] processes = 2 conflicts with \[resources\]"):
            load_config(path)


def test_the_workers_flag_overrides_processes(tmp_path):
    r = emgrid("plan", _with(tmp_path, "processes = 2"), "--workers", 1)
    assert r.returncode == 0, r.stderr
    assert "= 1/1 workers" in r.stdout


@pytest.mark.parametrize("value,ok", [("1", True), ("2", True), ('"inherit"', True), ("0", False),
                                      ('"all"', False), ("1.5", False), ("true", False)])
def test_blas_threads_in_the_config(tmp_path, value, ok):
    path = _with(tmp_path, f"blas_threads = {value}")
    if ok:
        options = load_config(path).executor.executor_options()
        assert options["blas_threads"] == (None if value == '"inherit"' else int(value))
    else:
        with pytest.raises(ConfigError, match=r"executor\.blas_threads"):
            load_config(path)


def test_a_fit_runs_with_the_configs_blas_threads(tmp_path):
    r = emgrid("fit", _with(tmp_path, 'blas_threads = "inherit"'), "--quiet")
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("configured,cores,threads,counts,parallel", [
    (2, 2, 1, [2], 2), (8, 4, 1, [2, 4], 4), (1, 1, 1, [], 1), (4, 4, 2, [2], 2), (4, 2, None, [], 1),
])
def test_advise_measures_no_more_workers_than_the_cores_run_at_once(configured, cores, threads, counts, parallel):
    assert worker_counts(configured, cores, threads) == (counts, parallel)


@pytest.mark.parametrize("before, after, parallel, says", [
    (1.98, 1.95, 2, []),                                 # an idle machine: the prediction stands
    (1.05, 1.10, 2, ["keep about 0.9 of the 2 cores busy"]),  # another process holds a core
    (1.95, 1.20, 2, ["keep about 0.8", "load changed"]),  # it arrived while advise measured
])
def test_advise_says_when_its_prediction_is_not_to_be_trusted(before, after, parallel, says):
    notes = " ".join(trust_notes(before, after, parallel))
    for words in says:
        assert words in notes
    assert bool(notes) == bool(says)
