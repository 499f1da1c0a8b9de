"""What a shard keeps: of its replica's rows (``restrict_columns``) and of the model
(``shard_model``): the shards' parts, exchanging as the executors do, give the statistics
of the whole model."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import assume, given, note
from hypothesis import strategies as st

from emgrid.executors.step import Elsewhere, grid_layout, restrict_columns, shard_model
from emgrid.models import Composite, Gaussian, Poisson, Ragged, Sequence
from emgrid.models.data import n_rows
from emgrid.models.engine import shard_block, shard_down, shard_up

from .. import strategies as S
from .plans import grid_plan


def test_a_sequence_wholly_on_other_shards_leaves_nothing_behind_unless_it_is_split():
    model = Composite([Sequence(Composite([Gaussian(0.0, 1.0), Poisson(2.0)]), 3.0), Gaussian(1.0, 2.0)])
    data = model.prepare(model.sample(50, np.random.default_rng(0)))
    # the sequence's leaves are on other shards: neither its values nor its offsets stay
    assert restrict_columns(model, data, frozenset({"1"})) == (None, data[1])
    # a split sequence is evaluated on every shard: its offsets stay, its other columns do not
    kept = restrict_columns(model, data, frozenset({"1"}), split=frozenset({"", "0"}))
    assert isinstance(kept[0], Ragged) and kept[0].offsets is data[0].offsets
    assert kept[0].values == (None, None)
    # a shard holding one of its leaves keeps the offsets and that leaf's column only
    mine = restrict_columns(model, data, frozenset({"0.0.1"}))
    assert mine[0].offsets is data[0].offsets and mine[0].values[0] is None
    assert mine[0].values[1] is data[0].values[1] and mine[1] is None


@given(S.models_with_data(min_rows=4, max_rows=30), st.data())
def test_the_shards_parts_of_the_model_give_the_whole_models_statistics(model_data, draw):
    model, raw = model_data
    leaves = [p for p, _ in model.leaves()]
    assume(len(leaves) >= 2)
    m = draw.draw(st.integers(2, min(3, len(leaves))), label="shards")
    order = draw.draw(st.permutations(range(len(leaves))), label="order")
    placement = {leaves[i]: k % m for k, i in enumerate(order)}
    note(repr(placement))
    data = model.prepare(raw)
    n = n_rows(data)
    specs = grid_layout(model, grid_plan(model, n, 1, m, placement))[0]
    parts = [shard_model(model, spec) for spec in specs]
    w = np.ones(n)
    ups = [shard_up(part, data, spec.owned) for part, spec in zip(parts, specs)]
    every = {k: v for _, mine in ups for k, v in mine.items()}
    got, ll = {}, 0.0
    for part, spec, (passes, _) in zip(parts, specs, ups):
        out, share = shard_down(part, data, w, spec.owned, passes, every, spec.first_shard)
        assert not set(out) & set(got)  # every node's statistics come from one shard
        got.update(out)
        ll += share
    want, want_ll = shard_block(model, data, w, [""], lambda x: x, True)
    assert set(got) == set(want)
    for key in want:
        for a, b in zip(got[key], want[key]):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
    assert ll == pytest.approx(want_ll, rel=1e-9)
    for part, spec in zip(parts, specs):  # a shard's part holds no other shard's leaf
        mine = {p for p, node in part.leaves() if not isinstance(node, Elsewhere)}
        assert mine == set(spec.leaves)
        stubs = sum(isinstance(node, Elsewhere) for _, node in part.nodes())
        assert len(pickle.dumps(part)) <= len(pickle.dumps(model)) + 128 * stubs
