"""Fits from tables: a DataFrame, a Parquet file, a CSV file and the equivalent ``.npz`` give
one trace on every executor, and each worker reads only its rows of the file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from emgrid.executors import NpyDataset, optimize
from emgrid.models import HMM, Categorical, Composite, DiagGaussian, Gaussian, Mixture, Ragged, take_rows
from emgrid.models.data import flatten, unflatten
from emgrid.models.tables import Table, bind

from .plans import grid_plan
from .table_models import COLORS, N, table_model
from .test_datafiles import assert_same_data

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pcsv = pytest.importorskip("pyarrow.csv")

MODEL = table_model()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The same rows as a dict of columns, a Parquet file of 10 row groups, a CSV file and an
    ``.npz`` of the positional encoding."""
    tmp = tmp_path_factory.mktemp("tables")
    x, codes, pos = MODEL.sample(N, np.random.default_rng(3))
    cols = {"id": np.arange(N), "x": x, "color": np.array(COLORS, dtype=object)[codes], "px": pos[:, 0],
            "py": pos[:, 1]}
    table = pa.table(cols)
    pq.write_table(table, tmp / "t.parquet", row_group_size=N // 10)
    pcsv.write_csv(table, tmp / "t.csv")
    np.savez(tmp / "t.npz", **flatten((x, codes, pos)))
    return cols, tmp


def traces(src, executor, d=2):
    fit = optimize(src, MODEL, plan=grid_plan(MODEL, N, d, 1), executor=executor, max_iter=6, tol=0.0)
    return fit


@pytest.mark.parametrize("executor", ["local", "multiprocessing"])
def test_dataframe_parquet_csv_and_npz_give_one_trace(files, executor):
    cols, tmp = files
    with np.load(tmp / "t.npz") as z:
        expected = traces(unflatten({k: z[k] for k in z.files}), "local")
    sources = [cols, tmp / "t.parquet", str(tmp / "t.csv")]
    try:
        import pandas as pd

        sources.append(pd.DataFrame(cols))
    except ImportError:
        pass
    for src in sources:
        got = traces(src, executor)
        np.testing.assert_allclose(got.log_likelihood, expected.log_likelihood, rtol=1e-9)
        assert got.model.node_at("0.1").values == tuple(COLORS)
        assert got.model.to_spec()["components"][0]["fields"] == ["x", "color", "pos"]


def test_a_worker_reads_only_the_row_groups_of_its_rows(files, tmp_path, monkeypatch):
    _, tmp = files
    ds = NpyDataset.from_table(tmp / "t.parquet", MODEL, tmp_path / "ds")
    assert ds.n_rows == N
    read = []
    original = pq.ParquetFile.read_row_groups

    def counting(self, groups, *args, **kw):
        read.append(list(groups))
        return original(self, groups, *args, **kw)

    monkeypatch.setattr(pq.ParquetFile, "read_row_groups", counting)
    whole = MODEL.prepare(tmp / "t.parquet")
    read.clear()
    rows = ds.open_rows(125, 300)  # row groups of 60 rows: 2..4
    assert_same_data(rows, take_rows(whole, 125, 300))
    assert read and all(g == [2, 3, 4] for g in read), read
    meta = pq.ParquetFile(tmp / "t.parquet").metadata
    size = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    got = sum(meta.row_group(i).total_byte_size for i in {g for gs in read for g in gs})
    assert got <= 0.35 * size


def test_a_worker_reads_only_the_bytes_of_its_rows_of_a_csv(files, tmp_path, monkeypatch):
    _, tmp = files
    ds = NpyDataset.from_table(tmp / "t.csv", MODEL, tmp_path / "ds")
    whole = MODEL.prepare(tmp / "t.csv")
    for a, b in [(0, 1), (0, N), (17, 203), (N - 5, N), (300, 300)]:
        assert_same_data(ds.open_rows(a, b), take_rows(whole, a, b))
    offsets = np.load(tmp_path / "ds" / "rows.npy")
    assert offsets[-1] == (tmp / "t.csv").stat().st_size and offsets.size == N + 1


def test_seeding_a_template_samples_rows_without_reading_whole_columns(files, tmp_path):
    _, tmp = files
    template = Mixture([Composite({"x": Gaussian(), "color": Categorical(), "pos": DiagGaussian(dim=2)},
                                  columns={"pos": ["px", "py"]}) for _ in range(2)])
    fits = [optimize(src, template, plan=grid_plan(bind(template, tmp / "t.parquet"), N, 2, 1), max_iter=3,
                     tol=0.0, seed=1) for src in (tmp / "t.parquet", MODEL.prepare(tmp / "t.parquet"))]
    np.testing.assert_allclose(fits[0].log_likelihood, fits[1].log_likelihood, rtol=1e-9)


def test_long_parquet_table_grouped_by_id_fits_as_the_ragged(tmp_path):
    hmm = HMM([Composite({"x": Gaussian(m, 1.0)}) for m in (-2.0, 2.0)], [[0.9, 0.1], [0.2, 0.8]], [0.5, 0.5], 4.5)
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 9, 80)
    x = rng.normal(size=int(lengths.sum())) + np.repeat(rng.choice([-2.0, 2.0], lengths.size), lengths)
    users = np.repeat([f"u{i:03d}" for i in range(lengths.size)], lengths)
    pq.write_table(pa.table({"user": users, "x": x}), tmp_path / "events.parquet", row_group_size=50)
    ragged = Ragged((x,), np.concatenate([[0], np.cumsum(lengths)]))
    plan = grid_plan(hmm, lengths.size, 2, 1)
    expected = optimize(ragged, hmm, plan=plan, max_iter=5, tol=0.0)
    for executor in ["local", "multiprocessing"]:
        got = optimize(Table(tmp_path / "events.parquet", sequence_id="user"), hmm, plan=plan, executor=executor,
                       max_iter=5, tol=0.0)
        np.testing.assert_allclose(got.log_likelihood, expected.log_likelihood, rtol=1e-9)


MPIEXEC = Path(sys.executable).with_name("mpiexec")


@pytest.mark.skipif(not MPIEXEC.exists(), reason=f"no mpiexec next to {sys.executable}")
@pytest.mark.parametrize("name", ["t.parquet", "t.csv"])
def test_mpi_ranks_read_their_rows_of_the_file_and_give_the_local_trace(files, tmp_path, name):
    pytest.importorskip("mpi4py")
    _, tmp = files
    here = Path(__file__).resolve().parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(here.parents[1]), os.environ.get("PYTHONPATH")])),
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    out = tmp_path / "result.json"
    proc = subprocess.run([str(MPIEXEC), "-n", "2", sys.executable, str(here / "mpi_table_script.py"), str(tmp / name),
                           str(out)], capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = json.loads(out.read_text())
    assert got["same_on_all_ranks"]
    np.testing.assert_allclose(got["trace"], traces(tmp / name, "local").log_likelihood, rtol=1e-9)


def test_the_coordinator_reads_only_the_categorical_columns_of_a_parquet_file(files, monkeypatch):
    _, tmp = files
    read = []
    original_table, original_groups = pq.read_table, pq.ParquetFile.read_row_groups

    def reading_table(source, *args, columns=None, **kw):
        read.append(("read_table", tuple(columns or ["<all>"])))
        return original_table(source, *args, columns=columns, **kw)

    def reading_groups(self, groups, columns=None, **kw):
        read.append(("read_row_groups", tuple(columns or ["<all>"])))
        return original_groups(self, groups, columns=columns, **kw)

    monkeypatch.setattr(pq, "read_table", reading_table)
    monkeypatch.setattr(pq.ParquetFile, "read_row_groups", reading_groups)
    model = Mixture([Composite({"x": Gaussian(mean, 1.0), "color": Categorical(probs),
                                "pos": DiagGaussian([mean, 0.0], [1.0, 1.0])}, columns={"pos": ["px", "py"]})
                     for mean, probs in [(-1.0, [0.6, 0.3, 0.1]), (2.0, [0.1, 0.3, 0.6])]], [0.4, 0.6])
    fit = optimize(tmp / "t.parquet", model, plan=grid_plan(model, N, 2, 1), executor="multiprocessing", max_iter=2,
                   tol=0.0)
    assert fit.model.node_at("0.1").values == ("blue", "green", "red")
    assert read and {c for _, cols in read for c in cols} == {"color"}, read


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
@pytest.mark.parametrize("family,bad,message", [
    ("Poisson", 2.5, "Poisson expects integers, got non-integral values such as 2.5"),
    ("Poisson", -3.0, "Poisson counts must be >= 0, got -3"),
    ("Exponential", -0.5, "Exponential data must be >= 0, got -0.5"),
])
def test_a_files_rows_are_checked_by_their_leaf_as_rows_in_memory_are(tmp_path, fmt, family, bad, message):
    """A worker reading its rows from a table file checks them as ``prepare`` checks rows in
    memory: a fractional or negative count, a value outside a leaf's support is refused with
    the file and the column named, not fitted (a fractional count was, its rate the column's mean)."""
    from emgrid.models import Exponential, Poisson
    from emgrid.models.errors import DataError, FitError

    rng = np.random.default_rng(0)
    k = rng.poisson(3.0, 300).astype(np.float64)
    k[150] = bad
    table = pa.table({"g": rng.normal(size=300), "k": k})
    path = tmp_path / f"rows.{fmt}"
    pq.write_table(table, path) if fmt == "parquet" else pcsv.write_csv(table, path)
    leaf = Poisson(2.0) if family == "Poisson" else Exponential(1.0)
    model = Composite({"g": Gaussian(0.0, 1.0), "k": leaf})
    with pytest.raises(DataError, match="Exponential|Poisson") as err:
        model.prepare(Table(table))  # in memory: the leaf's own check
    assert message in str(err.value)
    with pytest.raises(DataError) as err:
        optimize(str(path), model, plan=grid_plan(model, 300, 1, 1), max_iter=3)
    assert message in str(err.value) and "'k'" in str(err.value) and str(path) in str(err.value)
    with pytest.raises(FitError) as err:  # a worker's rows: the worker that read them fails with it
        optimize(str(path), model, plan=grid_plan(model, 300, 2, 1), executor="multiprocessing", max_iter=3)
    assert message in str(err.value) and "'k'" in str(err.value)


def test_a_csv_text_NA_is_a_category_and_only_empty_null_and_nan_fields_are_missing(tmp_path):
    """pyarrow reads "NA" and "N/A" as missing by default; they are data (Namibia's code)."""
    path = tmp_path / "countries.csv"
    path.write_text("country,x\nDE,1.0\nNA,2.0\nN/A,3.0\nFR,4.0\n,5.0\nnull,6.0\nNaN,7.0\n")
    table = Table(str(path), drop_missing=True)
    model = bind(Composite({"country": Categorical(np.full(4, 0.25)), "x": Gaussian(0.0, 1.0)}), table)
    assert set(model.children[0].values) == {"DE", "FR", "NA", "N/A"}
    with pytest.warns(UserWarning, match="dropped 3 of 7 rows"):  # the empty, null and NaN fields'
        assert len(model.prepare(table)[1]) == 4


def test_an_integer_column_with_a_null_keeps_ids_beyond_2_to_the_53_apart():
    """pyarrow converts an integer column with nulls to float64, where 2**53 and 2**53 + 1 are
    one number: the ids must stay two categories."""
    ids = pa.array([2**53, 2**53 + 1, None, 2**53 + 1, 2**53], type=pa.int64())
    table = Table(pa.table({"a": [1.0, 2.0, 3.0, 4.0, 5.0], "c": ids}), drop_missing=True)
    model = bind(Composite({"a": Gaussian(0.0, 1.0), "c": Categorical()}), table)
    assert model.children[1].values == (2**53, 2**53 + 1)
    with pytest.warns(UserWarning, match="dropped 1 of 5 rows"):
        assert model.prepare(table)[1].tolist() == [0, 1, 1, 0]


@pytest.mark.parametrize("bad", [np.inf, 1e20])
def test_a_categorical_float_column_beyond_int64_is_refused_not_wrapped(bad):
    from emgrid.models.errors import DataError

    table = pa.table({"a": [1.0, 2.0, 3.0], "c": [1.0, 2.0, bad]})
    with pytest.raises(DataError, match=r"column 'c': a categorical column holds floats; only integral floats "
                                        r"within int64 are taken, got (inf|1e\+20)"):
        bind(Composite({"a": Gaussian(0.0, 1.0), "c": Categorical()}), table)
