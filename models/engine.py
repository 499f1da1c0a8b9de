"""The two passes of one E-step over a model tree, shared by every executor.

*Upward*: each node's log density per row from its children's (leaves from data).
*Downward*: each node turns its row weights into its children's row weights and folds its
own sufficient statistics. Sibling leaves of one family under a mixture or HMM go through
their family's batched matrix kernels. Every leaf's kernels run under the support rule
(``models.support``): rows outside a leaf's support get log density -inf and weight 0.

The same passes run on a model shard (``models.shard``): a shard evaluates the subtrees it
holds whole (its shard roots), the shards of a replica exchange those subtrees' log
densities (the coupling), every shard evaluates the spanning nodes above them from those,
then each shard folds the statistics of its subtrees (the lead shard also those of the
spanning nodes). With one shard holding the root this is exactly the single-process E-step.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from .cost import block_bytes_per_row, tree_costs
from .data import Data, n_rows, take_rows
from .stats import Stats, StatsAccumulator
from .support import Rows, leaf_accumulate, leaf_log_density, leaf_rows, siblings_rows
from .tree import batch_class, child_path
from .units import BLOCK_BYTES, LEAF_BLOCK_BYTES, MAX_BLOCK_ROWS, MIN_BLOCK_ROWS

if TYPE_CHECKING:
    from .base import Node

#: ``block_rows`` of the models in use (every worker asks for it several times per
#: iteration; a model is immutable, and the next iteration's is a new object).
_BLOCK_ROWS: "weakref.WeakKeyDictionary[Node, int]" = weakref.WeakKeyDictionary()


def block_rows(model: Node) -> int:
    """Rows per block so that one block's working arrays stay near ``BLOCK_BYTES`` and no
    leaf's beyond ``LEAF_BLOCK_BYTES``."""
    hit = _BLOCK_ROWS.get(model)
    if hit is None:
        hit = _BLOCK_ROWS[model] = _block_rows(model)
    return hit


def _block_rows(model: Node) -> int:
    costs = tree_costs(model)
    per_row = block_bytes_per_row(costs)
    per_leaf = max(max(c.batch_bytes_per_row, c.work_bytes_per_row + c.scratch_bytes_per_row if c.is_leaf else 0.0)
                   for c in costs)
    rows = min(BLOCK_BYTES // max(per_row, 1.0), LEAF_BLOCK_BYTES // max(per_leaf, 1.0))
    return int(min(MAX_BLOCK_ROWS, max(MIN_BLOCK_ROWS, rows)))


def _batch_family(node: Node, path: str, frontier) -> type | None:
    """The leaf class when all children are leaves of one class evaluated here, else None."""
    cls = batch_class(node)
    if cls is None:
        return None
    if frontier and any(child_path(path, i) in frontier for i in range(len(node.children))):
        return None
    return cls


def _siblings_up(node: Node, data: Data, cls: type, shift: bool = True) -> tuple[np.ndarray, object, object, Rows]:
    """A sibling batch's upward pass under the support rule: ``(child_lds, work, offsets,
    rule)``, with the parent's log offsets added by a kernel that takes them when ``shift``
    (``offsets`` is None when they were not). Leaves of one support run the batched kernels
    on the column with stand-ins and get -inf where rows are outside; leaves whose supports
    differ, with rows outside one of them, run one by one."""
    rule = siblings_rows(node.children, node._child_data(data, 0))
    if rule.per_leaf is not None:
        lds = np.stack([leaf_log_density(c, r) for c, r in zip(node.children, rule.per_leaf)])
        return lds, None, None, rule
    work = cls.batch_prepare(node.children, rule.data)
    offsets = node.child_log_offsets() if shift and cls.batch_takes_offsets else None
    lds = cls.batch_log_density(node.children, rule.data, work, offsets)
    if rule.out is not None:
        lds = np.where(rule.out, -np.inf, lds)
    return lds, work, offsets, rule


class _Pass:
    """Caches of one block's upward pass, consumed by the downward pass.

    A node's children are evaluated one by one (recursively), or, when they are a sibling
    batch (``Leaf`` kernels over one column), by their class's batched kernels, whose
    ``work`` both passes share. What a leaf reads under the support rule (``models.support``:
    its rows outside found, stand-ins in their place) is found once, in the upward pass, and
    kept for the downward one.
    """

    def __init__(self, frontier: dict[str, np.ndarray] | None = None):
        self.frontier = frontier or {}
        self.ld: dict[str, np.ndarray] = {}
        self.aux: dict[str, tuple] = {}
        self.rows: dict[str, Rows] = {}

    def up(self, node: Node, data: Data, path: str) -> np.ndarray:
        if path in self.frontier:
            ld = self.frontier[path]
        elif node.is_leaf:
            rows = self.rows[path] = leaf_rows(node, data)
            ld = leaf_log_density(node, rows)
        else:
            cls = _batch_family(node, path, self.frontier)
            if cls is None:
                work, offsets, rule = None, None, None
                child_lds = [self.up(c, node._child_data(data, i), child_path(path, i)) for i, c in enumerate(node.children)]
            else:
                child_lds, work, offsets, rule = _siblings_up(node, data, cls)
            ld, aux = node._combine(data, child_lds, offsets is not None)
            self.aux[path] = (child_lds, aux, cls, work, rule)
        self.ld[path] = ld
        return ld

    def down(self, node: Node, data: Data, w: np.ndarray, path: str, out: dict, *,
             stop: frozenset = frozenset(), reached: dict | None = None, fold_upper: bool = True) -> None:
        """Folds statistics below ``node`` into ``out``; stops at the paths in ``stop``, whose
        row weights go to ``reached``, and folds the nodes above them only with ``fold_upper``."""
        if path in stop:
            reached[path] = w
            return
        if node.is_leaf:
            rows = self.rows[path] if path in self.rows else leaf_rows(node, data)
            out[path] = leaf_accumulate(node, rows, w)
            return
        child_lds, aux, cls, work, rule = self.aux[path]
        child_ws, own = node._distribute(data, w, child_lds, self.ld[path], aux)
        if fold_upper and node.has_own_stats:
            out[path] = own
        if cls is not None:
            W = np.asarray(child_ws, dtype=None if cls.float32_kernels else np.float64)
            if rule.per_leaf is not None:
                for i, (c, r) in enumerate(zip(node.children, rule.per_leaf)):
                    out[child_path(path, i)] = leaf_accumulate(c, r, W[i])
                return
            if rule.out is not None:
                W = np.where(rule.out, 0.0, W)
            folded = cls.batch_accumulate(node.children, rule.data, W, work)
            for i, s in enumerate(folded):
                out[child_path(path, i)] = s
            return
        for i, c in enumerate(node.children):
            self.down(c, node._child_data(data, i), child_ws[i], child_path(path, i), out,
                      stop=stop, reached=reached, fold_upper=fold_upper)


def subtree_data(model: Node, data: Data, path: str) -> Data:
    """The data a subtree reads (for a node under a sequence: one entry per position)."""
    node = model
    if path:
        for part in path.split("."):
            data = node._child_data(data, int(part))
            node = node.children[int(part)]
    return data


def shard_block(model: Node, data: Data, w: np.ndarray, roots: Sequence[str],
                exchange: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]],
                lead: bool) -> tuple[dict, float]:
    """One block of rows on one model shard: its statistics dict and its log-likelihood share.

    ``roots`` are this shard's shard-root paths; ``exchange`` sends their per-row log
    densities to the other shards of the replica and returns every shard root's. The
    log-likelihood is returned by the lead shard only, so a sum over workers counts
    every row once.
    """
    out: dict = {}
    if list(roots) == [""]:
        p = _Pass()
        ld = p.up(model, data, "")
        p.down(model, data, w, "", out)
        return out, float(w @ ld)
    passes, mine = shard_up(model, data, roots)
    return shard_down(model, data, w, roots, passes, exchange(mine), lead)


def shard_up(model: Node, data: Data, roots: Sequence[str]) -> tuple[dict, dict[str, np.ndarray]]:
    """First half of :func:`shard_block`: the upward pass of every subtree at ``roots``.

    Returns the passes' caches (for :func:`shard_down`) and the shard roots' per-row log
    densities, which are what this shard sends to the other shards of its replica.
    """
    passes, mine = {}, {}
    for r in roots:
        p = _Pass()
        mine[r] = p.up(model.node_at(r), subtree_data(model, data, r), r)
        passes[r] = p
    return passes, mine


def shard_down(model: Node, data: Data, w: np.ndarray, roots: Sequence[str], passes: dict,
               every: dict[str, np.ndarray], lead: bool) -> tuple[dict, float]:
    """Second half of :func:`shard_block`, given every shard root's log density of the replica."""
    out: dict = {}
    upper = _Pass(frontier=every)
    ld = upper.up(model, data, "")
    reached: dict = {}
    upper.down(model, data, w, "", out, stop=frozenset(every), reached=reached, fold_upper=lead)
    for r in roots:
        passes[r].down(model.node_at(r), subtree_data(model, data, r), reached[r], r, out)
    return out, (float(w @ ld) if lead else 0.0)


def e_step(model: Node, data: Data, w: np.ndarray | None = None, *, rows_per_block: int | None = None) -> tuple[Stats, float]:
    """Statistics and weighted log-likelihood of prepared data, block by block."""
    n = n_rows(data)
    w = np.ones(n) if w is None else w
    step = rows_per_block or block_rows(model)
    total = StatsAccumulator()
    ll = 0.0
    for a in range(0, n, step):
        b = min(n, a + step)
        out, part = shard_block(model, take_rows(data, a, b), w[a:b], [""], lambda x: x, True)
        total.add(out)
        ll += part
    return (total.result() if n > 0 else None), ll


def log_density(model: Node, data: Data) -> np.ndarray:
    """Per-row log density of prepared data."""
    return _Pass().up(model, data, "")


def accumulate(model: Node, data: Data, w: np.ndarray) -> Stats:
    return e_step(model, data, w)[0]


def em_step(model: Node, data: Data, w: np.ndarray | None = None) -> tuple[Node, float]:
    """One EM iteration on prepared data: ``(new model, log-likelihood of the old one)``."""
    stats, ll = e_step(model, data, w)
    return model.estimate(stats), ll


def child_weights(model: Node, data: Data, at: str) -> tuple[np.ndarray, np.ndarray]:
    """One block of prepared rows: the row weights the node at path ``at`` hands its children
    in the downward pass, as a ``(K, m)`` array (``m``: the rows its children read, one per
    position under a sequence), and the root's log density per row.

    The upward pass runs over the whole tree (the weight reaching a nested node depends on
    every sibling above it); the downward pass follows only the path to ``at`` and folds no
    statistics, so each column of the result sums to the weight reaching ``at``.
    """
    p = _Pass()
    ld = p.up(model, data, "")
    node, d, path = model, data, ""
    w = np.ones(n_rows(data))
    for i in [int(part) for part in at.split(".")] if at else []:
        child_lds, aux = p.aux[path][:2]
        child_ws, _ = node._distribute(d, w, child_lds, p.ld[path], aux)
        w, d, node, path = child_ws[i], node._child_data(d, i), node.children[i], child_path(path, i)
    child_lds, aux = p.aux[path][:2]
    child_ws, _ = node._distribute(d, w, child_lds, p.ld[path], aux)
    return np.asarray(child_ws, dtype=np.float64), ld


def children_log_density(node: Node, data: Data) -> np.ndarray:
    """``(K, m)``: each child's log density of the rows it reads (``node``'s children share
    one data column), through the children's batched kernel where they form one."""
    cls = batch_class(node)
    if cls is not None:
        return np.asarray(_siblings_up(node, data, cls, shift=False)[0])
    cd = node._child_data(data, 0)
    return np.stack([_Pass().up(c, cd, str(i)) for i, c in enumerate(node.children)])
