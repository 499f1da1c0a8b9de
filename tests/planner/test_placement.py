"""The layouts a grid of several replicas is searched on (``planner.placement.small_layouts``)
and the mixes of replicas its bounds range over (``replica_mixes``), against brute forces over
ordered choices of workers."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from emgrid.planner import Resources
from emgrid.planner.placement import _canonical, replica_mixes, small_layouts
from emgrid.planner.resources import Network, Worker


def brute_force(res: Resources, d: int, m: int, coordinated: bool) -> set:
    """Every canonical arrangement of worker types over the ``d x m`` cells, from every
    ordered choice of ``d * m`` distinct workers none of which an idle worker dominates."""
    kind = [(w.flops_per_s, w.memory_bytes) for w in res.workers]
    out = set()
    for chosen in itertools.permutations(range(len(kind)), d * m):
        rest = [w for w in range(len(kind)) if w not in chosen]
        if any(kind[i][0] >= kind[w][0] and kind[i][1] >= kind[w][1] and kind[i] != kind[w]
               for w in chosen for i in rest):
            continue
        out.add(_canonical([[kind[chosen[r * m + s]] for s in range(m)] for r in range(d)], coordinated))
    return out


@st.composite
def small_resources(draw):
    types = draw(st.lists(st.tuples(st.sampled_from([1e6, 2e6, 4e6]), st.sampled_from([300_000, 400_000])),
                          min_size=1, max_size=3, unique=True))
    counts = [draw(st.integers(1, 3)) for _ in types]
    workers = [Worker(name=f"w{i}", flops_per_s=s, memory_bytes=mem)
               for i, (s, mem) in enumerate(t for t, c in zip(types, counts) for _ in range(c))]
    return Resources(workers=tuple(workers), network=Network(), coordinator_in_grid=draw(st.booleans()))


@settings(max_examples=40, deadline=None)
@given(res=small_resources(), shape=st.sampled_from([(2, 2), (2, 3), (3, 2)]))
def test_small_layouts_are_every_arrangement_of_distinct_cost(res, shape):
    d, m = shape
    if d * m > res.n_workers:
        return
    got = small_layouts(res, d, m, res.coordinator_in_grid, limit=10_000)
    assert got is not None
    kind = [(w.flops_per_s, w.memory_bytes) for w in res.workers]
    keys = [_canonical([[kind[w] for w in row] for row in lay.grid], res.coordinator_in_grid) for lay in got]
    assert len(keys) == len(set(keys)), "a layout listed twice"
    assert set(keys) == brute_force(res, d, m, res.coordinator_in_grid)
    for lay in got:  # each a placement of distinct workers
        cells = [w for row in lay.grid for w in row]
        assert len(set(cells)) == len(cells)


def test_many_workers_of_few_types_have_few_layouts():
    # 256 workers of two types: the arrangements of types, not of workers, are enumerated
    workers = tuple(Worker(name=f"w{i}", flops_per_s=4e9 if i % 2 else 2e9, memory_bytes=10**9) for i in range(256))
    got = small_layouts(Resources(workers=workers, network=Network()), 2, 2, False)
    assert got is not None and 1 <= len(got) <= 24


def _mix_key(kind, rows) -> tuple:
    """A layout's replicas as a multiset of multisets of worker types."""
    return tuple(sorted(tuple(sorted(kind[w] for w in row)) for row in rows))


@settings(max_examples=40, deadline=None)
@given(res=small_resources(), shape=st.sampled_from([(2, 1), (2, 2), (2, 3), (3, 2), (4, 1)]))
def test_replica_mixes_are_every_way_to_staff_the_replicas(res, shape):
    d, m = shape
    if d * m > res.n_workers:
        return
    kind = [(w.flops_per_s, w.memory_bytes) for w in res.workers]
    want = {_mix_key(kind, [chosen[r * m:(r + 1) * m] for r in range(d)])
            for chosen in itertools.permutations(range(len(kind)), d * m)}
    mixes = replica_mixes(res, d, m)
    assert mixes is not None
    got = set()
    for counts in mixes.counts:
        assert counts.sum() == d
        rows = [mixes.workers[k] for k, c in enumerate(counts) for _ in range(c)]
        key = _mix_key(kind, rows)
        assert key not in got, "a mix listed twice"
        got.add(key)
    assert got == want
    for k, workers in enumerate(mixes.workers):  # distinct workers of the kind's speeds and memories
        assert len(set(workers)) == m
        assert [kind[w] for w in workers] == list(zip(mixes.speed[k], mixes.memory[k]))
