"""The floating-point cost model against the models' own definitions."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from emgrid.models import Categorical, Composite, Gaussian, Mixture
from emgrid.models.cost import tree_costs
from emgrid.models.shard import coupling_bytes_per_row, shard_roots, spanning_nodes
from emgrid.planner import Network, Resources, Worker
from emgrid.planner.costing import capped_rows, cell_memory, replica_rows, row_caps, shard_sums
from emgrid.planner.facts import model_facts, model_fingerprint
from tests.planner.helpers import dg, fg, nest, probs
from tests.strategies import models


def _evaluated(model, shard_of_leaf, s):
    spanning = spanning_nodes(model, shard_of_leaf)
    paths = {c.path for c in tree_costs(model)}
    out = set(spanning)
    for root, shard in shard_roots(model, shard_of_leaf).items():
        if shard == s:
            out |= {p for p in paths if root == "" or p == root or p.startswith(root + ".")}
    return out


@given(models(), st.integers(1, 4), st.randoms(use_true_random=False))
def test_shard_sums_follow_the_models_spanning_and_coupling_rules(model, m, rnd):
    facts = model_facts(model)
    m = min(m, facts.n_leaves)
    shard = {p: rnd.randrange(m) for p in facts.leaf_paths}
    sums = shard_sums(facts, [shard[p] for p in facts.leaf_paths], m)
    assert {facts.paths[i] for i in np.flatnonzero(sums.spanning)} == spanning_nodes(model, shard)
    assert sums.coupling_bytes_per_row == pytest.approx(coupling_bytes_per_row(model, shard))
    costs = {c.path: c for c in tree_costs(model)}
    spanning = spanning_nodes(model, shard)

    def work(p):  # a spanning node holds its spanning arrays (no batched block)
        return costs[p].split_work_bytes_per_row if p in spanning else costs[p].work_bytes_per_row

    def scratch(p):
        return costs[p].split_scratch_bytes_per_row if p in spanning else costs[p].scratch_bytes_per_row

    for s in range(m):
        ev = _evaluated(model, shard, s)
        assert sums.flops[s] == pytest.approx(sum(costs[p].flops_per_row for p in ev))
        assert sums.param[s] == pytest.approx(sum(costs[p].param_bytes for p in ev))
        assert sums.work[s] == pytest.approx(sum(work(p) for p in ev))
        assert sums.scratch[s] == pytest.approx(max((scratch(p) for p in ev), default=0.0))


def test_mixture_components_share_one_data_column():
    model = Mixture([fg(4), dg(4), dg(4)], probs(3))
    facts = model_facts(model)
    one = shard_sums(facts, [0, 0, 0], 1)
    two = shard_sums(facts, [0, 1, 1], 2)
    assert one.data[0] == pytest.approx(32.0)  # one copy of the 4 floats, not three
    assert list(two.data) == pytest.approx([32.0, 32.0])


def test_composite_fields_are_separate_columns():
    facts = model_facts(Composite([Gaussian(0, 1), Categorical(probs(3))]))
    assert shard_sums(facts, [0, 0], 1).data[0] == pytest.approx(16.0)


@given(st.integers(1, 10**6), st.lists(st.sampled_from([1.0, 2.0, 3.5]), min_size=1, max_size=9))
def test_replica_rows_sum_to_n_and_follow_speed(n, speeds):
    speeds = speeds[: n]
    rows = replica_rows(n, speeds)
    assert sum(rows) == n and min(rows) >= 1
    if n >= 100 * len(speeds):
        per_speed = [r / s for r, s in zip(rows, speeds)]
        assert max(per_speed) - min(per_speed) <= 1.0 / min(speeds) + 1e-9


def test_fingerprint_ignores_parameter_values_but_not_structure():
    a = Mixture([Gaussian(0, 1), Gaussian(3, 2)], [0.5, 0.5])
    b = Mixture([Gaussian(5, 9), Gaussian(-1, 1)], [0.9, 0.1])
    c = Mixture([Gaussian(0, 1), Gaussian(3, 2), Gaussian(1, 1)], probs(3))
    assert model_fingerprint(a) == model_fingerprint(b)
    assert model_fingerprint(a) != model_fingerprint(c)
    assert model_fingerprint(Mixture([dg(3), dg(3)], [0.5, 0.5])) != model_fingerprint(Mixture([dg(4), dg(4)], [0.5, 0.5]))


def test_facts_are_cached_by_identity():
    model = nest()
    assert model_facts(model) is model_facts(model)


@given(st.lists(st.sampled_from([1.0, 2.0, 3.5, 0.5]), min_size=1, max_size=5), st.integers(1, 400), st.data())
def test_capped_rows_follow_speed_under_every_cap(speeds, n, data):
    d = len(speeds)
    caps = data.draw(st.lists(st.integers(0, 300), min_size=d, max_size=d), label="caps")
    got = capped_rows(n, speeds, caps)
    if d > n or min(caps) < 1 or sum(caps) < n:
        assert got is None
        return
    assert got is not None and sum(got) == n and all(1 <= x <= c for x, c in zip(got, caps)), got
    plain = replica_rows(n, speeds)
    if all(x <= c for x, c in zip(plain, caps)):
        assert got == plain  # caps that do not bind change nothing
    for r in range(d):  # a replica below its cap is not starved: no replica takes rows it could share
        for q in range(d):
            if got[r] < caps[r] and got[q] > 1 and got[q] < caps[q]:
                assert (got[r] + 1) / speeds[r] >= (got[q] - 1) / speeds[q] - 1e-9, (got, caps)


def test_row_caps_are_the_most_rows_each_replicas_cells_hold():
    model = Composite([fg(8), Categorical(probs(50)), dg(16)])
    facts = model_facts(model)
    sums = shard_sums(facts, [0, 1, 1], 2)
    n = 5000
    grid = [[0, 1], [2, 3]]
    # cells' memory at 400 rows and 1,200 rows: the caps land between
    low = cell_memory(facts, Resources.uniform(4), sums, 2, [400, 400])
    high = cell_memory(facts, Resources.uniform(4), sums, 2, [1200, 1200])
    mems = [int(low[0].max()) + 1, int(high[0].max()) + 1, int(low[1].max()) + 1, None]
    res = Resources(workers=tuple(Worker(name=f"w{i}", flops_per_s=1e9, memory_bytes=m) for i, m in enumerate(mems)),
                    network=Network())
    caps = row_caps(facts, res, n, sums, grid)
    limit = np.array([[np.inf if m is None else m for m in mems[2 * r:2 * r + 2]] for r in range(2)])
    for r in range(2):
        def fits(x):
            rows = [1, 1]
            rows[r] = x
            return bool(np.all(np.ceil(cell_memory(facts, res, sums, 2, rows)[r]) <= limit[r]))
        assert 400 <= caps[r] < 1200 and fits(caps[r]) and not fits(caps[r] + 1), (r, caps)
