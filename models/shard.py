"""What a model shard is: the part of a model tree, and of its data, that one shard holds.

A plan places every leaf on one of ``M`` shards (``shard_of_leaf``). From that placement:

- a *spanning node* is an internal node whose leaves lie on more than one shard
  (:func:`spanning_nodes`); every shard evaluates the spanning nodes;
- a *shard root* is a maximal subtree whose leaves all lie on one shard
  (:func:`shard_roots`): the child of a spanning node that is not spanning itself, or the
  root when nothing spans. Its shard evaluates it whole and sends its per-row log density
  to the other shards of the replica (the coupling, :func:`coupling_bytes_per_row`).

:class:`ShardView`, built once per plan, answers everything else a worker needs: the pruned
model a shard holds (:meth:`ShardView.model_for`: its subtrees whole, the spanning nodes
above them, every other shard's subtree an :class:`Elsewhere`), the columns of the data it
reads (:meth:`ShardView.columns_for`), and its upward and downward passes per block. The
executors move rows and bytes; nothing in them depends on a family.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from . import engine
from .base import Node
from .cost import COUPLING_BYTES, tree_costs
from .data import Data, Ragged
from .tree import child_path

LogDensities = dict[str, np.ndarray]


# ---------------------------------------------------------------- the placement's structure
def leaves_under(model: Node, path: str) -> list[str]:
    """The leaf paths of the subtree at ``path``, in pre-order."""
    return [p for p, _ in model.leaves() if p == path or p.startswith(path + ".") or path == ""]


def spanning_nodes(model: Node, shard_of_leaf: Mapping[str, int]) -> set[str]:
    """Paths of the internal nodes whose leaves lie on more than one shard."""
    shards: dict[str, set[int]] = {}
    for path, node in reversed(model.nodes()):
        if node.is_leaf:
            shards[path] = {shard_of_leaf[path]}
        else:
            shards[path] = set().union(*(shards[child_path(path, i)] for i in range(len(node.children))))
    return {p for p, s in shards.items() if len(s) > 1}


def shard_roots(model: Node, shard_of_leaf: Mapping[str, int]) -> dict[str, int]:
    """The maximal subtrees held by one shard, ``{path: shard}`` in pre-order; just
    ``{"": s}`` when no node spans shards."""
    spanning = spanning_nodes(model, shard_of_leaf)
    if not spanning:
        return {"": shard_of_leaf[model.leaves()[0][0]]}
    out = {}
    for path, _ in model.nodes():
        parent = path.rsplit(".", 1)[0] if "." in path else ("" if path else None)
        if path not in spanning and parent is not None and parent in spanning:
            out[path] = shard_of_leaf[leaves_under(model, path)[0]]
    return out


def coupling_bytes_per_row(model: Node, shard_of_leaf: Mapping[str, int]) -> float:
    """Bytes per root row the shard roots send to the other shards of their replica: one
    ``COUPLING_BYTES`` log density per row of each root (``models.cost``'s convention)."""
    roots = shard_roots(model, shard_of_leaf)
    if list(roots) == [""]:
        return 0.0
    mult = {c.path: c.rows_per_root_row for c in tree_costs(model)}
    return float(sum(COUPLING_BYTES * mult[p] for p in roots))


def column_keys(model: Node) -> dict[str, str]:
    """The key of the data column every node reads, by path: nodes with one key read one column.

    The root's key is ``""``; a child's is its parent's followed by ``.i`` (child ``i`` of a
    composite or a sequence), or by ``.*`` for every child of a node whose children read
    one column together (``shares_child_data``: a mixture's components, an HMM's emissions),
    so such siblings share one key: their column is held once, by a shard that holds any of
    them. (The planner's ``planner.costing`` groups data bytes by the same keys.)
    """
    keys = {"": ""}
    for path, node in model.nodes():
        for i in range(len(node.children)):
            step = "*" if node.shares_child_data else str(i)
            keys[child_path(path, i)] = f"{keys[path]}.{step}"
    return keys


# ---------------------------------------------------------------- the pruned model
def with_children(node: Node, children: tuple[Node, ...]) -> Node:
    """``node`` with other children, sharing its own parameters (nothing is copied but the
    node object): the spanning nodes of a shard's model hold stubs for other shards' subtrees."""
    twin = copy.copy(node)
    twin.children = tuple(children)
    return twin


class Elsewhere(Node):
    """Stands for a subtree that another shard of the replica holds, in the model a shard
    receives (:meth:`ShardView.model_for`): its log density arrives by the exchange, so it is
    never evaluated here, and its parameters stay with its own shard."""

    has_own_stats = False
    support = None  # never evaluated here (``_log_density`` says so)

    def __init__(self, path: str, data_type: str | None = None):
        self.path = path
        self._data_type = data_type  # the subtree's, so a split node above it can be rebuilt

    def data_type(self) -> str | None:
        return self._data_type

    def __reduce__(self):
        return (Elsewhere, (self.path, self._data_type))

    def _estimate(self, own, children) -> "Elsewhere":
        return self  # its own shard estimates the subtree (executors.mstep)

    def own_unset(self) -> tuple[str, ...]:
        return ()  # its own shard's part is checked there

    def params(self):
        return {}

    def describe(self) -> str:
        return f"(subtree {self.path!r} on another shard)"

    def to_spec(self) -> dict:
        """A stub in a skeleton's spec (``models.sharded``): the path of the subtree it
        stands for and that subtree's data type."""
        return {"family": "Elsewhere", "path": self.path, "data_type": self._data_type}

    def cost(self):
        raise AssertionError(f"{self.describe()} has no cost here")

    def _log_density(self, data):
        raise AssertionError(f"{self.describe()} was evaluated on the wrong shard")

    def _accumulate(self, data, w):
        raise AssertionError(f"{self.describe()} was folded on the wrong shard")


# Module-level recursions, not closures: a nested function that calls itself is a reference
# cycle, which would keep the subtrees it was given alive until the cyclic collector runs.
def _skeleton(node: Node, path: str, spanning: frozenset[str]) -> Node:
    if path not in spanning:
        return node if isinstance(node, Elsewhere) else Elsewhere(path, node.data_type())
    return with_children(node, tuple(_skeleton(c, child_path(path, i), spanning) for i, c in enumerate(node.children)))


def fill_stubs(skeleton: Node, owned: Mapping[str, Node]) -> Node:
    """``skeleton`` (spanning nodes above :class:`Elsewhere` stubs) with each stub whose path
    ``owned`` names replaced by that subtree; the other stubs stay."""
    if isinstance(skeleton, Elsewhere):
        return owned.get(skeleton.path, skeleton)
    if not skeleton.children:
        return skeleton
    return with_children(skeleton, tuple(fill_stubs(c, owned) for c in skeleton.children))


# ---------------------------------------------------------------- the columns a shard reads
def restrict_columns(model: Node, data: Data, keep: frozenset[str], spanning: frozenset[str] = frozenset(),
                     keys: Mapping[str, str] | None = None) -> Data:
    """``data`` with the columns of leaves outside ``keep`` replaced by None.

    The tuples are kept whole, and the offsets of every sequence level that the shard
    evaluates: those above a kept leaf and those of the ``spanning`` nodes, which every shard
    evaluates whatever leaves it holds (a sequence wholly on other shards loses its offsets
    too). Siblings of one column key (:func:`column_keys`) read one column, which is kept
    when any of them is kept.
    """
    keys = column_keys(model) if keys is None else keys

    def walk(node: Node, data: Data, path: str) -> Data:
        if node.is_leaf:
            return data if path in keep else None
        reads = [node._child_data(data, i) for i in range(len(node.children))]
        by_key: dict[str, Data] = {}
        for i, (child, d) in enumerate(zip(node.children, reads)):
            p = child_path(path, i)
            part = walk(child, d, p)
            key = keys[p]
            by_key[key] = _union(by_key[key], part) if key in by_key else part
        parts = [by_key[keys[child_path(path, i)]] for i in range(len(node.children))]
        if all(d is data for d in reads):  # the children read this node's own column
            return parts[0]
        if isinstance(data, tuple) and all(d is data[i] for i, d in enumerate(reads)):
            return tuple(parts)
        if isinstance(data, Ragged) and all(d is data.values for d in reads):
            merged = parts[0]
            return None if _holds_nothing(merged) and path not in spanning else Ragged.unchecked(merged, data.offsets)
        raise TypeError(f"{node.family} at {path or '<root>'!r}: cannot tell how its children read its data")

    return walk(model, data, "")


def _holds_nothing(data: Data) -> bool:
    """No column at all: None, or tuples of nothing (a kept sequence holds its offsets)."""
    if data is None:
        return True
    return isinstance(data, tuple) and all(_holds_nothing(d) for d in data)


def _union(a: Data, b: Data) -> Data:
    """Two restrictions of one column: every part held by either."""
    if a is None:
        return b
    if b is None:
        return a
    if isinstance(a, tuple):
        return tuple(_union(x, y) for x, y in zip(a, b))
    if isinstance(a, Ragged):
        return Ragged.unchecked(_union(a.values, b.values), a.offsets)
    return a


# ---------------------------------------------------------------- the view
def _no_exchange(mine: LogDensities) -> LogDensities:
    raise AssertionError("a tree held whole by one shard has nothing to exchange")


@dataclass(frozen=True, eq=False)
class ShardView:
    """One placement of a model's leaves on ``n_shards`` shards, and what each shard holds.

    Built once per plan (:meth:`of`); it holds the tree's structure, not its parameters, so
    it serves every iteration's model (the same tree with new parameters) and pickles small.
    """

    n_shards: int
    #: leaf path -> shard
    shard_of_leaf: Mapping[str, int]
    #: paths of the spanning nodes, sorted; every shard evaluates them
    spanning: tuple[str, ...]
    #: shard-root path -> shard, in pre-order; ``{"": s}`` when nothing spans
    roots: Mapping[str, int]
    #: bytes per root row the shard roots send to the other shards of their replica
    coupling_bytes_per_row: float
    #: every shard's roots (by shard), in pre-order: the order its coupling messages carry them
    roots_by_shard: tuple[tuple[str, ...], ...]
    #: :func:`column_keys` of the tree
    keys: Mapping[str, str] = field(repr=False)

    @classmethod
    def of(cls, model: Node, shard_of_leaf: Mapping[str, int], n_shards: int | None = None) -> "ShardView":
        """The view of ``model`` with its leaves on ``shard_of_leaf``'s shards (``n_shards``,
        default one more than the largest; a shard without leaves holds no shard root)."""
        placement = {p: int(shard_of_leaf[p]) for p, _ in model.leaves()}
        n = max(placement.values()) + 1 if n_shards is None else n_shards
        roots = shard_roots(model, placement)
        by_shard = tuple(tuple(p for p, s in roots.items() if s == k) for k in range(n))
        return cls(n_shards=n, shard_of_leaf=placement, spanning=tuple(sorted(spanning_nodes(model, placement))),
                   roots=roots, coupling_bytes_per_row=coupling_bytes_per_row(model, placement),
                   roots_by_shard=by_shard, keys=column_keys(model))

    # ------------------------------------------------------------ who holds what
    @property
    def whole(self) -> bool:
        """No node spans shards: one shard holds the whole tree, the others nothing."""
        return not self.spanning

    def roots_of(self, shard: int) -> tuple[str, ...]:
        """The shard roots that ``shard`` holds, in pre-order (the order of its coupling message)."""
        return self.roots_by_shard[shard]

    def leaves_of(self, shard: int) -> tuple[str, ...]:
        """The leaves placed on ``shard``, in pre-order."""
        return tuple(p for p, s in self.shard_of_leaf.items() if s == shard)

    def evaluates(self, shard: int) -> bool:
        """Whether ``shard`` evaluates anything (an idle shard of a tree held whole does not)."""
        return bool(self.roots_by_shard[shard]) or not self.whole

    @property
    def lead_shard(self) -> int:
        """The shard that folds the spanning nodes' statistics and counts the log-likelihood:
        shard 0, or the one that holds the whole tree."""
        return self.roots[""] if self.whole else 0

    # ------------------------------------------------------------ the shard's part
    def model_for(self, shard: int, model: Node) -> Node:
        """What ``shard`` needs of ``model`` (a model of this view's tree): its shard roots'
        subtrees whole and the spanning nodes above them, every other shard's subtree an
        :class:`Elsewhere`; the whole model when nothing spans, a bare :class:`Elsewhere`
        for an idle shard."""
        return self.assemble(self.skeleton(model), self.owned(shard, model))

    def skeleton(self, model: Node) -> Node:
        """The spanning nodes of ``model`` (a model of this view's tree, or any shard's part
        of one) with every shard root an :class:`Elsewhere`: what the coordinator holds and
        estimates; a bare :class:`Elsewhere` when nothing spans."""
        return _skeleton(model, "", frozenset(self.spanning))

    def owned(self, shard: int, model: Node) -> dict[str, Node]:
        """The subtrees of ``shard``'s roots in ``model`` (the whole model, or the shard's part
        of it), by path in pre-order."""
        return {p: model.node_at(p) for p in self.roots_of(shard)}

    def assemble(self, skeleton: Node, owned: Mapping[str, Node]) -> Node:
        """``skeleton`` (:meth:`skeleton`) with the subtrees of ``owned`` (shard-root path ->
        subtree) in their stubs' places: a shard's part given its own roots, the whole model
        given every shard's."""
        return fill_stubs(skeleton, owned)

    def columns_for(self, shard: int, model: Node, data: Data) -> Data | None:
        """The columns of ``data`` (rows of ``model``'s data) that ``shard`` reads, the others
        None (:func:`restrict_columns`); None for an idle shard."""
        if not self.evaluates(shard):
            return None
        return restrict_columns(model, data, frozenset(self.leaves_of(shard)), frozenset(self.spanning), self.keys)

    # ------------------------------------------------------------ one block's passes
    def whole_block(self, model: Node, block: Data, w: np.ndarray) -> tuple[dict, float]:
        """A block of a tree held whole: its statistics by path and its log-likelihood."""
        return engine.shard_block(model, block, w, ("",), _no_exchange, True)

    def up(self, shard: int, model: Node, block: Data) -> tuple[dict, LogDensities]:
        """The upward pass of ``shard``'s roots over a block of its model (:meth:`model_for`)
        and columns: the passes' caches for :meth:`down`, and the roots' log densities,
        which the shard sends to the other shards of its replica."""
        return engine.shard_up(model, block, self.roots_of(shard))

    def down(self, shard: int, model: Node, block: Data, w: np.ndarray, cache: dict,
             every: LogDensities) -> tuple[dict, float]:
        """The rest of the block, given every shard root's log density of the replica: the
        shard's statistics by path (the lead shard's include the spanning nodes') and its
        share of the log-likelihood (zero but on the lead shard)."""
        return engine.shard_down(model, block, w, self.roots_of(shard), cache, every, shard == self.lead_shard)

