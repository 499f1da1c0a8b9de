"""Checks that turn a user's column into the canonical encoding of one leaf (``_prepare``),
and the rule for the column a mixture's or an HMM's children read together."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .data import Data, Ragged
from .errors import DataError

if TYPE_CHECKING:
    from .base import Node


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
    if not np.all(np.isfinite(x)):
        raise DataError(f"{where}: {family} data holds NaN or inf (first at row {int(np.argmin(np.isfinite(x)))})")
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
        x = x.astype(np.int64)
    elif x.dtype.kind not in "iub":
        raise DataError(f"{where}: {family} expects integers, got dtype {x.dtype}")
    if x.ndim != 1:
        raise DataError(f"{where}: {family} expects shape (n,), got {x.shape}")
    return x.astype(np.int64, copy=False)


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
