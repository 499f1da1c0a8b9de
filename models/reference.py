"""EM in one process, written as plainly as the family contract allows: the oracle every
executor's fit is checked against (``tests/executors/test_reference.py``).

No blocks, no sibling batches, no shards, no caches: the upward pass asks each leaf for its
log density and each internal node to combine its children's; the downward pass hands each
node its rows' weights and takes back its children's and its own statistics; the M-step is
the one recursion every executor runs (``Node.estimate``). Its sums run in another order
than the engine's, so it agrees with every executor to rounding, not to the bit.
"""

from __future__ import annotations

import numpy as np

from .base import Node
from .regularize import Regularization, regularize
from .stats import Stats
from .support import leaf_accumulate, leaf_log_density, leaf_rows
from .tree import child_path


def _up(node: Node, data):
    """``(log density per row, what the downward pass needs)``."""
    if node.is_leaf:
        rows = leaf_rows(node, data)
        return leaf_log_density(node, rows), rows
    below = [_up(c, node._child_data(data, i)) for i, c in enumerate(node.children)]
    lds = [ld for ld, _ in below]
    ld, aux = node._combine(data, lds, False)
    return ld, (lds, aux, [memo for _, memo in below])


def _down(node: Node, data, w: np.ndarray, ld: np.ndarray, memo, path: str, out: dict) -> None:
    if node.is_leaf:
        out[path] = leaf_accumulate(node, memo, w)
        return
    lds, aux, memos = memo
    child_ws, own = node._distribute(data, w, lds, ld, aux)
    if node.has_own_stats:
        out[path] = own
    for i, c in enumerate(node.children):
        _down(c, node._child_data(data, i), child_ws[i], lds[i], memos[i], child_path(path, i), out)


def reference_fit(model: Node, data, *, max_iter: int = 100, tol: float = 1e-6,
                  regularization: Regularization | None = None) -> tuple[Node, list[float]]:
    """EM from ``model`` on ``data`` (raw, prepared here) until ``|ll_t - ll_{t-1}| <= tol *
    |ll_t|`` or ``max_iter`` iterations, as ``optimize`` stops: ``(fitted model, the
    log-likelihood of every iteration's starting model)``."""
    data = model.prepare(data)
    trace: list[float] = []
    for _ in range(max_iter):
        ld, memo = _up(model, data)
        out: dict = {}
        _down(model, data, np.ones(ld.shape[0]), ld, memo, "", out)
        trace.append(float(ld.sum()))
        model = model.estimate(regularize(model, Stats(out), regularization))
        if len(trace) > 1 and abs(trace[-1] - trace[-2]) <= tol * abs(trace[-1]):
            break
    return model, trace
