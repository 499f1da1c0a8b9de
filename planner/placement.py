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

These four cover every placement only when the workers are identical (``planner.solve``
says when a grid is settled exactly). For one replica, :func:`single_replica_layouts`
lists every placement up to dominance, the coordinator's column included.
"""

from __future__ import annotations

import itertools
import math
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


#: Most single-replica layouts (:func:`single_replica_layouts`) a grid enumerates.
MAX_SINGLE_REPLICA_LAYOUTS = 24


def _worker_types(resources: Resources):
    """The workers by type ``(speed, memory)``: ``types[key]`` their indices, ``keys`` in
    order of decreasing speed, then memory (a type's dominators come before it), ``avail``
    the count of each, ``dominators[i]`` the types at least as fast and as large as ``i``."""
    speed, memory = worker_arrays(resources)
    types: dict[tuple[float, float], list[int]] = {}
    for w in worker_order(resources, "speed"):
        types.setdefault((float(speed[w]), float(memory[w])), []).append(w)
    keys = list(types)
    avail = [len(types[k]) for k in keys]
    dominators = [[j for j in range(i) if keys[j][0] >= keys[i][0] and keys[j][1] >= keys[i][1]]
                  for i in range(len(keys))]
    return types, keys, avail, dominators


def single_replica_layouts(resources: Resources, m: int, coordinated: bool,
                           limit: int = MAX_SINGLE_REPLICA_LAYOUTS) -> tuple[list[Layout], bool]:
    """Every ``1 x m`` layout up to dominance, and whether the list is complete.

    With one replica the rows are all ``n_data``, and the program places units on columns
    freely, so a layout matters only through the multiset of workers it uses and, when the
    coordinator is in the grid (``coordinated``), the worker of column 0. Workers of equal
    speed and memory are interchangeable; a worker at least as fast and as large as another
    (one of the two strictly) *dominates* it: putting it in the other's place keeps every
    shard's time and memory within its limits, so some optimal plan uses a dominated
    worker only when all of its dominators are used. The multisets listed are exactly those
    closed under that rule (types in order of decreasing speed, then memory, so dominators
    come first), each once per worker type that can sit at column 0. ``False`` when
    ``limit`` cut the list short.
    """
    types, keys, avail, dominators = _worker_types(resources)
    suffix = np.concatenate([np.cumsum(avail[::-1])[::-1], [0]])
    out: list[Layout] = []
    complete = True

    def emit(counts):
        nonlocal complete
        used = [i for i, c in enumerate(counts) if c]
        heads = used if coordinated else used[:1]
        for head in heads:
            if len(out) >= limit:
                complete = False
                return
            cols = [types[keys[head]][0]]
            for i in used:
                cols += types[keys[i]][int(i == head):counts[i]]
            out.append(Layout(name=f"single/{len(out)}", grid=(tuple(cols),)))

    def walk(i, left, counts):
        if not complete:
            return
        if left == 0:
            emit(counts + [0] * (len(keys) - i))
            return
        if i == len(keys) or suffix[i] < left:
            return
        full = all(counts[j] == avail[j] for j in dominators[i])
        top = min(avail[i], left) if full else 0
        for c in range(top, -1, -1):
            walk(i + 1, left - c, counts + [c])

    walk(0, m, [])
    return out, complete


#: Most layouts :func:`small_layouts` enumerates before giving up.
MAX_SMALL_LAYOUTS = 24
#: Most arrangements of worker types over the cells :func:`small_layouts` looks at.
MAX_SMALL_PLACEMENTS = 5_000
#: Most row-and-column permutations :func:`small_layouts` tries in all to find each
#: arrangement's canonical form (``d! m!`` per arrangement).
MAX_SMALL_PERMUTATIONS = 200_000


def small_layouts(resources: Resources, d: int, m: int, coordinated: bool,
                  limit: int = MAX_SMALL_LAYOUTS) -> list[Layout] | None:
    """Every ``d x m`` layout of distinct cost, or None when there are more than ``limit``.

    Two layouts cost the same when one is the other with replicas permuted and shard columns
    permuted (the program places shards on columns freely); with the coordinator in the
    grid, replica 0 and column 0 stay where they are. Workers of equal speed and memory are
    interchangeable, so a layout is an arrangement of worker *types* (enumerated as such,
    however many workers share a type), and a worker dominated by an idle one is never
    needed (see :func:`single_replica_layouts`): the multisets of types used are the ones
    closed under that rule."""
    types, keys, avail, dominators = _worker_types(resources)
    cells = d * m
    multisets: list[list[int]] = []

    def walk(i, left, counts):
        if left == 0:
            multisets.append(counts + [0] * (len(keys) - i))
            return
        if i == len(keys):
            return
        full = all(counts[j] == avail[j] for j in dominators[i])
        for c in range(min(avail[i], left) if full else 0, -1, -1):
            walk(i + 1, left - c, counts + [c])
            if len(multisets) > MAX_SMALL_PLACEMENTS:
                return

    walk(0, cells, [])
    arrangements = sum(math.factorial(cells) // math.prod(math.factorial(c) for c in counts) for counts in multisets)
    if (len(multisets) > MAX_SMALL_PLACEMENTS or arrangements > MAX_SMALL_PLACEMENTS
            or arrangements * math.factorial(d) * math.factorial(m) > MAX_SMALL_PERMUTATIONS):
        return None
    seen: set = set()
    out: list[Layout] = []
    for counts in multisets:
        for kinds in _distinct_permutations([i for i, c in enumerate(counts) for _ in range(c)]):
            key = _canonical([[keys[kinds[r * m + s]] for s in range(m)] for r in range(d)], coordinated)
            if key in seen:
                continue
            seen.add(key)
            if len(out) >= limit:
                return None
            taken = [0] * len(keys)
            grid = []
            for r in range(d):
                row = []
                for s in range(m):
                    k = kinds[r * m + s]
                    row.append(types[keys[k]][taken[k]])
                    taken[k] += 1
                grid.append(tuple(row))
            out.append(Layout(name=f"small/{len(out)}", grid=tuple(grid)))
    return out


#: Most replica kinds, and most mixes of them, :func:`replica_mixes` lists.
MAX_REPLICA_KINDS = 200
MAX_REPLICA_MIXES = 20_000


@dataclass(frozen=True)
class ReplicaMixes:
    """The replicas a ``d x m`` grid can be built of, up to the order of its columns.

    ``speed[k]``, ``memory[k]``: the ``m`` workers of replica kind ``k`` (a multiset of
    worker types), ``workers[k]`` some ``m`` distinct workers of those types; ``counts[j, k]``:
    how many replicas of kind ``k`` mix ``j`` uses. Every layout of the grid has the
    replicas of one mix."""

    speed: np.ndarray
    memory: np.ndarray
    workers: tuple[tuple[int, ...], ...]
    counts: np.ndarray


def replica_mixes(resources: Resources, d: int, m: int) -> ReplicaMixes | None:
    """Every mix of ``d`` replicas of ``m`` workers each that the workers can staff, or None
    when there are more than :data:`MAX_REPLICA_KINDS` kinds or :data:`MAX_REPLICA_MIXES` mixes.
    A relaxation of the layouts: columns are not matched across replicas, dominance is not
    applied and the coordinator's cell is not told apart."""
    types, keys, avail, _ = _worker_types(resources)
    avail_arr = np.asarray(avail)
    kinds = []
    for combo in itertools.combinations_with_replacement(range(len(keys)), m):
        use = np.bincount(combo, minlength=len(keys))
        if np.all(use <= avail_arr):
            kinds.append((combo, use))
            if len(kinds) > MAX_REPLICA_KINDS:
                return None
    mixes: list[list[int]] = []

    def walk(k: int, left: int, free: np.ndarray, counts: list[int]) -> bool:
        if left == 0:
            mixes.append(counts + [0] * (len(kinds) - k))
            return len(mixes) <= MAX_REPLICA_MIXES
        if k == len(kinds):
            return True
        use = kinds[k][1]
        most = min([left] + [int(free[t] // use[t]) for t in np.flatnonzero(use)])
        for c in range(most, -1, -1):
            if not walk(k + 1, left - c, free - c * use, counts + [c]):
                return False
        return True

    if not walk(0, d, avail_arr, []):
        return None
    speed = np.array([[keys[t][0] for t in combo] for combo, _ in kinds], dtype=np.float64)
    memory = np.array([[keys[t][1] for t in combo] for combo, _ in kinds], dtype=np.float64)
    workers = []
    for combo, _ in kinds:
        taken = dict.fromkeys(combo, 0)
        row = []
        for t in combo:
            row.append(types[keys[t]][taken[t]])
            taken[t] += 1
        workers.append(tuple(row))
    return ReplicaMixes(speed=speed, memory=memory, workers=tuple(workers),
                        counts=np.array(mixes, dtype=np.int64).reshape(-1, len(kinds)))


def _distinct_permutations(items: list[int]):
    """Every distinct ordering of ``items`` (a multiset), each once."""
    counts: dict[int, int] = {}
    for x in items:
        counts[x] = counts.get(x, 0) + 1
    order = sorted(counts)
    seq: list[int] = []

    def rec():
        if len(seq) == len(items):
            yield tuple(seq)
            return
        for x in order:
            if counts[x]:
                counts[x] -= 1
                seq.append(x)
                yield from rec()
                seq.pop()
                counts[x] += 1

    yield from rec()


def _canonical(cells, coordinated: bool):
    """The least matrix among the layout's row and column permutations (the first row and
    column fixed when ``coordinated``)."""
    d, m = len(cells), len(cells[0])
    rows = list(range(1, d)) if coordinated else list(range(d))
    cols = list(range(1, m)) if coordinated else list(range(m))
    best = None
    for rp in itertools.permutations(rows):
        rord = ([0] if coordinated else []) + list(rp)
        for cp in itertools.permutations(cols):
            cord = ([0] if coordinated else []) + list(cp)
            key = tuple(tuple(cells[r][c] for c in cord) for r in rord)
            if best is None or key < best:
                best = key
    return best
