"""Rows ``start:stop`` of a ``.parquet`` or ``.csv`` file's columns, in a leaf's encoding:
what each worker of an on-disk dataset (``executors.datafiles.NpyDataset.from_table``)
reads, and nothing else (:mod:`models.tables` reads a table whole).

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

from .base import from_spec
from .columns import MAX_ABS_VALUE, encode_values
from .data import vector_rows
from .errors import DataError
from .tables import (Col, arrow_error, column_arrays, csv_options, csv_sample, file_columns, missing_rows,
                     pyarrow_module)

_BLOCK = 1 << 22
_LF, _COMMA, _QUOTE = 10, 44, 34


def file_rows(path: Path, directory: Path) -> tuple[int, dict]:
    """The file's row count and what a reader needs (a CSV's row offsets file and schema);
    DataError naming the file for one that is no regular file, no Parquet or CSV, names a
    column twice, ends its lines with CR alone, or has a row whose field count differs from
    its header's."""
    have = file_columns(path)
    pa = pyarrow_module()
    if path.suffix.lower() == ".parquet":
        try:
            pf = pyarrow_module("pyarrow.parquet").ParquetFile(path)
        except (pa.ArrowException, OSError) as e:
            raise arrow_error(path, e) from None
        types = {f.name: str(f.type) for f in pf.schema_arrow}
        return pf.metadata.num_rows, {"format": "parquet", "columns": have, "types": types}
    with open(path, "rb") as f:
        header = f.readline()
    n_boundaries, last_content = _scan_csv(path, header, len(have))
    rows = directory / "rows.npy"
    starts = np.lib.format.open_memmap(rows, mode="w+", dtype=np.int64, shape=(n_boundaries,))
    _fill_starts(path, len(header), starts)
    # blank lines at the end are no rows: the rows end at the first boundary after the last
    # byte that is not blank
    n = int(np.searchsorted(starts, last_content, side="right")) if last_content >= len(header) else 0
    n = max(0, min(n, n_boundaries - 1))
    starts.flush()
    del starts
    try:
        first = csv_sample(path)
    except pa.ArrowException as e:
        raise arrow_error(path, e) from None
    types = {name: str(first.schema.field(name).type) for name in first.column_names}
    return n, {"format": "csv", "header": header.decode("utf-8", "replace"), "columns": have, "types": types,
               "rows": "rows.npy"}


def _scan_csv(path: Path, header: bytes, n_fields: int) -> tuple[int, int]:
    """One pass over a CSV's bytes after its header, a block at a time: the number of row
    boundaries (each line end, and the file's end when its last line has none) and the offset
    of its last byte that is not blank. A complete line whose comma count is not the header's
    is refused naming its row (a block holding a quote is not counted: quoted commas belong
    to their field, and the rows' reader checks those)."""
    pos = len(header)
    n_ends, last_content, carry, row = 0, -1, b"", 0
    blank = np.zeros(256, dtype=bool)
    blank[[9, 10, 13, 32]] = True
    for at, block in _blocks(path, pos):
        arr = np.frombuffer(block, dtype=np.uint8)
        ends = np.flatnonzero(arr == _LF)
        n_ends += int(ends.size)
        content = np.flatnonzero(~blank[arr])
        if content.size:
            last_content = at + int(content[-1])
        if ends.size:
            lines = carry + block[:int(ends[-1]) + 1]
            row = _check_fields(path, lines, row, n_fields)
            carry = block[int(ends[-1]) + 1:]
        else:
            carry += block
            if len(carry) > MAX_LINE_BYTES:
                raise DataError(f"data file {str(path)!r}: row {row} is longer than {MAX_LINE_BYTES:,} bytes "
                                "(models.table_rows.MAX_LINE_BYTES)")
        pos = at + len(block)
    if carry.strip():
        _check_fields(path, carry + b"\n", row, n_fields)
    ends_at_eof = pos == len(header) or (n_ends > 0 and _last_byte(path) == _LF)
    return 1 + n_ends + (0 if ends_at_eof else 1), last_content


#: The longest CSV row the coordinator's pass takes (a file without line ends is no CSV).
MAX_LINE_BYTES = 1 << 26


def _blocks(path: Path, pos: int):
    """``(offset, bytes)`` of the file from byte ``pos`` on, :data:`_BLOCK` bytes at a time."""
    with open(path, "rb") as f:
        f.seek(pos)
        while block := f.read(_BLOCK):
            yield pos, block
            pos += len(block)


def _last_byte(path: Path) -> int:
    with open(path, "rb") as f:
        f.seek(-1, 2)
        return f.read(1)[0]


def _check_fields(path: Path, lines: bytes, row: int, n_fields: int) -> int:
    """Checks that every line of ``lines`` (complete ones, the first being row ``row``) holds
    ``n_fields`` fields; returns the next row's number. Blank lines are skipped here."""
    arr = np.frombuffer(lines, dtype=np.uint8)
    ends = np.flatnonzero(arr == _LF)
    if (arr == _QUOTE).any():
        return row + int(ends.size)
    commas = np.flatnonzero(arr == _COMMA)
    per_line = np.bincount(np.searchsorted(ends, commas), minlength=ends.size)[:ends.size]
    bad = np.flatnonzero(per_line != n_fields - 1)
    if bad.size:
        starts = np.concatenate([[0], ends[:-1] + 1])
        for i in bad:
            text = lines[int(starts[i]):int(ends[i])].rstrip(b"\r")
            if text.strip():
                raise DataError(f"data file {str(path)!r}: row {row + int(i)} has {int(per_line[i]) + 1} field(s), "
                                f"the header names {n_fields}: {text[:80].decode('utf-8', 'replace')!r}")
    return row + int(ends.size)


def _fill_starts(path: Path, header_bytes: int, starts: np.ndarray) -> int:
    """Writes the byte offset of every row's start, then the file's end, into ``starts``;
    returns the file's size."""
    pos, k = header_bytes, 1
    starts[0] = header_bytes
    for at, block in _blocks(path, header_bytes):
        ends = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == _LF).astype(np.int64) + (at + 1)
        starts[k:k + ends.size] = ends
        k += int(ends.size)
        pos = at + len(block)
    if k < starts.size:
        starts[k] = pos
    return pos


def read_rows(directory: Path, node: dict, start: int, stop: int) -> np.ndarray:
    """Rows ``start:stop`` of one leaf's columns (a layout node of kind ``table``), in the
    leaf's encoding; a missing value, NaN, inf or a float beyond ``models.columns.MAX_ABS_VALUE``
    is refused naming its column and the file's row, and a number or count column is checked
    by its leaf (the node's ``spec``) as in memory: counts integral and in range, values in
    the leaf's support."""
    names = node["names"]
    values = node.get("values")
    strings = node["leaf"] == "cat" and values is not None and any(isinstance(v, str) for v in values)
    as_type = "double" if node["leaf"] in ("float", "vec") else ("string" if strings else None)
    cols = read_columns(directory, node["source"], names, start, stop, as_type=as_type)
    missing_rows(cols, False, first_row=start)  # refuses a missing value, naming its column and row
    col = Col(tuple(names), node["leaf"], "")
    if col.kind == "vec":
        x = vector_rows(np.asarray(cols[n][0], dtype=np.float64) for n in names)
        _check_floats(x, names, start, node["source"]["file"])
        return x
    x = cols[names[0]][0]
    if col.kind == "cat" and values is not None:
        return encode_values(x, tuple(values), f"column {names[0]!r}")
    if col.kind == "float":
        x = np.asarray(x, dtype=np.float64)
        _check_floats(x[:, None], names, start, node["source"]["file"])
    if "spec" not in node:  # a categorical's integer codes
        return np.asarray(x, dtype=np.int64) if x.dtype.kind in "iub" else x
    where = f"data file {node['source']['file']!r}: column {names[0]!r} (rows {start}-{stop - 1})"
    return from_spec(node["spec"])._prepare(x, where)


def _check_floats(x: np.ndarray, names: list[str], first_row: int, file: str) -> None:
    ok = np.abs(x) <= MAX_ABS_VALUE
    if ok.all():
        return
    row, j = divmod(int(np.argmin(ok.reshape(-1))), x.shape[1])
    v = float(x[row, j])
    why = "values must be finite" if not np.isfinite(v) else (f"values must be within +-{MAX_ABS_VALUE:g} (their "
                                                               "squares are summed over the rows): rescale the column")
    raise DataError(f"data file {file!r}: column {names[j]!r} holds {v:g} at row {first_row + row}; {why}")


def read_columns(directory: Path, source: dict, names: list[str], start: int, stop: int,
                 as_type: str | None = None) -> dict:
    """The named columns of rows ``start:stop`` of the source file, as ``column_arrays``
    (``as_type``: a CSV's columns parsed as that pyarrow type, whatever its first rows
    looked like)."""
    path = Path(source["file"])
    if source["format"] == "parquet":
        table = parquet_rows(path, names, start, stop)
    else:
        table = csv_rows(directory, source, path, names, start, stop, as_type)
    return {n: column_arrays(table.column(n), n) for n in names}


def parquet_rows(path: Path, names: list[str], start: int, stop: int):
    """Rows ``start:stop`` of the columns ``names``, read from the row groups holding them."""
    pa = pyarrow_module()
    try:
        pf = pyarrow_module("pyarrow.parquet").ParquetFile(path)
        meta = pf.metadata
        sizes = np.array([meta.row_group(i).num_rows for i in range(meta.num_row_groups)], dtype=np.int64)
        bounds = np.concatenate([[0], np.cumsum(sizes)])
        groups = [i for i in range(len(sizes)) if bounds[i] < stop and bounds[i + 1] > start]
        if not groups:
            return pf.schema_arrow.empty_table().select(names)
        table = pf.read_row_groups(groups, columns=names)
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"data file {str(path)!r}, rows {start}:{stop}: {str(e).splitlines()[0][:200]}") from None
    first = int(bounds[groups[0]])
    return table.slice(start - first, stop - start)


def csv_rows(directory: Path, source: dict, path: Path, names: list[str], start: int, stop: int,
             as_type: str | None = None):
    """Rows ``start:stop`` of a CSV file: the bytes between their offsets, parsed with the
    header and the column types the coordinator read (or ``as_type``). A row that does not
    parse is refused naming the file, the row and the column."""
    pa, pcsv = pyarrow_module(), pyarrow_module("pyarrow.csv")
    offsets = np.load(directory / source["rows"], mmap_mode="r")
    a, b = int(offsets[start]), int(offsets[stop])
    with open(path, "rb") as f:
        f.seek(a)
        chunk = f.read(b - a)
    types = {n: pa.type_for_alias(as_type or source["types"][n]) for n in names if n in source["types"]}
    opts = csv_options(include_columns=names, column_types=types)
    body = source["header"].encode() + chunk
    try:
        table = pcsv.read_csv(io.BytesIO(body), convert_options=opts)
    except pa.ArrowException as e:
        raise _bad_rows(path, source, names, types, chunk, start, e) from None
    if table.num_rows != stop - start:
        raise DataError(f"{str(path)!r}: rows {start}:{stop} hold {table.num_rows} CSV records; a blank line or a "
                        f"quoted field with a line end breaks the one-record-per-line layout workers read by")
    return table


def _bad_rows(path: Path, source: dict, names: list[str], types: dict, chunk: bytes, start: int,
              e: BaseException) -> DataError:
    """The DataError of rows that pyarrow refused: the first value of a column that is not of
    the column's type, named by its row, else pyarrow's own line."""
    pa, pcsv = pyarrow_module(), pyarrow_module("pyarrow.csv")
    try:
        raw = pcsv.read_csv(io.BytesIO(source["header"].encode() + chunk), convert_options=csv_options(
            include_columns=names, column_types={n: pa.string() for n in names}))
    except pa.ArrowException:
        raw = None
    if raw is not None:
        for n, t in types.items():
            for i, v in enumerate(raw.column(n).to_pylist()):
                if v is None:
                    continue
                try:
                    pa.array([v]).cast(t)
                except (pa.ArrowException, ValueError):
                    return DataError(f"data file {str(path)!r}: column {n!r} holds {v[:40]!r} at row {start + i}, "
                                     f"where its first rows hold {t} values")
    stop = start + chunk.count(b"\n")
    return DataError(f"data file {str(path)!r}, rows {start}:{stop}: {str(e).splitlines()[0][:200]}")


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
