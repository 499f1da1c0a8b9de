"""Gaussian leaves: scalar, diagonal and full covariance, with matrix-form batched kernels."""

from __future__ import annotations

import numpy as np

from .base import Leaf, as_float_array, check_positive, float_column, spec_field
from .cost import NodeCost, stat_bytes
from .data import Ragged
from .errors import DataError, ModelError
from .floors import MIN_WEIGHT, VAR_FLOOR

LOG_2PI = float(np.log(2 * np.pi))


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
        return -0.5 * (LOG_2PI + np.log(self.var) + (x - self.mean) ** 2 / self.var)

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
        return NodeCost(flops_per_row=10.0, param_bytes=16, stat_bytes=stat_bytes(scalars=3),
                        data_bytes_per_row=8.0, coupling_bytes_per_row=0.0, work_bytes_per_row=32.0)


def _vector_column(data, where, family, d):
    if isinstance(data, (tuple, Ragged)):
        raise DataError(f"{where}: {family} expects a float array of shape (n, {d}), got {type(data).__name__}")
    try:
        x = np.asarray(data, dtype=np.float64)
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
        self._const = float(self.mean.size * LOG_2PI + np.log(self.var).sum() + (self.mean**2 / self.var).sum())

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
        return -0.5 * (np.square(x - self.mean) / self.var).sum(axis=1) - 0.5 * (self.dim * LOG_2PI + np.log(self.var).sum())

    def _accumulate(self, x, w):
        wx = w @ x
        return (float(w.sum()), wx, w @ (x * x))

    @classmethod
    def _batch_log_density(cls, leaves, x):
        prec = np.array([g.var for g in leaves]) ** -1.0  # (K, d)
        mp = np.array([g.mean for g in leaves]) * prec
        const = np.array([g._const for g in leaves])
        out = (x * x) @ prec.T  # (n, K)
        out -= 2.0 * (x @ mp.T)
        out += const
        out *= -0.5
        return np.ascontiguousarray(out.T)

    @classmethod
    def _batch_accumulate(cls, leaves, x, W):
        sw, sx, sxx = W.sum(axis=1), W @ x, W @ (x * x)
        return [(float(a), b, c) for a, b, c in zip(sw, sx, sxx)]

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
        return NodeCost(flops_per_row=8.0 * d + 10, param_bytes=16 * d, stat_bytes=stat_bytes(arrays=[d, d], scalars=1),
                        data_bytes_per_row=8.0 * d, coupling_bytes_per_row=0.0, work_bytes_per_row=16.0 * d + 16)


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
        self._shift = self.mean @ self._prec_chol
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
        z = x @ self._prec_chol
        z -= self._shift
        return -0.5 * (np.einsum("ij,ij->i", z, z) + self._const)

    def _accumulate(self, x, w):
        return (float(w.sum()), w @ x, (x * w[:, None]).T @ x)

    @classmethod
    def _batch_log_density(cls, leaves, x):
        return np.stack([g._log_density(x) for g in leaves])

    @classmethod
    def _batch_accumulate(cls, leaves, x, W):
        sx = W @ x
        return [(float(W[k].sum()), sx[k], (x * W[k][:, None]).T @ x) for k in range(len(leaves))]

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
        return NodeCost(flops_per_row=4.0 * d * d + 8.0 * d + 10, param_bytes=8 * d + 8 * d * d,
                        stat_bytes=stat_bytes(arrays=[d, d * d], scalars=1), data_bytes_per_row=8.0 * d,
                        coupling_bytes_per_row=0.0, work_bytes_per_row=16.0 * d + 16)
