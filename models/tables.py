"""Tables as data: a model with named record fields reads a table's columns by name.

A *table* is a pandas DataFrame (when pandas is installed), a pyarrow Table or RecordBatch,
a dict of equal-length 1-D arrays, or the path of a ``.parquet`` or ``.csv`` file (read
with pyarrow); :class:`Table` wraps any of them with how to read it (``sequence_id``,
``drop_missing``). Every ``model.prepare`` accepts one; so do ``optimize`` and
``[data] path``.

- A ``Composite`` with named fields maps each field to its column(s)
  (``Composite.column_names``); a mixture's components read the same columns.
- A ``value_coded`` leaf (a ``Categorical``) reads its column through its value list
  (``values``, in code order), which :func:`bind` takes from the column when a fit starts
  (``Leaf._bind_values``): strings, integers and booleans, and floats only when every one
  is integral; an unseen value is refused.
- A leaf whose ``columns`` name its columns by a pattern (a vector leaf's ``"*"``) gets the
  names it matches and, through its schema's ``Size(by="columns")``, its dimension.
- A missing value (null, NaN, an empty CSV field) is refused naming the column and the
  first row, unless ``drop_missing`` asks to drop those rows (a warning says how many).
- With ``sequence_id``, the rows of one sequence (an ``HMM``'s or a ``Sequence``'s
  positions) are the rows sharing that column's value; those rows must be contiguous and in
  order (an event log sorted by id); they are not re-sorted.
"""

from __future__ import annotations

import csv
import fnmatch
import importlib
import io
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .columns import encode_values, is_pattern, value_list
from .data import Data, Ragged, vector_rows
from .errors import DataError
from .files import regular_file
from .hints import hint
from .schema import Children, Size
from .tree import child_path

if TYPE_CHECKING:
    from .base import Node

FILE_SUFFIXES = (".parquet", ".csv")
#: The longest first line (the column names) a CSV file may have.
MAX_HEADER_BYTES = 1 << 20


def pyarrow_module(name: str = "pyarrow"):
    """``pyarrow`` or one of its modules, imported when a table first needs it (an optional
    dependency: ``pip install 'emgrid[tables]'``)."""
    try:
        return importlib.import_module(name)
    except ImportError:
        raise DataError("reading .parquet and .csv files needs pyarrow: pip install 'emgrid[tables]'") from None


#: The CSV fields read as missing: an empty field, null and NaN. pyarrow's own list also
#: takes "NA", "N/A", "#N/A" and more, which can be data (Namibia's country code is NA).
CSV_NULLS = ("", "null", "NULL", "NaN", "nan")


def csv_options(**kw):
    """pyarrow's CSV conversion options with :data:`CSV_NULLS` as the missing values."""
    return pyarrow_module("pyarrow.csv").ConvertOptions(null_values=list(CSV_NULLS), strings_can_be_null=True, **kw)


@dataclass(frozen=True)
class Table:
    """A table with how to read it: ``source`` (see the module), ``sequence_id`` (the
    column whose runs of equal values are the sequences), ``drop_missing`` (drop rows
    with a missing value instead of refusing them)."""

    source: object
    sequence_id: str | None = None
    drop_missing: bool = False


def is_table(data) -> bool:
    """Whether ``data`` is read by column name (see the module)."""
    if isinstance(data, Table):
        return True
    if isinstance(data, (str, Path)):
        return Path(data).suffix.lower() in FILE_SUFFIXES
    if isinstance(data, dict):
        return bool(data) and all(isinstance(k, str) for k in data)
    mod = type(data).__module__ or ""
    return (mod.startswith("pandas") and hasattr(data, "columns")) or (
        mod.startswith("pyarrow") and hasattr(data, "column_names"))


def as_table(data) -> Table:
    return data if isinstance(data, Table) else Table(data)


# ---------------------------------------------------------------- which columns a model reads
@dataclass(frozen=True)
class Col:
    """The columns one leaf position of the data reads: ``kind`` is float, int, cat or vec."""

    names: tuple[str, ...]
    kind: str
    path: str


@dataclass(frozen=True)
class Seq:
    """Sequences of the rows of a long table, grouped by its ``sequence_id`` column; each
    position reads ``values`` (a column tree)."""

    values: object


def column_tree(model: "Node", sequence_id: str | None = None, patterns: dict | None = None):
    """How the model's data are built from columns: a :class:`Col`, a tuple of trees (a
    record) or a :class:`Seq` (sequences from ``sequence_id``). Also returns every leaf's
    columns by path (a mixture's components read the same columns). A leaf's own
    ``columns`` name its columns; one still naming them by a pattern is refused, unless
    ``patterns`` collects it (by path) for :func:`bind` to resolve."""
    reads: dict[str, Col] = {}
    tree = _walk(model, "", None, sequence_id, reads, patterns)
    return tree, reads


def _where(path: str) -> str:
    return repr(path) if path else "'<root>'"


def _no_names(node, path: str) -> DataError:
    """The error of a leaf whose columns nothing names, with how to name them."""
    if "columns" in node.spec_fields:
        fix = hint(f"give its columns: {node.family}(columns='*') (every numeric column), columns='mean_*' (a glob) "
                   f"or columns=['a', 'b'], or put it in a Composite with named fields",
                   f"give its columns: inline = {{ family = \"{node.family}\", columns = \"*\" }} (every numeric "
                   "column), columns = \"mean_*\" (a glob) or columns = [\"a\", \"b\"]")
    else:
        fix = hint(f"a table is read through a Composite with named fields, e.g. Composite({{'x': {node.family}()}})",
                   f"a table is read through a Composite with named fields, e.g. inline = {{ family = \"Composite\", "
                   f"fields = [\"x\"], children = [{{ family = \"{node.family}\" }}] }}")
    return DataError(f"the {node.family} at path {_where(path)} has no column name: {fix}")


def _walk(node, path, names, sequence_id, reads, patterns=None):
    if node.is_leaf:
        own = getattr(node, "columns", None)
        if is_pattern(own):
            if patterns is None:
                raise DataError(f"the {node.family} at path {_where(path)} names its columns by the pattern {own!r}, "
                                "which a table resolves: fit it on a table (models.tables.bind resolves it)")
            patterns[path] = own
            return Col((), "pattern", path)
        if own is not None:
            names = own
        if names is None:
            raise _no_names(node, path)
        t = node.data_type()
        if t.startswith("vec["):
            d = int(t[4:-1])
            if len(names) != d:
                raise DataError(f"the {node.family} at path {_where(path)} reads {d} columns, but its field "
                                f"names {len(names)}: {list(names)}")
            col = Col(names, "vec", path)
        else:
            if len(names) != 1:
                raise DataError(f"the {node.family} at path {_where(path)} reads one column, got {list(names)}")
            col = Col(names, "cat" if getattr(node, "value_coded", False) else t, path)
        reads[path] = col
        return col
    if node.reads_ragged:
        if sequence_id is None:
            how = hint("Table(path, sequence_id='id')", "[data] sequence_id = \"id\"")
            raise DataError(f"the {node.family} at path {_where(path)} reads sequences: give the column that "
                            f"groups a table's rows into sequences ({how})")
        subs = [_walk(c, child_path(path, i), names, None, reads, patterns) for i, c in enumerate(node.children)]
        return Seq(subs[0])
    if node.shares_child_data:
        subs = [_walk(c, child_path(path, i), names, sequence_id, reads, patterns) for i, c in enumerate(node.children)]
        first = _columns_of(subs[0])
        for i, sub in enumerate(subs[1:], 1):
            if _columns_of(sub) != first:
                raise DataError(f"the children of the {node.family} at path {_where(path)} read one column set, "
                                f"but child 0 reads {list(first)} and child {i} {list(_columns_of(sub))}")
        return subs[0]
    if getattr(node, "fields", None) is None:
        how = hint("Composite({'name': child, ...})", "fields = [\"name\", ...] beside children")
        raise DataError(f"the {node.family} at path {_where(path)} has positional fields; name them to read a "
                        f"table ({how})")
    return tuple(_walk(c, child_path(path, i), node.column_names(i), sequence_id, reads, patterns)
                 for i, c in enumerate(node.children))


def _columns_of(tree) -> tuple:
    """What a column tree reads, without its paths (a pattern reads as itself)."""
    if isinstance(tree, Col):
        return (tree.kind, tree.names)
    if isinstance(tree, Seq):
        return ("seq", _columns_of(tree.values))
    return tuple(_columns_of(t) for t in tree)


def leaf_columns(tree):
    """Every :class:`Col` of a column tree, in order."""
    if isinstance(tree, Col):
        yield tree
    elif isinstance(tree, Seq):
        yield from leaf_columns(tree.values)
    else:
        for t in tree:
            yield from leaf_columns(t)


def needed_columns(tree) -> list[str]:
    out: list[str] = []
    for col in leaf_columns(tree):
        out.extend(n for n in col.names if n not in out)
    return out


# ---------------------------------------------------------------- columns as numpy
def column_arrays(col, name: str = "?") -> tuple[np.ndarray, np.ndarray | None]:
    """A pandas Series, pyarrow (Chunked)Array or array-like as ``(values, missing)``:
    ``missing`` marks nulls and NaN (None when there are none). A column of lists or
    records (``name`` names it) is refused: a leaf reads numbers, strings or booleans."""
    mod = type(col).__module__ or ""
    if mod.startswith("pyarrow"):
        pa = pyarrow_module()
        if isinstance(col, pa.ChunkedArray):
            col = col.combine_chunks()
        if pa.types.is_dictionary(col.type):
            col = col.dictionary_decode()
        if pa.types.is_nested(col.type):
            raise DataError(f"column {name!r} holds {col.type} values; a column a leaf reads holds numbers, strings "
                            "or booleans (a vector reads one column per entry)")
        missing = col.is_null().to_numpy(zero_copy_only=False) if col.null_count else None
        if missing is not None and pa.types.is_integer(col.type):
            col = col.fill_null(0)  # with its nulls an integer column converts to float64, merging ids above 2**53
        values = col.to_numpy(zero_copy_only=False)
    elif mod.startswith("pandas"):
        missing = np.asarray(col.isna())
        missing = missing if missing.any() else None
        values = col.to_numpy()
    else:
        values = np.asarray(col)
        missing = None
        if values.ndim != 1:
            raise DataError(f"column {name!r} has shape {values.shape}; a column a leaf reads is 1-D")
        if values.dtype.kind == "O":
            missing = np.array([v is None for v in values.tolist()], dtype=bool)
            missing = missing if missing.any() else None
    if values.dtype.kind == "f":
        nan = np.isnan(values)
        if nan.any():
            missing = nan if missing is None else (missing | nan)
    if values.dtype.kind == "O" and missing is None:
        floats = [i for i, v in enumerate(values.tolist()) if isinstance(v, float) and v != v]
        if floats:
            missing = np.zeros(values.size, dtype=bool)
            missing[floats] = True
    return values, missing


def read_columns(source, names: list[str]) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
    """The named columns of an in-memory table or a whole file, as :func:`column_arrays`."""
    if isinstance(source, (str, Path)):
        source = read_file(Path(source), names)
    if isinstance(source, dict):
        have = list(source)
    elif hasattr(source, "column_names"):
        have = list(source.column_names)
    else:
        have = [str(c) for c in source.columns]
    check_columns(names, have)
    out = {}
    for n in names:
        col = source[n] if not hasattr(source, "column") else source.column(n)
        out[n] = column_arrays(col, n)
    lengths = {n: v.shape[0] for n, (v, _) in out.items()}
    if len(set(lengths.values())) > 1:
        raise DataError(f"the table's columns differ in length: {lengths}")
    return out


def arrow_error(path, e: BaseException) -> DataError:
    """A pyarrow error reading ``path`` as one line naming the file (for a CSV row with
    another number of fields than the header's, that row by number)."""
    kind = "Parquet" if Path(path).suffix.lower() == ".parquet" else "CSV"
    text = str(e).splitlines()[0].strip() if str(e).strip() else type(e).__name__
    ragged = _ragged_row(path) if kind == "CSV" and "Expected" in text and "columns" in text else None
    if ragged is not None:
        return ragged
    return DataError(f"data file {str(path)!r} cannot be read as {kind}: {text[:200]}")


def _ragged_row(path) -> DataError | None:
    """The first data row of an unquoted CSV whose fields the header's count does not match
    (read only once pyarrow has refused the file, so the scan costs nothing on good files)."""
    try:
        with open(path, newline="", encoding="utf-8", errors="replace") as f:
            rows = csv.reader(f)
            header = next(rows, None)
            for i, fields in enumerate(rows):
                if fields and header is not None and len(fields) != len(header):
                    shown = ",".join(fields)[:80]
                    return DataError(f"data file {str(path)!r}: row {i} has {len(fields)} field(s), the header "
                                     f"names {len(header)}: {shown!r}")
    except (OSError, csv.Error):
        return None
    return None


def check_header(path, have: list[str]) -> None:
    """Refuses a file whose columns are unnamed or named twice."""
    seen = set()
    for name in have:
        if name in seen:
            raise DataError(f"data file {str(path)!r} names column {name!r} twice; every column needs its own name")
        seen.add(name)
    if not have:
        raise DataError(f"data file {str(path)!r} has no columns")


def check_columns(names, have: list[str], where: str = "the table") -> None:
    """Refuses ``names`` that are not all among ``have`` (a table's columns), naming the first."""
    missing = [n for n in names if n not in have]
    if missing:
        shown = ", ".join(have[:12]) + (", ..." if len(have) > 12 else "")
        raise DataError(f"{where} has no column {missing[0]!r} (it has: {shown})")


def file_columns(path: Path) -> list[str]:
    """The column names of a ``.parquet`` file's schema or a ``.csv`` file's header, checked
    (:func:`check_header`); the file must be a regular one."""
    regular_file(path, "data file", DataError)
    pa = pyarrow_module()
    try:
        if path.suffix.lower() == ".parquet":
            have = list(pyarrow_module("pyarrow.parquet").ParquetFile(path).schema_arrow.names)
        else:
            pcsv = pyarrow_module("pyarrow.csv")
            with open(path, "rb") as f:
                header = f.readline(MAX_HEADER_BYTES + 1)
            if len(header) > MAX_HEADER_BYTES:
                raise DataError(f"data file {str(path)!r}: its first line is longer than {MAX_HEADER_BYTES:,} bytes "
                                "(models.tables.MAX_HEADER_BYTES); a CSV's first line names its columns")
            if not header.strip():
                raise DataError(f"data file {str(path)!r} is empty: a CSV's first line names its columns")
            check_line_ends(path, header)
            have = list(pcsv.read_csv(io.BytesIO(header)).column_names)
    except pa.ArrowException as e:
        raise arrow_error(path, e) from None
    except OSError as e:
        raise DataError(f"cannot read data file {str(path)!r}: {e.strerror or e}") from None
    check_header(path, have)
    return have


def check_line_ends(path, header: bytes) -> None:
    """Refuses a CSV whose lines end with CR alone (its first line would hold the whole file)."""
    if b"\r" in header.rstrip(b"\r\n"):
        raise DataError(f"data file {str(path)!r}: its lines end with a carriage return alone (CR); emgrid reads "
                        "CSV lines ending with LF or CRLF")


def read_file(path: Path, names: list[str] | None = None):
    """A ``.parquet`` or ``.csv`` file's columns ``names`` as a pyarrow Table (pyarrow
    needed: ``pip install emgrid[tables]``); DataError naming the file for a file that is
    missing, no regular file, no Parquet or CSV, or lacks a column."""
    if not path.exists():
        raise DataError(f"data file {str(path)!r} does not exist")
    have = file_columns(path)
    if names is not None:
        check_columns(names, have, f"data file {str(path)!r}")
    pa = pyarrow_module()
    try:
        if path.suffix.lower() == ".parquet":
            return pyarrow_module("pyarrow.parquet").read_table(path, columns=names)
        pcsv = pyarrow_module("pyarrow.csv")
        return pcsv.read_csv(path, convert_options=csv_options(include_columns=names) if names else csv_options())
    except pa.ArrowException as e:
        raise arrow_error(path, e) from None
    except OSError as e:
        raise DataError(f"cannot read data file {str(path)!r}: {e.strerror or e}") from None


# ---------------------------------------------------------------- the model and its data
def bind(model: "Node", data, columns: list[tuple[str, bool]] | None = None, distinct=None) -> "Node":
    """``model`` bound to the table ``data``: every leaf naming its columns by a pattern
    gets the table's columns it matches (:func:`resolve_patterns`), and every
    ``value_coded`` leaf that reads a column and has no value list is bound to the column's
    distinct values, sorted (``Leaf._bind_values``; only those columns are read).

    A table read where it lives (a Spark DataFrame) gives its ``columns`` (as
    :func:`table_columns`) and ``distinct(name)``, a column's distinct non-missing values."""
    table = as_table(data)
    model = resolve_patterns(model, table, columns)
    _, reads = column_tree(model, table.sequence_id)
    todo = {p: c for p, c in reads.items() if c.kind == "cat" and model.node_at(p).values is None}
    if not todo:
        return model
    names = sorted({c.names[0] for c in todo.values()})
    if distinct is None:
        cols = read_columns(table.source, names)
        found = {name: value_list(x if miss is None else x[~miss], f"column {name!r}") for name, (x, miss) in cols.items()}
    else:
        found = {name: value_list(distinct(name), f"column {name!r}") for name in names}
    new = {}
    for p, c in todo.items():
        leaf = model.node_at(p)
        new[p] = leaf._bind_values(found[c.names[0]], c.names[0], f"{leaf.family} at path {_where(p)}")
    return replace_nodes(model, new)


def resolve_patterns(model: "Node", table: Table, columns: list[tuple[str, bool]] | None = None) -> "Node":
    """``model`` with every leaf's pattern of ``columns`` replaced by the names it matches
    among the table's numeric columns, in the table's order: ``"*"`` every one, a glob
    (``fnmatch``: ``"mean_*"``) those it matches; columns other leaves name and the
    ``sequence_id`` column are left out. The leaf's dimension becomes their number.
    ``columns``: the table's ``(name, numeric)`` when it is not read here (default:
    :func:`table_columns` of its source)."""
    patterns: dict[str, str] = {}
    tree, _ = column_tree(model, table.sequence_id, patterns)
    if not patterns:
        return model
    taken = set(needed_columns(tree)) | ({table.sequence_id} if table.sequence_id else set())
    columns = table_columns(table.source) if columns is None else columns
    numeric = [n for n, is_number in columns if is_number and n not in taken]
    new = {}
    for path, pattern in patterns.items():
        names = numeric if pattern == "*" else [n for n in numeric if fnmatch.fnmatchcase(n, pattern)]
        leaf = model.node_at(path)
        if not names:
            shown = ", ".join(numeric[:12]) + (", ..." if len(numeric) > 12 else "") if numeric else "none"
            raise DataError(f"the {leaf.family} at path {_where(path)} reads the columns {pattern!r}, which match no "
                            f"numeric column of the table (its numeric columns: {shown})")
        # the size the columns give (a vector leaf's dim), known already when its parameter is set
        size = next((f for f in leaf.schema if isinstance(f, Size) and f.by == "columns"), None)
        dim = None if size is None else leaf._sizes.get(size.name)
        if dim is not None and dim != len(names):
            raise DataError(f"the {leaf.family} at path {_where(path)} has dimension {dim}, but its columns "
                            f"{pattern!r} match {len(names)}: {names[:8]}")
        sized = {} if size is None else {size.name: len(names) if getattr(leaf, size.of) is None else None}
        new[path] = leaf.with_fields(columns=names, **sized)
    return replace_nodes(model, new)


def table_columns(source) -> list[tuple[str, bool]]:
    """``(name, numeric)`` of every column of a table, in order: numeric are integer and
    floating columns (not booleans). A CSV's types are those of its first MiB."""
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.exists():
            raise DataError(f"data file {str(path)!r} does not exist")
        file_columns(path)
        pa = pyarrow_module()
        try:
            if path.suffix.lower() == ".parquet":
                schema = pyarrow_module("pyarrow.parquet").ParquetFile(path).schema_arrow
            else:
                schema = csv_sample(path).schema
        except pa.ArrowException as e:
            raise arrow_error(path, e) from None
        return [(f.name, _arrow_numeric(f.type)) for f in schema]
    if isinstance(source, dict):
        return [(n, np.asarray(v).dtype.kind in "iuf") for n, v in source.items()]
    if hasattr(source, "schema") and hasattr(source, "column_names"):
        return [(f.name, _arrow_numeric(f.type)) for f in source.schema]
    return [(str(c), getattr(source[c].dtype, "kind", "O") in "iuf") for c in source.columns]


def _arrow_numeric(t) -> bool:
    pa = pyarrow_module()
    return pa.types.is_integer(t) or pa.types.is_floating(t)


def csv_sample(path: Path, limit: int = 1 << 20):
    """The first ``limit`` bytes of a CSV file's rows (whole lines), parsed as pyarrow infers
    them: the column types a reader of the file's parts uses."""
    pcsv = pyarrow_module("pyarrow.csv")
    with open(path, "rb") as f:
        sample = f.read(limit + 1)
    cut = sample.rfind(b"\n") + 1 if len(sample) > limit else len(sample)
    return pcsv.read_csv(io.BytesIO(sample[:cut] or sample), convert_options=csv_options())


def replace_nodes(node: "Node", new: dict, path: str = "") -> "Node":
    """The tree with the nodes at the paths of ``new`` replaced."""
    if path in new:
        return new[path]
    if node.is_leaf:
        return node
    kids = [replace_nodes(c, new, child_path(path, i)) for i, c in enumerate(node.children)]
    if all(a is b for a, b in zip(kids, node.children)):
        return node
    f = next(f for f in node.schema if isinstance(f, Children))
    return node.with_fields(**{f.name: kids if f.many else kids[0]})


def read_table(model: "Node", data) -> Data:
    """The table's columns the model reads, assembled into its encoding (tuples for
    records, ``Ragged`` for sequences); categorical columns encoded with their value lists."""
    table = as_table(data)
    tree, _ = column_tree(model, table.sequence_id)
    names = needed_columns(tree) + ([table.sequence_id] if table.sequence_id else [])
    cols = read_columns(table.source, list(dict.fromkeys(names)))
    keep = missing_rows(cols, table.drop_missing)
    if keep is not None:
        cols = {n: (x[keep], None) for n, (x, _) in cols.items()}
    offsets = None
    if table.sequence_id is not None:
        offsets = group_offsets(cols[table.sequence_id][0], table.sequence_id)
    return assemble(value_lists(model, tree), tree, {n: x for n, (x, _) in cols.items()}, offsets)


def missing_rows(cols: dict, drop: bool, first_row: int = 0) -> np.ndarray | None:
    """None when no value is missing; else refuses naming the column and first row, or
    (``drop``) returns the mask of rows kept and warns how many were dropped."""
    bad = None
    for name, (_, miss) in cols.items():
        if miss is None:
            continue
        if not drop:
            row = first_row + int(np.argmax(miss))
            how = hint("Table(path, drop_missing=True)", "[data] drop_missing = true")
            raise DataError(f"column {name!r} has a missing value (null, NaN or an empty field) at row {row}; "
                            f"drop such rows with {how}")
        bad = miss.copy() if bad is None else (bad | miss)
    if bad is None:
        return None
    warnings.warn(f"dropped {int(bad.sum())} of {bad.size} rows with a missing value", UserWarning, stacklevel=3)
    return ~bad


def group_offsets(ids: np.ndarray, name: str, first_row: int = 0) -> np.ndarray:
    """Offsets of the runs of equal ``ids`` (one sequence each); a value in two runs is
    refused, since rows of one sequence must be contiguous."""
    n = ids.shape[0]
    if n == 0:
        return np.zeros(1, dtype=np.int64)
    change = np.flatnonzero(ids[1:] != ids[:-1]) + 1
    starts = np.concatenate([[0], change]).astype(np.int64)
    firsts = ids[starts]
    uniq, first_at = np.unique(firsts, return_index=True)
    if uniq.size != starts.size:
        seen = np.zeros(starts.size, dtype=bool)
        seen[first_at] = True
        j = int(np.argmin(seen))
        value = firsts[j]
        earlier = int(starts[np.flatnonzero(firsts[:j] == value)[0]])
        raise DataError(f"sequence_id column {name!r}: value {value!r} appears in separate runs (rows "
                        f"{first_row + earlier} and {first_row + int(starts[j])}); the rows of one sequence must be "
                        f"contiguous and in order (sort the table by {name!r}, keeping the order within each)")
    return np.concatenate([starts, [n]]).astype(np.int64)


def value_lists(model: "Node", tree) -> dict[str, tuple | None]:
    """The value list of every categorical column's leaf in ``tree``, by path (None: the
    column holds the codes): what :func:`assemble` encodes with."""
    return {c.path: model.node_at(c.path).values for c in leaf_columns(tree) if c.kind == "cat"}


def assemble(values: dict[str, tuple | None], tree, cols: dict[str, np.ndarray], offsets: np.ndarray | None) -> Data:
    """The model's data from raw columns by name, as :func:`column_tree` lays it out, each
    categorical column encoded under its leaf's value list (``values``, :func:`value_lists`)."""
    if isinstance(tree, Col):
        if tree.kind == "vec":
            return vector_rows(np.asarray(cols[n], dtype=np.float64) for n in tree.names)
        x = cols[tree.names[0]]
        if tree.kind == "cat" and values.get(tree.path) is not None:  # a value_coded leaf: its codes
            return encode_values(x, values[tree.path], f"column {tree.names[0]!r}")
        return x
    if isinstance(tree, Seq):
        return Ragged(assemble(values, tree.values, cols, None), offsets)
    return tuple(assemble(values, t, cols, offsets) for t in tree)
