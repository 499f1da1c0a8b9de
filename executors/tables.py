"""Columns of a ``.parquet`` or ``.csv`` file as the leaves of an on-disk dataset
(``NpyDataset.from_table``): each worker reads only its rows.

- Parquet: the row groups that overlap a worker's rows, of the columns its leaves read
  (``ParquetFile.read_row_groups``).
- CSV: the bytes of a worker's rows, found through ``rows.npy``, the byte offset of every
  row's start that the coordinator writes in one pass over the file (it counts line ends
  and parses nothing; a quoted field holding a line end is not supported).

The coordinator reads the file's metadata (Parquet) or header and first block (CSV), the
columns of ``Categorical`` leaves (their value lists) and a ``sequence_id`` column (the
sequences' offsets); nothing else. A missing value is found by the worker whose rows hold
it and refused naming the column and the file's row.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from emgrid.models.columns import encode_values
from emgrid.models.errors import DataError
from emgrid.models.tables import Col, column_arrays, missing_rows, pyarrow_module

_BLOCK = 1 << 22


def file_rows(path: Path, directory: Path) -> tuple[int, dict]:
    """The file's row count and what a reader needs (a CSV's row offsets file and schema)."""
    if path.suffix.lower() == ".parquet":
        return pyarrow_module("pyarrow.parquet").ParquetFile(path).metadata.num_rows, {"format": "parquet"}
    pcsv = pyarrow_module("pyarrow.csv")
    with open(path, "rb") as f:
        header = f.readline()
        starts = [np.array([len(header)], dtype=np.int64)]
        pos = len(header)
        while True:
            block = f.read(_BLOCK)
            if not block:
                break
            ends = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10).astype(np.int64) + pos + 1
            starts.append(ends)
            pos += len(block)
    starts = np.unique(np.concatenate(starts + [np.array([pos], dtype=np.int64)]))  # the end closes the last row
    with open(path, "rb") as f:
        while starts.size > 1:  # blank lines at the end are no rows
            f.seek(int(starts[-2]))
            if f.read(int(starts[-1] - starts[-2])).strip():
                break
            starts = starts[:-1]
        f.seek(0)
        sample = f.read(min(pos, 1 << 20))
    cut = sample.rfind(b"\n") + 1 if len(sample) < pos else len(sample)
    first = pcsv.read_csv(io.BytesIO(sample[:cut] or header),
                          convert_options=pcsv.ConvertOptions(strings_can_be_null=True))
    types = {name: str(first.schema.field(name).type) for name in first.column_names}
    np.save(directory / "rows.npy", starts)
    return int(starts.size - 1), {"format": "csv", "header": header.decode(), "types": types, "rows": "rows.npy"}


def read_rows(directory: Path, node: dict, start: int, stop: int) -> np.ndarray:
    """Rows ``start:stop`` of one leaf's columns (a layout node of kind ``table``), in the
    leaf's encoding."""
    names = node["names"]
    cols = read_columns(directory, node["source"], names, start, stop, floats=node["leaf"] in ("float", "vec"))
    missing_rows(cols, False, first_row=start)  # refuses a missing value, naming its column and row
    col = Col(tuple(names), node["leaf"], "")
    if col.kind == "vec":
        return np.column_stack([np.asarray(cols[n][0], dtype=np.float64) for n in names])
    x = cols[names[0]][0]
    if col.kind == "cat" and node.get("values") is not None:
        return encode_values(x, tuple(node["values"]), f"column {names[0]!r}")
    if col.kind == "float":
        return np.asarray(x, dtype=np.float64)
    return np.asarray(x, dtype=np.int64) if x.dtype.kind in "iub" else x


def read_columns(directory: Path, source: dict, names: list[str], start: int, stop: int,
                 floats: bool = False) -> dict:
    """The named columns of rows ``start:stop`` of the source file, as ``column_arrays``
    (``floats``: a CSV's columns parsed as floats, whatever its first rows looked like)."""
    path = Path(source["file"])
    if source["format"] == "parquet":
        table = parquet_rows(path, names, start, stop)
    else:
        table = csv_rows(directory, source, path, names, start, stop, floats)
    return {n: column_arrays(table.column(n)) for n in names}


def parquet_rows(path: Path, names: list[str], start: int, stop: int):
    """Rows ``start:stop`` of the columns ``names``, read from the row groups holding them."""
    pf = pyarrow_module("pyarrow.parquet").ParquetFile(path)
    meta = pf.metadata
    sizes = np.array([meta.row_group(i).num_rows for i in range(meta.num_row_groups)], dtype=np.int64)
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    groups = [i for i in range(len(sizes)) if bounds[i] < stop and bounds[i + 1] > start]
    if not groups:
        return pf.schema_arrow.empty_table().select(names)
    table = pf.read_row_groups(groups, columns=names)
    first = int(bounds[groups[0]])
    return table.slice(start - first, stop - start)


def csv_rows(directory: Path, source: dict, path: Path, names: list[str], start: int, stop: int, floats: bool):
    """Rows ``start:stop`` of a CSV file: the bytes between their offsets, parsed with the
    header and the column types the coordinator read."""
    pa, pcsv = pyarrow_module(), pyarrow_module("pyarrow.csv")
    offsets = np.load(directory / source["rows"], mmap_mode="r")
    a, b = int(offsets[start]), int(offsets[stop])
    with open(path, "rb") as f:
        f.seek(a)
        chunk = f.read(b - a)
    types = {n: pa.float64() if floats else pa.type_for_alias(source["types"][n]) for n in names
             if n in source["types"]}
    opts = pcsv.ConvertOptions(include_columns=names, column_types=types, strings_can_be_null=True)
    body = source["header"].encode() + chunk
    table = pcsv.read_csv(io.BytesIO(body), convert_options=opts)
    if table.num_rows != stop - start:
        raise DataError(f"{str(path)!r}: rows {start}:{stop} hold {table.num_rows} CSV records; a blank line or a "
                        f"quoted field with a line end breaks the one-record-per-line layout workers read by")
    return table


class LazyColumn:
    """One leaf's column of a table dataset that reads rows only when indexed: what a
    template's seeding samples from (``models.init.sample_rows``), one block of rows at a
    time, so the coordinator never holds the whole column."""

    block_rows = 1 << 16

    def __init__(self, directory: Path, node: dict):
        self.directory, self.node = directory, node
        width = len(node["names"]) if node["leaf"] == "vec" else None
        self.shape = (int(node["n"]),) if width is None else (int(node["n"]), width)
        self.ndim = len(self.shape)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index):
        if isinstance(index, slice):
            a, b, step = index.indices(self.shape[0])
            return read_rows(self.directory, self.node, a, b)[::step]
        index = np.asarray(index, dtype=np.int64)
        order = np.argsort(index, kind="stable")
        sorted_idx = index[order]
        parts = []
        for lo in np.unique(sorted_idx // self.block_rows) * self.block_rows:
            hi = min(lo + self.block_rows, self.shape[0])
            sel = sorted_idx[(sorted_idx >= lo) & (sorted_idx < hi)]
            parts.append(read_rows(self.directory, self.node, int(lo), int(hi))[sel - lo])
        if not parts:
            return read_rows(self.directory, self.node, 0, 0)
        out = np.concatenate(parts, axis=0)
        back = np.empty_like(order)
        back[order] = np.arange(order.size)
        return out[back]
