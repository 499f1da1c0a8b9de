"""Categorical leaf: an integer in ``0..V-1`` per row."""

from __future__ import annotations

import functools

import numpy as np

from .base import Leaf
from .columns import column_max, encode_values, int_column
from .cost import NodeCost, stat_bytes
from .errors import DataError, ModelError
from .floors import MIN_WEIGHT, PROB_FLOOR
from .schema import SIMPLEX, Meta, Param, Size, frozen
from .support import Interval
from .units import SLOW_FLOPS


def floor_probs(p: np.ndarray, axis: int = -1, in_place: bool = False) -> np.ndarray:
    """Probabilities lifted to ``PROB_FLOOR`` and renormalized (see ``models.floors``),
    frozen (``models.schema.frozen``) for a constructor to keep as they are: a new array,
    or ``p`` itself with ``in_place`` (a fresh array of the caller's, so an M-step makes one
    table, not three)."""
    p = np.maximum(p, PROB_FLOOR, out=p if in_place else None)
    p /= p.sum(axis=axis, keepdims=True)
    return frozen(p)


@functools.lru_cache(maxsize=256)
def codes(v: int | None) -> Interval:
    """The codes ``0..v-1`` (``0..`` for None): one object per ``v``, so sibling leaves of one
    size share their support (the engine checks a batch's rows once)."""
    return Interval(0, np.inf if v is None else v - 1)


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
    value_coded = True

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

    @property
    def support(self):
        """The codes ``0..V-1`` (``0..`` while ``V`` is unset)."""
        return codes(self.n_values)

    def _log_density(self, x):
        return self._logp[x]

    def _accumulate(self, x, w):
        return (np.bincount(x, weights=w, minlength=self.n_values).astype(np.float64, copy=False),)

    @classmethod
    def batch_log_density(cls, leaves, x, work, offsets):
        """``(K, n)`` log densities gathered from each leaf's own table: stacking the tables
        first would hold a second copy of every one of them for each block."""
        out = np.empty((len(leaves), x.size))
        for k, c in enumerate(leaves):
            np.take(c._logp, x, out=out[k])
        return out

    def _bind_values(self, values, column, at):
        """Bound to a column's distinct ``values``; a ``Categorical(n_values=V)`` (or a complete
        one) whose column holds the codes ``0..V-1`` keeps them: its values are ``0..V-1``."""
        v = self.n_values
        if v is not None and all(isinstance(a, int) and not isinstance(a, bool) and 0 <= a < v for a in values):
            values = list(range(v))
        elif v is not None and len(values) != v:
            raise DataError(f"column {column!r} holds {len(values)} distinct value(s) but the {at} has n_values={v}")
        return self.with_fields(values=values)

    def _sizes_from_data(self, x, at):
        """``n_values``: the largest value of its column plus one."""
        if self.n_values is not None:
            return {}
        if len(x) == 0:
            raise ModelError(f"{at} cannot take n_values from the data: its column is empty")
        return {"n_values": column_max(x) + 1}

    def _regularize(self, own, reg):
        """``pseudo_count`` more of every value (the MAP under a symmetric Dirichlet prior)."""
        if reg.pseudo_count > 0 and own[0].sum() >= MIN_WEIGHT:
            return (own[0] + reg.pseudo_count,)
        return own

    def _estimate(self, own, children):
        (counts,) = own
        total = counts.sum()
        if total < MIN_WEIGHT:
            return self
        return Categorical(floor_probs(counts / total, in_place=True), values=self.values)

    def _sample(self, n, rng):
        return rng.choice(self.n_values, size=n, p=self.probs).astype(np.int64)

    @classmethod
    def strategy(cls, st, like=None):
        """Over ``like``'s number of values (2..5 when None), every probability above about 0.01."""
        sizes = st.just(like.n_values) if like is not None else st.integers(2, 5)
        probs = st.floats(0.05, 1.0, allow_nan=False, allow_infinity=False)
        return sizes.flatmap(lambda v: st.lists(probs, min_size=v, max_size=v).map(
            lambda p: np.array(p) / np.sum(p)).map(Categorical))

    def oracle_log_density(self, x):
        x = np.asarray(x)
        inside = (x >= 0) & (x < self.n_values)
        with np.errstate(divide="ignore"):
            return np.where(inside, np.log(self.probs[np.clip(x, 0, self.n_values - 1)]), -np.inf)

    def oracle_estimate(self, x, w):
        counts = np.array([w[x == k].sum() for k in range(self.n_values)])
        return {"probs": counts / counts.sum()}

    def cost(self):
        v = self.n_values
        if v is None:
            raise ModelError("Categorical.n_values is unset; models.complete_shapes(model, data) takes it from the data")
        # log density: support check (min, max) and a gather; counts: the check and a bincount
        flops = 4 + 2 * SLOW_FLOPS
        return NodeCost(flops_per_row=flops, param_bytes=8 * v, stat_bytes=stat_bytes(arrays=[v]),
                        data_bytes_per_row=8.0, coupling_bytes_per_row=0.0, work_bytes_per_row=8.0,
                        scratch_bytes_per_row=8.0, cache_bytes=8 * v)  # the log table
