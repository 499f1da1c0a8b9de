"""Scoring a new file in one command (``emgrid predict --data``) with the rows it cannot score
refused in one line or skipped in place, and a numeric table fitted from a one-line spec
(``columns = "*"``, a glob or a list)."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from emgrid.cli.main import main
from emgrid.models import Categorical, Composite, Gaussian, Mixture, save_model

MODEL = Mixture([Composite({"x": Gaussian(-2.0, 1.0), "c": Categorical([0.7, 0.3], values=["a", "b"])}),
                 Composite({"x": Gaussian(2.0, 1.0), "c": Categorical([0.2, 0.8], values=["a", "b"])})], [0.5, 0.5])
RUN = '[model]\nspec = "model.json"\n[data]\npath = "train.csv"\n[resources]\nworkers = 1\n[fit]\noutput = "out"\n'
# rows 1 (a missing x), 3 (an unseen category) and 5 (a text in a number column) cannot be scored
NEW = "x,c\n-2.1,a\n,b\n1.9,b\n0.5,zz\n2.2,a\nabc,a\n-1.0,b\n"
GOOD = [0, 2, 4, 6]


@pytest.fixture
def folder(tmp_path):
    save_model(MODEL, tmp_path / "model.json")
    (tmp_path / "train.csv").write_text("x,c\n-2.0,a\n2.0,b\n")
    (tmp_path / "new.csv").write_text(NEW)
    (tmp_path / "run.toml").write_text(RUN)
    return tmp_path


def _predict(folder, *extra):
    return main(["predict", str(folder / "run.toml"), "--model", str(folder / "model.json"),
                 "--data", str(folder / "new.csv"), *extra])


def _rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_every_unscorable_row_is_named_in_one_line_and_nothing_is_written(folder, capsys):
    assert _predict(folder, "--output", str(folder / "o.csv")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    for words in ["3 of 7 rows", "column 'x'", "missing", "row 1", "'zz'", "row 3", "--on-bad-row skip"]:
        assert words in err[0], (words, err[0])
    assert not (folder / "o.csv").exists()


def test_skip_keeps_output_row_i_as_input_row_i(folder, capsys):
    assert _predict(folder, "--output", str(folder / "o.csv"), "--on-bad-row", "skip") == 0
    assert "3 of 7 rows" in capsys.readouterr().err
    rows = _rows(folder / "o.csv")
    assert [int(r["row"]) for r in rows] == list(range(7))
    # the scored rows hold what the model gives those rows alone (an independent call)
    good = {"x": np.array([-2.1, 1.9, 2.2, -1.0]), "c": np.array(["a", "b", "a", "b"], dtype=object)}
    expect = MODEL.score_samples(MODEL.prepare(good))
    got = np.array([float(rows[i]["log_likelihood"]) for i in GOOD])
    np.testing.assert_allclose(got, expect, rtol=1e-12)
    for i in set(range(7)) - set(GOOD):
        assert rows[i]["label"] == "" and np.isnan(float(rows[i]["log_likelihood"]))
        assert np.isnan(float(rows[i]["p0"])) and np.isnan(float(rows[i]["p1"]))


def test_skip_in_npz_marks_the_rows_not_scored(folder):
    assert _predict(folder, "--output", str(folder / "o.npz"), "--on-bad-row", "skip") == 0
    with np.load(folder / "o.npz") as z:
        assert sorted(z["bad_rows"].tolist()) == [1, 3, 5]
        assert np.isnan(z["log_likelihood"][[1, 3, 5]]).all() and np.isfinite(z["log_likelihood"][GOOD]).all()


def test_an_output_that_is_the_data_file_is_refused(folder, capsys):
    before = (folder / "new.csv").read_bytes()
    assert _predict(folder, "--output", str(folder / "new.csv"), "--on-bad-row", "skip") == 2
    assert "new.csv" in capsys.readouterr().err
    assert (folder / "new.csv").read_bytes() == before


def _table(tmp_path, n_cols=30, n=400, seed=0):
    rng = np.random.default_rng(seed)
    names = [f"mean_{i}" for i in range(n_cols // 2)] + [f"worst_{i}" for i in range(n_cols - n_cols // 2)]
    z = rng.integers(0, 2, n)
    x = rng.normal(size=(n, n_cols)) + 3.0 * z[:, None]
    with open(tmp_path / "t.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(names)
        w.writerows(x.tolist())
    return names


def _fit_columns(tmp_path, tag, columns_toml):
    out = tmp_path / tag
    (tmp_path / f"{tag}.toml").write_text(
        f'[model]\ninline = {{ family = "Mixture", k = 2, component = {{ family = "DiagGaussian", '
        f'columns = {columns_toml} }} }}\n[data]\npath = "t.csv"\n[fit]\nmax_iter = 15\nseed = 3\n'
        f'output = "{tag}"\n')
    assert main(["fit", str(tmp_path / f"{tag}.toml"), "--quiet"]) in (0, 1)
    spec = json.loads((out / "model.json").read_text())
    report = json.loads((out / "report.json").read_text())
    return spec, report


def test_all_columns_shorthand_fits_a_30_column_table_as_the_list_of_its_columns(tmp_path):
    names = _table(tmp_path)
    star, star_report = _fit_columns(tmp_path, "star", '"*"')
    listed, listed_report = _fit_columns(tmp_path, "listed", json.dumps(names))
    assert star["components"][0]["columns"] == names
    assert len(star["components"][0]["mean"]) == 30
    assert star_report["log_likelihood"] == listed_report["log_likelihood"]
    assert star["components"] == listed["components"]


def test_a_glob_picks_the_columns_it_matches_in_the_files_order(tmp_path):
    names = _table(tmp_path)
    spec, _ = _fit_columns(tmp_path, "glob", '"worst_*"')
    assert spec["components"][0]["columns"] == [n for n in names if n.startswith("worst_")]
    assert len(spec["components"][1]["mean"]) == 15
