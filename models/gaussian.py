"""Gaussian leaves: scalar, diagonal and full covariance, with matrix-form batched kernels.

The batched kernels (sibling leaves of one class under a mixture or an HMM) build a
*feature block* once per row block and share it between the log densities (upward pass)
and the statistics (downward pass). Its layout is component-first, features by data rows,
so both passes are single matrix products with the components on the short side, split
along the rows by ``models.kernels``:

- ``DiagGaussian``: ``F = [xc; xc**2; 1]`` with ``xc = x - c``, ``c`` the mean of the
  components' means. Log densities ``P @ F``, statistics ``W @ F'``.
- ``FullGaussian``: ``F = [xc; 1; xc_i * xc_j (i <= j)]``: log densities ``P @ F`` (the
  expanded quadratic form), statistics ``F @ W'``. Above ``FEATURE_MAX_DIM`` the block holds
  ``[xc; 1]`` only and the kernels work per component.

The expanded form ``xc' A xc - 2 xc' A mc + mc' A mc`` loses accuracy when the data sit far
from the components in units of their spread; centering on ``c`` removes the dependence on
the origin, and a block whose rounding-error bound exceeds ``kernels.EXPANDED_MAX_ERROR`` is scored
with the whitened form ``||L' (x - mean)||^2`` instead. Statistics are returned about the
origin, exactly what the unbatched ``_accumulate`` returns.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from .base import Leaf
from .columns import check_floats, float_column, leaf_columns
from .cost import BatchCost, NodeCost, stat_bytes
from .data import Ragged
from .errors import DataError
from .floored import AT_FLOOR, dims_named, floor_line
from .floors import MIN_WEIGHT, VAR_FLOOR
from .kernels import (MAX_GEMM_COLS, centered_t, coordinates, expanded_is_accurate, gemm_cols, matmul_cols,
                      offset_matrix, radius2, radius2_of_squares, stacked, weighted_sums, weighted_sums_t)
from .schema import POSITIVE, SPD, Meta, Param, Size
from .units import GEMM_FLOPS, MATMUL_FLOPS, SLOW_FLOPS, VECTOR_FLOPS

LOG_2PI = float(np.log(2 * np.pi))

#: Largest dimension for which ``FullGaussian``'s batched kernels build the quadratic
#: feature block (``8 * d(d+1)/2`` bytes per row); above it they work per component.
FEATURE_MAX_DIM = 32

#: Interpreter time of the batched kernels per block, in node visits (``units.NODE_CALL_S``
#: each): the diagonal kernel's block and each component's slice of the statistics; the
#: full kernel's block (plus a share per dimension: the products ``xc_i xc_j`` are built one
#: row at a time) and each component's moments (``bench/results/cost_units.md``).
#: ``FullGaussian``'s caches in ``d x d`` float64 matrices: its Cholesky factor and the
#: whitening inverse; in a batch also its slice of the stacked whitening and (up to
#: ``FEATURE_MAX_DIM``) half a matrix of quadratic coefficients.
FULL_CACHE_SQUARES = 3.5
#: ``FullGaussian``'s M-step at its peak, in ``d x d`` matrices: the new node with its caches
#: and the temporaries that make it (centred moments, the symmetrized covariance, the
#: eigenvalue and Cholesky work, the identity and the inverse's factorization); measured
#: with ``tracemalloc`` on one process (``bench/memory.py``'s worker figures agree).
FULL_MSTEP_SQUARES = 5.0

DIAG_KERNEL_CALLS = 2.4
DIAG_COMPONENT_CALLS = 0.16
FULL_KERNEL_CALLS = 4.1
FEATURE_CALLS_PER_DIM = 0.22
FULL_COMPONENT_CALLS = 0.3


class _Expanded(NamedTuple):
    """Stacked parameters of sibling Gaussians for the expanded (feature-block) form."""

    c: np.ndarray  # centering point (d,)
    P: np.ndarray  # log densities are P @ F, (K, features)
    lam: np.ndarray  # per component, bounds |sum_ij A_ij u_i v_j| / (|u| |v|) for the quadratic term
    slack: int  # rounding steps per log density beyond the dot product (products, coefficients)
    mc_norm: np.ndarray  # per component, |mean - c|
    pconst: np.ndarray  # per component, |constant term of P|
    const: np.ndarray  # per component, d log(2 pi) + log det cov
    mc: np.ndarray  # per component, mean - c (K, d)
    whiten: np.ndarray  # diagonal: precisions (K, d); full: stacked L' (K*d, d + 1)


def _is_accurate(r2: float, p: _Expanded, n_features: int, dtype) -> bool:
    """Whether ``P @ F`` of ``n_features`` rows, computed in ``dtype``, is within
    ``kernels.EXPANDED_MAX_ERROR`` of every log density of a block whose rows have
    ``|x - c|^2 <= r2`` (see ``kernels.expanded_is_accurate``)."""
    return expanded_is_accurate(r2, p.lam, p.mc_norm, p.pconst, n_features + p.slack, dtype)


def _in(a: np.ndarray, F: np.ndarray) -> np.ndarray:
    """The parameter matrix ``a`` in the feature block's dtype (float32 blocks multiply in float32)."""
    return a if a.dtype == F.dtype else a.astype(F.dtype)


@functools.lru_cache(maxsize=64)
def _upper(d: int) -> tuple[tuple[np.ndarray, np.ndarray], np.ndarray]:
    """The upper triangle's indices of a ``d x d`` matrix (``np.triu_indices``) and the
    expanded form's coefficient per entry (-0.5 on the diagonal, -1 off it), read-only."""
    iu = np.triu_indices(d)
    coef = np.where(iu[0] == iu[1], -0.5, -1.0)
    for a in (*iu, coef):
        a.setflags(write=False)
    return iu, coef


@functools.lru_cache(maxsize=64)
def _eye(d: int) -> np.ndarray:
    """The ``d x d`` identity, read-only."""
    out = np.eye(d)
    out.setflags(write=False)
    return out


def _spectral_norms(A: np.ndarray) -> np.ndarray:
    """Per matrix of the stack ``A`` (K, d, d), its spectral norm: ``np.linalg.norm(A[k], 2)``
    to the bit (the largest singular value), in one batched call."""
    return np.linalg.svd(A, compute_uv=False).max(axis=-1)


def _row_norms(a: np.ndarray) -> np.ndarray:
    """``np.linalg.norm(a, axis=1)`` for a real matrix, to the bit, without its dispatch."""
    return np.sqrt(np.add.reduce(a * a, axis=1))


def _floats(st, lo: float, hi: float):
    return st.floats(lo, hi, allow_nan=False, allow_infinity=False)


def _dims(st, like):
    """A test strategy's dimension: ``like``'s, or 1..3."""
    return st.just(like.dim) if like is not None else st.integers(1, 3)


def _variance_regularized(own, reg):
    """``reg_covar`` more on every variance (``sw * reg_covar`` on the second moments)."""
    if reg.reg_covar > 0 and own[0] >= MIN_WEIGHT:
        sw, sx, sxx = own
        return (sw, sx, sxx + sw * reg.reg_covar)
    return own


def _variance_warnings(node, at: str, rows, dims_shown: bool) -> list[str]:
    """The line of a (diagonal) variance at the floor, naming its dimensions with ``dims_shown``."""
    if node.var is None:
        return []
    var = np.atleast_1d(np.asarray(node.var, dtype=np.float64))
    dims = np.flatnonzero(var <= AT_FLOOR)
    if dims.size == 0:
        return []
    where = f" in {dims_named(node.columns, node.dim, dims)}" if dims_shown else ""
    what = f"{at}: a variance is at the floor ({float(var.min()):.3g}, VAR_FLOOR={VAR_FLOOR:g}){where}"
    return [floor_line(what, rows, node.mean, np.diag(var), dims)]


def _weighted_moments(x, w):
    """Weighted mean and mean squared deviation per column, written plainly (test oracles)."""
    mean = np.average(x, axis=0, weights=w)
    return mean, np.average((x - mean) ** 2, axis=0, weights=w)


class Gaussian(Leaf):
    """A univariate normal; data is a float per row."""

    family = "Gaussian"
    schema = (Param("mean", 0), Param("var", 0, POSITIVE))

    def __init__(self, mean: float | None = None, var: float | None = None):
        self._init_fields(mean=mean, var=var)

    def data_type(self):
        return "float"

    def _prepare(self, data, where):
        return float_column(data, where, self.family)

    def _log_density(self, x):
        z = x - self.mean
        z *= z
        z *= -0.5 / self.var
        z -= 0.5 * (LOG_2PI + np.log(self.var))
        return z

    def _accumulate(self, x, w):
        wx = w * x
        return (float(w.sum()), float(wx.sum()), float(wx @ x))

    @classmethod
    def batch_log_density(cls, leaves, x, work, offsets):
        mu = np.array([g.mean for g in leaves])[:, None]
        var = np.array([g.var for g in leaves])[:, None]
        return -0.5 * (LOG_2PI + np.log(var) + (x[None, :] - mu) ** 2 / var)

    @classmethod
    def batch_accumulate(cls, leaves, x, W, work):
        sw, sx, sxx = W.sum(axis=1), W @ x, W @ (x * x)
        return [(float(a), float(b), float(c)) for a, b, c in zip(sw, sx, sxx)]

    def _estimate(self, own, children):
        sw, sx, sxx = own
        if sw < MIN_WEIGHT:
            return self
        mean = sx / sw
        return Gaussian(mean, max(sxx / sw - mean * mean, VAR_FLOOR))

    def _sample(self, n, rng):
        return rng.normal(float(self.mean), float(np.sqrt(self.var)), size=n)

    def _regularize(self, own, reg):
        return _variance_regularized(own, reg)

    def _fit_warnings(self, at, rows):
        return _variance_warnings(self, at, rows, dims_shown=False)

    def rows_needed(self):
        return 2

    def cost(self):
        # log density: 4 passes; statistics: w * x, two sums, one dot
        return NodeCost(flops_per_row=7 + 2 * MATMUL_FLOPS, param_bytes=16, stat_bytes=stat_bytes(scalars=3),
                        data_bytes_per_row=8.0, coupling_bytes_per_row=0.0, work_bytes_per_row=8.0,
                        scratch_bytes_per_row=8.0)

    @classmethod
    def strategy(cls, st, like=None):
        """``Gaussian(mean in [-5, 5], var in [0.1, 5])``."""
        return st.builds(Gaussian, _floats(st, -5.0, 5.0), _floats(st, 0.1, 5.0))

    def oracle_log_density(self, x):
        mean, var = float(self.mean), float(self.var)
        return -0.5 * np.log(2 * np.pi * var) - (np.asarray(x) - mean) ** 2 / (2 * var)

    def oracle_estimate(self, x, w):
        mean = np.sum(w * x) / np.sum(w)
        return {"mean": mean, "var": np.sum(w * (x - mean) ** 2) / np.sum(w)}


def _vector_column(data, where, family, d):
    if d is None:
        raise DataError(f"{where}: this {family} names its columns by a pattern, which a table's column names resolve: "
                        "fit it on a table (a DataFrame, a pyarrow Table, a .csv or .parquet file)")
    if isinstance(data, (tuple, Ragged)):
        raise DataError(f"{where}: {family} expects a float array of shape (n, {d}), got {type(data).__name__}")
    try:
        x = np.asarray(data)
    except (TypeError, ValueError):
        raise DataError(f"{where}: {family} expects numbers, got {type(data).__name__}") from None
    if x.dtype.kind not in "biufO":
        raise DataError(f"{where}: {family} expects real numbers, got dtype {x.dtype}")
    try:
        x = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError):
        raise DataError(f"{where}: {family} expects numbers, got {type(data).__name__}") from None
    if x.ndim != 2 or x.shape[1] != d:
        raise DataError(f"{where}: {family} expects shape (n, {d}), got {x.shape}")
    check_floats(x, where, family)
    # as given when contiguous (a caller's array or mapped file is not copied); models.data
    return x if x.flags.c_contiguous or x.flags.f_contiguous else np.asfortranarray(x)


def _columns_kept(new, old):
    """``new`` (an M-step's node, made without the constructor's fields) with ``old``'s columns."""
    if old.columns is not None and new is not old:
        new.columns = old.columns
    return new


class DiagGaussian(Leaf):
    """A d-dimensional normal with diagonal covariance; data is ``(n, d)`` floats."""

    family = "DiagGaussian"
    #: the table columns it reads (a tuple of names, or a pattern a table resolves), or None
    columns = None
    schema = (Size("dim", of="mean", by="columns"), Param("mean", 1, shape=("dim",)),
              Param("var", 1, POSITIVE, shape=("dim",)), Meta("columns"))
    batch_takes_offsets = True
    float32_kernels = True
    float32_share = 0.5

    def __init__(self, mean=None, var=None, *, dim: int | None = None, columns=None):
        columns, dim = leaf_columns(columns, dim, mean, self.family)
        self._init_fields(mean=mean, var=var, dim=dim, columns=columns)

    @property
    def dim(self) -> int:
        return self._sizes["dim"]

    def describe(self):
        return f"DiagGaussian d={self.dim}"

    def data_type(self):
        return f"vec[{self.dim}]"

    def _prepare(self, data, where):
        return _vector_column(data, where, self.family, self.dim)

    def _log_density(self, x):
        z = centered_t(x, self.mean)  # coordinates: no bit depends on the rows' order
        z *= z
        out = (-0.5 / self.var) @ z
        out -= 0.5 * (self.dim * LOG_2PI + np.log(self.var).sum())
        return out

    def _accumulate(self, x, w):
        xt = coordinates(x)
        sx = xt @ w
        squares = np.multiply(xt, xt, out=None if np.may_share_memory(xt, x) else xt)  # one (d, n) at most
        return (float(w.sum()), sx, squares @ w)

    @classmethod
    def _batch_params(cls, leaves) -> _Expanded:
        def build(leaves):
            mean = np.array([g.mean for g in leaves])
            var = np.array([g.var for g in leaves])
            k, d = mean.shape
            c = mean.mean(axis=0)
            prec = 1.0 / var
            mc = mean - c
            const = d * LOG_2PI + np.log(var).sum(axis=1)
            # -0.5 * sum(prec * (xc - mc)^2) - 0.5 * const
            P = np.empty((k, 2 * d + 1))
            P[:, :d] = mc * prec
            P[:, d : 2 * d] = -0.5 * prec
            P[:, 2 * d] = -0.5 * (const + (mc * mc * prec).sum(axis=1))
            return _Expanded(c=c, P=P, lam=prec.max(axis=1), slack=3, mc_norm=_row_norms(mc),
                             pconst=np.abs(P[:, 2 * d]), const=const, mc=mc, whiten=prec)

        return stacked(leaves, build)

    @classmethod
    def batch_cost(cls, leaves) -> BatchCost:
        """Per row: the feature block (built once, kept through both passes); each component's
        rows of ``P @ F`` and ``W @ F'``; no scratch beyond the parent's."""
        d = leaves[0].dim
        return BatchCost(block_flops=d * SLOW_FLOPS + 3 * d + 1, component_flops=(8.0 * d + 4) * GEMM_FLOPS,
                         kept_bytes=8.0 * (2 * d + 1), scratch_bytes=0.0, block_calls=DIAG_KERNEL_CALLS,
                         component_calls=DIAG_COMPONENT_CALLS)

    @classmethod
    def batch_prepare(cls, leaves, x):
        """The feature block ``[xc; xc**2; 1]`` of shape ``(2d + 1, n)``, with the parameters."""
        p = cls._batch_params(leaves)
        n, d = x.shape
        F = np.empty((2 * d + 1, n), dtype=x.dtype)
        centered_t(x, p.c, F[:d])
        np.multiply(F[:d], F[:d], out=F[d : 2 * d])
        F[2 * d] = 1.0
        return p, F

    @classmethod
    def batch_log_density(cls, leaves, x, work, offsets):
        """Log densities ``(K, n)``, plus ``offsets[k]`` when given (finite, per component)."""
        p, F = work
        d = p.c.size
        r2 = radius2_of_squares(F[d : 2 * d])
        if _is_accurate(r2, p, F.shape[0], F.dtype):
            return matmul_cols(_in(offset_matrix(p.P, 2 * d, offsets), F), F)
        # the direct form sum(prec * (xc - mc)^2), one component at a time, in one (d, n)
        # buffer (a new ``F[:d] - mc`` per component held two at once); ``batch_cost`` counts
        # no scratch for it, the expanded form's block having none (this form is the rare one)
        out = np.empty((p.P.shape[0], F.shape[1]), dtype=F.dtype)
        t = np.empty((d, F.shape[1]), dtype=F.dtype)
        whiten = _in(p.whiten, F)
        for k in range(out.shape[0]):
            np.subtract(F[:d], p.mc[k][:, None], out=t)
            np.multiply(t, t, out=t)
            np.matmul(whiten[k], t, out=out[k])
        out += p.const[:, None]
        out *= -0.5
        if offsets is not None:
            out += offsets[:, None]
        return out

    @classmethod
    def batch_accumulate(cls, leaves, x, W, work):
        p, F = work
        c = p.c
        d = c.size
        S = weighted_sums(W, F)  # (K, 2d + 1)
        sw = S[:, 2 * d]
        sxc = S[:, :d]
        # back to moments about the origin: x = xc + c
        sx = sxc + sw[:, None] * c
        sxx = S[:, d : 2 * d] + 2.0 * c * sxc + sw[:, None] * (c * c)
        return list(zip(sw.tolist(), sx, sxx))

    def _estimate(self, own, children):
        sw, sx, sxx = own
        if sw < MIN_WEIGHT:
            return self
        mean = sx / sw
        return _columns_kept(DiagGaussian(mean, np.maximum(sxx / sw - mean * mean, VAR_FLOOR)), self)

    def _sample(self, n, rng):
        return self.mean + np.sqrt(self.var) * rng.standard_normal((n, self.dim))

    def _regularize(self, own, reg):
        return _variance_regularized(own, reg)

    def _fit_warnings(self, at, rows):
        return _variance_warnings(self, at, rows, dims_shown=True)

    def rows_needed(self):
        return 2

    @classmethod
    def strategy(cls, st, like=None):
        """Of ``like``'s dimension (1..3 when None), means in [-5, 5], variances in [0.1, 5]."""
        return _dims(st, like).flatmap(lambda d: st.builds(
            DiagGaussian,
            st.lists(_floats(st, -5.0, 5.0), min_size=d, max_size=d).map(np.array),
            st.lists(_floats(st, 0.1, 5.0), min_size=d, max_size=d).map(np.array),
        ))

    def oracle_log_density(self, x):
        z = (np.asarray(x) - self.mean) ** 2 / self.var
        return -0.5 * (np.log(2 * np.pi * self.var).sum() + z.sum(axis=1))

    def oracle_estimate(self, x, w):
        mean, var = _weighted_moments(x, w)
        return {"mean": mean, "var": var}

    def cost(self):
        d = self.dim
        # eight passes over the (n, d) rows (a matrix-vector product counts as one)
        # cache: its row of the stacked parameters of a batch (centred mean, precision,
        # the 2d + 1 coefficients of its products), where its parent batches it
        return NodeCost(flops_per_row=8.0 * d + 1, param_bytes=16 * d,
                        stat_bytes=stat_bytes(arrays=[d, d], scalars=1), data_bytes_per_row=8.0 * d,
                        coupling_bytes_per_row=0.0, work_bytes_per_row=8.0,
                        scratch_bytes_per_row=8.0 * d, cache_bytes=8 * (4 * d + 1))


class FullGaussian(Leaf):
    """A d-dimensional normal with full covariance; data is ``(n, d)`` floats."""

    family = "FullGaussian"
    #: the table columns it reads (a tuple of names, or a pattern a table resolves), or None
    columns = None
    schema = (Size("dim", of="mean", by="columns"), Param("mean", 1, shape=("dim",)),
              Param("cov", 2, SPD, shape=("dim", "dim")), Meta("columns"))
    batch_takes_offsets = True
    float32_kernels = True

    def __init__(self, mean=None, cov=None, *, dim: int | None = None, columns=None):
        columns, dim = leaf_columns(columns, dim, mean, self.family)
        chol = self._init_fields(mean=mean, cov=cov, dim=dim, columns=columns).get("cov")
        if chol is not None:
            self._factor(chol)

    def _factor(self, chol: np.ndarray) -> None:
        """The caches of the kernels, from the covariance's lower Cholesky factor."""
        d = self.dim
        # z = (x - mean) @ prec_chol has identity covariance.
        self._prec_chol = np.linalg.solve(chol, _eye(d)).T.copy()
        self._const = float(d * LOG_2PI + 2.0 * np.log(chol.diagonal()).sum())
        self._chol = chol

    @classmethod
    def _fitted(cls, mean: np.ndarray, cov: np.ndarray, strict: bool = True) -> "FullGaussian | None":
        """``FullGaussian(mean, cov)`` for an M-step's result, with the checks its making
        already settles left out: ``mean`` and ``cov`` are fresh arrays nothing else holds
        (kept, made read-only, not copied) and ``cov`` is exactly symmetric (``_estimate``
        averages it with its transpose, then adds to the diagonal only). Everything the
        values themselves decide is still checked (float64, C order, shapes, finite, and
        positive definite: the Cholesky factor the caches need); a value that fails goes
        through the constructor, which names the problem (or, with ``strict=False``, gives None)."""
        d = mean.shape[0] if mean.ndim == 1 else 0
        if (d and mean.dtype == np.float64 and cov.dtype == np.float64 and cov.shape == (d, d)
                and cov.flags.c_contiguous and mean.flags.owndata and cov.flags.owndata
                and np.isfinite(mean).all() and np.isfinite(cov).all()):
            try:
                chol = np.linalg.cholesky(cov)
            except np.linalg.LinAlgError:
                chol = None
            if chol is not None:
                node = cls.__new__(cls)
                mean.setflags(write=False)
                cov.setflags(write=False)
                # the attributes in the order ``Node._init_fields`` sets them
                node.mean, node.cov, node._sizes, node._unset = mean, cov, {"dim": d}, ()
                node._factor(chol)
                return node
        return cls(mean, cov) if strict else None

    @property
    def dim(self) -> int:
        return self._sizes["dim"]

    def describe(self):
        return f"FullGaussian d={self.dim}"

    def data_type(self):
        return f"vec[{self.dim}]"

    def _prepare(self, data, where):
        return _vector_column(data, where, self.family, self.dim)

    def _log_density(self, x):
        z = self._prec_chol.T @ centered_t(x, self.mean)  # coordinates: no bit depends on the rows' order
        z *= z
        out = np.ones(self.dim) @ z
        out += self._const
        out *= -0.5
        return out

    def _accumulate(self, x, w):
        sx, sxx = np.zeros(self.dim), np.zeros((self.dim, self.dim))
        for a in range(0, x.shape[0], MAX_GEMM_COLS):  # chunks: no (n, d) beside the rows
            xt, wa = coordinates(x[a : a + MAX_GEMM_COLS]), w[a : a + MAX_GEMM_COLS]
            sx += xt @ wa
            sxx += (xt * wa) @ xt.T
        return (float(w.sum()), sx, sxx)

    @classmethod
    def _batch_params(cls, leaves) -> _Expanded:
        def build(leaves):
            mean = np.array([g.mean for g in leaves])
            k, d = mean.shape
            c = mean.mean(axis=0)
            mc = mean - c
            features = d <= FEATURE_MAX_DIM
            iu, coef = _upper(d)
            P = np.empty((k, d + 1 + iu[0].size)) if features else None
            G = np.empty((k, d, d + 1))
            chols = np.array([g._prec_chol for g in leaves])
            const = np.array([g._const for g in leaves])
            # whitened: z = L' (x - mean) = L' xc - L' mc, all components at once
            G[:, :, :d] = chols.transpose(0, 2, 1)
            G[:, :, d] = -(mc[:, None, :] @ chols)[:, 0, :]
            if features:
                prec = chols @ chols.transpose(0, 2, 1)
                lm = (prec @ mc[:, :, None])[:, :, 0]
                # -0.5 * (xc' prec xc - 2 xc' prec mc + mc' prec mc + const)
                P[:, :d] = lm
                P[:, d] = -0.5 * (np.einsum("ki,ki->k", mc, lm) + const)
                P[:, d + 1 :] = coef * prec[:, iu[0], iu[1]]
            # prec = L L' is rounded: bound with |L| |L|' rather than |prec|, i.e. by the
            # squared spectral norm of |L| (one batched SVD for all components)
            lam = _spectral_norms(np.abs(chols)) ** 2 if features else np.empty(k)
            pconst = np.abs(P[:, d]) if features else np.full(k, np.inf)
            return _Expanded(c=c, P=P, lam=lam, slack=2 * d + 3, mc_norm=_row_norms(mc), pconst=pconst,
                             const=const, mc=mc, whiten=G.reshape(k * d, d + 1))

        return stacked(leaves, build)

    @classmethod
    def batch_prepare(cls, leaves, x):
        """``[xc; 1; xc_i * xc_j (i <= j)]`` (``d + 1`` rows only above ``FEATURE_MAX_DIM``)."""
        p = cls._batch_params(leaves)
        n, d = x.shape
        features = p.P is not None
        rows = d + 1 + (d * (d + 1) // 2 if features else 0)
        if features and x.dtype != np.float64:
            # float32 rows: where float32's rounding is too coarse for the expanded form on
            # them (sharp components), the block is built and scored in float64 instead of
            # the slower whitened form
            xc = np.empty((d, n), dtype=x.dtype)
            centered_t(x, p.c, xc)
            accurate = _is_accurate(radius2(xc), p, rows, x.dtype)
            F = np.empty((rows, n), dtype=x.dtype if accurate else np.float64)
            F[:d] = xc
            del xc
        else:
            F = np.empty((rows, n), dtype=x.dtype)
            centered_t(x, p.c, F[:d])
        F[d] = 1.0
        if features:
            o = d + 1
            for i in range(d):
                np.multiply(F[i], F[i:d], out=F[o : o + d - i])
                o += d - i
        return p, F

    @classmethod
    def batch_log_density(cls, leaves, x, work, offsets):
        """Log densities ``(K, n)``, plus ``offsets[k]`` when given (finite, per component)."""
        p, F = work
        d = p.c.size
        if p.P is not None and _is_accurate(radius2(F[:d]), p, F.shape[0], F.dtype):
            return matmul_cols(_in(offset_matrix(p.P, d, offsets), F), F)
        out = cls._whitened_log_density(p, F[: d + 1])
        if offsets is not None:
            out += offsets[:, None]
        return out

    @staticmethod
    def _whitened_log_density(p, Xa):
        """``-0.5 * (||L_k' (x - mean_k)||^2 + const_k)`` from ``Xa = [xc; 1]``, chunk by chunk."""
        k, d, n = p.const.size, p.c.size, Xa.shape[1]
        out = np.empty((k, n), dtype=Xa.dtype)
        cols = gemm_cols(*p.whiten.shape)
        Y = np.empty((k * d, min(n, cols)), dtype=Xa.dtype)
        whiten = _in(p.whiten, Xa)
        for a in range(0, n, cols):
            b = min(n, a + cols)
            y = Y[:, : b - a]
            np.matmul(whiten, Xa[:, a:b], out=y)
            np.multiply(y, y, out=y)
            np.sum(y.reshape(k, d, b - a), axis=1, out=out[:, a:b])
        out += p.const[:, None]
        out *= -0.5
        return out

    @classmethod
    def batch_accumulate(cls, leaves, x, W, work):
        p, F = work
        c = p.c
        k, d = p.const.size, c.size
        W = np.asarray(W, dtype=F.dtype)
        if p.P is not None:
            # F @ W' with W' row-major: the faster order for this many features
            S = weighted_sums_t(F, np.ascontiguousarray(W.T))  # (features, K)
            sw, sxc = S[d], S[:d].T
            iu, _ = _upper(d)
            M = np.empty((k, d, d))
            M[:, iu[0], iu[1]] = S[d + 1 :].T
            M[:, iu[1], iu[0]] = S[d + 1 :].T
        else:
            # float32 blocks: the products in float32 over the block, the moments float64 after
            xc = F[:d]
            sw, sxc = W.sum(axis=1, dtype=np.float64), np.asarray(W @ xc.T, dtype=np.float64)
            M = np.asarray(np.stack([(xc * W[i]) @ xc.T for i in range(k)]), dtype=np.float64)
        # back to moments about the origin: x = xc + c
        cx = c[None, :, None] * sxc[:, None, :]
        M += cx + cx.transpose(0, 2, 1)
        M += sw[:, None, None] * np.outer(c, c)
        sx = sxc + sw[:, None] * c
        return list(zip(sw.tolist(), sx, M))

    def _estimate(self, own, children):
        return _columns_kept(self._fit(own), self)

    def _fit(self, own):
        sw, sx, sxx = own
        if sw < MIN_WEIGHT:
            return self
        mean = sx / sw
        cov = sxx / sw - mean[:, None] * mean[None, :]  # np.outer's own product, without its call
        cov = 0.5 * (cov + cov.T)
        node = FullGaussian._fitted(mean, cov, strict=False)
        # cov's least eigenvalue is 1 / ||L^-1||_2^2 >= 1 / ||L^-1||_F^2: when that is well above
        # the floor (a factor 2 for rounding), the floor cannot apply and needs no eigenvalues
        if node is not None and 2.0 * VAR_FLOOR * float(np.square(node._prec_chol).sum()) <= 1.0:
            return node
        low = np.linalg.eigvalsh(cov)[0]
        if low < VAR_FLOOR:
            return FullGaussian._fitted(mean, cov + (VAR_FLOOR - low) * np.eye(self.dim))
        return node if node is not None else FullGaussian._fitted(mean, cov)

    def _sample(self, n, rng):
        return self.mean + rng.standard_normal((n, self.dim)) @ self._chol.T

    def _regularize(self, own, reg):
        """``reg_covar`` more on the covariance's diagonal."""
        if reg.reg_covar > 0 and own[0] >= MIN_WEIGHT:
            sw, sx, sxx = own
            return (sw, sx, sxx + sw * reg.reg_covar * np.eye(self.dim))
        return own

    def _fit_warnings(self, at, rows):
        if self.cov is None:
            return []
        cov = np.asarray(self.cov, dtype=np.float64)
        low = float(np.linalg.eigvalsh(cov)[0])
        if low > AT_FLOOR:
            return []
        what = f"{at}: the covariance's smallest eigenvalue is at the floor ({low:.3g}, VAR_FLOOR={VAR_FLOOR:g})"
        return [floor_line(what, rows, self.mean, cov, np.arange(self.dim))]

    def rows_needed(self):
        """``d + 1``: fewer rows span no ``d``-dimensional volume (the start would be singular,
        and a likelihood that grows without bound keeps it there)."""
        return self.dim + 1

    @classmethod
    def strategy(cls, st, like=None):
        """Of ``like``'s dimension (1..3 when None); ``cov = A A^T / d + D``."""
        def cov(values, diag):
            d = len(diag)
            a = np.array(values).reshape(d, d)
            c = a @ a.T / d + np.diag(diag)
            return 0.5 * (c + c.T)

        return _dims(st, like).flatmap(lambda d: st.tuples(
            st.lists(_floats(st, -5.0, 5.0), min_size=d, max_size=d),
            st.lists(_floats(st, -1.0, 1.0), min_size=d * d, max_size=d * d),
            st.lists(_floats(st, 0.2, 2.0), min_size=d, max_size=d),
        ).map(lambda mad: FullGaussian(np.array(mad[0]), cov(mad[1], mad[2]))))

    def oracle_log_density(self, x):
        diff = np.asarray(x) - self.mean
        _, logdet = np.linalg.slogdet(self.cov)
        maha = np.einsum("ni,in->n", diff, np.linalg.solve(self.cov, diff.T))
        return -0.5 * (self.dim * np.log(2 * np.pi) + logdet + maha)

    def oracle_estimate(self, x, w):
        mean = np.average(x, axis=0, weights=w)
        c = x - mean
        return {"mean": mean, "cov": np.einsum("n,ni,nj->ij", w, c, c) / np.sum(w)}

    def cost(self):
        d = self.dim
        # centre, whiten, squared norm; weighted sum, weighted rows, weighted outer products;
        # scratch: the centred rows and their whitened copy
        return NodeCost(flops_per_row=3.0 * d + d * SLOW_FLOPS + (4.0 * d * d + 2.0 * d) * MATMUL_FLOPS,
                        param_bytes=8 * d + 8 * d * d, stat_bytes=stat_bytes(arrays=[d, d * d], scalars=1),
                        data_bytes_per_row=8.0 * d, coupling_bytes_per_row=0.0, work_bytes_per_row=8.0,
                        scratch_bytes_per_row=16.0 * d, cache_bytes=FULL_CACHE_SQUARES * 8 * d * d,
                        mstep_bytes=FULL_MSTEP_SQUARES * 8 * d * d)

    @classmethod
    def batch_cost(cls, leaves) -> BatchCost:
        """Per row. Up to ``FEATURE_MAX_DIM``: the feature block (built once, kept through both
        passes); each component's rows of ``P @ F``, ``F @ W'`` and ``W'`` (the folding's
        scratch). Above: the centred rows kept; per component the whitened products, squares
        and sums and the weighted moments, one weighted copy of the rows as scratch."""
        d, k = leaves[0].dim, len(leaves)
        if d <= FEATURE_MAX_DIM:
            nf = d + 1 + d * (d + 1) // 2
            # with few components, reading the block (a pass per product), not FLOPs, bounds it
            floor = 2.0 * nf * max(0.0, 1.0 - 2.0 * k * GEMM_FLOPS)
            return BatchCost(block_flops=d * SLOW_FLOPS + nf + 2 * d + floor,
                             component_flops=4.0 * nf * GEMM_FLOPS + VECTOR_FLOPS, kept_bytes=8.0 * nf,
                             scratch_bytes=8.0 * k, block_calls=FULL_KERNEL_CALLS + FEATURE_CALLS_PER_DIM * d,
                             component_calls=FULL_COMPONENT_CALLS)
        return BatchCost(block_flops=d * SLOW_FLOPS + 1, component_flops=(4.0 * d * d + 4.0 * d) * MATMUL_FLOPS + 3 * d,
                         kept_bytes=8.0 * (d + 1), scratch_bytes=8.0 * d, block_calls=FULL_KERNEL_CALLS,
                         component_calls=FULL_COMPONENT_CALLS)
