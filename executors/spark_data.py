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

import bisect
import warnings

import numpy as np

from emgrid.models import Node
from emgrid.models.data import Data
from emgrid.models.errors import DataError
from emgrid.models.init import data_shapes_unset
from emgrid.models.tables import (Table, as_table, assemble, bind, check_columns, column_arrays, column_tree,
                                  missing_rows, needed_columns, value_lists)

from .step import WorkerSpec

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

    def _indexed(self):
        """``(row values, global index)`` of every row, in the DataFrame's order: the values of
        the columns read, in ``names``' order."""
        at = [self.df.columns.index(n) for n in self.names]
        return self.df.rdd.zipWithIndex().map(lambda pair: (tuple(pair[0][j] for j in at), pair[1]))

    def rows_at(self, index: np.ndarray) -> Data:
        """The rows of the global indices ``index`` (sorted), as the model's data in memory:
        only they come to the driver."""
        sc = self.df.sparkSession.sparkContext
        wanted = sc.broadcast(frozenset(int(i) for i in index))
        try:
            got = self._indexed().filter(lambda pair: pair[1] in wanted.value).collect()
        finally:
            wanted.unpersist()
        got.sort(key=lambda pair: pair[1])
        return assemble_rows(self, [values for values, _ in got], int(index[0]) if len(index) else 0)

    def by_cell(self, starts: list[int], m: int):
        """An RDD with one partition per grid cell (grid order ``r * m + s``), cell ``(r, s)``'s
        holding ``(index, row values)`` of every row of replica ``r`` (the replicas' first
        rows ``starts``), in no particular order."""
        d = len(starts)

        def route(pair):
            values, i = pair
            r = bisect.bisect_right(starts, i) - 1
            for s in range(m):
                yield r * m + s, (i, values)

        return self._indexed().flatMap(route).partitionBy(d * m, lambda key: key).values()

    def reader(self) -> "RowReader":
        """What a cell needs to assemble its rows (small: no rows, no model)."""
        return RowReader(self.tree, self.values, self.names)


class RowReader:
    """How rows (tuples of the read columns' values) become the model's data: the column
    tree, the categorical leaves' value lists, the columns' names in the tuples' order."""

    def __init__(self, tree, values: dict, names: list[str]):
        self.tree, self.values, self.names = tree, values, names


def assemble_rows(reader, rows: list[tuple], first_row: int) -> Data:
    """``rows`` (tuples in ``reader.names``' order, the first being global row ``first_row``)
    as the model's data; a missing value is refused naming its column and global row."""
    cols = {}
    for j, name in enumerate(reader.names):
        raw = [row[j] for row in rows]
        x = np.asarray(raw) if raw and not any(v is None for v in raw) else np.array(raw, dtype=object)
        cols[name] = column_arrays(x, name)
    missing_rows(cols, False, first_row)
    return assemble(reader.values, reader.tree, {n: x for n, (x, _) in cols.items()}, None)


def cell_rows(reader: RowReader, spec: WorkerSpec, part: Node, pairs) -> Data:
    """A cell's partition (``(index, row values)`` of its replica's rows) as its rows: sorted
    by index, checked to be exactly rows ``spec.start:spec.stop`` (a source that gave other
    rows when read again would make it fit other data), only its shard's columns."""
    got = sorted(pairs, key=lambda pair: pair[0])
    index = np.fromiter((i for i, _ in got), dtype=np.int64, count=len(got))
    if index.size != spec.stop - spec.start or (index.size and (index[0] != spec.start or index[-1] != spec.stop - 1)):
        raise DataError(f"worker {spec.name!r} was to read rows {spec.start}:{spec.stop} of the DataFrame but got "
                        f"{index.size} rows; the DataFrame must give the same rows each time it is read (cache or "
                        "checkpoint one whose source changes)")
    data = assemble_rows(reader, [values for _, values in got], spec.start)
    return spec.view.columns_for(spec.shard, part, data)
