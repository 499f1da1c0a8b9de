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
