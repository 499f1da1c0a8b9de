"""What a shard keeps (``models.shard``): of its replica's rows (``ShardView.columns_for``)
and of the model (``ShardView.model_for``): the shards' parts, exchanging as the executors
do, give the statistics of the whole model. The view's structure is held against a
brute-force reading of the placement, and its column keys against the data each node reads."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import assume, given, note
from hypothesis import strategies as st

from emgrid.executors.step import grid_layout
from emgrid.models import Composite, Gaussian, Mixture, Poisson, Ragged, Sequence, ShardView
from emgrid.models.base import child_path
from emgrid.models.data import n_rows
from emgrid.models.engine import shard_block, subtree_data
from emgrid.models.shard import Elsewhere, column_keys, restrict_columns

from .. import strategies as S
from .plans import grid_plan


@st.composite
def placements(draw, model, max_shards: int = 3):
    """``(m, shard_of_leaf)``: the leaves dealt round-robin to ``m >= 2`` shards in a drawn order."""
    leaves = [p for p, _ in model.leaves()]
    m = draw(st.integers(2, min(max_shards, len(leaves))), label="shards")
    order = draw(st.permutations(range(len(leaves))), label="order")
    return m, {leaves[i]: k % m for k, i in enumerate(order)}


def test_a_sequence_wholly_on_other_shards_leaves_nothing_behind_unless_it_spans():
    model = Composite([Sequence(Composite([Gaussian(0.0, 1.0), Poisson(2.0)]), 3.0), Gaussian(1.0, 2.0)])
    data = model.prepare(model.sample(50, np.random.default_rng(0)))
    # the sequence's leaves are on other shards: neither its values nor its offsets stay
    assert restrict_columns(model, data, frozenset({"1"})) == (None, data[1])
    # a spanning sequence is evaluated on every shard: its offsets stay, its other columns do not
    kept = restrict_columns(model, data, frozenset({"1"}), spanning=frozenset({"", "0"}))
    assert isinstance(kept[0], Ragged) and kept[0].offsets is data[0].offsets
    assert kept[0].values == (None, None)
    # a shard holding one of its leaves keeps the offsets and that leaf's column only
    mine = restrict_columns(model, data, frozenset({"0.0.1"}))
    assert mine[0].offsets is data[0].offsets and mine[0].values[0] is None
    assert mine[0].values[1] is data[0].values[1] and mine[1] is None


@given(S.models_with_data(min_rows=4, max_rows=30), st.data())
def test_the_shards_parts_of_the_model_give_the_whole_models_statistics(model_data, draw):
    model, raw = model_data
    assume(len(model.leaves()) >= 2)
    m, placement = draw.draw(placements(model))
    note(repr(placement))
    data = model.prepare(raw)
    n = n_rows(data)
    view = ShardView.of(model, placement, m)
    parts = [view.model_for(s, model) for s in range(m)]
    columns = [view.columns_for(s, model, data) for s in range(m)]
    w = np.ones(n)
    ups = [view.up(s, parts[s], columns[s]) for s in range(m)]
    every = {k: v for _, mine in ups for k, v in mine.items()}
    got, ll = {}, 0.0
    for s, (cache, _) in enumerate(ups):
        out, share = view.down(s, parts[s], columns[s], w, cache, every)
        assert not set(out) & set(got)  # every node's statistics come from one shard
        got.update(out)
        ll += share
    want, want_ll = shard_block(model, data, w, [""], lambda x: x, True)
    assert set(got) == set(want)
    for key in want:
        for a, b in zip(got[key], want[key]):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
    assert ll == pytest.approx(want_ll, rel=1e-9)
    for s, part in enumerate(parts):  # a shard's part holds no other shard's leaf
        mine = {p for p, node in part.leaves() if not isinstance(node, Elsewhere)}
        assert mine == set(view.leaves_of(s))
        stubs = sum(isinstance(node, Elsewhere) for _, node in part.nodes())
        assert len(pickle.dumps(part)) <= len(pickle.dumps(model)) + 128 * stubs


@given(S.models(), st.data())
def test_spanning_nodes_and_shard_roots_are_those_of_the_placement(model, draw):
    """Oracle: the set of shards under every node, read off the leaves' paths."""
    assume(len(model.leaves()) >= 2)
    m, placement = draw.draw(placements(model))
    view = ShardView.of(model, placement, m)

    def shards_under(path):
        return {s for p, s in placement.items() if path == "" or p == path or p.startswith(path + ".")}

    spanning = {p for p, node in model.nodes() if len(shards_under(p)) > 1}
    assert set(view.spanning) == spanning
    parent = {child_path(p, i): p for p, node in model.nodes() for i in range(len(node.children))}
    roots = {p: shards_under(p).pop() for p, _ in model.nodes()
             if p not in spanning and (parent.get(p) in spanning if p else not spanning)}
    assert dict(view.roots) == roots
    for s in range(m):
        assert view.roots_of(s) == tuple(p for p in view.roots if roots[p] == s)
        assert set(view.leaves_of(s)) == {p for p, k in placement.items() if k == s}
    assert view.whole == (not spanning)
    # every leaf lies under exactly one shard root, of its own shard
    for leaf, s in placement.items():
        over = [r for r in view.roots if r == "" or leaf == r or leaf.startswith(r + ".")]
        assert len(over) == 1 and roots[over[0]] == s


@given(S.models_with_data(min_rows=2, max_rows=6))
def test_siblings_share_a_column_key_exactly_when_they_read_one_column(model_data):
    """Oracle: the data objects the engine hands every node (``engine.subtree_data``)."""
    model, raw = model_data
    data = model.prepare(raw)
    keys = column_keys(model)
    assert set(keys) == {p for p, _ in model.nodes()}
    for path, node in model.nodes():
        kids = [child_path(path, i) for i in range(len(node.children))]
        for a in kids:
            for b in kids:
                same = subtree_data(model, data, a) is subtree_data(model, data, b)
                assert (keys[a] == keys[b]) == same, (a, b)


def test_a_shards_model_shares_the_parameters_and_leaves_the_model_alone():
    inner = Mixture([Gaussian(0.0, 1.0), Gaussian(3.0, 1.0)], [0.5, 0.5])
    model = Composite([inner, Poisson(2.0)])
    before = pickle.dumps(model)
    view = ShardView.of(model, {"0.0": 0, "0.1": 1, "1": 1})
    part = view.model_for(0, model)
    assert pickle.dumps(model) == before
    assert model.children[0].children[1] is inner.children[1]
    assert isinstance(part.children[1], Elsewhere) and isinstance(part.children[0].children[1], Elsewhere)
    assert part.children[0].children[0] is inner.children[0]
    assert part.children[0].weights is inner.weights
    assert view.model_for(1, model).children[1] is model.children[1]


def test_a_tree_held_whole_goes_whole_to_its_shard_and_nothing_to_the_others():
    model = Composite([Gaussian(0.0, 1.0), Poisson(2.0)])
    data = model.prepare(model.sample(10, np.random.default_rng(1)))
    view = ShardView.of(model, {"0": 1, "1": 1}, 3)
    assert view.whole and view.lead_shard == 1 and view.coupling_bytes_per_row == 0.0
    assert view.model_for(1, model) is model and view.columns_for(1, model, data) == data
    for s in (0, 2):
        assert isinstance(view.model_for(s, model), Elsewhere) and view.columns_for(s, model, data) is None
        assert not view.evaluates(s) and view.roots_of(s) == ()


def test_every_worker_of_a_grid_shares_one_view():
    model = Composite([Gaussian(0.0, 1.0), Poisson(2.0), Gaussian(1.0, 1.0)])
    layout = grid_layout(model, grid_plan(model, 30, 2, 2))
    views = {id(spec.view) for row in layout for spec in row}
    assert len(views) == 1
    assert [[(spec.replica, spec.shard, spec.roots) for spec in row] for row in layout] == \
        [[(r, 0, ("0", "2")), (r, 1, ("1",))] for r in (0, 1)]
