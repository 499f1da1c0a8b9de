"""Which physical worker runs each ``(replica, shard)`` of a ``D x M`` grid.

A *layout* picks the ``D*M`` workers a grid uses and arranges them in a ``D x M`` matrix.
The planner considers, for every grid, the distinct layouts of two orders and two
arrangements:

- order ``"speed"``: fastest first, then most memory (unknown memory counts as the most);
  order ``"memory"``: most memory first, then fastest; ties keep the resources' order;
- ``"chunked"``: replica ``r`` takes the ``r``-th run of ``M`` workers, so replicas are
  as homogeneous as the workers allow and rows follow speed (slow replicas take fewer
  rows); ``"striped"``: shard column ``s`` takes the ``s``-th run of ``D`` workers, so the
  best workers hold shard 0 in every replica, the next ones shard 1, and so on.

Inside a layout the assignment of leaves to shard columns is free, so the exact program
puts heavy shards on fast or large columns itself. Layouts with the same
``(speed, memory)`` profile cost the same and are kept once; with identical workers there
is exactly one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .facts import worker_arrays
from .resources import Resources

ORDERS = ("speed", "memory")
ARRANGEMENTS = ("chunked", "striped")


@dataclass(frozen=True)
class Layout:
    """``grid[r][s]`` = index into ``resources.workers``; ``name`` = ``"order/arrangement"``."""

    name: str
    grid: tuple[tuple[int, ...], ...]

    @property
    def d(self) -> int:
        return len(self.grid)

    @property
    def m(self) -> int:
        return len(self.grid[0])

    def as_lists(self) -> list[list[int]]:
        return [list(row) for row in self.grid]


_ORDERS: dict[tuple[int, str], tuple[Resources, list[int]]] = {}


def worker_order(resources: Resources, order: str = "speed") -> list[int]:
    """Worker indices, best first under ``order`` (cached per resources object)."""
    hit = _ORDERS.get((id(resources), order))
    if hit is not None and hit[0] is resources:
        return hit[1]
    if len(_ORDERS) > 32:
        _ORDERS.clear()
    out = _worker_order(resources, order)
    _ORDERS[(id(resources), order)] = (resources, out)
    return out


def _worker_order(resources: Resources, order: str) -> list[int]:
    inf = float("inf")

    def mem(i):
        m = resources.workers[i].memory_bytes
        return inf if m is None else float(m)

    def key(i):
        w = resources.workers[i]
        return (-w.flops_per_s, -mem(i), i) if order == "speed" else (-mem(i), -w.flops_per_s, i)

    return sorted(range(resources.n_workers), key=key)


def make_layout(resources: Resources, d: int, m: int, order: str = "speed", arrangement: str = "chunked") -> Layout:
    """The layout of one order and arrangement (see the module docstring)."""
    if d * m > resources.n_workers:
        raise ValueError(f"grid {d}x{m} needs {d * m} workers, resources have {resources.n_workers}")
    sel = worker_order(resources, order)[: d * m]
    if arrangement == "chunked":
        grid = tuple(tuple(sel[r * m + s] for s in range(m)) for r in range(d))
    else:
        grid = tuple(tuple(sel[s * d + r] for s in range(m)) for r in range(d))
    return Layout(name=f"{order}/{arrangement}", grid=grid)


def profile(resources: Resources, layout: Layout) -> bytes:
    """The layout's ``(speed, memory)`` matrix, as a hashable key."""
    speed, memory = worker_arrays(resources)
    g = np.asarray(layout.grid)
    return np.stack([speed[g], memory[g]]).tobytes()


def candidate_layouts(resources: Resources, d: int, m: int) -> list[Layout]:
    """The distinct layouts of a ``d x m`` grid, ``speed/chunked`` first."""
    out, seen = [], set()
    for order in ORDERS:
        for arrangement in ARRANGEMENTS:
            lay = make_layout(resources, d, m, order, arrangement)
            key = profile(resources, lay)
            if key not in seen:
                seen.add(key)
                out.append(lay)
    return out


def default_layout(resources: Resources, d: int, m: int) -> Layout:
    return make_layout(resources, d, m, "speed", "chunked")
