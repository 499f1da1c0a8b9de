"""The M-step recursion: every node's ``_estimate`` from its own statistics and its children
already fitted, in post-order. ``Node.estimate`` and the sharded M-step
(``executors.mstep``) both run it; the second also takes the old tree apart as it goes.

Taking apart (``uses`` given): statistics are popped from ``stats`` as they are used, and
an old node is emptied (:func:`discard`) once its last place in the tree has its new node,
so at any time the tree is held about once and one node twice. ``uses`` counts the places
of the tree each node object stands at (a component given twice stands at two), by
``id``; -1 marks a node never to empty (one that is not the caller's to take apart, or
whose statistics weigh too little and which keeps itself). The results are the same
nodes, to the last bit, either way.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING

from .errors import ModelError
from .tree import child_path

if TYPE_CHECKING:
    from .base import Node

__all__ = ["estimate_tree", "estimate_releasing", "discard"]


def estimate_tree(node: Node, stats: Mapping, path: str = "", uses: Counter | None = None) -> Node:
    """The new subtree at ``path`` from ``stats`` (keyed by path); with ``uses``, taking
    the old one apart (see the module). Module level, not a closure: a nested function that
    calls itself is a reference cycle, which would keep the old subtrees alive."""
    children = tuple(estimate_tree(c, stats, child_path(path, i), uses) for i, c in enumerate(node.children))
    if not node.has_own_stats:
        new = node._estimate((), children)
    elif path not in stats:
        raise ModelError(f"statistics hold nothing for node {path or '<root>'!r} ({node.family})")
    else:
        new = node._estimate(stats[path] if uses is None else stats.pop(path), children)
    if uses is not None:
        if new is node:  # it keeps itself: never empty it
            uses[id(node)] = -1
        elif uses[id(node)] > 0:
            uses[id(node)] -= 1
            if not uses[id(node)]:
                discard(node)
    return new


def estimate_releasing(node: Node, stats: dict, path: str, uses: Counter | None = None) -> Node:
    """``node.estimate(stats, path)``, letting each old node and its statistics go as soon
    as its replacement exists (the module's taking apart). ``node`` must be this process's
    own, referenced from nowhere else (it is taken apart, itself included), ``stats`` a dict
    this call may empty; ``uses`` defaults to the places of ``node``'s own tree."""
    if uses is None:
        uses = Counter(id(n) for _, n in node.nodes(path))
    return estimate_tree(node, stats, path, uses)


def discard(node: Node) -> None:
    """Drops what an old node holds (its arrays, its children): its replacement exists, and
    the tuple of its parent that still names it goes when the parent is replaced."""
    node.__dict__.clear()
