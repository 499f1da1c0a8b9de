"""Checks that turn a user's column into the canonical encoding of one leaf (``_prepare``),
and the rule for the column a mixture's or an HMM's children read together."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .data import Data, Ragged
from .errors import DataError, ModelError

if TYPE_CHECKING:
    from .base import Node


#: The largest magnitude a float datum may have: EM sums squares (and products of a vector's
#: entries) over the rows, which stay finite for any number of rows below this.
MAX_ABS_VALUE = 1e100
#: Rows of a column read at a time where it may be memory-mapped (:func:`column_max`).
CHUNK_ROWS = 1 << 20


def check_floats(x: np.ndarray, where: str, family: str, first_row: int = 0) -> None:
    """Refuses (DataError) NaN, inf or a magnitude above :data:`MAX_ABS_VALUE` in a float
    column ``(n,)`` or vector ``(n, d)``, naming the first such row (counted from
    ``first_row``) and, for a vector, its entry."""
    ok = np.abs(x) <= MAX_ABS_VALUE  # False for NaN
    if ok.all():
        return
    flat = int(np.argmin(ok.reshape(-1)))
    row, entry = divmod(flat, x.shape[1]) if x.ndim == 2 else (flat, None)
    v = float(x.reshape(-1)[flat])
    at = f"row {first_row + row}" + ("" if entry is None else f", entry {entry}")
    if np.isfinite(v):
        raise DataError(f"{where}: {family} data holds {v:g} at {at}; values must be within +-{MAX_ABS_VALUE:g} "
                        "(their squares are summed over the rows): rescale the column")
    raise DataError(f"{where}: {family} data holds NaN or inf (first at {at}: {v})")


def is_pattern(columns) -> bool:
    """Whether a leaf's ``columns`` still names its columns by a pattern (a string: ``"*"``,
    every numeric column, or a glob such as ``"mean_*"``) rather than by a list."""
    return isinstance(columns, str)


def leaf_columns(columns, dim, mean, family: str):
    """A vector leaf's ``columns`` (a pattern, or a tuple of distinct names) and its ``dim``:
    a list gives the dimension when neither ``dim`` nor ``mean`` does, and must agree with them
    otherwise."""
    if columns is None or is_pattern(columns):
        if is_pattern(columns) and not columns:
            raise ModelError(f"{family}.columns must be a list of column names or a pattern such as '*', got ''")
        return columns, dim
    if not hasattr(columns, "__iter__") or isinstance(columns, (bytes, dict)):
        raise ModelError(f"{family}.columns must be a list of column names or a pattern such as '*', got {columns!r}")
    names = tuple(columns)
    for n in names:
        if not isinstance(n, str) or not n:
            raise ModelError(f"{family}.columns must hold non-empty strings, got {n!r}")
    if len(set(names)) != len(names):
        dup = next(n for i, n in enumerate(names) if n in names[:i])
        raise ModelError(f"{family}.columns must be distinct, got {dup!r} twice")
    if not names:
        raise ModelError(f"{family}.columns must name at least one column")
    d = dim if dim is not None else (None if mean is None else int(np.shape(mean)[0]) if np.ndim(mean) == 1 else None)
    if d is not None and d != len(names):
        raise ModelError(f"{family}.columns names {len(names)} column(s) for a vector of dimension {d}")
    return names, (len(names) if dim is None and mean is None else dim)


def float_column(data, where: str, family: str) -> np.ndarray:
    """A finite float64 column of shape (n,)."""
    if isinstance(data, (tuple, Ragged)):
        raise DataError(f"{where}: {family} expects a 1-D float array, got {type(data).__name__}")
    try:
        x = np.asarray(data)
        if x.dtype.kind not in "biufO":
            raise DataError(f"{where}: {family} expects real numbers, got dtype {x.dtype}")
        x = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as e:
        if isinstance(e, DataError):
            raise
        raise DataError(f"{where}: {family} expects numbers, got {type(data).__name__}") from None
    if x.ndim != 1:
        raise DataError(f"{where}: {family} expects shape (n,), got {x.shape}")
    check_floats(x, where, family)
    return x


def int_column(data, where: str, family: str) -> np.ndarray:
    """An int64 column of shape (n,); floats are accepted only when integral."""
    if isinstance(data, (tuple, Ragged)):
        raise DataError(f"{where}: {family} expects a 1-D integer array, got {type(data).__name__}")
    x = np.asarray(data)
    if x.dtype.kind == "f":
        if not np.all(np.isfinite(x)):
            raise DataError(f"{where}: {family} data holds NaN or inf")
        if np.any(x != np.round(x)):
            raise DataError(f"{where}: {family} expects integers, got non-integral values such as {x[x != np.round(x)][0]}")
        big = np.abs(x) >= 2.0**63
        if np.any(big):
            raise DataError(f"{where}: {family} counts must be below 2**63 (int64), got {x[big][0]:g}")
        x = x.astype(np.int64)
    elif x.dtype.kind == "u" and x.size and x.max() >= 2**63:
        raise DataError(f"{where}: {family} counts must be below 2**63 (int64), got {x.max()}")
    elif x.dtype.kind not in "iub":
        raise DataError(f"{where}: {family} expects integers, got dtype {x.dtype}")
    if x.ndim != 1:
        raise DataError(f"{where}: {family} expects shape (n,), got {x.shape}")
    return x.astype(np.int64, copy=False)


def column_max(x) -> int:
    """The largest value of a non-empty integer column, read in chunks (it may be memory-mapped)."""
    return int(max(int(np.max(x[a:a + CHUNK_ROWS])) for a in range(0, len(x), CHUNK_ROWS)))


def _integral_if_float(x, where: str) -> np.ndarray:
    """A raw categorical column as an array; floats become int64 when every one is integral."""
    x = np.asarray(x)
    if x.dtype.kind == "f":
        with np.errstate(invalid="ignore"):
            bad = x[(x != np.round(x)) | ~(np.abs(x) < 2.0**63)]  # NaN, inf and beyond int64 too
        if bad.size:
            raise DataError(f"{where}: a categorical column holds floats; only integral floats within int64 are "
                            f"taken, got {float(bad[0]):g}")
        x = x.astype(np.int64)
    return x


def value_list(x: np.ndarray, where: str) -> list:
    """The distinct values of a raw column in code order (sorted), as JSON scalars; floats
    only when every one is integral."""
    x = _integral_if_float(x, where)
    if x.dtype.kind == "O":
        kinds = {type(v) for v in x.tolist()}
        if len(kinds) > 1:
            raise DataError(f"{where}: a categorical column must hold values of one type, got "
                            f"{', '.join(sorted(k.__name__ for k in kinds))}")
    try:
        uniq = np.unique(x)
    except TypeError as e:
        raise DataError(f"{where}: the values of a categorical column cannot be ordered ({e})") from None
    return [v.item() if isinstance(v, np.generic) else v for v in uniq.tolist()]


def _key(v):
    """A lookup key that keeps ``True`` apart from ``1`` and ``"1"`` apart from ``1``."""
    return (bool, v) if isinstance(v, (bool, np.bool_)) else ((int, int(v)) if isinstance(v, (int, np.integer)) else (type(v), v))


def encode_values(x: np.ndarray, values: tuple, where: str) -> np.ndarray:
    """Codes (int64) of a raw column under a value list; an unseen value is a DataError
    naming ``where`` and the value."""
    x = _integral_if_float(x, where)
    try:
        uniq, inverse = np.unique(x, return_inverse=True)
    except TypeError:  # values of mixed types: the first that does not belong is unseen
        uniq, inverse = np.array(list(dict.fromkeys(x.tolist())), dtype=object), None
    code = {_key(v): i for i, v in enumerate(values)}
    table = np.empty(uniq.size, dtype=np.int64)
    for j, v in enumerate(uniq.tolist()):
        if _key(v) not in code:
            shown = ", ".join(repr(a) for a in values[:8]) + (", ..." if len(values) > 8 else "")
            raise DataError(f"{where}: value {v!r} was not seen when the model was fitted (its values: {shown})")
        table[j] = code[_key(v)]
    if inverse is None:
        return np.array([code[_key(v)] for v in x.tolist()], dtype=np.int64)
    return table[inverse.reshape(-1)]


def prepare_by_any(children: tuple[Node, ...], data, where: str) -> Data:
    """Data of a node whose children share one data type (a mixture's components, an HMM's
    emissions), prepared by the first child whose support holds every row.

    The node's support is the union of its children's, and same-type leaves have nested
    supports (``Categorical`` values ``0..V-1`` inside a ``Poisson``'s counts, an
    ``Exponential``'s ``x >= 0`` inside a ``Gaussian``'s reals), so the order of the
    children does not decide which data are accepted. When no child accepts the data, the
    first child's error is raised.
    """
    first_error = None
    for child in children:
        try:
            return child._prepare(data, where)
        except DataError as e:
            if first_error is None:
                first_error = e
    raise first_error
