"""``[data] path`` as a ``.parquet`` or ``.csv`` table, run as a user runs the command."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

RECORDS = """
[model.inline]
family = "Mixture"
k = 2
component = {{ family = "Composite", fields = ["x", "color"], children = [{{ family = "Gaussian" }}, {{ family = "Categorical" }}] }}
[data]
path = "{path}"
{extra}
[resources]
workers = 2
memory = "1GiB"
[fit]
max_iter = 8
output = "out"
"""


def emgrid(*args, cwd):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "emgrid.cli.main", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, timeout=300, env=env)


def table(n=400, seed=0):
    rng = np.random.default_rng(seed)
    half = rng.integers(0, 2, n)
    return {"x": rng.normal(size=n) + 4 * half,
            "color": np.where(rng.random(n) < 0.2 + 0.6 * half, "red", "blue").astype(object)}


def write_config(tmp_path, path, extra=""):
    p = tmp_path / "run.toml"
    p.write_text(RECORDS.format(path=path, extra=extra))
    return p


def test_fit_from_parquet_keeps_the_values_and_predict_refuses_an_unseen_one(tmp_path):
    pq.write_table(pa.table(table()), tmp_path / "t.parquet", row_group_size=100)
    r = emgrid("fit", write_config(tmp_path, "t.parquet"), "--quiet", cwd=tmp_path)
    assert r.returncode in (0, 1), r.stderr
    spec = json.loads((tmp_path / "out" / "model.json").read_text())
    assert spec["components"][0]["fields"] == ["x", "color"]
    assert spec["components"][0]["children"][1]["values"] == ["blue", "red"]
    new = table(20, seed=1)
    new["color"][7] = "green"
    pq.write_table(pa.table(new), tmp_path / "new.parquet")
    r = emgrid("predict", write_config(tmp_path, "new.parquet"), "--model", "out/model.json", "--output", "p.csv",
               cwd=tmp_path)
    assert r.returncode == 2 and "column 'color'" in r.stderr and "'green'" in r.stderr, r.stderr


def test_a_csv_with_an_empty_field_is_refused_or_its_row_dropped(tmp_path):
    cols = table(50)
    lines = ["x,color"] + [f"{x:.17g},{c}" for x, c in zip(cols["x"], cols["color"])]
    lines[1 + 13] = f"{cols['x'][13]:.17g},"
    (tmp_path / "t.csv").write_text("\n".join(lines) + "\n")
    r = emgrid("fit", write_config(tmp_path, "t.csv"), "--quiet", cwd=tmp_path)
    assert r.returncode == 2 and "column 'color'" in r.stderr and "row 13" in r.stderr, r.stderr
    r = emgrid("fit", write_config(tmp_path, "t.csv", "drop_missing = true"), "--quiet", cwd=tmp_path)
    assert r.returncode in (0, 1), r.stderr
    assert "dropped 1 of 50 rows" in r.stderr


def test_sequences_from_a_long_table_and_sequence_id_only_for_tables(tmp_path):
    rng = np.random.default_rng(2)
    lengths = rng.integers(2, 7, 60)
    pq.write_table(pa.table({"user": np.repeat(np.arange(60), lengths),
                             "x": rng.normal(size=int(lengths.sum()))}), tmp_path / "events.parquet")
    p = tmp_path / "hmm.toml"
    p.write_text("""
[model.inline]
family = "HMM"
n_states = 2
emission = { family = "Composite", fields = ["x"], children = [{ family = "Gaussian" }] }
[data]
path = "events.parquet"
sequence_id = "user"
[fit]
max_iter = 4
output = "out"
""")
    r = emgrid("fit", p, "--quiet", cwd=tmp_path)
    assert r.returncode in (0, 1), r.stderr
    assert f"{int(lengths.sum())} observations" in r.stdout, r.stdout  # BIC counts positions
    np.save(tmp_path / "x.npy", np.zeros(5))
    p.write_text(p.read_text().replace("events.parquet", "x.npy"))
    r = emgrid("plan", p, cwd=tmp_path)
    assert r.returncode == 2 and "sequence_id" in r.stderr, r.stderr


def test_a_parquet_config_gives_a_dataset_its_workers_read_by_rows(tmp_path):
    from emgrid.cli.config import load_config
    from emgrid.cli.session import build_data, build_model, table_dataset
    from emgrid.executors import optimize

    pq.write_table(pa.table(table()), tmp_path / "t.parquet", row_group_size=50)
    cfg = load_config(write_config(tmp_path, "t.parquet"))
    model = build_model(cfg)
    assert model.children[0].children[1].values == ("blue", "red")
    ds = table_dataset(cfg, model, tmp_path / "ds")
    assert ds is not None and ds.n_rows == 400
    fits = [optimize(d, model, executor="multiprocessing", max_iter=4, tol=0.0, seed=0)
            for d in (ds, build_data(cfg, model))]
    np.testing.assert_allclose(fits[0].log_likelihood, fits[1].log_likelihood, rtol=1e-9)
    cfg_npy = load_config(write_config(tmp_path, "x.npy"))
    assert table_dataset(cfg_npy, model, tmp_path / "ds2") is None
