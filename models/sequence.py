"""Sequence: an i.i.d. variable-length run of the child's rows per row."""

from __future__ import annotations

import numpy as np

from .base import Internal, Node
from .columns import prepare_by_any
from .cost import NodeCost, stat_bytes
from .data import Ragged
from .errors import DataError, ModelError
from .floors import MIN_WEIGHT
from .schema import POSITIVE, Children, Param
from .units import MATMUL_FLOPS, SCAN_FLOPS, SLOW_FLOPS


def known_length(node: Node, length: float | None = None) -> float:
    """``length``, or the node's ``mean_length``; a ModelError when both are unknown."""
    if length is not None:
        return float(length)
    if node.mean_length is None:
        raise ModelError(f"{node.family}.mean_length is unset; models.complete_shapes(model, data) takes it "
                         f"from the data's lengths")
    return float(node.mean_length)


def prepare_ragged(data, children: tuple[Node, ...], where: str, family: str) -> Ragged:
    """Accepts a Ragged or a list of per-row arrays; checks the values against ``children``
    (one child, or the emissions of an HMM, see :func:`models.columns.prepare_by_any`)."""
    if not isinstance(data, Ragged):
        if isinstance(data, np.ndarray) and data.dtype != object:
            raise DataError(f"{where}: {family} expects a list of per-row arrays or a Ragged, got a {data.ndim}-D array")
        try:
            rows = [_as_rows(r) for r in data]
        except (TypeError, ValueError):
            raise DataError(f"{where}: {family} expects a list of per-row arrays or a Ragged, got {type(data).__name__}") from None
        for i, r in enumerate(rows):
            if not _is_rows(r):
                raise DataError(
                    f"{where}: {family} rows must be arrays of positions (one array per row); row {i} is {r!r}"
                )
        data = Ragged.from_rows(rows)
    values = prepare_by_any(children, data.values, f"{where}.values")
    return Ragged(values, data.offsets)


def _as_rows(r):
    return r if isinstance(r, (tuple, Ragged)) else np.asarray(r)


def _is_rows(r) -> bool:
    """Whether ``r`` holds rows: a Ragged, an array of >= 1 dimension, or a tuple of those."""
    if isinstance(r, Ragged):
        return True
    if isinstance(r, tuple):
        return len(r) > 0 and all(_is_rows(_as_rows(c)) for c in r)
    return r.ndim >= 1


class Sequence(Internal):
    """Log density of a row is the sum over its positions of the child's log density.

    ``mean_length`` is the expected number of positions per row: it sets the sampling
    distribution of lengths (Poisson) and the planner's per-row cost, and the M-step
    updates it to the weighted mean length of the data. Lengths are treated as given:
    they are not part of the density, and ``mean_length`` is not a free parameter
    (``n_parameters``). Left unset, it is the data's mean length (``models.complete_shapes``).
    ``bic`` counts the positions (``models.inference.n_observations``).
    """

    family = "Sequence"
    schema = (Children("child", many=False),
              Param("mean_length", 0, POSITIVE, free=False))
    reads_ragged = True
    has_own_stats = True

    def __init__(self, child, mean_length: float | None = None):
        self._init_fields(child=child, mean_length=mean_length)

    @property
    def child(self):
        return self.children[0]

    def child_rows(self, i):
        return known_length(self)

    def describe(self):
        return "Sequence L~?" if self.mean_length is None else f"Sequence L~{float(self.mean_length):.3g}"

    def data_type(self):
        return f"seq<{self.child.data_type()}>"

    def _prepare(self, data, where):
        return prepare_ragged(data, self.children, where, self.family)

    def _child_data(self, data, i):
        return data.values

    def _combine(self, data, child_lds, shifted):
        return data.segment_sum(child_lds[0]), None

    def _distribute(self, data, w, child_lds, ld, aux):
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

    def cost(self, length: float | None = None):
        """Per row of ``length`` positions (default: ``mean_length``; see ``models.cost.data_lengths``)."""
        L = known_length(self, length)
        # per position: the segment sums' running sum, its copy, the repeated weights; per row:
        # gathers at the offsets and the statistics; kept: per-position log densities, offsets
        flops = L * (SCAN_FLOPS + 3) + 2 * SLOW_FLOPS + 4 + 2 * MATMUL_FLOPS
        return NodeCost(flops_per_row=flops, param_bytes=8, stat_bytes=stat_bytes(scalars=2),
                        data_bytes_per_row=8.0, coupling_bytes_per_row=8.0 * L, work_bytes_per_row=8.0 * L + 16)
