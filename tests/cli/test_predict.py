"""``emgrid predict`` and the summary line of ``emgrid fit``: what the files hold equals the
in-process answers, block by block, in every format; bad requests exit 2 with one line."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest

from emgrid.cli.main import main
from emgrid.models import HMM, Gaussian, Mixture, Poisson, Sequence, load_model, save_model
from emgrid.models.data import flatten, unflatten
from tests.cli.test_commands import config, emgrid

HMM_MODEL = HMM([Poisson(1.0), Poisson(7.0), Poisson(15.0)], [[0.8, 0.1, 0.1], [0.1, 0.8, 0.1], [0.2, 0.2, 0.6]],
                [0.5, 0.3, 0.2], 5.0)
NESTED = Mixture([Sequence(Mixture([Gaussian(-3.0, 1.0), Gaussian(3.0, 1.0)], [0.5, 0.5]), 3.0),
                  Sequence(Gaussian(0.0, 4.0), 3.0)], [0.6, 0.4])

FILE_CONFIG = """
[model]
spec = "model.json"
[data]
path = "data.npz"
[resources]
workers = 1
[fit]
output = "out"
"""


def file_run(tmp_path, model, n=300, seed=0):
    """A config reading rows drawn from ``model`` from a file, and the model as its spec."""
    data = model.prepare(model.sample(n, np.random.default_rng(seed)))
    np.savez(tmp_path / "data.npz", **flatten(data))
    save_model(model, tmp_path / "model.json")
    (tmp_path / "run.toml").write_text(FILE_CONFIG)
    return tmp_path / "run.toml", data


def predict(tmp_path, cfg, output, *extra):
    return main(["predict", str(cfg), "--model", str(tmp_path / "model.json"), "--output", str(output), *extra])


def read_csv(path) -> dict[str, np.ndarray]:
    with open(path) as f:
        rows = list(csv.reader(f))
    return {name: np.array([float(r[j]) for r in rows[1:]]) for j, name in enumerate(rows[0])}


def test_hmm_answers_in_npz_and_csv_equal_the_in_process_ones_block_by_block(tmp_path, capsys):
    cfg, data = file_run(tmp_path, HMM_MODEL)
    assert predict(tmp_path, cfg, tmp_path / "a.npz", "--rows-per-block", "37") == 0
    assert predict(tmp_path, cfg, tmp_path / "a.csv", "--rows-per-block", "37") == 0
    assert "wrote" in capsys.readouterr().out
    with np.load(tmp_path / "a.npz") as z:
        np.testing.assert_allclose(z["log_likelihood"], HMM_MODEL.score_samples(data), rtol=1e-12)
        labels = unflatten(z, "label")
        np.testing.assert_array_equal(labels.offsets, data.offsets)
        np.testing.assert_array_equal(labels.values, HMM_MODEL.predict(data).values)
        np.testing.assert_allclose(unflatten(z, "proba").values, HMM_MODEL.predict_proba(data).values, rtol=1e-9)
        np.testing.assert_array_equal(unflatten(z, "viterbi").values, HMM_MODEL.viterbi(data).values)
    table = read_csv(tmp_path / "a.csv")
    assert list(table) == ["row", "position", "log_likelihood", "label", "p0", "p1", "p2", "viterbi"]
    np.testing.assert_array_equal(table["row"], np.repeat(np.arange(len(data)), data.lengths))
    np.testing.assert_array_equal(table["position"], np.arange(data.offsets[-1]) - np.repeat(data.offsets[:-1], data.lengths))
    np.testing.assert_array_equal(table["viterbi"], HMM_MODEL.viterbi(data).values)
    np.testing.assert_allclose(table["p1"], HMM_MODEL.predict_proba(data).values[:, 1], rtol=1e-12)


def test_nested_node_at_a_path_answers_per_position(tmp_path):
    cfg, data = file_run(tmp_path, NESTED)
    assert predict(tmp_path, cfg, tmp_path / "n.npz", "--at", "0.0") == 0
    with np.load(tmp_path / "n.npz") as z:
        proba = unflatten(z, "proba")
        np.testing.assert_array_equal(proba.offsets, data.offsets)
        np.testing.assert_allclose(proba.values, NESTED.predict_proba(data, "0.0").values, rtol=1e-9)
        np.testing.assert_allclose(proba.values.sum(axis=1), np.repeat(NESTED.predict_proba(data)[:, 0], data.lengths),
                                   rtol=1e-9)
        assert "viterbi" not in z.files and "viterbi.values" not in z.files


def test_a_root_that_chooses_nothing_writes_log_likelihoods_and_says_where_to_look(tmp_path, capsys):
    model = Sequence(Mixture([Poisson(1.0), Poisson(9.0)], [0.5, 0.5]), 4.0)
    cfg, data = file_run(tmp_path, model)
    assert predict(tmp_path, cfg, tmp_path / "s.csv") == 0
    assert "--at PATH" in capsys.readouterr().err
    table = read_csv(tmp_path / "s.csv")
    assert list(table) == ["row", "log_likelihood"]
    np.testing.assert_allclose(table["log_likelihood"], model.score_samples(data), rtol=1e-12)


def test_bad_requests_exit_2_with_one_line(tmp_path, capsys):
    cfg, _ = file_run(tmp_path, NESTED, n=20)
    assert predict(tmp_path, cfg, tmp_path / "x.txt") == 2
    assert predict(tmp_path, cfg, tmp_path / "x.npz", "--at", "1.0") == 2
    err = capsys.readouterr().err
    assert "extension must be one of .npz, .csv, .parquet" in err
    assert "node '1.0' is a Gaussian; predict needs a Mixture or HMM, which are at: '', '0.0'" in err
    assert main(["predict", str(cfg), "--model", str(tmp_path / "nope.json"), "--output", str(tmp_path / "x.npz")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_parquet_is_written_with_pyarrow_or_refused_naming_it(tmp_path, capsys):
    cfg, data = file_run(tmp_path, NESTED, n=50)
    try:
        import pyarrow.parquet as pq
    except ImportError:
        assert predict(tmp_path, cfg, tmp_path / "x.parquet") == 2
        assert "needs pyarrow" in capsys.readouterr().err
        return
    assert predict(tmp_path, cfg, tmp_path / "x.parquet") == 0
    table = pq.read_table(tmp_path / "x.parquet").to_pydict()
    np.testing.assert_array_equal(table["label"], NESTED.predict(data))


@pytest.mark.parametrize("quiet", [True, False])
def test_fit_ends_with_one_summary_line(tmp_path, quiet):
    r = emgrid("fit", config(tmp_path), *(["--quiet"] if quiet else []), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    line = r.stdout.strip().splitlines()[-1]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    ll = report["log_likelihood"][-1]
    assert line.startswith(f"fit: {report['iterations']} iterations, converged=True, final log-likelihood ")
    bic = float(line.split("BIC ")[1].split()[0])
    assert bic == pytest.approx(-2 * ll + 5 * math.log(4000), rel=1e-9)
    r = emgrid("predict", tmp_path / "run.toml", "--model", tmp_path / "out" / "model.json", "--output",
               tmp_path / "p.csv", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert len(read_csv(tmp_path / "p.csv")["label"]) == 4000


def test_the_summary_bic_of_an_hmm_counts_positions_as_the_models_bic_does(tmp_path, capsys):
    cfg, data = file_run(tmp_path, HMM_MODEL, n=40)
    (tmp_path / "run.toml").write_text(FILE_CONFIG.replace('output = "out"', 'output = "out"\nmax_iter = 5'))
    assert main(["fit", str(cfg), "--quiet"]) in (0, 1)
    line = capsys.readouterr().out.strip().splitlines()[-1]
    fitted = load_model(tmp_path / "out" / "model.json")
    positions = int(data.offsets[-1])
    assert positions > 40 and f"{positions} observations" in line
    bic = float(line.split("BIC ")[1].split()[0])
    ll = json.loads((tmp_path / "out" / "report.json").read_text())["log_likelihood"][-1]
    assert bic == pytest.approx(-2 * ll + fitted.n_parameters() * math.log(positions), rel=1e-9)
    assert fitted.bic(data) == pytest.approx(-2 * fitted.score_samples(data).sum()
                                             + fitted.n_parameters() * math.log(positions), rel=1e-9)
