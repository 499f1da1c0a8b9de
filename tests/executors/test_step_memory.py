"""A worker's E-step holds one block at a time: running many blocks of a model-parallel
worker traces no more memory than running the largest of them alone (nothing of a block
outlives it), which is what the plan's memory model counts (``planner.costing``: one block
of working arrays).

Blocks of one worker need not cost the same: what a block allocates follows its rows (an
HMM block's positions and longest sequence, which decide its arrays and whether it scans;
a leaf's rows outside its support, found per block; a Gaussian batch whose expanded form
would round too far). So the reference is every block run alone, the largest of them, not
the first: against the first block, a later block that is merely larger read as a block
outliving itself. Whether a block's own working arrays are what the plan predicts is
``tests/planner/test_memory_oracle.py``'s question (``tests/models/test_costs.py`` for a
tree held whole).

Numpy's allocations are traced with ``tracemalloc``; the other shard's messages are
computed beforehand and arrive as ``executors.coupling``'s messages, as the executors move them."""

from __future__ import annotations

import json
import tracemalloc
from dataclasses import replace

import numpy as np
from hypothesis import given, note, settings

from emgrid.executors import coupling
from emgrid.executors.step import WorkerStep, grid_layout
from emgrid.models.data import take_rows

from .. import strategies as S
from .plans import grid_plan

BLOCK = 1500
#: Allocations of a step that do not grow with the block (Python objects, small arrays).
SLACK_BYTES = 64 * 1024


def other_shard_messages(model, data, specs, shard: int) -> list[bytes]:
    """What the other shard of two sends at every block, from both shards run in lockstep."""
    gens = [WorkerStep.from_full(model, spec, data).passes(model) for spec in specs]
    sent = [next(g) for g in gens]
    messages = []
    while True:
        messages.append(coupling.pack(sent[1 - shard], specs[1 - shard].roots).tobytes())
        every = {k: v for m in sent for k, v in m.items()}
        try:
            sent = [g.send(every) for g in gens]
        except StopIteration:
            return messages


def traced_peak(model, data, spec, messages: list[bytes]) -> int:
    step = WorkerStep.from_full(model, spec, data)
    queue = []

    def exchange(mine):
        messages = [coupling.pack(mine, spec.roots), np.frombuffer(queue.pop(0))]  # as a pipe brings it
        if spec.shard == 1:
            messages.reverse()
        return coupling.merge(messages, spec.replica_roots)

    queue[:] = messages
    step.run(model, exchange)  # caches warm
    queue[:] = messages
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        share = step.run(model, exchange)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    del share
    return peak


@settings(max_examples=40, deadline=None)
@given(split=S.split_in_two(), seed=S.seeds())
def test_a_model_parallel_worker_holds_one_block_however_many_it_runs(split, seed):
    m, shard_of = split
    note(json.dumps(m.to_spec()))
    note(repr(shard_of))
    n = 3 * BLOCK
    data = m.prepare(m.sample(n, np.random.default_rng(seed)))
    specs = [replace(spec, block_rows=BLOCK) for spec in grid_layout(m, grid_plan(m, n, 1, 2, shard_of))[0]]
    blocks = [take_rows(data, a, a + BLOCK) for a in range(0, n, BLOCK)]
    alone_specs = [replace(x, stop=x.start + BLOCK) for x in specs]
    for s in (0, 1):
        # each block alone, as the only block of the worker (see the module docstring)
        alone = [traced_peak(m, one, alone_specs[s], other_shard_messages(m, one, alone_specs, s)) for one in blocks]
        many = traced_peak(m, data, specs[s], other_shard_messages(m, data, specs, s))
        note(f"shard {s}: each block alone {alone}, three blocks {many}")
        assert many <= 1.1 * max(alone) + SLACK_BYTES
