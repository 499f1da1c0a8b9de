"""Tree helpers that need nothing but a node's ``children``: paths and sibling batches.

A path is the dotted child indices from the root (``"2.0"`` = first child of the third
child; the root is ``""``).
"""

from __future__ import annotations


def child_path(path: str, i: int) -> str:
    """Path of child ``i`` below ``path``."""
    return f"{path}.{i}" if path else str(i)


def batch_class(node) -> type | None:
    """The leaf class whose batched kernels evaluate all of ``node``'s children in one
    pass (they read one data column and are leaves of one class), else None."""
    if not node.shares_child_data or len(node.children) < 2:
        return None
    cls = type(node.children[0])
    if not all(type(c) is cls and c.is_leaf for c in node.children):
        return None
    return cls
