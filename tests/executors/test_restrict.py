"""What a shard keeps of its replica's rows (``executors.step.restrict_columns``)."""

from __future__ import annotations

import numpy as np

from executors.step import restrict_columns
from models import Composite, Gaussian, Poisson, Ragged, Sequence


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
