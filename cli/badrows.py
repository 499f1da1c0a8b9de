"""Rows of a table that a fitted model cannot score, found all at once (``emgrid predict``).

:func:`read_scorable` reads the columns a model reads from a ``.csv`` / ``.parquet`` file (or
any table ``models.tables`` reads) and finds, per column, every row that cannot be scored:

- a missing value (null, NaN, an empty field);
- a value a ``Categorical`` did not see when it was fitted;
- a number outside its leaf's support: not finite, not a number, not an integer where the
  leaf counts, negative where the leaf refuses negatives (the leaf itself is asked, so the
  rule lives with its family).

``on_bad_row="error"`` turns every problem of the file into one :class:`DataError` line
(each column, each kind, the counts and the first rows); ``"skip"`` returns the data with
each bad row filled by a value its leaf accepts, plus the mask of those rows, so the caller
writes an empty answer there and output row ``i`` stays input row ``i``. Under a
``sequence_id`` a bad position makes its whole sequence (one data row) bad.
Rows are counted from 0, the header not counted, as ``models.tables`` counts them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from emgrid.models.columns import encode_values
from emgrid.models.errors import DataError
from emgrid.models.tables import as_table, assemble, column_tree, group_offsets, needed_columns, read_columns, value_lists

#: how many row numbers a message shows per problem
SHOWN_ROWS = 5
#: each kind of problem, as one row and as several say it
KINDS = {
    "missing": ("missing value (null, NaN or an empty field)", "missing values (null, NaN or an empty field)"),
    "text": ("value that is not a number", "values that are not numbers"),
    "infinite": ("value that is not finite", "values that are not finite"),
    "fraction": ("value that is not an integer", "values that are not integers"),
    "negative": ("negative value", "negative values"),
    "unseen": ("value not seen when the model was fitted", "values not seen when the model was fitted"),
}


@dataclass
class Problem:
    """One kind of problem in one column: its rows, and the values at fault (when telling)."""

    column: str
    kind: str
    rows: np.ndarray
    values: list = field(default_factory=list)

    def describe(self) -> str:
        n = int(self.rows.size)
        shown = ", ".join(str(int(r)) for r in self.rows[:SHOWN_ROWS]) + (", ..." if n > SHOWN_ROWS else "")
        what = f" ({', '.join(repr(v) for v in self.values[:4])}{', ...' if len(self.values) > 4 else ''})" \
            if self.values else ""
        kind = KINDS[self.kind][n > 1]
        return f"column {self.column!r}: {n} {kind}{what} at row{'s' if n > 1 else ''} {shown}"


def problems_message(where: str, problems: list[Problem], bad_rows: int, n: int) -> str:
    kinds = "; ".join(p.describe() for p in problems)
    return (f"{where}: {bad_rows} of {n} rows cannot be scored (rows counted from 0): {kinds}; "
            f"--on-bad-row skip writes them with an empty label and NaN probabilities")


def _accepts(leaf, value: float) -> bool:
    try:
        leaf._prepare(np.array([value]), "probe")
    except DataError:
        return False
    return True


def _as_numbers(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``x`` as float64 and the mask of entries that are not numbers at all (text)."""
    if x.dtype.kind in "fiub":
        return x.astype(np.float64), np.zeros(x.shape[0], dtype=bool)
    out = np.empty(x.shape[0], dtype=np.float64)
    text = np.zeros(x.shape[0], dtype=bool)
    for i, v in enumerate(x.tolist()):
        try:
            out[i] = float(v) if not isinstance(v, str) else float(v.strip())
        except (TypeError, ValueError):
            out[i], text[i] = 0.0, True
    return out, text


def _numeric_problems(leaf, name: str, x: np.ndarray, missing: np.ndarray, counts: bool) -> list[Problem]:
    nums, text = _as_numbers(x)
    ok = ~missing
    found = []
    if text[ok].any():
        bad = text & ok
        found.append(Problem(name, "text", np.flatnonzero(bad),
                             list(dict.fromkeys(x[bad].tolist()))))
    good = ok & ~text
    inf = good & ~np.isfinite(nums)
    if inf.any():
        found.append(Problem(name, "infinite", np.flatnonzero(inf)))
    good &= ~inf
    if counts:
        frac = good & (nums != np.round(nums))
        if frac.any():
            found.append(Problem(name, "fraction", np.flatnonzero(frac)))
        good &= ~frac
    if not _accepts(leaf, -1.0):
        neg = good & (nums < 0)
        if neg.any():
            found.append(Problem(name, "negative", np.flatnonzero(neg)))
    return found


def _unseen(leaf, name: str, x: np.ndarray, missing: np.ndarray) -> list[Problem]:
    ok = ~missing
    try:
        uniq = list(dict.fromkeys(x[ok].tolist()))
    except TypeError:  # pragma: no cover - unhashable cells are refused by models.tables
        return []
    unseen = []
    for v in uniq:
        try:
            encode_values(np.array([v], dtype=x.dtype if x.dtype.kind != "U" else object), leaf.values, name)
        except DataError:
            unseen.append(v)
    if not unseen:
        return []
    odd = set(unseen)
    bad = ok & np.fromiter((v in odd for v in x.tolist()), dtype=bool, count=x.shape[0])
    return [Problem(name, "unseen", np.flatnonzero(bad), unseen)]


@dataclass
class Scorable:
    """The data to score (bad rows filled), the mask of bad data rows (None: none), the
    problems found and the number of data rows."""

    data: object
    bad: np.ndarray | None
    problems: list[Problem]
    n_rows: int


def read_scorable(model, source, where: str, *, sequence_id: str | None = None, on_bad_row: str = "error") -> Scorable:
    """See the module: the table ``source`` read for ``model``, every unscorable row found."""
    table = as_table(source)
    sequence_id = sequence_id if sequence_id is not None else table.sequence_id
    tree, reads = column_tree(model, sequence_id)
    names = list(dict.fromkeys(needed_columns(tree) + ([sequence_id] if sequence_id else [])))
    cols = read_columns(table.source, names)
    n = next(iter(cols.values()))[0].shape[0] if cols else 0
    if n == 0:
        raise DataError(f"{where}: the table has no rows")
    problems: list[Problem] = []
    missing = {}
    for name, (x, miss) in cols.items():
        missing[name] = np.zeros(n, dtype=bool) if miss is None else np.asarray(miss, dtype=bool)
        if missing[name].any():
            problems.append(Problem(name, "missing", np.flatnonzero(missing[name])))
    if sequence_id is not None and missing[sequence_id].any():
        raise DataError(f"{where}: sequence_id column {sequence_id!r} has {int(missing[sequence_id].sum())} missing "
                        f"value(s) (rows {', '.join(str(r) for r in np.flatnonzero(missing[sequence_id])[:SHOWN_ROWS])}); "
                        "a row without a sequence cannot be placed")
    seen = set()
    for path, col in reads.items():
        leaf = model.node_at(path)
        for name in col.names:
            if (name, col.kind, leaf.family) in seen:  # a mixture's components read one column alike
                continue
            seen.add((name, col.kind, leaf.family))
            x, miss = cols[name][0], missing[name]
            if col.kind == "cat" and getattr(leaf, "values", None) is not None:
                problems += _unseen(leaf, name, x, miss)
            elif col.kind != "cat":
                problems += _numeric_problems(leaf, name, x, miss, counts=col.kind == "int")
    bad_table = np.zeros(n, dtype=bool)
    for p in problems:
        bad_table[p.rows] = True
    offsets = group_offsets(cols[sequence_id][0], sequence_id) if sequence_id is not None else None
    if offsets is None:
        bad = bad_table
    else:  # one data row per sequence: bad when any of its positions is
        bad = np.logical_or.reduceat(bad_table, offsets[:-1]) if n else np.zeros(0, dtype=bool)
    n_data = bad.shape[0]
    if problems and on_bad_row == "error":
        problems.sort(key=lambda p: (list(cols).index(p.column), int(p.rows[0])))
        if offsets is not None:
            where = f"{where} (positions of {n_data} sequences)"
        raise DataError(problems_message(where, problems, int(bad_table.sum()), n))
    raw = {name: _filled(model, reads, name, x, bad_table) for name, (x, _) in cols.items()}
    data = assemble(value_lists(model, tree), tree, raw, offsets)
    return Scorable(data=data, bad=bad if bad.any() else None, problems=problems, n_rows=n_data)


def _filled(model, reads, name: str, x: np.ndarray, bad: np.ndarray) -> np.ndarray:
    """Column ``name`` with every bad row replaced by a value its leaves accept."""
    if not bad.any():
        return x
    cats = [model.node_at(p) for p, c in reads.items() if name in c.names and c.kind == "cat"]
    if cats and getattr(cats[0], "values", None):
        fill = cats[0].values[0]
        out = x.astype(object) if x.dtype.kind not in "O" else x.copy()
        out[bad] = fill
        if all(not isinstance(v, str) for v in cats[0].values) and x.dtype.kind in "iufb":
            out = out.astype(x.dtype)
        return out
    good = np.flatnonzero(~bad)
    if good.size:
        nums, _ = _as_numbers(x[good[:1]])
        fill = nums[0]
    else:
        fill = 0.0
    out, _ = _as_numbers(x)
    out[bad] = fill
    if x.dtype.kind in "iu":
        return out.astype(x.dtype)
    return out


def missing_mask(model, source, sequence_id: str | None = None) -> np.ndarray:
    """The rows of the table ``source`` with a missing value in a column ``model`` reads (those
    ``[data] drop_missing`` leaves out of a fit)."""
    tree, _ = column_tree(model, sequence_id)
    names = list(dict.fromkeys(needed_columns(tree) + ([sequence_id] if sequence_id else [])))
    cols = read_columns(as_table(source).source, names)
    n = next(iter(cols.values()))[0].shape[0]
    out = np.zeros(n, dtype=bool)
    for _, miss in cols.values():
        if miss is not None:
            out |= np.asarray(miss, dtype=bool)
    return out
