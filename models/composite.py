"""Composite: a record whose fields are independent children."""

from __future__ import annotations

import numpy as np

from collections.abc import Mapping

from .base import Internal
from .cost import NodeCost
from .data import n_rows
from .errors import DataError, ModelError
from .schema import Children, Meta


def _names(value, what: str) -> tuple[str, ...]:
    if isinstance(value, str) or not hasattr(value, "__iter__"):
        raise ModelError(f"Composite.{what} must be a list of names, got {value!r}")
    names = tuple(value)
    for n in names:
        if not isinstance(n, str) or not n:
            raise ModelError(f"Composite.{what} must hold non-empty strings, got {n!r}")
    if len(set(names)) != len(names):
        dup = next(n for i, n in enumerate(names) if n in names[:i])
        raise ModelError(f"Composite.{what} must be distinct, got {dup!r} twice")
    return names


class Composite(Internal):
    """A record: data is a tuple with one column per child; the density is their product.

    ``Composite([a, b])`` has positional fields; ``Composite({"age": a, "pos": b})`` names
    them (order kept), and a table (``models.tables``) is then read by column name: a
    scalar field reads the column of its name, a vector field of dimension ``d`` the columns
    ``columns[name]`` when given, else ``name.0`` .. ``name.{d-1}``. Its spec holds
    ``fields`` (and ``columns``) beside ``children``; a positional record's spec has neither.
    """

    family = "Composite"
    schema = (Children("children"), Meta("fields"), Meta("columns"))
    has_own_stats = False

    def __init__(self, children, *, fields=None, columns=None):
        if isinstance(children, Mapping):
            if fields is not None:
                raise ModelError("Composite takes its field names from a mapping or from fields=, not both")
            fields, children = list(children.keys()), list(children.values())
        children = list(children) if not isinstance(children, (list, tuple)) else children
        fields = None if fields is None else _names(fields, "fields")
        if fields is not None and len(fields) != len(children):
            raise ModelError(f"Composite.fields names {len(fields)} field(s) for {len(children)} children")
        if columns is not None:
            if fields is None:
                raise ModelError("Composite.columns needs named fields (a mapping of name to child)")
            if not isinstance(columns, Mapping):
                raise ModelError(f"Composite.columns must map a field name to its column names, got {columns!r}")
            columns = {k: _names(v, f"columns[{k!r}]") for k, v in columns.items()}
            for k in columns:
                if k not in fields:
                    raise ModelError(f"Composite.columns names field {k!r}, which is not one of {list(fields)}")
        self._init_fields(children=children, fields=fields, columns=columns or None)

    def column_names(self, i: int) -> tuple[str, ...] | None:
        """The table columns field ``i`` reads (None for a positional record)."""
        if self.fields is None:
            return None
        name = self.fields[i]
        if self.columns and name in self.columns:
            return self.columns[name]
        t = self.children[i].data_type()
        if t.startswith("vec["):
            return tuple(f"{name}.{j}" for j in range(int(t[4:-1])))
        return (name,)

    def describe(self):
        return f"Composite of {len(self.children)}"

    def data_type(self):
        if self.fields is None:
            return "(" + ", ".join(c.data_type() for c in self.children) + ")"
        parts = []
        for i, c in enumerate(self.children):
            cols = self.column_names(i)
            named = "" if cols == (self.fields[i],) else "[" + ",".join(cols) + "]"
            parts.append(f"{self.fields[i]}{named}: {c.data_type()}")
        return "(" + ", ".join(parts) + ")"

    def _prepare(self, data, where):
        if not isinstance(data, (tuple, list)):
            raise DataError(f"{where}: Composite expects a tuple of {len(self.children)} columns, got {type(data).__name__}")
        if len(data) != len(self.children):
            raise DataError(f"{where}: Composite expects {len(self.children)} fields, got {len(data)}")
        cols = tuple(c._prepare(d, f"{where}[{i}]") for i, (c, d) in enumerate(zip(self.children, data)))
        rows = [n_rows(c) for c in cols]
        if len(set(rows)) > 1:
            raise DataError(f"{where}: Composite fields must have equal row counts, got {rows}")
        return cols

    def _child_data(self, data, i):
        return data[i]

    def _combine(self, data, child_lds, shifted):
        total = np.array(child_lds[0], dtype=np.float64, copy=True)
        for ld in child_lds[1:]:
            total += ld
        return total, None

    def _distribute(self, data, w, child_lds, ld, aux):
        return [w] * len(self.children), ()

    def _estimate(self, own, children):
        return self.with_fields(children=list(children))

    def rows_needed(self):
        return max(c.rows_needed() for c in self.children)

    def _sample(self, n, rng):
        return tuple(c._sample(n, rng) for c in self.children)

    def cost(self):
        c = len(self.children)
        # one copy and c - 1 additions of the children's log densities
        return NodeCost(flops_per_row=float(c), param_bytes=0, stat_bytes=0, data_bytes_per_row=0.0,
                        coupling_bytes_per_row=8.0 * c, work_bytes_per_row=8.0)
