"""What a fitted model says about its own fit: collapsed components and variances at the floor.

``fit_warnings(model)`` lists one line per finding, each naming the node path, for the
warnings ``executors.optimize`` raises (``models.errors.ConvergenceWarning``). Each family
writes its own lines (``Node._fit_warnings``): a ``Mixture`` a component whose weight is
below ``mixture.COLLAPSED_WEIGHT``, the Gaussian families a variance (or a covariance's
smallest eigenvalue) at the floor, with the cause the rows show (``models.floored``).
"""

from __future__ import annotations

from .base import Node
from .engine import subtree_data


def _where(path: str) -> str:
    return repr(path) if path else "'<root>'"


def fit_warnings(model: Node, prefix: str = "", data=None) -> list[str]:
    """One line per collapsed component or floored variance of a complete model (or of the
    subtree at path ``prefix`` of one, or of a shard's part: stubs say nothing).

    ``data``, when given, is the rows ``model`` was fitted to (anything ``model.prepare``
    takes); a node's line may then name the cause its rows show."""
    out = []
    prepared = None if data is None else model.prepare(data)
    for path, node in model.nodes(prefix):
        rows = None if prepared is None else _rows(model, prepared, _relative(path, prefix))
        out.extend(node._fit_warnings(f"{node.family} at path {_where(path)}", rows))
    return out


def _rows(model: Node, prepared, path: str):
    """The rows of the subtree at ``path``, read when a family's line asks for them."""
    return lambda: subtree_data(model, prepared, path)


def _relative(path: str, prefix: str) -> str:
    """``path`` (a node under ``prefix``) relative to the node at ``prefix``."""
    if not prefix or path == prefix:
        return "" if prefix else path
    return path[len(prefix) + 1:]
