"""A Spark DataFrame as data, read where it lives: by column name, with the rules of every
table (:mod:`emgrid.models.tables`), its rows never collected on the driver.

:meth:`SparkFrame.bind` binds a model to the DataFrame with Spark doing the reading: the
numeric columns a leaf's pattern (``"*"``) matches come from the DataFrame's schema, a
categorical column's value list from a ``distinct`` of that column, the row count from a
``count``; ``drop_missing`` drops the rows with a null or NaN in a column the model reads
(``dropna``, counted). Its rows are numbered in the DataFrame's order (``zipWithIndex``), the
order ``toPandas`` gives, so a plan's row ranges mean the same rows as for that table.

- The seeding sample (:func:`emgrid.models.init.initialize`) is read by its rows' global
  indices (:meth:`SparkFrame.rows_at`: a filter on the index, only those rows come to the
  driver), so every executor starts from the same rows.
- Each grid cell's rows come from the DataFrame's partitions straight to the executor that
  runs the cell: :meth:`SparkFrame.by_cell` routes every row to the cells of its replica
  (one partition per cell, in grid order) and :func:`cell_rows` assembles a partition into
  the model's data (categorical columns encoded with their value lists), then keeps only
  the columns the cell's shard reads.

Sequences (``sequence_id``) are not read from a Spark DataFrame: a sequence's rows would have
to stay on one replica, which the row ranges of a plan of rows do not say.
"""

from __future__ import annotations

import pickle
import warnings

import numpy as np

from emgrid.models import Node
from emgrid.models.data import Data
from emgrid.models.errors import DataError
from emgrid.models.init import data_shapes_unset
from emgrid.models.tables import (Table, as_table, assemble, bind, check_columns, column_arrays, column_tree,
                                  missing_rows, needed_columns, value_lists)

from .step import PROTOCOL, WorkerSpec

#: Spark SQL type names (``DataType.typeName()``) of the columns a pattern of numeric columns
#: matches, as :func:`emgrid.models.tables.table_columns` counts a table's numeric columns.
NUMERIC_TYPES = frozenset({"byte", "short", "integer", "long", "float", "double"})


def is_spark_frame(data) -> bool:
    """Whether ``data`` is a Spark DataFrame, or a :class:`Table` of one."""
    source = data.source if isinstance(data, Table) else data
    return (type(source).__module__ or "").startswith("pyspark.sql") and hasattr(source, "sparkSession")


class SparkFrame:
    """A Spark DataFrame bound to a model (:meth:`bind`): ``names`` the columns it reads,
    ``n_rows`` its rows (after ``drop_missing``)."""

    def __init__(self, df, tree, values: dict, names: list[str], n_rows: int):
        self.df, self.tree, self.values, self.names, self.n_rows = df, tree, values, names, n_rows
        self._offsets: list[int] | None = None

    @classmethod
    def bind(cls, data, model: Node) -> tuple["SparkFrame", Node]:
        """The DataFrame (or its :class:`Table`) and ``model`` bound to it (see the module)."""
        table = as_table(data)
        df = table.source
        if table.sequence_id is not None:
            raise DataError(f"sequence_id={table.sequence_id!r}: sequences are not read from a Spark DataFrame; "
                            "write it to Parquet sorted by the id and fit the file with another executor")
        columns = [(f.name, f.dataType.typeName() in NUMERIC_TYPES) for f in df.schema.fields]
        check_columns(needed_columns(column_tree(model, None, {})[0]), [n for n, _ in columns], "the DataFrame")

        def distinct(name: str) -> np.ndarray:
            got = [r[0] for r in df.select(name).distinct().collect() if r[0] is not None and r[0] == r[0]]
            return np.array(got, dtype=object)

        model = bind(model, table, columns, distinct)
        tree, _ = column_tree(model, None)
        names = needed_columns(tree)
        unset = data_shapes_unset(model)
        if unset:
            shown = ", ".join(f"{p or '<root>'}.{f}" for p, f in unset)
            raise DataError(f"the sizes {shown} "
                            "are taken from the data's values, which a Spark DataFrame is not read for: set them "
                            "(a categorical's values come from its column)")
        # rows numbered on the DataFrame as given (a projection first could change the order of
        # a repartitioned one), the columns read taken in the tasks
        frame = df
        n = frame.count()
        if table.drop_missing:
            frame = frame.dropna(subset=names)
            kept = frame.count()
            if kept < n:
                warnings.warn(f"dropped {n - kept} of {n} rows with a missing value", UserWarning, stacklevel=3)
            n = kept
        if n == 0:
            raise DataError("the DataFrame has no rows")
        return cls(frame, tree, value_lists(model, tree), names, n), model

    def n_observations(self) -> int:
        """The ``n`` of BIC: its rows (a DataFrame holds no sequences here)."""
        return self.n_rows

    def offsets(self) -> list[int]:
        """The global index of each partition's first row (and the row count last): the
        partitions' sizes, counted where they are."""
        if self._offsets is None:
            def count(batches):
                import pyarrow as pa
                from pyspark import TaskContext

                n = sum(b.num_rows for b in batches)
                yield pa.RecordBatch.from_pydict({"part": [TaskContext.get().partitionId()], "n": [n]},
                                                 schema=pa.schema([("part", pa.int32()), ("n", pa.int64())]))

            sizes = dict(self.df.mapInArrow(count, "part int, n long").collect())
            self._offsets = [0]
            for p in range(max(sizes, default=-1) + 1):
                self._offsets.append(self._offsets[-1] + sizes.get(p, 0))
        return self._offsets

    def _blocks(self, pick):
        """A DataFrame of ``(cell, first, blob)`` made where the rows are: ``pick(lo, hi)``
        says, for a batch of the global rows ``lo:hi``, which ``(cell, first, rows)`` to
        make, ``rows`` a slice or the positions of the rows in the batch, ``first`` the first
        one's global index; a ``blob`` is those rows' columns
        (:func:`emgrid.models.tables.column_arrays` of the columns read), pickled once."""
        offsets, names = self.offsets(), self.names

        def split(batches):
            import pyarrow as pa
            from pyspark import TaskContext

            schema = pa.schema([("cell", pa.int32()), ("first", pa.int64()), ("blob", pa.binary())])
            first = offsets[TaskContext.get().partitionId()]
            for b in batches:
                lo, hi = first, first + b.num_rows
                first = hi
                made: dict[tuple[int, int], bytes] = {}
                out = {"cell": [], "first": [], "blob": []}
                for cell, at, rows in pick(lo, hi):
                    key = (rows.start, rows.stop) if isinstance(rows, slice) else None
                    blob = made.get(key) if key is not None else None
                    if blob is None:
                        part = (b.slice(rows.start, rows.stop - rows.start) if isinstance(rows, slice)
                                else b.take(pa.array(rows)))
                        blob = pickle.dumps({n: column_arrays(part.column(n), n) for n in names}, protocol=PROTOCOL)
                        if key is not None:
                            made[key] = blob
                    out["cell"].append(cell)
                    out["first"].append(at)
                    out["blob"].append(blob)
                if out["cell"]:
                    yield pa.RecordBatch.from_pydict(out, schema=schema)

        return self.df.mapInArrow(split, "cell int, first long, blob binary")

    def rows_at(self, index: np.ndarray) -> Data:
        """The rows of the global indices ``index`` (sorted), as the model's data in memory:
        only they come to the driver."""
        wanted = np.asarray(index, dtype=np.int64)

        def pick(lo, hi):
            a, z = np.searchsorted(wanted, [lo, hi])
            return [(0, int(wanted[a]), wanted[a:z] - lo)] if z > a else []

        got = sorted((r[1], r[2]) for r in self._blocks(pick).collect())
        cols = join_blocks(self.names, [blob for _, blob in got])
        for name, (_, miss) in cols.items():  # refused naming the missing value's global row
            if miss is not None and miss.any():
                k = int(np.argmax(miss))
                missing_rows({name: (None, miss[k:])}, False, int(wanted[k]))
        return assemble(self.values, self.tree, {n: x for n, (x, _) in cols.items()}, None)

    def by_cell(self, starts: list[int], m: int):
        """An RDD with one partition per grid cell (grid order ``r * m + s``), cell ``(r, s)``'s
        holding ``(first, blob)`` blocks of the rows of replica ``r`` (the replicas' first
        rows ``starts``), in no particular order."""
        d = len(starts)
        bounds = [*starts, self.n_rows]

        def pick(lo, hi):
            out = []
            for r in range(d):
                a, z = max(lo, bounds[r]), min(hi, bounds[r + 1])
                if a < z:
                    out.extend((r * m + s, a, slice(a - lo, z - lo)) for s in range(m))
            return out

        return (self._blocks(pick).rdd.map(lambda row: (row[0], (row[1], row[2])))
                .partitionBy(d * m, lambda key: key).values())

    def reader(self) -> "RowReader":
        """What a cell needs to assemble its rows (small: no rows, no model)."""
        return RowReader(self.tree, self.values, self.names)


class RowReader:
    """How rows (tuples of the read columns' values) become the model's data: the column
    tree, the categorical leaves' value lists, the columns' names in the tuples' order."""

    def __init__(self, tree, values: dict, names: list[str]):
        self.tree, self.values, self.names = tree, values, names


def join_blocks(names: list[str], blobs: list[bytes]) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
    """The columns of pickled blocks (in order) joined: ``(values, missing)`` by name."""
    parts = [pickle.loads(b) for b in blobs]
    out = {}
    for n in names:
        values = [p[n][0] for p in parts]
        x = np.concatenate(values) if values else np.zeros(0)
        misses = [p[n][1] for p in parts]
        miss = None
        if any(mm is not None for mm in misses):
            miss = np.concatenate([np.zeros(len(v), dtype=bool) if mm is None else mm for v, mm in zip(values, misses)])
        out[n] = (x, miss)
    return out


def cell_rows(reader: "RowReader", spec: WorkerSpec, part: Node, blocks) -> Data:
    """A cell's partition (``(first, blob)`` blocks of its replica's rows) as its rows: in
    order, checked to be exactly rows ``spec.start:spec.stop`` (a source that gave other
    rows when read again would make it fit other data), only its shard's columns."""
    got = sorted(blocks, key=lambda block: block[0])
    cols = join_blocks(reader.names, [blob for _, blob in got])
    n = len(next(iter(cols.values()))[0]) if cols else 0
    firsts = [f for f, _ in got]
    if n != spec.stop - spec.start or (firsts and firsts[0] != spec.start):
        raise DataError(f"worker {spec.name!r} was to read rows {spec.start}:{spec.stop} of the DataFrame but got "
                        f"{n} rows; the DataFrame must give the same rows each time it is read (cache or "
                        "checkpoint one whose source changes)")
    missing_rows(cols, False, spec.start)
    data = assemble(reader.values, reader.tree, {name: x for name, (x, _) in cols.items()}, None)
    return spec.view.columns_for(spec.shard, part, data)
