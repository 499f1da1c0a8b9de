"""The columnar data encoding shared by every node.

- A scalar leaf's data is a 1-D array (float64 for Gaussian/Exponential, int64 for
  Categorical/Poisson); a vector leaf's is a 2-D ``(n, d)`` float64 array, of either memory
  order, and no result depends on which. emgrid builds vectors column-major where it
  assembles them from columns (:func:`vector_rows`: tables) or ships them to a cell: the
  batched kernels read a block of rows one coordinate at a time, which a row-major block
  makes a transposing copy (the largest cost of a diagonal mixture's E-step beside its
  products). A caller's array is used as it is; the ``.npy`` files of a dataset are row-major
  (``executors.datafiles.NpyDataset.write``), and a worker reads its range of vectors from them
  into column-major memory (``executors.datafiles.rows_as``).
- A ``Composite``'s data is a tuple with one entry per field, each that field's data.
- A ``Sequence``'s or ``HMM``'s data is a :class:`Ragged`: ``values`` is the child's data for
  all positions of all rows laid end to end, ``offsets`` (int64, length ``n + 1``, starting at
  0, non-decreasing) says row ``i`` holds positions ``offsets[i]:offsets[i + 1]``.

Every helper here works on any nesting of these, so executors can slice rows without
knowing the model. ``None`` stands for a column a model shard does not hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import numpy as np

from .errors import ConfigError, DataError


@dataclass(frozen=True, eq=False)
class Ragged:
    """Variable-length rows: child data for all positions plus row offsets."""

    values: "Data"
    offsets: np.ndarray

    def __post_init__(self):
        offsets = np.asarray(self.offsets)
        if offsets.ndim != 1 or offsets.size < 1:
            raise DataError(f"Ragged.offsets must be a 1-D array of length n+1, got shape {offsets.shape}")
        if offsets.dtype.kind not in "iu":
            raise DataError(f"Ragged.offsets must be integers, got dtype {offsets.dtype}")
        offsets = offsets.astype(np.int64, copy=False)
        if offsets[0] != 0:
            raise DataError(f"Ragged.offsets must start at 0, got {int(offsets[0])}")
        if np.any(np.diff(offsets) < 0):
            bad = int(np.argmax(np.diff(offsets) < 0))
            raise DataError(f"Ragged.offsets must be non-decreasing; row {bad} has negative length")
        object.__setattr__(self, "offsets", offsets)
        if self.values is not None:
            n_pos = n_rows(self.values)
            if n_pos != offsets[-1]:
                raise DataError(
                    f"Ragged.offsets end at {int(offsets[-1])} but values hold {n_pos} positions"
                )

    @classmethod
    def unchecked(cls, values: "Data", offsets: np.ndarray) -> "Ragged":
        """A Ragged without the checks, for parts of data already checked: row slices,
        restrictions to some columns (``values`` may hold None), files written from checked
        data. ``values`` and ``offsets`` are taken as they are."""
        r = object.__new__(cls)
        object.__setattr__(r, "values", values)
        object.__setattr__(r, "offsets", offsets)
        return r

    @classmethod
    def from_rows(cls, rows) -> "Ragged":
        """Builds from a list of per-row arrays (each that row's positions)."""
        rows = list(rows)
        lengths = np.array([n_rows(r) for r in rows], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        if rows:
            values = concat_rows(rows)
        else:
            values = np.zeros(0)
        return cls(values, offsets)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def __len__(self) -> int:
        return int(self.offsets.size - 1)

    def segment_sum(self, per_position: np.ndarray) -> np.ndarray:
        """Sums a per-position array within each row (0 for empty rows)."""
        csum = np.concatenate([[0.0], np.cumsum(per_position, dtype=np.float64)])
        return csum[self.offsets[1:]] - csum[self.offsets[:-1]]

    def __getitem__(self, i: int):
        return take_rows(self.values, int(self.offsets[i]), int(self.offsets[i + 1]))


Data = Union[np.ndarray, tuple, Ragged, None]


def n_rows(data: Data) -> int:
    """Number of rows of any encoded data (-1 for a column that is not held)."""
    if data is None:
        return -1
    if isinstance(data, Ragged):
        return len(data)
    if isinstance(data, tuple):
        counts = [n_rows(c) for c in data if c is not None]
        for c in counts:
            if c >= 0:
                return c
        return -1
    return int(data.shape[0])


def take_rows(data: Data, start: int, stop: int) -> Data:
    """Rows ``start:stop`` as views where possible."""
    if data is None:
        return None
    if isinstance(data, tuple):
        return tuple(take_rows(c, start, stop) for c in data)
    if isinstance(data, Ragged):
        a, b = int(data.offsets[start]), int(data.offsets[stop])
        vals = take_rows(data.values, a, b)
        return Ragged.unchecked(vals, data.offsets[start : stop + 1] - a)
    return data[start:stop]


#: The float types data and the E-step run in (``optimize(..., dtype=...)``); every sum that
#: makes a statistic or a log-likelihood is float64 in both.
DTYPES = ("float64", "float32")


def check_dtype(dtype) -> str:
    """``dtype`` as one of :data:`DTYPES` (a name, or numpy's type); ConfigError naming the value otherwise."""
    name = np.dtype(dtype).name if isinstance(dtype, (type, np.dtype)) else dtype
    if name not in DTYPES:
        raise ConfigError(f"dtype must be one of {', '.join(map(repr, DTYPES))}, got {dtype!r}")
    return name


def each_array(data: Data, fn) -> Data:
    """``data`` with every array ``a`` (columns, vectors, a sequence's values; not the
    offsets) replaced by ``fn(a)``; None stays None."""
    if data is None:
        return None
    if isinstance(data, tuple):
        return tuple(each_array(c, fn) for c in data)
    if isinstance(data, Ragged):
        return Ragged.unchecked(each_array(data.values, fn), data.offsets)
    return fn(data)


def with_dtype(data: Data, dtype: str) -> Data:
    """``data`` with its float arrays in ``dtype`` (integer columns and offsets as they are);
    the same objects where nothing changes, so float64 data in float64 costs nothing."""
    if data is None:
        return data

    def one(a):
        if not isinstance(a, np.ndarray):
            a = np.asarray(a)
        if a.dtype.kind != "f" or a.dtype == dtype:
            return a
        return a.astype(dtype)

    return each_array(data, one)


def column_major(data: Data) -> Data:
    """``data`` with every vector a contiguous column-major array: a row slice of one is a
    strided view, which serializing would turn into a row-major copy."""
    return each_array(data, lambda a: np.asfortranarray(a) if isinstance(a, np.ndarray) and a.ndim == 2 else a)


def take_index(data: Data, index: np.ndarray) -> Data:
    """Rows in the order of an integer index array."""
    index = np.asarray(index, dtype=np.int64)
    if data is None:
        return None
    if isinstance(data, tuple):
        return tuple(take_index(c, index) for c in data)
    if isinstance(data, Ragged):
        lengths = data.lengths[index]
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        starts = data.offsets[:-1][index]
        pos = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1], dtype=np.int64)
        return Ragged.unchecked(take_index(data.values, pos), offsets)
    return data[index]


def vector_rows(columns) -> np.ndarray:
    """An ``(n, d)`` float64 array, column-major, from ``d`` columns of ``n`` numbers."""
    columns = list(columns)
    n = len(columns[0]) if columns else 0
    out = np.empty((n, len(columns)), dtype=np.float64, order="F")
    for j, c in enumerate(columns):
        out[:, j] = c
    return out


def concat_rows(parts: list) -> Data:
    """Rows of several encoded datasets of one type, one after another."""
    first = parts[0]
    if first is None:
        return None
    if isinstance(first, tuple):
        return tuple(concat_rows([p[i] for p in parts]) for i in range(len(first)))
    if isinstance(first, Ragged):
        values = concat_rows([p.values for p in parts])
        shift = np.cumsum([0] + [int(p.offsets[-1]) for p in parts[:-1]])
        offsets = np.concatenate([[0]] + [p.offsets[1:] + s for p, s in zip(parts, shift)])
        return Ragged.unchecked(values, offsets.astype(np.int64))
    return np.concatenate([np.asarray(p) for p in parts], axis=0)


def flatten(data: Data, key: str = "x") -> dict[str, np.ndarray]:
    """Named arrays for any encoded data: fields as ``key.i``, sequences as ``key.offsets``
    and ``key.values``. This is the layout of ``.npz`` data files and per-column ``.npy``."""
    if data is None:
        return {}
    if isinstance(data, tuple):
        out = {}
        for i, c in enumerate(data):
            out.update(flatten(c, f"{key}.{i}"))
        return out
    if isinstance(data, Ragged):
        out = {f"{key}.offsets": data.offsets}
        out.update(flatten(data.values, f"{key}.values"))
        return out
    return {key: np.asarray(data)}


def unflatten(arrays, key: str = "x") -> Data:
    """Inverse of :func:`flatten` (``arrays`` is any mapping, e.g. an opened ``.npz``)."""
    names = list(arrays.keys()) if not isinstance(arrays, dict) else list(arrays)
    if key in names:
        return arrays[key]
    if f"{key}.offsets" in names:
        return Ragged.unchecked(unflatten(arrays, f"{key}.values"), np.asarray(arrays[f"{key}.offsets"]))
    fields = []
    i = 0
    while any(n == f"{key}.{i}" or n.startswith(f"{key}.{i}.") for n in names):
        fields.append(unflatten(arrays, f"{key}.{i}"))
        i += 1
    if not fields:
        raise DataError(f"data file has no array named {key!r} (has: {', '.join(sorted(names)[:8])})")
    return tuple(fields)
