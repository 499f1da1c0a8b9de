"""A dataset on disk opened by row range gives exactly the rows of the whole mapping."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emgrid.executors import NpyDataset
from emgrid.models import Gaussian, Ragged, take_rows
from emgrid.models.errors import DataError

from ..strategies import models_with_data


def assert_same_data(a, b) -> None:
    """Equal nesting, dtypes, shapes and values (a ``Ragged``'s offsets and values)."""
    assert type(a) is type(b)
    if isinstance(a, tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same_data(x, y)
    elif isinstance(a, Ragged):
        np.testing.assert_array_equal(a.offsets, b.offsets)
        assert_same_data(a.values, b.values)
    elif a is not None:
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)


@settings(max_examples=40, deadline=None)
@given(models_with_data(max_rows=30), st.data())
def test_rows_by_range_equal_the_whole_mapping_sliced(model_data, draw):
    model, data = model_data
    with tempfile.TemporaryDirectory() as tmp:
        ds = NpyDataset.write(data, Path(tmp) / "ds", model=model)
        start = draw.draw(st.integers(0, ds.n_rows), label="start")
        stop = draw.draw(st.integers(start, ds.n_rows), label="stop")
        assert_same_data(ds.open_rows(start, stop), take_rows(ds.open(), start, stop))


def test_rows_outside_the_dataset_are_refused(tmp_path):
    ds = NpyDataset.write(np.arange(5.0), tmp_path / "ds", model=Gaussian(0.0, 1.0))
    with pytest.raises(DataError, match="rows 3:7 are outside the dataset's 5 rows"):
        ds.open_rows(3, 7)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("order", ["C", "F"])
def test_vectors_are_written_row_major_and_a_workers_range_read_from_the_file_column_major(tmp_path, order, dtype,
                                                                                            monkeypatch):
    """A worker maps its own range of rows, so the files are row-major whatever the rows'
    order in memory; ``rows_as`` reads a mapped range of vectors (of a row-major file in one
    read, of a column-major one written by someone else column by column) from the file into
    column-major rows of its dtype, not through the mapping. Vectors in memory are cast, never
    copied for their order: a caller's row-major array in float64 is the same object."""
    from emgrid.executors import datafiles
    from emgrid.executors.datafiles import rows_as
    from emgrid.models.files import npy_header

    reads = []
    monkeypatch.setattr(datafiles, "_read_as", lambda *a, _r=datafiles._read_as: reads.append(a[1]) or _r(*a))

    x = np.asarray(np.random.default_rng(0).standard_normal((300_000, 3)), order=order)
    ds = NpyDataset.write(x, tmp_path / "ds")
    with open(tmp_path / "ds" / "c0.npy", "rb") as f:
        assert npy_header(f, "c0.npy", 1 << 40)[1] is False  # not fortran_order
    rows = ds.open_rows(1000, 250_000)
    np.testing.assert_array_equal(rows, x[1000:250_000])
    np.save(tmp_path / "f.npy", np.asfortranarray(x))  # a user's column-major file
    mapped = np.load(tmp_path / "f.npy", mmap_mode="r")
    # a range of the column-major file is read (column by column) only to change its type
    for a, n_reads in ((rows, 1), (np.asarray(mapped)[1000:250_000], 3 if dtype == "float32" else 0)):
        reads.clear()
        got = rows_as(a, dtype)
        np.testing.assert_array_equal(got, x[1000:250_000].astype(dtype))
        assert len(reads) == n_reads
        assert got.dtype == dtype and got.strides[0] == got.itemsize  # column-major, as the kernels read best
    # a caller's mapped array (the local executor's views) is not copied but to change its type
    reads.clear()
    got = rows_as(rows, dtype, own_rows=False)
    assert got is rows if dtype == "float64" else (len(reads) == 1 and got.dtype == np.float32)
    in_memory = np.random.default_rng(1).standard_normal((100, 3))
    reads.clear()
    got = rows_as((in_memory, np.arange(100)), dtype)
    assert not reads and got[1].dtype == np.int64
    assert got[0] is in_memory if dtype == "float64" else got[0].dtype == np.float32


def test_the_local_executor_reads_a_callers_mapped_vectors_in_place_and_a_worker_its_own_into_memory(tmp_path):
    """The local executor's cells hold views of the caller's arrays, a memory-mapped ``.npy``
    included; a multiprocessing or MPI worker's own range of the dataset's files is read into
    column-major memory (the layout the kernels read best)."""
    from emgrid.executors.step import WorkerStep, grid_layout
    from emgrid.models import DiagGaussian

    from .plans import grid_plan

    x = np.random.default_rng(0).standard_normal((1000, 3))
    np.save(tmp_path / "x.npy", x)
    mapped = np.load(tmp_path / "x.npy", mmap_mode="r")
    model = DiagGaussian(np.zeros(3), np.ones(3))
    spec = grid_layout(model, grid_plan(model, 1000, 1, 1))[0][0]
    local = WorkerStep.from_full(model, spec, model.prepare(mapped))
    assert np.shares_memory(local.data, mapped)
    ds = NpyDataset.write(x, tmp_path / "ds")
    worker = WorkerStep(model, spec, ds.open_rows(0, 1000))
    assert not isinstance(worker.data, np.memmap) and worker.data.flags.f_contiguous
    np.testing.assert_array_equal(worker.data, x)


def test_an_mpi_ranks_cell_uses_the_callers_mapped_rows_as_they_are(tmp_path):
    """An MPI rank's rows are views of the caller's arrays (the caller's script runs on every
    rank): its cell neither copies a memory-mapped ``.npy`` nor reads it from the file."""
    from emgrid.executors.cell import Cell
    from emgrid.executors.step import grid_layout
    from emgrid.models import DiagGaussian

    from .plans import grid_plan

    np.save(tmp_path / "x.npy", np.random.default_rng(0).standard_normal((1000, 3)))
    model = DiagGaussian(np.zeros(3), np.ones(3))
    spec = grid_layout(model, grid_plan(model, 1000, 1, 1))[0][0]
    for mode in ("r", "c"):
        mapped = np.load(tmp_path / "x.npy", mmap_mode=mode)
        if mode == "c":
            mapped += 100.0  # in this process's memory only
        cell = Cell(spec, model, None, take_rows(model.prepare(mapped), spec.start, spec.stop), own_rows=False)
        try:
            assert np.shares_memory(cell.step.data, mapped), mode
        finally:
            cell.close()


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("own_rows", [True, False])
def test_a_copy_on_write_mapping_is_read_from_memory_not_from_its_file(tmp_path, dtype, own_rows):
    """What a copy-on-write mapping holds may differ from its file: converting it (to
    column-major vectors, or to float32) reads its memory."""
    from emgrid.executors.datafiles import rows_as

    np.save(tmp_path / "x.npy", np.random.default_rng(0).standard_normal((500, 3)))
    np.save(tmp_path / "c.npy", np.random.default_rng(1).standard_normal(500))
    vec, col = np.load(tmp_path / "x.npy", mmap_mode="c"), np.load(tmp_path / "c.npy", mmap_mode="c")
    vec += 100.0
    col -= 100.0
    got_vec, got_col = rows_as((vec[100:400], col[100:400]), dtype, own_rows=own_rows)
    np.testing.assert_array_equal(got_vec, vec[100:400].astype(dtype))
    np.testing.assert_array_equal(got_col, col[100:400].astype(dtype))
