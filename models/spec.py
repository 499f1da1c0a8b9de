"""Model specs: a JSON-ready dict per node, ``{"family": NAME, ...}``."""

from __future__ import annotations

import json
from pathlib import Path

from .base import FAMILIES, Node
from .errors import SpecError


def from_spec(spec) -> Node:
    """Builds a model from a spec dict (as ``to_spec`` writes); raises SpecError or ModelError."""
    if isinstance(spec, Node):
        return spec
    if not isinstance(spec, dict):
        raise SpecError(f"a model spec must be a mapping with a 'family' key, got {type(spec).__name__}")
    family = spec.get("family")
    if family is None:
        raise SpecError(f"model spec is missing field 'family' (keys: {sorted(spec)})")
    cls = FAMILIES.get(family)
    if cls is None:
        raise SpecError(f"unknown model family {family!r}; known: {', '.join(sorted(FAMILIES))}")
    unknown = sorted(set(spec) - {"family", *cls.spec_fields})
    if unknown:
        raise SpecError(f"{family} spec has unknown field(s) {unknown}; allowed: {list(cls.spec_fields)}")
    return cls._from_spec(spec)


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
