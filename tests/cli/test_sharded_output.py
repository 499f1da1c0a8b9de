"""``emgrid fit`` on a grid that splits the model writes it shard by shard (``models.sharded``):
``model.json`` and every checkpoint are a root naming one file per shard, read back whole
equal to the model the fit gathers; ``--resume`` from such a checkpoint gives the
uninterrupted fit; ``emgrid predict`` reads the sharded file; a damaged one is one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from emgrid.cli.checkpoint import CHECKPOINT, checkpoint_files, read_checkpoint
from emgrid.cli.main import main
from emgrid.cli.outdir import MANIFEST
from emgrid.models import Composite, DiagGaussian, Mixture, load_model
from emgrid.models.sharded import read_shard

D = 40


def _comp(a: float, b: float) -> Composite:
    return Composite([DiagGaussian(np.full(D, a), np.ones(D)), DiagGaussian(np.full(D, b), np.ones(D))])


def _toml(o) -> str:
    if isinstance(o, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in o.items()) + " }"
    if isinstance(o, list):
        return "[" + ", ".join(_toml(v) for v in o) + "]"
    if isinstance(o, str):
        return json.dumps(o)
    return repr(float(o)) if isinstance(o, float) else str(o)


START = Mixture([_comp(-0.5, 0.5), _comp(0.5, -0.5)], [0.5, 0.5])  # the root mixture spans the shards
TRUTH = Mixture([_comp(-0.15, 0.1), _comp(0.1, -0.1)], [0.3, 0.7])


def config(folder: Path, *, workers: int = 4, max_iter: int = 6, every: int = 0, name: str = "run.toml") -> Path:
    # 3 MB per worker: one worker cannot hold every column, so the plan splits the model
    # (2 workers: 1x2, 4 workers: 2x2)
    p = folder / name
    p.write_text(f"""
[model]
inline = {_toml(START.to_spec())}
[data]
synthetic = 2000
truth = {_toml(TRUTH.to_spec())}
[resources]
workers = {workers}
memory = "3MB"
[fit]
max_iter = {max_iter}
tol = 0.0
checkpoint_every = {every}
output = "out"
""")
    return p


def fit(cfg: Path, capsys, *args) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["fit", str(cfg), "--quiet", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def gathered(cfg: Path, max_iter: int):
    """The same fit through ``optimize`` (same plan, same data): its gathered model."""
    from emgrid.cli.main import _config, _plan
    from emgrid.cli.session import build_data, build_model
    from emgrid.executors import optimize
    from emgrid.models import n_rows

    class Args:
        config, workers, memory, flops, executor = str(cfg), None, None, None, None
        max_iter = tol = output = seed = None

    c = _config(Args)
    model = build_model(c)
    data = build_data(c, model)
    plan = _plan(c, model, n_rows(data))
    return optimize(data, model, plan=plan, executor="local", max_iter=max_iter, tol=0.0, gather=True), plan


def shard_files(out: Path, stem: str) -> list[str]:
    return sorted(p.name for p in out.glob(f"{stem}.*.shard-*.json"))


@pytest.mark.parametrize("workers,grid", [(2, (1, 2)), (4, (2, 2))], ids=["1x2", "2x2"])
def test_a_split_fit_writes_shard_files_that_read_back_as_the_gathered_model(tmp_path, capsys, workers, grid):
    cfg = config(tmp_path, workers=workers, every=2)
    code, stdout, err = fit(cfg, capsys)
    assert code == 1, err  # tol = 0: max_iter ends it
    out = tmp_path / "out"
    report = json.loads((out / "report.json").read_text())
    assert (report["plan"]["data_parallel"], report["plan"]["model_parallel"]) == grid
    root = json.loads((out / "model.json").read_text())
    assert root["format"] == "emgrid-sharded" and root["skeleton"]["family"] == "Mixture"
    assert [e["roots"] for e in root["shards"]] == [["0"], ["1"]]
    assert shard_files(out, "model") == sorted(e["file"] for e in root["shards"])

    result, plan = gathered(cfg, 6)
    assert (plan.data_parallel, plan.model_parallel) == grid
    assert result.model is not None and result.log_likelihood == report["log_likelihood"]
    assert load_model(out / "model.json").to_spec() == result.model.to_spec()
    k = result.model.n_parameters()
    assert f"({k} free parameters, 2000 observations)" in stdout.strip().splitlines()[-1]
    for s in range(2):  # one shard alone: its subtree, and the skeleton's weights
        one = read_shard(out / "model.json", s)
        assert one.subtrees[str(s)].to_spec() == result.model.children[s].to_spec()
        np.testing.assert_array_equal(one.skeleton.weights, result.model.weights)

    # the last checkpoint is sharded too, and holds the same model
    ck = json.loads((out / CHECKPOINT).read_text())
    assert ck["model"]["format"] == "emgrid-sharded"
    iteration, model, trace = read_checkpoint(out)
    assert iteration == 6 and trace == report["log_likelihood"]
    assert model.to_spec() == result.model.to_spec()
    # nothing but the run's files: the earlier checkpoints' shard files are gone
    assert sorted(p.name for p in out.iterdir()) == sorted(checkpoint_files(out) + [MANIFEST, "model.json", "report.json"]
                                                           + shard_files(out, "model"))


def test_predict_reads_a_sharded_model(tmp_path, capsys):
    cfg = config(tmp_path, workers=2, max_iter=3)
    assert fit(cfg, capsys)[0] == 1
    out = tmp_path / "out"
    assert shard_files(out, "model")
    capsys.readouterr()
    assert main(["predict", str(cfg), "--model", str(out / "model.json"), "--output", str(tmp_path / "p.npz")]) == 0
    z = np.load(tmp_path / "p.npz")
    assert z["log_likelihood"].shape == (2000,) and np.all(np.isfinite(z["log_likelihood"]))
    model = load_model(out / "model.json")  # the same numbers as the model read back whole
    from emgrid.cli.session import build_data, build_model
    from emgrid.cli.config import load_config

    c = load_config(cfg)
    np.testing.assert_allclose(z["log_likelihood"], model.log_density(build_data(c, build_model(c))), rtol=1e-12)


def test_resume_from_a_sharded_checkpoint_equals_the_uninterrupted_fit(tmp_path, capsys):
    whole = tmp_path / "whole"
    whole.mkdir()
    assert fit(config(whole, max_iter=8), capsys)[0] == 1
    full = json.loads((whole / "out" / "report.json").read_text())["log_likelihood"]

    part = tmp_path / "part"
    part.mkdir()
    assert fit(config(part, max_iter=5, every=5), capsys)[0] == 1
    ck = json.loads((part / "out" / CHECKPOINT).read_text())
    assert ck["iteration"] == 5 and ck["model"]["format"] == "emgrid-sharded"
    first = shard_files(part / "out", "checkpoint")
    assert len(first) == 2
    code, _, err = fit(config(part, max_iter=8, every=5), capsys, "--resume")
    assert code == 1, err
    resumed = json.loads((part / "out" / "report.json").read_text())["log_likelihood"]
    assert resumed == full
    assert load_model(part / "out" / "model.json").to_spec() == load_model(whole / "out" / "model.json").to_spec()
    assert set(first).isdisjoint(shard_files(part / "out", "checkpoint"))  # replaced, not left behind


def test_an_interrupted_local_fit_keeps_its_last_iteration_sharded_and_resumes_equal(tmp_path, capsys, monkeypatch):
    from emgrid.cli import progress

    whole = tmp_path / "whole"
    whole.mkdir()
    assert fit(config(whole, max_iter=7), capsys)[0] == 1
    full = json.loads((whole / "out" / "report.json").read_text())["log_likelihood"]

    real = progress.Progress.update

    def ctrl_c_at_4(self, iteration, *a, **k):
        real(self, iteration, *a, **k)
        if iteration == 4:
            raise KeyboardInterrupt

    part = tmp_path / "part"
    part.mkdir()
    monkeypatch.setattr(progress.Progress, "update", ctrl_c_at_4)
    code, _, err = fit(config(part, max_iter=7), capsys)  # no periodic checkpoints
    assert code == 130, err
    assert "the checkpoint of iteration 4 is in" in err
    monkeypatch.setattr(progress.Progress, "update", real)
    assert sorted(p.name for p in (part / "out").iterdir()) == sorted(checkpoint_files(part / "out") + [MANIFEST])
    assert len(checkpoint_files(part / "out")) == 3
    code, _, err = fit(config(part, max_iter=7), capsys, "--resume")
    assert code == 1, err
    assert json.loads((part / "out" / "report.json").read_text())["log_likelihood"] == full


@pytest.mark.parametrize("damage,words", [
    ("lost-shard-file", ["field 'model'", "cannot read shard 1"]),
    ("shard-of-another-write", ["field 'model'", "not the roots"]),
])
def test_a_damaged_sharded_checkpoint_is_one_line_exit_2(tmp_path, capsys, damage, words):
    cfg = config(tmp_path, workers=2, max_iter=3, every=1)
    assert fit(cfg, capsys)[0] == 1
    out = tmp_path / "out"
    ck = json.loads((out / CHECKPOINT).read_text())
    files = [e["file"] for e in ck["model"]["shards"]]
    if damage == "lost-shard-file":
        (out / files[1]).unlink()
    else:
        (out / files[0]).write_text((out / files[1]).read_text())
    code, _, err = fit(cfg, capsys, "--resume", "--max-iter", "5")
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("emgrid: error: --resume: checkpoint"), err
    assert all(w in lines[0] for w in words), lines[0]


def test_a_resumed_fit_already_at_max_iter_writes_its_model_sharded(tmp_path, capsys):
    cfg = config(tmp_path, workers=2, max_iter=3, every=3)
    assert fit(cfg, capsys)[0] == 1
    out = tmp_path / "out"
    before = load_model(out / "model.json").to_spec()
    (out / "model.json").unlink()
    code, stdout, err = fit(cfg, capsys, "--resume")
    assert code == 1, err
    assert json.loads((out / "model.json").read_text())["format"] == "emgrid-sharded"
    assert load_model(out / "model.json").to_spec() == before
    assert "free parameters" in stdout
