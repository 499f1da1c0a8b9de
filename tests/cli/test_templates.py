"""Templates on the command line: the examples, [fit] n_init / seed / init, warnings, errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def emgrid(*args, timeout=300):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "emgrid.cli.main", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=env)


def _example(tmp_path, name: str, **fit) -> str:
    """Copies ``examples/<name>.toml`` and its truth into ``tmp_path``, with [fit] keys replaced
    (or added)."""
    shutil.copy(EXAMPLES / f"{name}_truth.json", tmp_path)
    lines = (EXAMPLES / f"{name}.toml").read_text().splitlines()
    for key, value in fit.items():
        if not any(line.startswith(f"{key} =") for line in lines):
            lines.insert(lines.index("[fit]") + 1, f"{key} =")
        lines = [f"{key} = {json.dumps(value)}" if line.startswith(f"{key} =") else line for line in lines]
    (tmp_path / f"{name}.toml").write_text("\n".join(lines) + "\n")
    return str(tmp_path / f"{name}.toml")


def _report(tmp_path, name: str) -> dict:
    return json.loads((tmp_path / "out" / name / "report.json").read_text())


@pytest.mark.parametrize("name", ["iris", "wine"])
def test_the_template_examples_fit_from_the_data_alone(tmp_path, name):
    r = emgrid("fit", _example(tmp_path, name), "--quiet")
    assert r.returncode == 0, r.stderr
    report = _report(tmp_path, name)
    assert len(report["init"]["log_likelihoods"]) == 5
    assert report["log_likelihood"][0] >= max(report["init"]["log_likelihoods"]) - 1e-6
    model = json.loads((tmp_path / "out" / name / "model.json").read_text())
    assert "weights" in model and "k" not in model  # the fitted model is complete


def test_the_digits_example_plans_and_starts(tmp_path):
    cfg = _example(tmp_path, "digits", max_iter=5, n_init=2)
    plan = emgrid("plan", cfg, "--json")  # the Categorical's values come from the data
    assert plan.returncode == 0, plan.stderr
    r = emgrid("fit", cfg, "--quiet")
    assert r.returncode == 1 and "not converged" in r.stderr, r.stderr
    assert len(_report(tmp_path, "digits")["init"]["log_likelihoods"]) == 2


def test_the_fit_seed_drives_the_starts(tmp_path):
    # one refining iteration: each start's reported log-likelihood is the start's own (more
    # iterations may take two starts to one optimum, bit for bit on some CPUs)
    runs = {}
    for tag, seed in [("a", 0), ("b", 0), ("c", 1)]:
        d = tmp_path / tag
        d.mkdir()
        cfg = _example(d, "iris", seed=seed, n_init=2, max_iter=3, init_iter=1)
        assert emgrid("fit", cfg, "--quiet").returncode in (0, 1)
        runs[tag] = _report(d, "iris")["init"]["log_likelihoods"]
    assert runs["a"] == runs["b"] and runs["a"] != runs["c"]


@pytest.mark.parametrize(("fit", "words"), [
    ({"n_init": 0}, ["fit.n_init", "0"]),
    ({"init": "kmeans++"}, ["fit.init", "kmeans++"]),
    ({"seed": -2}, ["fit.seed", "-2"]),
])
def test_bad_initialization_keys_exit_2_with_one_line(tmp_path, fit, words):
    r = emgrid("fit", _example(tmp_path, "iris", **fit), "--quiet")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    for w in words:
        assert w in r.stderr


def test_synthetic_data_from_a_template_needs_a_truth(tmp_path):
    lines = [line for line in (EXAMPLES / "iris.toml").read_text().splitlines() if not line.startswith("truth")]
    (tmp_path / "run.toml").write_text("\n".join(lines))
    r = emgrid("fit", tmp_path / "run.toml", "--quiet")
    assert r.returncode == 2 and "template" in r.stderr and "truth" in r.stderr, r.stderr


def test_warnings_are_one_line_each(tmp_path):
    (tmp_path / "run.toml").write_text("""
[model]
inline = { family = "Mixture", weights = [0.5, 0.3, 0.2], components = [
  { family = "Gaussian", mean = 0.0, var = 1.0 }, { family = "Gaussian", mean = 1.0, var = 1.0 },
  { family = "Gaussian", mean = 1000.0, var = 1.0 } ] }
[data]
synthetic = 2000
truth = { family = "Gaussian", mean = 0.0, var = 1.0 }
[fit]
max_iter = 5
output = "out"
""")
    r = emgrid("fit", tmp_path / "run.toml", "--quiet")
    lines = [x for x in r.stderr.splitlines() if x.startswith("emgrid: warning:")]
    assert any("Mixture at path '<root>': component 2" in x and "collapsed" in x for x in lines), r.stderr
