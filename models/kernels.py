"""Numeric building blocks of the batched kernels, independent of any family.

- BLAS chunking: products of a short parameter matrix with a wide feature block are split
  along the data rows into calls of ``m * n * k <= SMALL_GEMM_MNK``, the range OpenBLAS runs
  with its small-matrix kernels (:func:`matmul_cols`, :func:`weighted_sums`,
  :func:`weighted_sums_t`).
- Copies that numpy's broadcasting makes slow: :func:`centered_t` (``(x - c).T``
  component-first) and :func:`coordinates` (``x.T`` with contiguous rows), which make a
  result's bits independent of the rows' memory order.
- The rounding-error guard of an expanded quadratic form (:func:`expanded_is_accurate`).
- float32 blocks (``optimize(..., dtype="float32")``): the products run in float32 on
  chunks of at most ``MAX_GEMM_COLS`` rows, and :func:`weighted_sums` and
  :func:`weighted_sums_t` add the chunks' sums in float64, so a statistic's rounding grows
  with a chunk's rows, not the block's or the data's.
- :func:`log_softmax_parts`: a log-sum-exp over components that keeps subnormal numbers out
  of later products (see ``models.floors.LOG_CLAMP``), and :func:`raise_to`, the floor it
  and the HMMs' emissions apply.
- :func:`stacked`: a cache of parameters stacked over a tuple of sibling leaves.
"""

from __future__ import annotations

import functools
import weakref

import numpy as np

from .floors import LOG_CLAMP

#: Largest ``m * n * k`` of one product call (see the module docstring).
SMALL_GEMM_MNK = 1_000_000
MAX_GEMM_COLS = 1024
#: Largest rounding error (absolute, per log density) accepted from an expanded form; a
#: block whose bound exceeds it is scored with the direct form instead. In float32 (unit
#: roundoff 6e-8) the bound is 1e-2, a worst case (every rounding one way) of which the
#: direct form's own float32 rounding is a few tenths on rows of typical spread.
EXPANDED_MAX_ERROR = {np.dtype(np.float64): 1e-9, np.dtype(np.float32): 1e-2}
UNIT_ROUNDOFF = float(np.finfo(np.float64).eps) / 2
#: Nats between the floor the unshifted log-sum-exp raises far terms to and every row's
#: largest term: such a term's weight is below e^-64 (1.6e-28) of its row's, so no sum of
#: them over any number of rows reaches ``MIN_WEIGHT`` (a component far from every row keeps
#: its parameters as under the shifted form, whose far terms weigh e^-700).
UNSHIFTED_MARGIN = 64.0

#: Stacked parameters of a tuple of sibling leaves, kept with the first leaf (weakly, so they
#: go with the model): ``{leaves[0]: (weak references to the leaves, value)}``.
_STACKED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def stacked(leaves, build):
    """``build(leaves)``, computed once per tuple of leaf objects (leaves are immutable)."""
    hit = _STACKED.get(leaves[0])
    if hit is not None and len(hit[0]) == len(leaves) and all(r() is g for r, g in zip(hit[0], leaves)):
        return hit[1]
    value = build(leaves)
    _STACKED[leaves[0]] = (tuple(weakref.ref(g) for g in leaves), value)
    return value


def gemm_cols(m: int, k: int) -> int:
    """Data rows per product of an ``(m, k)`` matrix with ``(k, rows)`` (see ``SMALL_GEMM_MNK``)."""
    return min(MAX_GEMM_COLS, max(64, SMALL_GEMM_MNK // max(m * k, 1) // 64 * 64))


def matmul_cols(A: np.ndarray, F: np.ndarray) -> np.ndarray:
    """``A @ F`` for a wide ``F``, computed in column chunks."""
    n = F.shape[1]
    out = np.empty((A.shape[0], n), dtype=np.result_type(A, F))
    cols = gemm_cols(*A.shape)
    for a in range(0, n, cols):
        b = min(n, a + cols)
        np.matmul(A, F[:, a:b], out=out[:, a:b])
    return out


def weighted_sums(W: np.ndarray, F: np.ndarray) -> np.ndarray:
    """``W @ F.T`` (sums over the data rows, shape ``(K, features)``, float64) in chunks of rows."""
    W = np.asarray(W, dtype=F.dtype if F.dtype == np.float32 else np.float64)
    n = F.shape[1]
    cols = gemm_cols(W.shape[0], F.shape[0])
    if n <= cols:
        return np.asarray(W @ F.T, dtype=np.float64)
    out = np.asarray(W[:, :cols] @ F[:, :cols].T, dtype=np.float64)
    part = np.empty(out.shape, dtype=W.dtype)
    for a in range(cols, n, cols):
        b = min(n, a + cols)
        np.matmul(W[:, a:b], F[:, a:b].T, out=part)
        out += part
    return out


def weighted_sums_t(F: np.ndarray, Wt: np.ndarray) -> np.ndarray:
    """``F @ Wt`` (sums over the data rows, shape ``(features, K)``, float64) in chunks of rows."""
    n = F.shape[1]
    cols = gemm_cols(F.shape[0], Wt.shape[1])
    if n <= cols:
        return np.asarray(F @ Wt, dtype=np.float64)
    out = np.asarray(F[:, :cols] @ Wt[:cols], dtype=np.float64)
    part = np.empty(out.shape, dtype=np.result_type(F, Wt))
    for a in range(cols, n, cols):
        b = min(n, a + cols)
        np.matmul(F[:, a:b], Wt[a:b], out=part)
        out += part
    return out


def centered_t(x: np.ndarray, c: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``(x - c).T`` of ``(n, d)`` rows into ``out`` (default: a new row-major float64
    ``(d, n)`` array), which it returns: one contiguous subtraction on column-major rows; on
    row-major ones the transposing copy in chunks of 1024 rows (both sides stay in L2), then
    the subtraction. The same bits either way (elementwise) when ``out`` has ``x``'s type."""
    if out is None:
        out = np.empty((x.shape[1], x.shape[0]))
    if x.strides[0] == x.itemsize:  # column-major rows: ``x.T``'s rows are contiguous
        np.subtract(x.T, c[:, None], out=out)
        return out
    _transpose_into(x, out)
    out -= c[:, None]
    return out


def _transpose_into(x: np.ndarray, out: np.ndarray) -> None:
    """``out[:] = x.T`` in chunks of 1024 rows (both sides stay in L2: two thirds of the time
    of one ``np.ascontiguousarray(x.T)`` at d=16)."""
    n = x.shape[0]
    for a in range(0, n, 1024):
        b = min(n, a + 1024)
        out[:, a:b] = x[a:b].T


def coordinates(x: np.ndarray) -> np.ndarray:
    """``x.T`` of ``(n, d)`` rows as a ``(d, n)`` array with contiguous rows: a view of
    column-major rows (or a row slice of them), a copy of row-major ones. A product over the
    rows computed from it gives the same bits whatever the rows' memory order (BLAS sums in
    another order for the other layout)."""
    if x.strides[0] == x.itemsize:
        return x.T
    out = np.empty((x.shape[1], x.shape[0]), dtype=x.dtype)
    _transpose_into(x, out)
    return out


def radius2(xc: np.ndarray) -> float:
    """The largest ``|xc|^2`` over the columns of ``xc`` (d, n)."""
    return float(np.einsum("ij,ij->j", xc, xc).max()) if xc.shape[1] else 0.0


def radius2_of_squares(sq: np.ndarray) -> float:
    """The largest column sum of ``sq`` (d, n), the squares of centered rows: ``radius2``
    of those rows, by a matrix-vector product (a third of the time of ``sq.sum(axis=0)``)."""
    return float((np.ones(sq.shape[0], dtype=sq.dtype) @ sq).max()) if sq.shape[1] else 0.0


def offset_matrix(P: np.ndarray, column: int, offsets) -> np.ndarray:
    """``P`` with per-component ``offsets`` added to its constant column (the one multiplying
    the ones row of a feature block): adding them in the product costs nothing."""
    if offsets is None:
        return P
    P = P.copy()
    P[:, column] += offsets
    return P


def expanded_is_accurate(r2: float, lam: np.ndarray, mc_norm: np.ndarray, pconst: np.ndarray, n_terms: int,
                         dtype=np.float64) -> bool:
    """Whether an expanded quadratic form ``P @ F`` computed in ``dtype`` is within
    ``EXPANDED_MAX_ERROR[dtype]`` of every value, for a block whose rows have ``|x - c|^2 <= r2``.

    Per component, each value is a dot product whose terms' absolute values sum to at most
    ``lam * (r^2 / 2 + mc_norm * r) + pconst`` (quadratic, linear and constant terms); its
    rounding error, the products, the centering and the coefficients of ``P`` included, is at
    most ``n_terms * u`` times that, ``u`` the unit roundoff of ``dtype``.
    """
    r = np.sqrt(r2)
    magnitude = float(np.max(lam * (0.5 * r2 + mc_norm * r) + pconst))
    dtype = np.dtype(dtype)
    u = UNIT_ROUNDOFF if dtype == np.float64 else float(np.finfo(dtype).eps) / 2
    return n_terms * u * magnitude <= EXPANDED_MAX_ERROR[dtype]


def log_softmax_parts(A: np.ndarray, *, overwrite: bool = False):
    """For a ``(K, n)`` array of logs: ``(logsumexp over K, exp(A - shift), sum)``, no subnormals.

    ``shift`` is 0 when every row's largest term is at least ``UNSHIFTED_MARGIN`` above the
    log of ``dtype``'s smallest normal number and the sums cannot overflow
    (``_unshifted_range``): the terms below that floor are raised to it, which gives them a
    weight below ``e**-UNSHIFTED_MARGIN`` of their row's (the common case: no subtraction of
    the per-row maximum). Otherwise ``shift`` is the per-row maximum, with the exponents
    clamped at the same floor (``LOG_CLAMP`` in float64; float32's exp is subnormal sooner).
    Either way ``E / s`` are the normalized exponentials. A row with no finite term (every
    log ``-inf``) has ``E`` 0, ``s`` 0 and log-sum-exp ``-inf``; a NaN stays NaN. With
    ``overwrite`` the exponentials are computed in ``A``'s memory (one pass less).
    """
    m = A.max(axis=0)
    floor, safe, high = _unshifted_range(A.dtype, A.shape[0])
    if m.size and m.min() >= safe and m.max() <= high:  # false for NaN too
        E = raise_to(A if overwrite else A.copy(), floor)
        np.exp(E, out=E)
        s = np.ones(E.shape[0], dtype=E.dtype) @ E
        return np.log(s), E, s
    dead = None
    if not np.isfinite(m).all():
        dead = m == -np.inf  # rows with no finite term: weight 0 and log-sum-exp -inf
        m = np.where(np.isfinite(m), m, 0.0)
    E = raise_to(np.subtract(A, m, out=A if overwrite else None), floor)
    np.exp(E, out=E)
    if dead is not None and dead.any():
        E[:, dead] = 0.0
    s = np.ones(E.shape[0], dtype=E.dtype) @ E  # a matrix-vector product: faster than E.sum(axis=0)
    with np.errstate(divide="ignore"):
        return m + np.log(s), E, s


def raise_to(A: np.ndarray, floor: float) -> np.ndarray:
    """``A`` with every value below ``floor`` raised to it, in place; returns ``A``.

    The floor is broadcast from a row of ``A.shape[-1]`` copies rather than a scalar: numpy's
    ``maximum`` with a scalar operand took twice the time of the same call with a contiguous
    one (numpy 2.4 on AVX-512). Raising unconditionally costs about what finding the minimum
    first would, and the exponentials that follow run faster on raised logs (numpy's ``exp``
    took 8x as long on logs spread over [-900, 0] as over [-700, 0])."""
    return np.maximum(A, np.full(A.shape[-1:], floor, dtype=A.dtype), out=A)


@functools.lru_cache(maxsize=64)
def _unshifted_range(dtype, k: int) -> tuple[float, float, float]:
    """``(floor, safe, high)`` for logs in ``dtype`` over ``k`` rows: ``exp(floor)`` is a
    normal number (and ``floor >= LOG_CLAMP``); ``safe`` is ``floor + UNSHIFTED_MARGIN``;
    sums of ``k`` terms up to ``high`` are finite."""
    info = np.finfo(dtype)
    floor = max(LOG_CLAMP, float(np.log(info.tiny)) + 1.0)
    return floor, floor + UNSHIFTED_MARGIN, float(np.log(info.max)) - float(np.log(max(k, 1))) - 1.0
