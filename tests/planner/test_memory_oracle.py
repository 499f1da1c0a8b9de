"""The plan's per-shard working memory against numpy's traced allocations while one worker
runs one block of a model-parallel plan: its owned subtrees upward, the exchange of their
log densities (as the executors move them: ``executors.coupling``'s messages), the spanning nodes, and its
leaves' statistics. The whole-model case is in ``tests/models/test_costs.py``."""

from __future__ import annotations

import json
import tracemalloc

import numpy as np
from hypothesis import given, note

from emgrid.executors import coupling
from emgrid.models.data import n_rows, take_rows
from emgrid.models.engine import shard_down, shard_up
from emgrid.models.shard import shard_roots
from emgrid.planner.costing import COUPLING_COPIES, shard_sums
from emgrid.planner.facts import leaf_shard_array, model_facts
from tests import strategies as S
from tests.models.test_costs import FIXED_BLOCK_BYTES


def traced_shard_block(model, data, roots: dict[str, int], shard: int) -> int:
    n = n_rows(data)
    mine_roots = [r for r, s in roots.items() if s == shard]
    other_roots = [r for r, s in roots.items() if s != shard]
    # what the other shards send: their owned roots' log densities (computed outside the trace)
    others = shard_up(model, take_rows(data, 0, n), other_roots)[1]

    def run():
        block, w = take_rows(data, 0, n), np.ones(n)
        cache, mine = shard_up(model, block, mine_roots)
        sent = coupling.pack(mine, mine_roots)
        received = np.frombuffer(coupling.pack(others, other_roots).tobytes())  # as a pipe brings it
        every = coupling.merge([sent, received], [mine_roots, other_roots])
        del mine
        return shard_down(model, block, w, mine_roots, cache, every, shard == 0)

    run()  # caches warm
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        out = run()
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    del out
    return peak


@given(split=S.split_in_two(), seed=S.seeds())
def test_a_model_parallel_block_holds_what_the_plan_predicts(split, seed):
    m, shard_of = split
    note(json.dumps(m.to_spec()))
    note(repr(shard_of))
    n = 2000
    data = m.prepare(m.sample(n, np.random.default_rng(seed)))
    facts = model_facts(m)
    sums = shard_sums(facts, leaf_shard_array(facts, shard_of), 2)
    roots = shard_roots(m, shard_of)
    for s in (0, 1):
        predicted = (sums.work[s] + sums.scratch[s] + COUPLING_COPIES * sums.coupling_bytes_per_row) * n
        traced = traced_shard_block(m, data, roots, s)
        note(f"shard {s}: predicted {predicted:.0f} traced {traced}")
        assert traced <= 1.25 * predicted + FIXED_BLOCK_BYTES
        assert traced >= 0.3 * predicted
