"""Mixture: a weighted choice among components that read the same data."""

from __future__ import annotations

import numpy as np

from .base import Internal, Node, as_float_array, check_probs, prepare_by_any, spec_field, spec_list
from .categorical import floor_probs
from .cost import NodeCost, stat_bytes
from .data import concat_rows, take_index
from .engine import MATMUL_FLOPS, VECTOR_FLOPS
from .errors import ModelError
from .floors import LOG_CLAMP, MIN_WEIGHT


def check_same_type(children, family, field):
    types = [c.data_type() for c in children]
    for i, t in enumerate(types[1:], 1):
        if t != types[0]:
            raise ModelError(
                f"{family}.{field} must share one data type; {field}[0] reads {types[0]}, {field}[{i}] reads {t}"
            )


def sample_by_label(children, labels: np.ndarray, rng: np.random.Generator):
    """Data for rows whose generating child is ``labels[row]``, in row order."""
    order = np.argsort(labels, kind="stable")
    counts = np.bincount(labels, minlength=len(children))
    parts = [children[k]._sample(int(counts[k]), rng) for k in range(len(children))]
    stacked = concat_rows(parts)
    inverse = np.empty_like(order)
    inverse[order] = np.arange(order.size)
    return take_index(stacked, inverse)


def log_softmax_parts(A: np.ndarray, *, overwrite: bool = False):
    """For a ``(K, n)`` array of logs: ``(logsumexp over K, exp(A - max), sum)``, no subnormals.

    With ``overwrite`` the exponentials are computed in ``A``'s memory (one pass less).
    """
    m = A.max(axis=0)
    if not np.isfinite(m).all():
        m = np.where(np.isfinite(m), m, 0.0)
    E = np.subtract(A, m, out=A if overwrite else None)
    if E.size and E.min() < LOG_CLAMP:  # clamping is a no-op otherwise; checking is cheaper
        np.maximum(E, LOG_CLAMP, out=E)
    np.exp(E, out=E)
    s = np.ones(E.shape[0]) @ E  # a matrix-vector product: faster than E.sum(axis=0)
    with np.errstate(divide="ignore"):
        return m + np.log(s), E, s


class Mixture(Internal):
    """``p(x) = sum_k weights[k] * components[k](x)``."""

    family = "Mixture"
    spec_fields = ("components", "weights")
    has_own_stats = True
    shares_child_data = True

    def __init__(self, components, weights):
        components = tuple(components)
        if not components:
            raise ModelError("Mixture.components must hold at least one component, got 0")
        for i, c in enumerate(components):
            if not isinstance(c, Node):
                raise ModelError(f"Mixture.components[{i}] must be a model node, got {type(c).__name__}")
        check_same_type(components, self.family, "components")
        self.weights = as_float_array(weights, "weights", self.family, 1)
        if self.weights.shape != (len(components),):
            raise ModelError(f"Mixture.weights must have shape ({len(components)},), got {self.weights.shape}")
        check_probs(self.weights, "weights", self.family)
        self.children = components
        with np.errstate(divide="ignore"):
            self._logw = np.log(self.weights)

    @property
    def components(self):
        return self.children

    def params(self):
        return {"weights": self.weights}

    @classmethod
    def _from_spec(cls, spec):
        from .spec import from_spec

        comps = [from_spec(c) for c in spec_list(spec, "components", cls.family)]
        return cls(comps, spec_field(spec, "weights", cls.family))

    def to_spec(self):
        return {"family": self.family, "components": [c.to_spec() for c in self.children],
                "weights": self.weights.tolist()}

    def describe(self):
        return f"Mixture K={len(self.children)}"

    def data_type(self):
        return self.children[0].data_type()

    def _prepare(self, data, where):
        return prepare_by_any(self.children, data, where)

    def _child_data(self, data, i):
        return data

    @property
    def _child_log_offsets(self) -> np.ndarray | None:
        """The log weights, for batched kernels that add them to their own constant term (see
        ``_combine_shifted``); None when a weight is 0, whose -inf must not enter a product."""
        return self._logw if np.all(np.isfinite(self._logw)) else None

    def child_data_shares(self):
        return self.weights

    def _combine(self, data, child_lds):
        if isinstance(child_lds, np.ndarray):  # a batched kernel's (K, n): add into a fresh array
            A = np.add(child_lds, self._logw[:, None], dtype=np.float64)
        else:
            A = np.array(child_lds, dtype=np.float64)  # fresh (K, n)
            A += self._logw[:, None]
        return self._combine_shifted(data, A)

    def _combine_shifted(self, data, A):
        """``_combine`` from ``A[k] = log weights[k] + log density of component k`` (a fresh
        ``(K, n)`` array, overwritten with the exponentials kept for ``_split``)."""
        ld, E, s = log_softmax_parts(A, overwrite=True)
        return ld, (E, s)

    def _split(self, data, w, child_lds, ld, aux):
        E, s = aux
        scale = w / np.where(s > 0, s, 1.0)
        E *= scale  # E now holds each component's row weights
        return E, (E @ np.ones(E.shape[1]),)

    def _estimate(self, own, children):
        (counts,) = own
        total = counts.sum()
        weights = self.weights if total < MIN_WEIGHT else floor_probs(counts / total)
        return Mixture(children, weights)

    def _sample(self, n, rng):
        labels = rng.choice(len(self.children), size=n, p=self.weights)
        return sample_by_label(self.children, labels, rng)

    def cost(self):
        k = len(self.children)
        # combine: max, subtract, min (3 K passes), exp (K), sum (a product), log, 3 passes of
        # n; split: scale (K), count (a product), 3 passes of n. (The log weights are added in
        # the batched kernels' products, or in one more K pass.)
        flops = 4 * k + 6 + 4 * k * MATMUL_FLOPS + (k + 1) * VECTOR_FLOPS
        return NodeCost(flops_per_row=flops, param_bytes=8 * k, stat_bytes=stat_bytes(arrays=[k]),
                        data_bytes_per_row=0.0, coupling_bytes_per_row=8.0 * k, work_bytes_per_row=8.0 * k + 16,
                        scratch_bytes_per_row=16.0)
