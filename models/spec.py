"""Model specs on disk: a JSON-ready dict per node, ``{"family": NAME, ...}``.

Building a node from a spec (``from_spec``) is the family registry's, in ``models.base``;
every family's spec fields are its ``schema``.
"""

from __future__ import annotations

import json
from pathlib import Path

from .base import Node, from_spec
from .errors import SpecError

__all__ = ["from_spec", "load_model", "save_model"]


def load_model(path) -> Node:
    """Reads a model from a JSON spec file."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise SpecError(f"cannot read model spec {str(p)!r}: {e.strerror}") from None
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as e:
        raise SpecError(f"model spec {str(p)!r} is not valid JSON: {e.msg} at line {e.lineno}") from None
    return from_spec(spec)


def save_model(model: Node, path) -> None:
    Path(path).write_text(json.dumps(model.to_spec(), indent=1))
