"""Mixture: a weighted choice among components that read the same data."""

from __future__ import annotations

import numpy as np

from .base import Internal
from .columns import prepare_by_any
from .categorical import floor_probs
from .cost import NodeCost, stat_bytes
from .data import concat_rows, take_index
from .floors import MIN_WEIGHT
from .kernels import log_softmax_parts
from .schema import SIMPLEX, Children, Param
from .units import MATMUL_FLOPS, VECTOR_FLOPS

#: A fitted weight below this is reported as a collapsed component (``models.diagnose``).
COLLAPSED_WEIGHT = 1e-3


def sample_by_label(children, labels: np.ndarray, rng: np.random.Generator):
    """Data for rows whose generating child is ``labels[row]``, in row order."""
    order = np.argsort(labels, kind="stable")
    counts = np.bincount(labels, minlength=len(children))
    parts = [children[k]._sample(int(counts[k]), rng) for k in range(len(children))]
    stacked = concat_rows(parts)
    inverse = np.empty_like(order)
    inverse[order] = np.arange(order.size)
    return take_index(stacked, inverse)


class Mixture(Internal):
    """``p(x) = sum_k weights[k] * components[k](x)``."""

    family = "Mixture"
    schema = (Children("components", noun="component", same_type=True), Param("weights", 1, SIMPLEX, shape=("K",)))
    has_own_stats = True
    shares_child_data = True
    repeat = ("k", "component")

    def __init__(self, components, weights=None):
        self._init_fields(components=components, weights=weights)
        if self.weights is not None:
            with np.errstate(divide="ignore"):
                self._logw = np.log(self.weights)

    @property
    def components(self):
        return self.children

    def describe(self):
        return f"Mixture K={len(self.children)}"

    def data_type(self):
        return self.children[0].data_type()

    def _prepare(self, data, where):
        return prepare_by_any(self.children, data, where)

    def _child_data(self, data, i):
        return data

    def child_log_offsets(self) -> np.ndarray | None:
        """The log weights, for batched kernels that add them to their own constant term;
        None when a weight is 0, whose -inf must not enter a product."""
        if self.weights is None:
            return None
        return self._logw if np.all(np.isfinite(self._logw)) else None

    def child_data_shares(self):
        return super().child_data_shares() if self.weights is None else self.weights

    def _combine(self, data, child_lds, shifted):
        """From ``A[k] = log weights[k] + log density of component k``, a fresh ``(K, n)``
        array (the batched kernel's own output when ``shifted``), overwritten with the
        exponentials kept for ``_distribute``."""
        if shifted:
            A = child_lds
        elif isinstance(child_lds, np.ndarray):  # a batched kernel's (K, n): add into a fresh array
            A = np.add(child_lds, self._logw[:, None], dtype=np.float64)
        else:
            A = np.array(child_lds, dtype=np.float64)  # fresh (K, n)
            A += self._logw[:, None]
        ld, E, s = log_softmax_parts(A, overwrite=True)
        return ld, (E, s)

    def _distribute(self, data, w, child_lds, ld, aux):
        E, s = aux
        scale = w / np.where(s > 0, s, 1.0)
        E *= scale.astype(E.dtype, copy=False)  # E now holds each component's row weights
        if E.dtype == np.float64:
            return E, (E @ np.ones(E.shape[1]),)
        return E, (np.add.reduce(E, axis=1, dtype=np.float64),)  # a float32 block's counts, in float64

    @classmethod
    def _fitted(cls, children, weights: np.ndarray) -> "Mixture":
        """``Mixture(children, weights)`` for an M-step's result, without the checks its making
        settles: ``children`` are the new versions of the old ones (their count and class),
        ``weights`` come from ``floor_probs`` (frozen float64, every one above the floor, the
        sum renormalized). The attributes in the order ``Node._init_fields`` sets them."""
        node = cls.__new__(cls)
        node.children, node.weights, node._sizes, node._unset = tuple(children), weights, {}, ()
        node._logw = np.log(weights)
        return node

    def _estimate(self, own, children):
        (counts,) = own
        total = counts.sum()
        if total < MIN_WEIGHT:
            return Mixture(children, self.weights)
        return Mixture._fitted(children, floor_probs(counts / total))

    def _regularize(self, own, reg):
        """``pseudo_count`` more rows for every component."""
        if reg.pseudo_count > 0 and own[0].sum() >= MIN_WEIGHT:
            return (own[0] + reg.pseudo_count,)
        return own

    def _fit_warnings(self, at, rows):
        """A component whose weight is below ``COLLAPSED_WEIGHT`` (it explains almost none of
        the rows reaching the mixture)."""
        if self.weights is None:
            return []
        return [f"{at}: component {int(k)} has weight {float(self.weights[k]):.3g} (below {COLLAPSED_WEIGHT:g}): "
                f"it has collapsed" for k in np.flatnonzero(self.weights < COLLAPSED_WEIGHT)]

    def rows_needed(self):
        return max(c.rows_needed() for c in self.children)

    def _sample(self, n, rng):
        labels, _ = self._draw_labels(n, rng)
        return sample_by_label(self.children, labels, rng)

    def _draw_labels(self, n, rng):
        return rng.choice(len(self.children), size=n, p=self.weights), None

    def cost(self):
        k = len(self.children)
        # combine: the log-sum-exp over K rows; distribute: scaling and the counts
        flops = 4 * k + 6 + 4 * k * MATMUL_FLOPS + (k + 1) * VECTOR_FLOPS
        return NodeCost(flops_per_row=flops, param_bytes=8 * k, stat_bytes=stat_bytes(arrays=[k]),
                        data_bytes_per_row=0.0, coupling_bytes_per_row=8.0 * k, work_bytes_per_row=8.0 * k + 16,
                        scratch_bytes_per_row=16.0, cache_bytes=8 * k)  # the log weights
