"""Categorical leaf: an integer in ``0..V-1`` per row."""

from __future__ import annotations

import numpy as np

from .base import Leaf
from .columns import encode_values, int_column
from .cost import NodeCost, stat_bytes
from .errors import DataError, ModelError
from .floors import MIN_WEIGHT, PROB_FLOOR
from .schema import SIMPLEX, Meta, Param, Size, frozen
from .units import SLOW_FLOPS


def floor_probs(p: np.ndarray, axis: int = -1, in_place: bool = False) -> np.ndarray:
    """Probabilities lifted to ``PROB_FLOOR`` and renormalized (see ``models.floors``),
    frozen (``models.schema.frozen``) for a constructor to keep as they are: a new array,
    or ``p`` itself with ``in_place`` (a fresh array of the caller's, so an M-step makes one
    table, not three)."""
    p = np.maximum(p, PROB_FLOOR, out=p if in_place else None)
    p /= p.sum(axis=axis, keepdims=True)
    return frozen(p)


def _inside(x: np.ndarray, v: int) -> np.ndarray | None:
    """Mask of values in ``0..v-1``, or None when every value is."""
    if x.size == 0 or (x.min() >= 0 and x.max() < v):
        return None
    return (x >= 0) & (x < v)


def _lookup(logp: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``logp[:, x]`` for a ``(K, V)`` table, -inf where ``x`` is outside ``0..V-1``."""
    inside = _inside(x, logp.shape[1])
    if inside is None:
        return logp[:, x]
    out = np.full((logp.shape[0], x.size), -np.inf)
    out[:, inside] = logp[:, x[inside]]
    return out


def check_values(values, family: str = "Categorical") -> tuple | None:
    """A value list as a tuple of distinct JSON scalars (strings, integers, booleans)."""
    if values is None:
        return None
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise ModelError(f"{family}.values must be a list of distinct values, got {values!r}")
    out = []
    for v in values:
        if isinstance(v, np.generic):
            v = v.item()
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if not isinstance(v, (str, int, bool)):
            raise ModelError(f"{family}.values must hold strings, integers or booleans, got {v!r}")
        out.append(v)
    if not out:
        raise ModelError(f"{family}.values must hold at least one value, got 0")
    if len({(type(v), v) for v in out}) != len(out):
        seen = set()
        dup = next(v for v in out if (type(v), v) in seen or seen.add((type(v), v)))
        raise ModelError(f"{family}.values must be distinct, got {dup!r} twice")
    return tuple(out)


class Categorical(Leaf):
    family = "Categorical"
    schema = (Size("n_values", of="probs", from_data=True), Param("probs", 1, SIMPLEX, shape=("n_values",)),
              Meta("values"))

    def __init__(self, probs=None, *, n_values: int | None = None, values=None):
        """``Categorical(probs)``, or a template: ``Categorical(n_values=V)``, or
        ``Categorical()`` whose ``V`` is the largest value of its data column plus one.

        ``values`` lists what each code stands for, in code order (strings, integers or
        booleans): tables are encoded with it, and data that are not integers are looked
        up in it. A fit from a table sets it from the column (``models.tables.bind``)."""
        values = check_values(values)
        if values is not None and probs is None and n_values is None:
            n_values = len(values)
        self._init_fields(probs=probs, n_values=n_values, values=values)
        if values is not None and self.n_values is not None and len(values) != self.n_values:
            raise ModelError(f"Categorical.values has {len(values)} value(s) but n_values is {self.n_values}")
        if self.probs is not None:
            with np.errstate(divide="ignore"):
                self._logp = np.log(self.probs)

    @property
    def n_values(self) -> int | None:
        return self._sizes["n_values"]

    def describe(self):
        return f"Categorical V={self.n_values if self.n_values is not None else '?'}"

    def data_type(self):
        return "int"

    def _prepare(self, data, where):
        kind = np.asarray(data).dtype.kind if isinstance(data, (np.ndarray, list)) else ""
        if self.values is not None and kind in "USO" and kind:
            return encode_values(np.asarray(data), self.values, where)
        if kind and kind in "USO":
            raise DataError(f"{where}: Categorical reads integer codes 0..V-1, got dtype {np.asarray(data).dtype}; "
                            f"give Categorical(values=[...]) or read a table (models.tables), which encodes them")
        x = int_column(data, where, self.family)
        if self.n_values is None:
            if x.size and x.min() < 0:
                raise DataError(f"{where}: Categorical values must be >= 0, got {int(x.min())}")
            return x
        if x.size and (x.min() < 0 or x.max() >= self.n_values):
            bad = x[(x < 0) | (x >= self.n_values)][0]
            raise DataError(f"{where}: Categorical value {int(bad)} is outside its support 0..{self.n_values - 1}")
        return x

    # Values outside ``0..V-1`` reach these kernels only as rows of a mixture or an HMM
    # whose other components accept them (see ``models.columns.prepare_by_any``): their log
    # density is -inf and they add nothing to the counts.
    def _log_density(self, x):
        return _lookup(self._logp[None, :], x)[0]

    def _accumulate(self, x, w):
        inside = _inside(x, self.n_values)
        if inside is not None:
            x, w = x[inside], w[inside]
        return (np.bincount(x, weights=w, minlength=self.n_values).astype(np.float64, copy=False),)

    @classmethod
    def batch_log_density(cls, leaves, x, work, offsets):
        """``(K, n)`` log densities gathered from each leaf's own table: stacking the tables
        first would hold a second copy of every one of them for each block."""
        if len({c.n_values for c in leaves}) == 1:
            inside = _inside(x, leaves[0].n_values)
            if inside is None:
                out = np.empty((len(leaves), x.size))
                for k, c in enumerate(leaves):
                    np.take(c._logp, x, out=out[k])
                return out
            out = np.full((len(leaves), x.size), -np.inf)
            xs = x[inside]
            for k, c in enumerate(leaves):
                out[k, inside] = c._logp[xs]
            return out
        return super().batch_log_density(leaves, x, work, offsets)

    def _estimate(self, own, children):
        (counts,) = own
        total = counts.sum()
        if total < MIN_WEIGHT:
            return self
        return Categorical(floor_probs(counts / total, in_place=True), values=self.values)

    def _sample(self, n, rng):
        return rng.choice(self.n_values, size=n, p=self.probs).astype(np.int64)

    def cost(self):
        v = self.n_values
        if v is None:
            raise ModelError("Categorical.n_values is unset; models.complete_shapes(model, data) takes it from the data")
        # log density: support check (min, max) and a gather; counts: the check and a bincount
        flops = 4 + 2 * SLOW_FLOPS
        return NodeCost(flops_per_row=flops, param_bytes=8 * v, stat_bytes=stat_bytes(arrays=[v]),
                        data_bytes_per_row=8.0, coupling_bytes_per_row=0.0, work_bytes_per_row=8.0,
                        scratch_bytes_per_row=8.0, cache_bytes=8 * v)  # the log table
