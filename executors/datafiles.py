"""Prepared data on disk: one ``.npy`` file per leaf column and per offsets array, or the
columns of a ``.parquet`` / ``.csv`` file a model reads by name (``from_table``,
``models.table_rows``).

Worker processes open a dataset memory-mapped and slice their own row range (reading
their vectors into column-major memory, :func:`rows_as`), so no process ever reads (or is
sent) rows that are not its own. ``layout.json`` records how the
files nest (tuples for composites, ``Ragged`` for sequences and HMMs).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from emgrid.models import Node, Ragged, n_rows, table_rows
from emgrid.models.data import Data, each_array
from emgrid.models.errors import DataError
from emgrid.models.files import npy_header
from emgrid.models.tables import Col, Seq, as_table, check_columns, column_tree, group_offsets, needed_columns

from .warden import pid_alive

LAYOUT = "layout.json"
#: Rows copied at a time into a row-major file from column-major rows (``NpyDataset.write``).
WRITE_ROWS = 1 << 16
#: The name of every table dataset's scratch folder begins so: ``emgrid-table-<host>-<pid>-<tag>``.
SCRATCH_PREFIX = "emgrid-table-"
#: Largest leaf (in parameters) whose spec a table's layout keeps for its workers to check
#: their rows by: every number or count leaf but a categorical of many integer codes, whose
#: codes are then only cast (its table of probabilities would be read by every worker).
SPEC_MAX_PARAMS = 4096


def _host() -> str:
    return "".join(c if c.isalnum() else "_" for c in socket.gethostname())[:40] or "host"


def sweep_table_scratch(parent) -> list[Path]:
    """Removes the table scratch folders in ``parent`` that processes of this host left when
    they were killed: those named for this host and a pid that no longer runs, owned by this
    user. Returns what it removed."""
    host, removed = _host(), []
    try:
        entries = list(Path(parent).iterdir())
    except OSError:
        return removed
    for p in entries:
        if not p.name.startswith(SCRATCH_PREFIX):
            continue
        parts = p.name[len(SCRATCH_PREFIX):].rsplit("-", 2)
        if len(parts) != 3 or parts[0] != host or not parts[1].isdigit():
            continue
        try:
            st = p.lstat()
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or pid_alive(int(parts[1])):
            continue
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p)
    return removed


def new_table_scratch(parent=None) -> Path:
    """A new folder for a table dataset's files (a CSV's row offsets, a sequence's offsets)
    in ``parent`` (default: the system's temporary folder), named for this host and process
    so that the next run removes it when this one is killed before it could
    (:func:`sweep_table_scratch`, run here first)."""
    parent = Path(tempfile.gettempdir() if parent is None else parent)
    sweep_table_scratch(parent)
    return Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{_host()}-{os.getpid()}-", dir=parent))


@contextmanager
def table_scratch(parent=None):
    """:func:`new_table_scratch`, removed when the block ends."""
    folder = new_table_scratch(parent)
    try:
        yield str(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


class NpyDataset:
    """A directory written by :meth:`write`: prepared data, opened memory-mapped."""

    def __init__(self, directory):
        self.directory = Path(directory)
        try:
            meta = json.loads((self.directory / LAYOUT).read_text())
        except OSError as e:
            raise DataError(f"{str(self.directory)!r} is not an emgrid dataset: cannot read {LAYOUT} ({e.strerror})") from None
        self.layout = meta["layout"]
        self.n_rows = int(meta["n_rows"])

    def n_observations(self) -> int:
        """The ``n`` of BIC (``models.inference.n_observations``): the positions of the
        innermost sequence level when the rows are sequences, else the rows."""
        node, n = self.layout, self.n_rows
        while node["kind"] == "ragged":
            n = int(np.load(self.directory / node["offsets"], mmap_mode="r")[-1])
            node = node["values"]
        return n

    @classmethod
    def write(cls, data: Data, directory, model: Node | None = None) -> "NpyDataset":
        """Writes ``data`` (prepared with ``model.prepare`` first when ``model`` is given)."""
        if model is not None:
            data = model.prepare(data)
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        counter = iter(range(1 << 30))

        def put(d):
            if d is None:
                return {"kind": "none"}
            if isinstance(d, tuple):
                return {"kind": "tuple", "items": [put(c) for c in d]}
            if isinstance(d, Ragged):
                return {"kind": "ragged", "values": put(d.values), "offsets": save(d.offsets)}
            return {"kind": "array", "file": save(d)}

        def save(arr):
            name = f"c{next(counter)}.npy"
            arr = np.asarray(arr)
            if arr.ndim == 2 and not arr.flags.c_contiguous:
                # row-major, whatever the rows' order in memory: a worker maps its range of rows,
                # where a column-major file would have it map each column's range and, the
                # kernel mapping files in large folios, megabytes of its neighbours' rows beside
                out = np.lib.format.open_memmap(directory / name, mode="w+", dtype=arr.dtype, shape=arr.shape)
                for a in range(0, arr.shape[0], WRITE_ROWS):
                    out[a:a + WRITE_ROWS] = arr[a:a + WRITE_ROWS]
                out.flush()
                del out
            else:
                np.save(directory / name, arr, allow_pickle=False)
            return name

        layout = put(data)
        (directory / LAYOUT).write_text(json.dumps({"layout": layout, "n_rows": n_rows(data)}))
        return cls(directory)

    @classmethod
    def from_table(cls, data, model: Node, directory) -> "NpyDataset":
        """A dataset over the columns of a ``.parquet`` or ``.csv`` file (a path or a
        ``models.tables.Table`` of one) that ``model`` reads by name; ``model``'s
        categoricals carry their value lists (``models.tables.bind``). Only the file's
        metadata (a CSV: its row offsets) and a ``sequence_id`` column are read here."""
        table = as_table(data)
        if table.drop_missing:
            raise DataError("drop_missing reads the whole table; read it into memory (models.tables.read_table)")
        path = Path(table.source).resolve()
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        tree, _ = column_tree(model, table.sequence_id)
        n_file, source = table_rows.file_rows(path, directory)
        source["file"] = str(path)
        where = f"data file {str(table.source)!r}"
        needed = needed_columns(tree) + ([table.sequence_id] if table.sequence_id else [])
        check_columns(needed, source["columns"], where)
        for name in needed:
            if name in source["types"] and source["types"][name].startswith(("list", "large_list", "struct", "map",
                                                                             "fixed_size_list")):
                raise DataError(f"{where}: column {name!r} holds {source['types'][name]} values; a column a leaf "
                                "reads holds numbers, strings or booleans (a vector reads one column per entry)")
        if n_file == 0:
            raise DataError(f"{where} has no rows (only {'its schema' if source['format'] == 'parquet' else 'a header'})")

        def put(t):
            if isinstance(t, Col):
                leaf = model.node_at(t.path)
                values = leaf.values if t.kind == "cat" else None
                node = {"kind": "table", "source": source, "names": list(t.names), "leaf": t.kind,
                        "values": None if values is None else list(values), "n": n_file}
                if t.kind in ("int", "float") and sum(np.size(v) for v in leaf.params().values()) <= SPEC_MAX_PARAMS:
                    node["spec"] = leaf.to_spec()  # what a worker checks its rows by (read_rows)
                return node
            if isinstance(t, Seq):
                ids = table_rows.read_columns(directory, source, [table.sequence_id], 0, n_file)[table.sequence_id]
                if ids[1] is not None:
                    raise DataError(f"sequence_id column {table.sequence_id!r} has a missing value at row "
                                    f"{int(np.argmax(ids[1]))}")
                np.save(directory / "sequences.npy", group_offsets(ids[0], table.sequence_id))
                return {"kind": "ragged", "values": put(t.values), "offsets": "sequences.npy"}
            return {"kind": "tuple", "items": [put(c) for c in t]}

        layout = put(tree)
        n = n_file if table.sequence_id is None else int(np.load(directory / "sequences.npy", mmap_mode="r").size - 1)
        (directory / LAYOUT).write_text(json.dumps({"layout": layout, "n_rows": n}))
        return cls(directory)

    def open(self, lazy: bool = False) -> Data:
        """Every column, memory-mapped read-only (nothing is read until it is sliced and used);
        a table's columns are read whole, or with ``lazy`` only the rows indexed
        (``models.table_rows.LazyColumn``)."""
        return self._get(self.layout, None, lazy)

    def open_rows(self, start: int, stop: int) -> Data:
        """Rows ``start:stop`` of every column, each file mapped over just their bytes (a
        sequence's offsets first, then the values they span), not the whole file sliced: the
        kernel maps file pages around each fault, and for a worker whose rows start mid-file
        those around its first rows lie outside its range."""
        if not 0 <= start <= stop <= self.n_rows:
            raise DataError(f"rows {start}:{stop} are outside the dataset's {self.n_rows} rows")
        return self._get(self.layout, (start, stop), False)

    def _get(self, node: dict, rows: tuple[int, int] | None, lazy: bool) -> Data:
        """The data of a layout node: its rows ``rows`` (``(start, stop)``), or all of it (None)."""
        kind = node["kind"]
        if kind == "none":
            return None
        if kind == "tuple":
            return tuple(self._get(c, rows, lazy) for c in node["items"])
        if kind == "ragged":
            if rows is None:
                return Ragged.unchecked(self._get(node["values"], None, lazy), self._load(node["offsets"]))
            offsets = self._load_range(node["offsets"], rows[0], rows[1] + 1)
            lo, hi = int(offsets[0]), int(offsets[-1])
            return Ragged.unchecked(self._get(node["values"], (lo, hi), lazy), offsets - lo)
        if kind == "table":
            if lazy:
                return table_rows.LazyColumn(self.directory, node)
            return table_rows.read_rows(self.directory, node, *(rows or (0, node["n"])))
        return self._load(node["file"]) if rows is None else self._load_range(node["file"], *rows)

    def _load_range(self, name: str, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of one ``.npy`` file, memory-mapped from its first row's byte."""
        path = self.directory / name
        with open(path, "rb") as f:
            shape, fortran, dtype, header = npy_header(f, repr(str(path)), os.fstat(f.fileno()).st_size)
        if fortran and len(shape) > 1:  # not written by ``write``: rows of the whole mapping
            return np.asarray(self._load(name)[start:stop])
        row_bytes = dtype.itemsize * int(np.prod(shape[1:], dtype=np.int64))
        rows = (stop - start,) + tuple(shape[1:])
        if stop == start or row_bytes == 0:
            return np.empty(rows, dtype=dtype)
        return np.asarray(np.memmap(path, dtype=dtype, mode="r", offset=header + start * row_bytes, shape=rows))

    def _load(self, name: str) -> np.ndarray:
        path = self.directory / name
        try:
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
        except ValueError:  # an empty array cannot be mapped
            arr = np.load(path, allow_pickle=False)
        return np.asarray(arr)

    def __repr__(self) -> str:
        return f"NpyDataset({str(self.directory)!r}, n_rows={self.n_rows})"



def rows_as(data: Data, dtype: str, *, own_rows: bool = True) -> Data:
    """A worker's rows (its shard's columns) with their floats in ``dtype`` and, with
    ``own_rows``, its vectors column-major (``models.data``). What already is so stays as it
    is (a mapped column, a column-major file's vectors in their type). A mapped array that
    must change (row-major vectors: the worker's range of a ``.npy`` file,
    :meth:`NpyDataset.open_rows`; any float column of another type) is read from its file
    (:func:`_read_as`; a column-major file column by column), so the mapped pages of the
    stored copy are never touched; an array in memory, or mapped copy-on-write (whose memory
    may hold what its file does not), is converted in memory. Without ``own_rows`` (a
    caller's arrays) nothing is copied that is already in ``dtype``."""

    def one(a):
        if not isinstance(a, np.ndarray) or a.dtype.kind != "f":
            return a
        if a.dtype == dtype and (not own_rows or a.ndim != 2 or a.strides[0] == a.itemsize):
            return a  # nothing to change: a mapped column stays mapped
        path, start = _mapped_from(a)
        if path is None:
            return a if a.dtype == dtype else a.astype(dtype)
        if a.flags.c_contiguous:
            return _read_as(path, start, a.dtype, np.empty(a.shape, dtype=dtype, order="F" if a.ndim == 2 else "C"))
        if a.ndim == 2 and a.strides[0] == a.itemsize:  # rows of a column-major file: column by column
            out = np.empty(a.shape, dtype=dtype, order="F")
            for j in range(a.shape[1]):
                _read_as(path, start + j * a.strides[1], a.dtype, out[:, j])
            return out
        return a.astype(dtype)

    return each_array(data, one)


def _mapped_from(a: np.ndarray) -> tuple[Path | None, int]:
    """The file ``a`` is a mapped view of and the byte of its first value there, or ``(None, 0)``
    (also for a copy-on-write mapping: its memory may hold what its file does not)."""
    mapped = a.base
    while isinstance(mapped, np.ndarray) and isinstance(mapped.base, np.ndarray):
        mapped = mapped.base  # the mapping of the whole file, whose offset is its first byte's
    if not isinstance(mapped, np.memmap) or mapped.filename is None or mapped.mode == "c":
        return None, 0
    return Path(mapped.filename), mapped.offset + (a.ctypes.data - mapped.ctypes.data)


def _read_as(path: Path, offset: int, stored: np.dtype, out: np.ndarray) -> np.ndarray:
    """``out`` (1-D, or 2-D rows of either order) filled with as many values of ``stored``
    type, row-major, from byte ``offset`` of ``path``, cast to its type: read in chunks of
    about 128 KiB (not mapped, so the stored copy never counts in the process's memory beside
    the cast one, and a chunk stays within the allowance every worker's plan keeps for what
    no row count scales)."""
    rows = out if out.ndim == 2 else out.reshape(-1, 1)
    width = rows.shape[1]
    per = max(1, (128 << 10) // max(stored.itemsize * width, 1))
    with open(path, "rb") as f:
        f.seek(offset)
        for a in range(0, rows.shape[0], per):
            n = min(per, rows.shape[0] - a)
            chunk = np.fromfile(f, dtype=stored, count=n * width)
            if chunk.size != n * width:
                raise DataError(f"{str(path)!r} ends before its header's {out.size} values: it is damaged")
            rows[a:a + n] = chunk.reshape(n, width)
    return out
