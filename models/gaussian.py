"""Gaussian leaves: scalar, diagonal and full covariance, with matrix-form batched kernels.

The batched kernels (sibling leaves of one class under a mixture or an HMM) build a
*feature block* once per row block and share it between the log densities (upward pass)
and the statistics (downward pass). Its layout is component-first, features by data rows,
so both passes are single matrix products with the components on the short side, split
along the rows into calls OpenBLAS runs with its small-matrix kernels:

- ``DiagGaussian``: ``F = [xc; xc**2; 1]`` with ``xc = x - c``, ``c`` the mean of the
  components' means. Log densities ``P @ F``, statistics ``W @ F'``.
- ``FullGaussian``: ``F = [xc; 1; xc_i * xc_j (i <= j)]``: log densities ``P @ F`` (the
  expanded quadratic form), statistics ``F @ W'``. Above ``FEATURE_MAX_DIM`` the block holds
  ``[xc; 1]`` only and the kernels work per component.

The expanded form ``xc' A xc - 2 xc' A mc + mc' A mc`` loses accuracy when the data sit far
from the components in units of their spread; centering on ``c`` removes the dependence on
the origin, and a block whose rounding-error bound exceeds ``EXPANDED_MAX_ERROR`` is scored
with the whitened form ``||L' (x - mean)||^2`` instead. Statistics are returned about the
origin, exactly what the unbatched ``_accumulate`` returns.
"""

from __future__ import annotations

import weakref
from typing import NamedTuple

import numpy as np

from .base import Leaf, as_float_array, check_positive, float_column, spec_field
from .cost import BatchCost, NodeCost, stat_bytes
from .data import Ragged
from .engine import GEMM_FLOPS, MATMUL_FLOPS, SLOW_FLOPS, VECTOR_FLOPS
from .errors import DataError, ModelError
from .floors import MIN_WEIGHT, VAR_FLOOR

LOG_2PI = float(np.log(2 * np.pi))
_UNIT_ROUNDOFF = float(np.finfo(np.float64).eps) / 2

#: Matrix products in the batched kernels are split along the data rows so that each call
#: has ``m * n * k`` within OpenBLAS's small-matrix range (its dedicated kernels ran these
#: shapes up to 1.6x faster than one call over a block of thousands of rows).
SMALL_GEMM_MNK = 1_000_000
MAX_GEMM_COLS = 1024
#: Largest rounding error (absolute, per log density) accepted from the expanded form; a
#: block whose bound exceeds it (data far from the components in units of their spread)
#: is scored with the whitened form ``||L' (x - mean)||^2`` instead.
EXPANDED_MAX_ERROR = 1e-9
#: Largest dimension for which ``FullGaussian``'s batched kernels build the quadratic
#: feature block (``8 * d(d+1)/2`` bytes per row); above it they work per component.
FEATURE_MAX_DIM = 32

# Interpreter time of the batched kernels per block, in node visits (``engine.NODE_CALL_S``
# each), from mixtures of 1-32 components on 64-row blocks (d = 8, 16; medians of 200):
#: the diagonal kernel's block (2.4) and each component's slice of the statistics (0.16);
DIAG_KERNEL_CALLS = 2.4
DIAG_COMPONENT_CALLS = 0.16
#: the full kernel's block (4.1, plus 0.22 per dimension: the feature block's products are
#: built one row of ``xc_i xc_j`` at a time) and each component's moments (0.3).
FULL_KERNEL_CALLS = 4.1
FEATURE_CALLS_PER_DIM = 0.22
FULL_COMPONENT_CALLS = 0.3

#: Stacked parameters of a tuple of sibling leaves, kept with the first leaf (weakly, so they
#: go with the model): ``{leaves[0]: (weak references to the leaves, value)}``.
_STACKED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _stacked(leaves, build):
    """``build(leaves)``, computed once per tuple of leaf objects (leaves are immutable)."""
    hit = _STACKED.get(leaves[0])
    if hit is not None and len(hit[0]) == len(leaves) and all(r() is g for r, g in zip(hit[0], leaves)):
        return hit[1]
    value = build(leaves)
    _STACKED[leaves[0]] = (tuple(weakref.ref(g) for g in leaves), value)
    return value


def _gemm_cols(m: int, k: int) -> int:
    """Data rows per product of an ``(m, k)`` matrix with ``(k, rows)`` (see ``SMALL_GEMM_MNK``)."""
    return min(MAX_GEMM_COLS, max(64, SMALL_GEMM_MNK // max(m * k, 1) // 64 * 64))


def _matmul_cols(A: np.ndarray, F: np.ndarray) -> np.ndarray:
    """``A @ F`` for a wide ``F``, computed in column chunks."""
    n = F.shape[1]
    out = np.empty((A.shape[0], n))
    cols = _gemm_cols(*A.shape)
    for a in range(0, n, cols):
        b = min(n, a + cols)
        np.matmul(A, F[:, a:b], out=out[:, a:b])
    return out


def _weighted_sums(W: np.ndarray, F: np.ndarray) -> np.ndarray:
    """``W @ F.T`` (sums over the data rows, shape ``(K, features)``) in chunks of rows."""
    W = np.asarray(W, dtype=np.float64)
    n = F.shape[1]
    cols = _gemm_cols(W.shape[0], F.shape[0])
    if n <= cols:
        return W @ F.T
    out = W[:, :cols] @ F[:, :cols].T
    part = np.empty_like(out)
    for a in range(cols, n, cols):
        b = min(n, a + cols)
        np.matmul(W[:, a:b], F[:, a:b].T, out=part)
        out += part
    return out


def _weighted_sums_t(F: np.ndarray, Wt: np.ndarray) -> np.ndarray:
    """``F @ Wt`` (sums over the data rows, shape ``(features, K)``) in chunks of rows."""
    n = F.shape[1]
    cols = _gemm_cols(F.shape[0], Wt.shape[1])
    if n <= cols:
        return F @ Wt
    out = F[:, :cols] @ Wt[:cols]
    part = np.empty_like(out)
    for a in range(cols, n, cols):
        b = min(n, a + cols)
        np.matmul(F[:, a:b], Wt[a:b], out=part)
        out += part
    return out


def _centered_t(x: np.ndarray, c: np.ndarray, out: np.ndarray) -> None:
    """``out[:] = (x - c).T`` for ``(n, d)`` rows: the transposing copy in chunks of 1024 rows
    (both sides stay in L2), then one contiguous subtraction; 1.3x faster than one call."""
    n = x.shape[0]
    for a in range(0, n, 1024):
        b = min(n, a + 1024)
        out[:, a:b] = x[a:b].T
    out -= c[:, None]


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


def _expanded_is_accurate(r2: float, p: _Expanded, n_features: int) -> bool:
    """Whether ``P @ F`` is within ``EXPANDED_MAX_ERROR`` of every log density of a block whose
    rows have ``|x - c|^2 <= r2``.

    Each log density is a dot product of ``n_features`` terms whose absolute values sum to at
    most ``lam * (r^2 / 2 + |mean - c| r) + pconst`` (quadratic, linear and constant terms);
    its rounding error, the products, the centering and the coefficients of ``P`` included, is
    at most ``(n_features + slack) u`` times that, ``u`` the unit roundoff. (Against the direct
    forms in extended precision, 400 random ill-conditioned, off-centre cases per family
    stayed within half of this bound.)
    """
    r = np.sqrt(r2)
    magnitude = float(np.max(p.lam * (0.5 * r2 + p.mc_norm * r) + p.pconst))
    return (n_features + p.slack) * _UNIT_ROUNDOFF * magnitude <= EXPANDED_MAX_ERROR


def _offset_matrix(P: np.ndarray, column: int, offsets) -> np.ndarray:
    """``P`` with per-component ``offsets`` added to its constant column (the one multiplying
    the ones row of the feature block): adding them in the product costs nothing."""
    if offsets is None:
        return P
    P = P.copy()
    P[:, column] += offsets
    return P


def _radius2(xc: np.ndarray) -> float:
    """The largest ``|xc|^2`` over the columns of ``xc`` (d, n)."""
    return float(np.einsum("ij,ij->j", xc, xc).max()) if xc.shape[1] else 0.0


class Gaussian(Leaf):
    """A univariate normal; data is a float per row."""

    family = "Gaussian"
    spec_fields = ("mean", "var")

    def __init__(self, mean: float, var: float):
        self.mean = as_float_array(mean, "mean", self.family, 0)
        self.var = as_float_array(var, "var", self.family, 0)
        check_positive(self.var, "var", self.family)

    def params(self):
        return {"mean": self.mean, "var": self.var}

    @classmethod
    def _from_spec(cls, spec):
        return cls(spec_field(spec, "mean", cls.family), spec_field(spec, "var", cls.family))

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
    def _batch_log_density(cls, leaves, x):
        mu = np.array([g.mean for g in leaves])[:, None]
        var = np.array([g.var for g in leaves])[:, None]
        return -0.5 * (LOG_2PI + np.log(var) + (x[None, :] - mu) ** 2 / var)

    @classmethod
    def _batch_accumulate(cls, leaves, x, W):
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

    def cost(self):
        # log density: 4 passes (batched: 5); statistics: w * x, two sums, one dot
        return NodeCost(flops_per_row=7 + 2 * MATMUL_FLOPS, param_bytes=16, stat_bytes=stat_bytes(scalars=3),
                        data_bytes_per_row=8.0, coupling_bytes_per_row=0.0, work_bytes_per_row=8.0,
                        scratch_bytes_per_row=8.0)


def _centered(x: np.ndarray, mean: np.ndarray) -> np.ndarray:
    """``x - mean`` for ``(n, d)`` rows: a tiled copy then a same-shape subtraction, which ran
    twice as fast as the broadcast (numpy's inner loop over a broadcast row is only d long)."""
    z = np.tile(mean, (x.shape[0], 1))
    np.subtract(x, z, out=z)
    return z


def _vector_column(data, where, family, d):
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
    if not np.all(np.isfinite(x)):
        raise DataError(f"{where}: {family} data holds NaN or inf")
    return np.ascontiguousarray(x)


class DiagGaussian(Leaf):
    """A d-dimensional normal with diagonal covariance; data is ``(n, d)`` floats."""

    family = "DiagGaussian"
    spec_fields = ("mean", "var")

    def __init__(self, mean, var):
        self.mean = as_float_array(mean, "mean", self.family, 1)
        self.var = as_float_array(var, "var", self.family, 1)
        if self.mean.shape != self.var.shape or self.mean.size == 0:
            raise ModelError(f"{self.family}.var must have the shape of mean {self.mean.shape}, got {self.var.shape}")
        check_positive(self.var, "var", self.family)

    @property
    def dim(self):
        return self.mean.size

    def params(self):
        return {"mean": self.mean, "var": self.var}

    @classmethod
    def _from_spec(cls, spec):
        return cls(spec_field(spec, "mean", cls.family), spec_field(spec, "var", cls.family))

    def describe(self):
        return f"DiagGaussian d={self.dim}"

    def data_type(self):
        return f"vec[{self.dim}]"

    def _prepare(self, data, where):
        return _vector_column(data, where, self.family, self.dim)

    def _log_density(self, x):
        z = _centered(x, self.mean)
        z *= z
        out = z @ (-0.5 / self.var)
        out -= 0.5 * (self.dim * LOG_2PI + np.log(self.var).sum())
        return out

    def _accumulate(self, x, w):
        wx = w @ x
        return (float(w.sum()), wx, w @ (x * x))

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
            return _Expanded(c=c, P=P, lam=prec.max(axis=1), slack=3, mc_norm=np.linalg.norm(mc, axis=1),
                             pconst=np.abs(P[:, 2 * d]), const=const, mc=mc, whiten=prec)

        return _stacked(leaves, build)

    @classmethod
    def _batch_cost(cls, leaves) -> BatchCost:
        """The batched kernels per row: the feature block (x transposed, centred, squared, the
        ones row, the bound's sum of squares), built once and kept through both passes; each
        component's rows of ``P @ F`` and ``W @ F'`` (``2 (2d + 1)`` FLOPs each); no scratch
        beyond the parent's."""
        d = leaves[0].dim
        return BatchCost(block_flops=d * SLOW_FLOPS + 3 * d + 1, component_flops=(8.0 * d + 4) * GEMM_FLOPS,
                         kept_bytes=8.0 * (2 * d + 1), scratch_bytes=0.0, block_calls=DIAG_KERNEL_CALLS,
                         component_calls=DIAG_COMPONENT_CALLS)

    @classmethod
    def _batch_prepare(cls, leaves, x):
        """The feature block ``[xc; xc**2; 1]`` of shape ``(2d + 1, n)``, with the parameters."""
        p = cls._batch_params(leaves)
        n, d = x.shape
        F = np.empty((2 * d + 1, n))
        _centered_t(x, p.c, F[:d])
        np.multiply(F[:d], F[:d], out=F[d : 2 * d])
        F[2 * d] = 1.0
        return p, F

    @classmethod
    def _batch_log_density(cls, leaves, x, work=None, offsets=None):
        """Log densities ``(K, n)``, plus ``offsets[k]`` when given (finite, per component)."""
        p, F = work if work is not None else cls._batch_prepare(leaves, x)
        d = p.c.size
        r2 = float(F[d : 2 * d].sum(axis=0).max()) if F.shape[1] else 0.0  # squares are rows d..2d
        if _expanded_is_accurate(r2, p, F.shape[0]):
            return _matmul_cols(_offset_matrix(p.P, 2 * d, offsets), F)
        # the direct form sum(prec * (xc - mc)^2), one component at a time
        out = np.empty((p.P.shape[0], F.shape[1]))
        for k in range(out.shape[0]):
            t = F[:d] - p.mc[k][:, None]
            np.multiply(t, t, out=t)
            np.matmul(p.whiten[k], t, out=out[k])
        out += p.const[:, None]
        out *= -0.5
        if offsets is not None:
            out += offsets[:, None]
        return out

    @classmethod
    def _batch_accumulate(cls, leaves, x, W, work=None):
        p, F = work if work is not None else cls._batch_prepare(leaves, x)
        c = p.c
        d = c.size
        S = _weighted_sums(W, F)  # (K, 2d + 1)
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
        return DiagGaussian(mean, np.maximum(sxx / sw - mean * mean, VAR_FLOOR))

    def _sample(self, n, rng):
        return self.mean + np.sqrt(self.var) * rng.standard_normal((n, self.dim))

    def cost(self):
        d = self.dim
        # alone (batched: _batch_cost): eight passes over the (n, d) rows: centre, square,
        # the weighted sum (a matrix-vector product, bandwidth-bound like a pass), and for
        # the statistics x * x and two weighted sums
        return NodeCost(flops_per_row=8.0 * d + 1, param_bytes=16 * d,
                        stat_bytes=stat_bytes(arrays=[d, d], scalars=1), data_bytes_per_row=8.0 * d,
                        coupling_bytes_per_row=0.0, work_bytes_per_row=8.0,
                        scratch_bytes_per_row=8.0 * d)


class FullGaussian(Leaf):
    """A d-dimensional normal with full covariance; data is ``(n, d)`` floats."""

    family = "FullGaussian"
    spec_fields = ("mean", "cov")

    def __init__(self, mean, cov):
        self.mean = as_float_array(mean, "mean", self.family, 1)
        self.cov = as_float_array(cov, "cov", self.family, 2)
        d = self.mean.size
        if d == 0 or self.cov.shape != (d, d):
            raise ModelError(f"{self.family}.cov must have shape ({d}, {d}), got {self.cov.shape}")
        if not np.allclose(self.cov, self.cov.T, rtol=1e-8, atol=1e-12):
            raise ModelError(f"{self.family}.cov must be symmetric")
        try:
            chol = np.linalg.cholesky(self.cov)
        except np.linalg.LinAlgError:
            raise ModelError(f"{self.family}.cov must be positive definite (smallest eigenvalue {np.linalg.eigvalsh(self.cov).min():.3g})") from None
        # z = (x - mean) @ prec_chol has identity covariance.
        self._prec_chol = np.linalg.solve(chol, np.eye(d)).T.copy()
        self._const = float(d * LOG_2PI + 2.0 * np.log(np.diag(chol)).sum())
        self._chol = chol

    @property
    def dim(self):
        return self.mean.size

    def params(self):
        return {"mean": self.mean, "cov": self.cov}

    @classmethod
    def _from_spec(cls, spec):
        return cls(spec_field(spec, "mean", cls.family), spec_field(spec, "cov", cls.family))

    def describe(self):
        return f"FullGaussian d={self.dim}"

    def data_type(self):
        return f"vec[{self.dim}]"

    def _prepare(self, data, where):
        return _vector_column(data, where, self.family, self.dim)

    def _log_density(self, x):
        z = _centered(x, self.mean) @ self._prec_chol
        return -0.5 * (np.einsum("ij,ij->i", z, z) + self._const)

    def _accumulate(self, x, w):
        return (float(w.sum()), w @ x, (x * w[:, None]).T @ x)

    @classmethod
    def _batch_params(cls, leaves) -> _Expanded:
        def build(leaves):
            mean = np.array([g.mean for g in leaves])
            k, d = mean.shape
            c = mean.mean(axis=0)
            mc = mean - c
            features = d <= FEATURE_MAX_DIM
            iu = np.triu_indices(d)
            P = np.empty((k, d + 1 + iu[0].size)) if features else None
            G = np.empty((k, d, d + 1))
            lam = np.empty(k)
            for i, g in enumerate(leaves):
                L = g._prec_chol
                # whitened: z = L' (x - mean) = L' xc - L' mc
                G[i, :, :d] = L.T
                G[i, :, d] = -(mc[i] @ L)
                if features:
                    prec = L @ L.T
                    lm = prec @ mc[i]
                    # -0.5 * (xc' prec xc - 2 xc' prec mc + mc' prec mc + const)
                    P[i, :d] = lm
                    P[i, d] = -0.5 * (mc[i] @ lm + g._const)
                    P[i, d + 1 :] = np.where(iu[0] == iu[1], -0.5, -1.0) * prec[iu]
                    # prec = L L' is rounded: bound with |L| |L|' rather than |prec|
                    lam[i] = np.linalg.norm(np.abs(L), 2) ** 2
            const = np.array([g._const for g in leaves])
            pconst = np.abs(P[:, d]) if features else np.full(k, np.inf)
            return _Expanded(c=c, P=P, lam=lam, slack=2 * d + 3, mc_norm=np.linalg.norm(mc, axis=1), pconst=pconst,
                             const=const, mc=mc, whiten=G.reshape(k * d, d + 1))

        return _stacked(leaves, build)

    @classmethod
    def _batch_prepare(cls, leaves, x):
        """``[xc; 1; xc_i * xc_j (i <= j)]`` (``d + 1`` rows only above ``FEATURE_MAX_DIM``)."""
        p = cls._batch_params(leaves)
        n, d = x.shape
        features = p.P is not None
        F = np.empty((d + 1 + (d * (d + 1) // 2 if features else 0), n))
        _centered_t(x, p.c, F[:d])
        F[d] = 1.0
        if features:
            o = d + 1
            for i in range(d):
                np.multiply(F[i], F[i:d], out=F[o : o + d - i])
                o += d - i
        return p, F

    @classmethod
    def _batch_log_density(cls, leaves, x, work=None, offsets=None):
        """Log densities ``(K, n)``, plus ``offsets[k]`` when given (finite, per component)."""
        p, F = work if work is not None else cls._batch_prepare(leaves, x)
        d = p.c.size
        if p.P is not None and _expanded_is_accurate(_radius2(F[:d]), p, F.shape[0]):
            return _matmul_cols(_offset_matrix(p.P, d, offsets), F)
        out = cls._whitened_log_density(p, F[: d + 1])
        if offsets is not None:
            out += offsets[:, None]
        return out

    @staticmethod
    def _whitened_log_density(p, Xa):
        """``-0.5 * (||L_k' (x - mean_k)||^2 + const_k)`` from ``Xa = [xc; 1]``, chunk by chunk."""
        k, d, n = p.const.size, p.c.size, Xa.shape[1]
        out = np.empty((k, n))
        cols = _gemm_cols(*p.whiten.shape)
        Y = np.empty((k * d, min(n, cols)))
        for a in range(0, n, cols):
            b = min(n, a + cols)
            y = Y[:, : b - a]
            np.matmul(p.whiten, Xa[:, a:b], out=y)
            np.multiply(y, y, out=y)
            np.sum(y.reshape(k, d, b - a), axis=1, out=out[:, a:b])
        out += p.const[:, None]
        out *= -0.5
        return out

    @classmethod
    def _batch_accumulate(cls, leaves, x, W, work=None):
        p, F = work if work is not None else cls._batch_prepare(leaves, x)
        c = p.c
        k, d = p.const.size, c.size
        W = np.asarray(W, dtype=np.float64)
        if p.P is not None:
            # F @ W' with W' row-major ran 1.6x faster than W @ F' for this many features
            S = _weighted_sums_t(F, np.ascontiguousarray(W.T))  # (features, K)
            sw, sxc = S[d], S[:d].T
            iu = np.triu_indices(d)
            M = np.empty((k, d, d))
            M[:, iu[0], iu[1]] = S[d + 1 :].T
            M[:, iu[1], iu[0]] = S[d + 1 :].T
        else:
            xc = F[:d]
            sw, sxc = W.sum(axis=1), W @ xc.T
            M = np.stack([(xc * W[i]) @ xc.T for i in range(k)])
        # back to moments about the origin: x = xc + c
        cx = c[None, :, None] * sxc[:, None, :]
        M += cx + cx.transpose(0, 2, 1)
        M += sw[:, None, None] * np.outer(c, c)
        sx = sxc + sw[:, None] * c
        return list(zip(sw.tolist(), sx, M))

    def _estimate(self, own, children):
        sw, sx, sxx = own
        if sw < MIN_WEIGHT:
            return self
        mean = sx / sw
        cov = sxx / sw - np.outer(mean, mean)
        cov = 0.5 * (cov + cov.T)
        low = np.linalg.eigvalsh(cov)[0]
        if low < VAR_FLOOR:
            cov = cov + (VAR_FLOOR - low) * np.eye(self.dim)
        return FullGaussian(mean, cov)

    def _sample(self, n, rng):
        return self.mean + rng.standard_normal((n, self.dim)) @ self._chol.T

    def cost(self):
        d = self.dim
        # alone (batched: _batch_cost): centre, whiten (2 d^2), the squared norm (2 d); for
        # the statistics a weighted sum (2 d), the rows scaled by their weights (a broadcast)
        # and the weighted outer products (2 d^2). Its temporaries: the centred rows and
        # their whitened copy.
        return NodeCost(flops_per_row=3.0 * d + d * SLOW_FLOPS + (4.0 * d * d + 2.0 * d) * MATMUL_FLOPS,
                        param_bytes=8 * d + 8 * d * d, stat_bytes=stat_bytes(arrays=[d, d * d], scalars=1),
                        data_bytes_per_row=8.0 * d, coupling_bytes_per_row=0.0, work_bytes_per_row=8.0,
                        scratch_bytes_per_row=16.0 * d)

    @classmethod
    def _batch_cost(cls, leaves) -> BatchCost:
        """The batched kernels per row. Up to ``FEATURE_MAX_DIM``: the feature block (x
        transposed and centred, ones, products ``xc_i xc_j``, the bound) built once and kept
        through both passes; each component's rows of ``P @ F`` and ``F @ W'`` (``2 nf``
        FLOPs each) and of ``W'``, whose copy is the folding's scratch. Above: the centred
        rows kept; per component the whitened products (``2 d (d + 1)``), squares and sums
        and the weighted moments (``2 d^2 + 2 d``), one weighted copy of the rows as scratch."""
        d, k = leaves[0].dim, len(leaves)
        if d <= FEATURE_MAX_DIM:
            nf = d + 1 + d * (d + 1) // 2
            # each of the two products reads the whole block: with few components that read,
            # not their FLOPs, bounds it (a pass over nf elements per row)
            floor = 2.0 * nf * max(0.0, 1.0 - 2.0 * k * GEMM_FLOPS)
            return BatchCost(block_flops=d * SLOW_FLOPS + nf + 2 * d + floor,
                             component_flops=4.0 * nf * GEMM_FLOPS + VECTOR_FLOPS, kept_bytes=8.0 * nf,
                             scratch_bytes=8.0 * k, block_calls=FULL_KERNEL_CALLS + FEATURE_CALLS_PER_DIM * d,
                             component_calls=FULL_COMPONENT_CALLS)
        return BatchCost(block_flops=d * SLOW_FLOPS + 1, component_flops=(4.0 * d * d + 4.0 * d) * MATMUL_FLOPS + 3 * d,
                         kept_bytes=8.0 * (d + 1), scratch_bytes=8.0 * d, block_calls=FULL_KERNEL_CALLS,
                         component_calls=FULL_COMPONENT_CALLS)
