"""The analytic costs the planner consumes, against what the nodes really hold."""

from __future__ import annotations

import json
import pickle
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, note, settings

from emgrid.models import (HMM, Categorical, Composite, DiagGaussian, FullGaussian, Gaussian, Mixture, Node, NodeCost,
                    Sequence, Stats, tree_costs)
from emgrid.models.cost import COUPLING_BYTES, ROW_WEIGHT_BYTES, batch_cost, block_bytes_per_row, data_lengths
from emgrid.models.data import n_rows, take_rows
from emgrid.models.engine import shard_block

from tests import strategies as S


def own_stats_entry(model: Node, stats: Stats, path: str) -> Stats:
    node = model.node_at(path)
    return Stats({path: stats[path]} if node.has_own_stats else {})


@given(m=S.models())
def test_every_node_reports_a_nonnegative_cost(m):
    for _, node in m.nodes():
        c = node.cost()
        assert isinstance(c, NodeCost)
        for name, value in c.model_dump().items():
            if name == "mstep_bytes" and value is None:  # the new node alone (mstep_peak_bytes)
                continue
            assert np.isfinite(value) and value >= 0, (node.describe(), name, value)
        assert c.mstep_peak_bytes >= 0


@given(m=S.models())
def test_cache_bytes_cover_the_arrays_a_node_keeps_beside_its_parameters(m):
    # what each node holds built from its parameters (log tables, Cholesky factors), which
    # the planner charges a worker with one replica once (planner.costing.fixed_bytes)
    note(json.dumps(m.to_spec()))
    for path, node in m.nodes():
        params = {id(v) for v in node.params().values()}
        kept = sum(v.nbytes for v in vars(node).values() if isinstance(v, np.ndarray) and id(v) not in params)
        assert kept <= node.cost().cache_bytes, (path, node.describe(), kept, node.cost().cache_bytes)


@given(m=S.models())
def test_param_bytes_are_the_bytes_of_the_parameters(m):
    note(json.dumps(m.to_spec()))
    for path, node in m.nodes():
        want = sum(8 * np.asarray(v, dtype=np.float64).size for v in node.params().values())
        assert node.cost().param_bytes == want, (path, node.describe())
        assert want == sum(np.asarray(v).nbytes for v in node.params().values())


@given(md=S.models_with_data(min_rows=1, max_rows=30))
def test_stat_bytes_predict_the_pickled_statistics(md):
    m, x = md
    note(json.dumps(m.to_spec()))
    stats = m.accumulate(x)
    for path, node in m.nodes():
        actual = len(pickle.dumps(own_stats_entry(m, stats, path)))
        predicted = node.cost().stat_bytes
        assert abs(predicted - actual) <= 0.1 * actual + 256, (path, node.describe(), predicted, actual)


def sampled_rows(node: Node, data, path: str = "") -> dict[str, int]:
    """Rows every node of ``node`` reads of ``data``, routed as the engine routes them."""
    out = {path: n_rows(data)}
    for i, c in enumerate(node.children):
        out.update(sampled_rows(c, node._child_data(data, i), f"{path}.{i}" if path else str(i)))
    return out


@settings(max_examples=15)
@given(m=S.models(), seed=S.seeds())
def test_rows_per_root_row_are_the_rows_the_sampled_data_holds(m, seed):
    """An independent oracle for the multipliers: the model's own samples, counted. Under a
    mixture every component reads the same column, so a component's sequences hold every
    component's rows (the weighted mean length), not its own mean length."""
    note(json.dumps(m.to_spec()))
    n = 20_000
    counts = sampled_rows(m, m.prepare(m.sample(n, np.random.default_rng(seed))))
    for pc in tree_costs(m):
        assert counts[pc.path] / n == pytest.approx(pc.rows_per_root_row, rel=0.06, abs=0.02), pc.path


def test_components_of_a_mixture_read_the_mean_length_of_all_their_rows():
    short, long = Sequence(Gaussian(0, 1), 2.0), Sequence(Gaussian(0, 1), 8.0)
    rows = {p.path: p.rows_per_root_row for p in tree_costs(Mixture([short, long], [0.25, 0.75]))}
    assert rows == {"": 1.0, "0": 1.0, "0.0": 6.5, "1": 1.0, "1.0": 6.5}
    assert data_lengths(Mixture([short, long], [0.25, 0.75])) == {"0": 6.5, "1": 6.5}
    assert data_lengths(Mixture([short, short], [0.5, 0.5])) == {}


@given(m=S.models())
def test_tree_costs_rescale_every_node_by_its_rows_per_root_row(m):
    note(json.dumps(m.to_spec()))
    placed = tree_costs(m)
    lengths = data_lengths(m)
    assert [p.path for p in placed] == [p for p, _ in m.nodes()]
    for pc in placed:
        node = m.node_at(pc.path)
        own = node.cost() if pc.path not in lengths else node.cost(length=lengths[pc.path])
        mult = pc.rows_per_root_row
        assert pc.data_bytes_per_row == pytest.approx(own.data_bytes_per_row * mult, rel=1e-12)
        parent = m.node_at(pc.path.rsplit(".", 1)[0] if "." in pc.path else "") if pc.path else None
        # a batched kernel and its children: see the traced-memory tests below
        if (parent is None or batch_cost(parent) is None) and batch_cost(node) is None:
            assert pc.flops_per_row == pytest.approx(own.flops_per_row * mult, rel=1e-12)
            weights = ROW_WEIGHT_BYTES if pc.path == "" else 0.0
            assert pc.work_bytes_per_row == pytest.approx(own.work_bytes_per_row * mult + weights, rel=1e-12)
            assert pc.scratch_bytes_per_row == pytest.approx(own.scratch_bytes_per_row * mult, rel=1e-12)
        assert pc.owned_root_coupling_bytes_per_row == pytest.approx(COUPLING_BYTES * mult, rel=1e-12)
        assert (pc.param_bytes, pc.stat_bytes, pc.is_leaf) == (own.param_bytes, own.stat_bytes, node.is_leaf)


def traced_block_bytes(model: Node, data) -> int:
    """Peak bytes numpy allocates while one worker runs one block of all of ``data``, as
    ``executors.step`` does (the block's rows and unit weights taken; the data excluded)."""
    n = n_rows(data)
    shard_block(model, data, np.ones(n), [""], lambda x: x, True)  # caches (expanded parameters) warm
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        out = shard_block(model, take_rows(data, 0, n), np.ones(n), [""], lambda x: x, True)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    del out
    return peak


#: Small allocations of a block that do not grow with its rows (expanded parameters,
#: per-node scalars, Python objects).
FIXED_BLOCK_BYTES = 256 * 1024


@given(m=S.models(), seed=S.seeds())
def test_working_memory_of_a_block_is_predicted_from_the_costs(m, seed):
    """The oracle is the allocator: numpy's allocations traced while a block runs. The plan
    multiplies ``block_bytes_per_row`` by the block's rows; it must never under-count by
    more than a quarter, and over-counts only where nested HMMs share scratch."""
    note(json.dumps(m.to_spec()))
    n = 2000
    data = m.prepare(m.sample(n, np.random.default_rng(seed)))
    predicted = block_bytes_per_row(tree_costs(m)) * n
    traced = traced_block_bytes(m, data)
    note(f"predicted {predicted:.0f} traced {traced}")
    assert traced <= 1.25 * predicted + FIXED_BLOCK_BYTES
    assert traced >= 0.4 * predicted


@pytest.mark.parametrize("model", [
    Mixture([DiagGaussian(np.full(8, float(i)), np.ones(8)) for i in range(16)], np.full(16, 1 / 16)),
    Mixture([FullGaussian(np.full(24, float(i)), np.eye(24)) for i in range(2)], [0.5, 0.5]),
    HMM([DiagGaussian(np.full(4, float(i)), np.ones(4)) for i in range(4)], np.full((4, 4), 0.25), np.full(4, 0.25), 10.0),
    Composite([Categorical(np.full(20, 0.05)), Gaussian(0.0, 1.0), Sequence(DiagGaussian(np.zeros(4), np.ones(4)), 10.0)]),
], ids=["diag-mixture", "full-mixture", "hmm", "composite"])
def test_working_memory_of_the_benchmark_families_is_within_a_tenth(model):
    n = 4000
    data = model.prepare(model.sample(n, np.random.default_rng(0)))
    predicted = block_bytes_per_row(tree_costs(model)) * n
    assert traced_block_bytes(model, data) == pytest.approx(predicted, rel=0.1)


@pytest.mark.parametrize("leaf", [DiagGaussian(np.zeros(6), np.ones(6)), FullGaussian(np.zeros(5), np.eye(5)),
                                  FullGaussian(np.zeros(40), np.eye(40))], ids=["diag", "full", "full-wide"])
def test_a_batched_kernel_charges_its_block_once_and_each_component_its_share(leaf):
    def total(k):
        return sum(c.flops_per_row for c in tree_costs(Mixture([leaf] * k, np.full(k, 1 / k))))

    for k in (2, 3, 8):
        b = type(leaf).batch_cost((leaf,) * k)
        mixture_own = Mixture([leaf] * k, np.full(k, 1 / k)).cost().flops_per_row
        assert total(k) - mixture_own == pytest.approx(b.block_flops + k * b.component_flops)
        assert b.block_flops > 0 and b.component_flops > 0


def test_tree_costs_multiply_nested_sequence_lengths():
    m = Sequence(HMM([Gaussian(0, 1), Gaussian(1, 1)], [[0.5, 0.5], [0.5, 0.5]], [0.5, 0.5], 4.0), 3.0)
    rows = {p.path: p.rows_per_root_row for p in tree_costs(m)}
    assert rows == {"": 1.0, "0": 3.0, "0.0": 12.0, "0.1": 12.0}


@given(m=S.models(), seed=S.seeds())
def test_statistics_payload_does_not_grow_with_rows(m, seed):
    note(json.dumps(m.to_spec()))
    small = len(pickle.dumps(m.accumulate(m.sample(20, seed))))
    large = len(pickle.dumps(m.accumulate(m.sample(200, seed + 1))))
    assert abs(large - small) <= 8, (small, large)


def test_hmm_cost_grows_with_sequence_length():
    short = HMM([Gaussian(0, 1)] * 2, [[0.5, 0.5], [0.5, 0.5]], [0.5, 0.5], 5.0).cost()
    long = HMM([Gaussian(0, 1)] * 2, [[0.5, 0.5], [0.5, 0.5]], [0.5, 0.5], 50.0).cost()
    assert long.flops_per_row > 5 * short.flops_per_row
    assert long.param_bytes == short.param_bytes and long.stat_bytes == short.stat_bytes
