"""The distinct starts among a template's seeded ones.

Seeded starts often coincide on small or well-separated data: k-means from different seeds
lands on the same partition, and the same parts give bitwise the same components (in
another order). Such starts follow the same EM path, so refining one of them says all:
:func:`distinct_starts` keeps the first of each, and :func:`per_start` spreads what the
kept ones report back over every start.
"""

from __future__ import annotations

import hashlib

import numpy as np

from .base import Node
from .mixture import Mixture

__all__ = ["start_key", "distinct_starts", "per_start"]


def start_key(model: Node) -> bytes:
    """A digest of ``model``'s parameters, the same for two models that differ only in the
    order of some mixture's components (with their weights); other nodes keep their
    children's order (an HMM's states are tied to its transition matrix)."""
    return hashlib.blake2b(_key(model), digest_size=20).digest()


def _key(node: Node) -> bytes:
    own = {name: a for name, a in node.params().items()}
    kids = [_key(c) for c in node.children]
    if isinstance(node, Mixture) and node.weights is not None:
        weights = np.asarray(own.pop("weights"), dtype=np.float64)
        kids = sorted(weights[j].tobytes() + k for j, k in enumerate(kids))
    parts = [type(node).__name__.encode()]
    for name, a in own.items():
        a = np.ascontiguousarray(a)
        parts.append(f"{name}:{a.dtype.str}:{a.shape}".encode() + a.tobytes())
    parts.extend(hashlib.blake2b(k, digest_size=20).digest() for k in kids)
    return b"|".join(parts)


def distinct_starts(starts) -> tuple[list[Node], list[int]]:
    """The first start of each :func:`start_key`, in order, and for every start the index of
    its kept one."""
    kept, seen, index = [], {}, []
    for s in starts:
        key = start_key(s)
        if key not in seen:
            seen[key] = len(kept)
            kept.append(s)
        index.append(seen[key])
    return kept, index


def per_start(values, best: int | None, index: list[int]) -> tuple[list, int | None]:
    """What the kept starts report (``values`` per kept start, ``best`` one of them) for every
    start: a repeat gets its kept start's value; the best is the first start that is it."""
    spread = [values[i] for i in index]
    return spread, (None if best is None else index.index(best))
