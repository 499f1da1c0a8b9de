"""Model specs on disk: a JSON-ready dict per node, ``{"family": NAME, ...}``.

Building a node from a spec (``from_spec``) is the family registry's, in ``models.base``;
every family's spec fields are its ``schema``.
"""

from __future__ import annotations

import json
from pathlib import Path

from .base import Node, from_spec
from .errors import SpecError
from .sharded import is_sharded, model_from_root, read_root

__all__ = ["from_spec", "load_model", "save_model"]


def load_model(path) -> Node:
    """Reads a model from a JSON spec file: a plain spec, or the root of a model written
    shard by shard and its shard files beside it (``models.sharded``), read back whole."""
    p = Path(path)
    spec = read_root(p)
    if is_sharded(spec):  # a root naming its shard files (models.sharded)
        return model_from_root(spec, p.parent, f"model spec {str(p)!r}")
    try:
        return from_spec(spec)
    except SpecError as e:
        if str(e).startswith("model spec is nested"):
            raise SpecError(f"model spec {str(p)!r}{str(e)[len('model spec'):]}") from None
        raise


def save_model(model: Node, path) -> None:
    Path(path).write_text(json.dumps(model.to_spec(), indent=1))
