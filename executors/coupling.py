"""The coupling exchange's message: what one shard sends the other shards of its replica
for one block, as one flat float64 array.

``[n_1, ..., n_k, values_1, ..., values_k]``: the lengths and values of its ``k`` shard
roots' per-row log densities, in the order of ``WorkerSpec.roots`` (every shard knows every other
shard's roots from the plan, so no names travel). A received message is unpacked
into views of itself: nothing is copied, so a worker holds at most its own densities and
one copy of everyone's, the two copies the plan counts (``planner.costing.COUPLING_COPIES``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

def message_length(mine: dict[str, np.ndarray]) -> int:
    """Float64 values of the message that carries ``mine``."""
    return len(mine) + sum(v.size for v in mine.values())


def pack(mine: dict[str, np.ndarray], roots: Sequence[str]) -> np.ndarray:
    """The message of ``mine`` (keys: ``roots``, in that order), in a new array."""
    if list(mine) != list(roots):
        raise AssertionError(f"a shard sends its roots {list(roots)}, got {list(mine)}")
    out = np.empty(message_length(mine))
    at = len(roots)
    for i, r in enumerate(roots):
        v = mine[r]
        if v.ndim != 1:
            raise AssertionError(f"the log density of {r!r} has shape {v.shape}, not one value per row")
        out[i] = v.size
        out[at:at + v.size] = v
        at += v.size
    return out


def unpack(message: np.ndarray, roots: Sequence[str]) -> dict[str, np.ndarray]:
    """The shard roots' log densities in ``message`` (views of it)."""
    k = len(roots)
    lengths = message[:k].astype(np.int64)
    ends = k + np.cumsum(lengths)
    if len(message) != (ends[-1] if k else 0):
        raise AssertionError(f"a coupling message of {len(message)} values does not hold {k} roots of {lengths.tolist()}")
    return {r: message[end - n:end] for r, n, end in zip(roots, lengths.tolist(), ends.tolist())}


def merge(messages: Sequence[np.ndarray], roots_by_shard: Sequence[Sequence[str]]) -> dict[str, np.ndarray]:
    """Every shard root's log density from every shard's message (in shard order)."""
    every: dict[str, np.ndarray] = {}
    for message, roots in zip(messages, roots_by_shard):
        every.update(unpack(message, roots))
    return every
