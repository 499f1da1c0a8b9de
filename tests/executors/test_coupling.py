"""The coupling message (``executors.coupling``): what a shard packs, every shard unpacks
bit for bit, as views of the message, and a failed shard stops the merge."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from emgrid.executors import coupling

densities = arrays(np.float64, st.integers(0, 40), elements=st.floats(allow_nan=False, width=64))
parts = st.lists(st.lists(densities, max_size=4), min_size=1, max_size=4)


def roots(shards: list[list[np.ndarray]]) -> list[list[str]]:
    return [[f"{s}.{i}" for i in range(len(arrs))] for s, arrs in enumerate(shards)]


@given(parts)
def test_every_shards_densities_arrive_bit_for_bit_as_views_of_the_messages(shards):
    by_shard = roots(shards)
    mines = [dict(zip(names, arrs)) for names, arrs in zip(by_shard, shards)]
    messages = [coupling.pack(mine, names) for mine, names in zip(mines, by_shard)]
    for mine, message in zip(mines, messages):
        assert len(message) == coupling.message_length(mine)
    every = coupling.merge(messages, by_shard)
    assert list(every) == [r for names in by_shard for r in names]
    for mine, message in zip(mines, messages):
        for r, v in mine.items():
            assert every[r].tobytes() == v.tobytes()
            assert every[r].base is message or every[r].base is message.base


def test_a_message_that_does_not_match_its_roots_is_a_bug_not_data():
    with pytest.raises(AssertionError, match="sends its roots"):
        coupling.pack({"b": np.zeros(2), "a": np.zeros(2)}, ["a", "b"])
    with pytest.raises(AssertionError, match="one value per row"):
        coupling.pack({"a": np.zeros((2, 2))}, ["a"])
    message = coupling.pack({"a": np.zeros(3)}, ["a"])
    with pytest.raises(AssertionError, match="does not hold"):
        coupling.unpack(message[:-1], ["a"])
