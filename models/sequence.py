"""Sequence: an i.i.d. variable-length run of the child's rows per row."""

from __future__ import annotations

import numpy as np

from .base import Internal, Node, as_float_array, check_positive, spec_field
from .cost import NodeCost, stat_bytes
from .data import Ragged, concat_rows, n_rows
from .errors import DataError, ModelError
from .floors import MIN_WEIGHT

DEFAULT_MEAN_LENGTH = 10.0


def prepare_ragged(data, child: Node, where: str, family: str) -> Ragged:
    """Accepts a Ragged or a list of per-row arrays; checks the values against ``child``."""
    if not isinstance(data, Ragged):
        if isinstance(data, np.ndarray) and data.dtype != object:
            raise DataError(f"{where}: {family} expects a list of per-row arrays or a Ragged, got a {data.ndim}-D array")
        try:
            rows = list(data)
        except TypeError:
            raise DataError(f"{where}: {family} expects a list of per-row arrays or a Ragged, got {type(data).__name__}") from None
        if rows and not all(n_rows(_as_rows(r)) >= 0 for r in rows):
            raise DataError(f"{where}: {family} rows must be arrays")
        data = Ragged.from_rows([_as_rows(r) for r in rows])
    values = child._prepare(data.values, f"{where}.values")
    return Ragged(values, data.offsets)


def _as_rows(r):
    return r if isinstance(r, (tuple, Ragged)) else np.asarray(r)


class Sequence(Internal):
    """Log density of a row is the sum over its positions of the child's log density.

    ``mean_length`` is the expected number of positions per row: it sets the sampling
    distribution of lengths (Poisson) and the planner's per-row cost, and the M-step
    updates it to the weighted mean length of the data. Lengths are treated as given:
    they are not part of the density.
    """

    family = "Sequence"
    spec_fields = ("child", "mean_length")
    has_own_stats = True

    def __init__(self, child, mean_length: float = DEFAULT_MEAN_LENGTH):
        if not isinstance(child, Node):
            raise ModelError(f"Sequence.child must be a model node, got {type(child).__name__}")
        self.children = (child,)
        self.mean_length = as_float_array(mean_length, "mean_length", self.family, 0)
        check_positive(self.mean_length, "mean_length", self.family)

    @property
    def child(self):
        return self.children[0]

    def child_rows(self, i):
        return float(self.mean_length)

    def params(self):
        return {"mean_length": self.mean_length}

    @classmethod
    def _from_spec(cls, spec):
        from .spec import from_spec

        return cls(from_spec(spec_field(spec, "child", cls.family)), spec.get("mean_length", DEFAULT_MEAN_LENGTH))

    def to_spec(self):
        return {"family": self.family, "child": self.child.to_spec(), "mean_length": float(self.mean_length)}

    def describe(self):
        return f"Sequence L~{float(self.mean_length):.3g}"

    def data_type(self):
        return f"seq<{self.child.data_type()}>"

    def _prepare(self, data, where):
        return prepare_ragged(data, self.child, where, self.family)

    def _child_data(self, data, i):
        return data.values

    def _combine(self, data, child_lds):
        return data.segment_sum(child_lds[0]), None

    def _split(self, data, w, child_lds, ld, aux):
        lengths = data.lengths
        return [np.repeat(w, lengths)], (float(w.sum()), float(w @ lengths))

    def _estimate(self, own, children):
        sw, slen = own
        mean_length = self.mean_length if sw < MIN_WEIGHT or slen <= 0 else slen / sw
        return Sequence(children[0], mean_length)

    def _sample(self, n, rng):
        lengths = rng.poisson(float(self.mean_length), size=n)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        return Ragged(self.child._sample(int(offsets[-1]), rng), offsets)

    def cost(self):
        L = float(self.mean_length)
        return NodeCost(flops_per_row=3.0 * L + 4, param_bytes=8, stat_bytes=stat_bytes(scalars=2),
                        data_bytes_per_row=8.0, coupling_bytes_per_row=8.0 * L, work_bytes_per_row=16.0 * L + 16)
