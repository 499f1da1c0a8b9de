"""Analytic per-row costs of the model tree: what the planner consumes.

Each node reports its *own* cost per row of its own data (children excluded):
FLOPs of the E-step and statistic folding, parameter and statistic bytes, data and
working-array bytes per row, and the bytes that cross model shards per row when its
children are split. :func:`tree_costs` rescales every node to rows of the root
(a node under a ``Sequence`` of mean length 20 sees 20 of its rows per root row).

Coupling convention (the executors implement exactly this): when a node's subtree is
split across shards, every child subtree held whole by one shard ships its log density,
one float64 per row of that child, to the other shards of the replica. So the bytes per
root row are ``8 * rows_per_root_row`` summed over the *shard roots* (nodes held whole
whose parent spans shards); see ``models.shard.coupling_bytes_per_row``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from pydantic import BaseModel, ConfigDict

from .tree import batch_class, child_path

if TYPE_CHECKING:
    from .base import Node

#: Pickle overhead of one numpy array inside a statistics dict (header, dtype, shape).
PICKLE_ARRAY_OVERHEAD = 150
#: Pickle overhead of one node entry (path key, tuple) and of a float scalar.
PICKLE_ENTRY_OVERHEAD = 24
PICKLE_SCALAR = 9
#: Bytes one shard root's log density puts on the wire per row of that node.
COUPLING_BYTES = 8
#: A block's row weights (one float64 per root row), charged to the root's kept bytes.
ROW_WEIGHT_BYTES = 8
#: What float32 (``optimize(..., dtype="float32")``) does to a leaf's own figures: a leaf
#: reading floats holds its rows in half the bytes; a sibling batch of a family whose
#: batched kernels always run in float32 also keeps its block and counts its FLOPs at
#: ``Leaf.float32_share`` of float64's (twice the lanes per instruction). A leaf alone and
#: the nodes above the leaves are charged as in float64 (their arrays promote wherever a
#: float64 parameter enters).
FLOAT32_DATA_SHARE = 0.5


class NodeCost(BaseModel):
    """A node's own cost, per row of its own data.

    Working memory of one block has two parts. ``work_bytes_per_row``: arrays the node
    keeps from its upward pass until the block's statistics are folded (its log density,
    a mixture's responsibilities); every evaluated node's are live together, so they add.
    ``scratch_bytes_per_row``: temporaries that live only while the node computes (a
    leaf's centred copy of its rows); one node computes at a time, so a worker holds the
    largest of them, not their sum.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    flops_per_row: float
    param_bytes: int
    stat_bytes: int
    data_bytes_per_row: float
    coupling_bytes_per_row: float
    work_bytes_per_row: float
    scratch_bytes_per_row: float = 0.0
    #: Python-level passes one block costs the node, each ``units.NODE_CALL_S`` of
    #: interpreter time whatever the block's rows (an HMM loops over its time steps).
    calls_per_block: float = 1.0
    #: What the node keeps beside its parameters, built from them once (a categorical's log
    #: table, a covariance's Cholesky factors); resident for the whole fit.
    cache_bytes: int = 0
    #: The most the node's M-step holds at once beyond the old node and its statistics: the
    #: new node (parameters and caches) and the temporaries that make it. None: the new
    #: node alone (``param_bytes + cache_bytes``).
    mstep_bytes: int | None = None

    @property
    def mstep_peak_bytes(self) -> int:
        return self.param_bytes + self.cache_bytes if self.mstep_bytes is None else self.mstep_bytes


def stat_bytes(*, arrays: list[int] = (), scalars: int = 0) -> int:
    """Pickled size of one node's own statistics: arrays given by element count (float64)."""
    return (
        PICKLE_ENTRY_OVERHEAD
        + sum(8 * n + PICKLE_ARRAY_OVERHEAD for n in arrays)
        + scalars * PICKLE_SCALAR
    )


@dataclass(frozen=True)
class PlacedCost:
    """One node's cost rescaled to rows of the root."""

    path: str
    family: str
    description: str
    is_leaf: bool
    batch_bytes_per_row: float  # per root row: the shared block of its batched children, in its work (0: none)
    rows_per_root_row: float
    flops_per_row: float  # own FLOPs per root row
    param_bytes: int
    stat_bytes: int
    cache_bytes: int  # NodeCost.cache_bytes
    mstep_bytes: int  # NodeCost.mstep_peak_bytes
    data_bytes_per_row: float  # per root row
    work_bytes_per_row: float  # per root row, kept through the block's passes (they add)
    scratch_bytes_per_row: float  # per root row, while the node computes (the largest counts)
    #: the same two when the node is split across shards: a split node does not batch its
    #: children, which then run alone on their shards; it is charged their kept arrays and
    #: their largest scratch instead of the batch's block
    split_work_bytes_per_row: float
    split_scratch_bytes_per_row: float
    calls_per_block: float  # per block, whatever its rows
    owned_root_coupling_bytes_per_row: float  # shipped per root row when this node is an owned root


class BatchCost(NamedTuple):
    """Per row of the children's data, what one batched kernel over sibling leaves costs:
    the shared block (built once: its FLOPs, its bytes kept through both passes), each
    component's FLOPs, and the kernel's scratch. Its interpreter time per block, in node
    visits (``calls_per_block``): the kernel's own (building the block, the two products)
    and each component's (its slice of the statistics), far less than a lone leaf's visit."""

    block_flops: float
    component_flops: float
    kept_bytes: float
    scratch_bytes: float
    block_calls: float = 0.0
    component_calls: float = 0.0


def batch_cost(node: "Node") -> BatchCost | None:
    """The batched kernel of ``node``'s children, per row of the node's own rows, when they
    run as one kernel that builds a shared block (``Leaf.batch_cost``), else None.

    The block is charged to the parent and each child's FLOPs are its component share; the
    children have no scratch of their own, and where the parent adds its per-child log
    offsets in the kernel (a mixture), the kernel's output becomes the parent's own
    responsibilities, so the children keep no log densities either."""
    return _per_node_row(node, _child_batch_cost(node))


def _per_node_row(node: "Node", b: BatchCost | None, rows: float | None = None) -> BatchCost | None:
    """A batch cost per child row rescaled to the node's rows (an HMM's: its positions,
    ``rows`` per row, default ``child_rows``)."""
    if b is None:
        return None
    r = node.child_rows(0) if rows is None else rows
    return b._replace(block_flops=b.block_flops * r, component_flops=b.component_flops * r,
                      kept_bytes=b.kept_bytes * r, scratch_bytes=b.scratch_bytes * r)


def _child_batch_cost(node: "Node", dtype: str = "float64") -> BatchCost | None:
    """:func:`batch_cost` per row of the children's data, in ``dtype``."""
    cls = batch_class(node)
    if cls is None:
        return None
    b = cls.batch_cost(node.children)
    f = 1.0 if dtype == "float64" else cls.float32_share
    if b is None or f == 1.0:
        return b
    return b._replace(block_flops=b.block_flops * f, component_flops=b.component_flops * f,
                      kept_bytes=b.kept_bytes * f, scratch_bytes=b.scratch_bytes * f)


def reads_floats(node: "Node") -> bool:
    """Whether ``node`` is a leaf whose rows are floats (cast under ``dtype="float32"``)."""
    kind = node.data_type() if node.is_leaf else ""
    return kind == "float" or kind.startswith("vec[")


def in_dtype(node: "Node", c: NodeCost, dtype: str) -> NodeCost:
    """``node``'s own cost ``c`` in ``dtype`` (see :data:`FLOAT32_DATA_SHARE`)."""
    if dtype == "float64" or not node.is_leaf:
        return c
    if not reads_floats(node):
        return c
    # a leaf alone (not in a sibling batch) computes in float64 from its float32 rows
    return c.model_copy(update={"data_bytes_per_row": c.data_bytes_per_row * FLOAT32_DATA_SHARE})


def _adds_offsets_in_batch(node: "Node") -> bool:
    """Whether ``node``'s children run as a batched kernel that adds the node's per-child log
    offsets in its product: the kernel's output is then the node's, and the children keep no
    log densities of their own."""
    cls = batch_class(node)
    return cls is not None and cls.batch_takes_offsets and node.child_log_offsets() is not None


def block_bytes_per_row(costs: list[PlacedCost]) -> float:
    """Working bytes per root row of a block evaluating ``costs``: every node's kept arrays
    plus the largest scratch."""
    return sum(c.work_bytes_per_row for c in costs) + max((c.scratch_bytes_per_row for c in costs), default=0.0)


# A data profile: the expected rows, per row of a node, at every ragged level of the data
# it generates: None (a column), a tuple (a composite's fields) or ("ragged", positions,
# inner profile in the same units).
def _profile(node: "Node"):
    kids = [_profile(c) for c in node.children]
    if node.is_leaf:
        return None
    if node.shares_child_data:  # (the shares only matter where the column nests sequences)
        inner = None if kids[0] is None else _mix(kids, node.child_data_shares())
    else:
        inner = kids[0] if len(kids) == 1 else tuple(kids)
    if node.reads_ragged:
        length = float(node.mean_length)
        return ("ragged", length, _scale(inner, length))
    return inner


def _scale(p, s: float):
    if p is None:
        return None
    if isinstance(p, tuple) and p and p[0] == "ragged":
        return ("ragged", p[1] * s, _scale(p[2], s))
    return tuple(_scale(q, s) for q in p)


def _mix(profiles: list, shares) -> object:
    first = profiles[0]
    if first is None:
        return None
    if first[0] == "ragged":
        return ("ragged", sum(w * p[1] for p, w in zip(profiles, shares)),
                _mix([p[2] for p in profiles], shares))
    return tuple(_mix([p[i] for p in profiles], shares) for i in range(len(first)))


def data_lengths(model: "Node") -> dict[str, float]:
    """The mean length of the sequences every sequence-like node (``reads_ragged``) reads,
    where it is not its own ``mean_length``: the components of a mixture (the emissions of an
    HMM) read one column together, which holds every component's rows, so a component
    whose sequences are shorter than its siblings' reads the mean length of all of them,
    weighted by ``child_data_shares`` (a mixture's weights, an HMM's state occupancy)."""
    out: dict[str, float] = {}

    def walk(node, path, p):
        if node.is_leaf or p is None:
            return
        inner = p
        if node.reads_ragged:
            length = p[1]
            if abs(length - float(node.mean_length)) > 1e-9 * max(1.0, length):
                out[path] = length
            inner = _scale(p[2], 1.0 / length) if length > 0 else p[2]
        for i, ch in enumerate(node.children):
            sub = inner if node.shares_child_data or len(node.children) == 1 else inner[i]
            walk(ch, child_path(path, i), sub)

    walk(model, "", _profile(model))
    return out


def tree_costs(model: "Node", dtype: str = "float64") -> list[PlacedCost]:
    """Every node's cost per root row, in pre-order, with the sequences as long as the data
    they read (:func:`data_lengths`), for data and E-step in ``dtype`` (:func:`in_dtype`)."""
    out: list[PlacedCost] = []
    lengths = data_lengths(model)

    def walk(node, path, mult, batched: BatchCost | None = None, shifted=False):
        length = lengths.get(path)
        c = in_dtype(node, node.cost() if length is None else node.cost(length=length), dtype)
        rows = (lambda i: node.child_rows(i)) if length is None else (lambda i: length)  # noqa: E731
        flops, work, scratch = c.flops_per_row, c.work_bytes_per_row, c.scratch_bytes_per_row
        calls = c.calls_per_block
        if batched is not None:  # per row of this node: the parent's rows times child_rows
            flops, work, scratch = batched.component_flops, (0.0 if shifted else work), 0.0
            calls = batched.component_calls
        child = _child_batch_cost(node, dtype)
        batch = _per_node_row(node, child, rows(0))
        split_work, split_scratch = work, scratch
        if batch is not None:  # whole: the block; split: no block, the children run alone
            alone = [(in_dtype(ch, ch.cost(), dtype), rows(i)) for i, ch in enumerate(node.children)]
            split_work = work + sum(cc.work_bytes_per_row * r for cc, r in alone)
            split_scratch = max([scratch] + [cc.scratch_bytes_per_row * r for cc, r in alone])
            flops += batch.block_flops
            calls += batch.block_calls
            work, scratch = work + batch.kept_bytes, max(scratch, batch.scratch_bytes)
        if not path:
            work += ROW_WEIGHT_BYTES
            split_work += ROW_WEIGHT_BYTES
        out.append(
            PlacedCost(
                path=path,
                family=node.family,
                description=node.describe(),
                is_leaf=node.is_leaf,
                batch_bytes_per_row=(batch.kept_bytes + batch.scratch_bytes if batch else 0.0) * mult,
                rows_per_root_row=mult,
                flops_per_row=flops * mult,
                param_bytes=c.param_bytes,
                stat_bytes=c.stat_bytes,
                cache_bytes=c.cache_bytes,
                mstep_bytes=c.mstep_peak_bytes,
                data_bytes_per_row=c.data_bytes_per_row * mult,
                work_bytes_per_row=work * mult,
                scratch_bytes_per_row=scratch * mult,
                split_work_bytes_per_row=split_work * mult,
                split_scratch_bytes_per_row=split_scratch * mult,
                calls_per_block=calls,
                owned_root_coupling_bytes_per_row=COUPLING_BYTES * mult,
            )
        )
        shifted_children = child is not None and _adds_offsets_in_batch(node)
        for i, ch in enumerate(node.children):
            walk(ch, child_path(path, i), mult * rows(i), child, shifted_children)

    walk(model, "", 1.0)
    return out


def ceil_log2(m: int) -> int:
    return max(0, math.ceil(math.log2(m))) if m > 1 else 0
