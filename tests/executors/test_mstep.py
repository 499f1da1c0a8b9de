"""The sharded M-step (``executors.mstep``): every shard's head estimates its subtrees, the
coordinator only the spanning nodes, and together they give the whole model's M-step to
the last bit; the column's tree reduce sums in one fixed order; no head's report carries
another shard's statistics."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emgrid.executors import optimize
from emgrid.executors.mstep import (ShardPart, Shards, estimate_releasing, join_columns, skeleton_m_step, tree_role,
                                    tree_rounds, tree_sum)
from emgrid.models import Composite, FullGaussian, Gaussian, Mixture, ShardView, Stats
from emgrid.models.errors import FitError
from emgrid.models.regularize import Regularization
from emgrid.models.shard import Elsewhere

from .. import strategies as S
from .plans import grid_plan
from .test_shard_parts import placements


def same(a, b) -> bool:
    return pickle.dumps(a.to_spec()) == pickle.dumps(b.to_spec())


def shard_stats(view: ShardView, stats: Stats, s: int) -> Stats:
    """What shard ``s``'s workers fold: its subtrees' statistics (the lead shard's also the
    spanning nodes')."""
    def mine(p):
        return any(r == "" or p == r or p.startswith(r + ".") for r in view.roots_of(s))
    return Stats({p: v for p, v in stats.items() if mine(p) or (p in view.spanning and s == view.lead_shard)})


@settings(max_examples=40, deadline=None)
@given(S.models_with_data(min_rows=4, max_rows=30), st.data(), st.sampled_from([None, Regularization(1e-3, 0.5)]),
       st.booleans())
def test_the_shards_and_the_skeleton_estimate_the_whole_model_to_the_last_bit(model_data, draw, reg, private):
    model, data = model_data
    if len(model.leaves()) < 2:
        m, placement = 1, {p: 0 for p, _ in model.leaves()}
    else:
        m, placement = draw.draw(placements(model))
    view = ShardView.of(model, placement, m)
    stats = model.accumulate(data)
    from emgrid.models.regularize import regularize

    whole = model.estimate(regularize(model, stats, reg))
    skeleton = view.skeleton(model)
    owned, reports = {}, []
    for s in range(m):
        # a private part (as unpickled by a worker) is taken apart as it is re-estimated
        mine = view.model_for(s, copy.deepcopy(model) if private else model)
        part = ShardPart(view, s, mine, reg, private=private)
        reports.append(part.estimate(shard_stats(view, stats, s), 0.0))
        owned.update(part.pending)
        part.apply(skeleton)
        assert isinstance(part.part, Elsewhere) or set(view.owned(s, part.part)) == set(view.roots_of(s))
    split, _, bad = join_columns(reports)
    assert bad is None
    assert set(split) <= set(view.spanning)
    assembled = view.assemble(skeleton_m_step(skeleton, split, reg), owned)
    assert same(assembled, whole)


@pytest.mark.parametrize("d", range(1, 10))
def test_the_tree_reduce_takes_ceil_log2_rounds_and_heads_at_replica_0(d):
    rounds = tree_rounds(d)
    assert len(rounds) == (d - 1).bit_length()
    senders = [r for pairs in rounds for _, r in pairs]
    assert sorted(senders) == list(range(1, d))  # every replica but the head sends once
    for r in range(d):
        got, target = tree_role(r, d)
        assert (target is None) == (r == 0)
        assert all(g > r for g in got)
    col = [(Stats({"x": (np.array([2.0 ** -i]),)}), float(i)) for i in range(d)]
    total, ll = tree_sum(col)
    assert total["x"][0][0] == sum(2.0 ** -i for i in range(d)) and ll == sum(range(d))


def test_the_tree_adds_in_its_own_fixed_order():
    # (s0 + s1) + (s2 + s3) differs from ((s0 + s1) + s2) + s3 in floating point here
    vals = [1.0, 1e-16, 1e-16, -1.0]
    col = [(Stats({"x": (np.array([v]),)}), 0.0) for v in vals]
    assert tree_sum(col)[0]["x"][0][0] == (vals[0] + vals[1]) + (vals[2] + vals[3])


def two_records():
    rng = np.random.default_rng(3)
    model = Mixture([Composite([FullGaussian(rng.normal(size=3), np.eye(3)), Gaussian(float(i), 1.0)]) for i in range(3)],
                    np.full(3, 1 / 3))
    return model, model.sample(400, rng)


@pytest.mark.parametrize("grid", [(1, 2), (2, 2), (1, 4), (3, 2)])
def test_a_sharded_fit_equals_the_whole_one_and_gathers_the_same_model(grid):
    model, data = two_records()
    one = optimize(data, model, plan=grid_plan(model, 400),
                   executor="local", max_iter=6, tol=0.0)
    n = one.plan.n_data
    fit = optimize(data, model, plan=grid_plan(model, n, *grid), executor="local", max_iter=6, tol=0.0)
    assert np.allclose(fit.log_likelihood, one.log_likelihood, rtol=1e-12, atol=0)
    assert fit.model is not None
    assert np.allclose(fit.model.log_density(data), one.model.log_density(data), rtol=1e-9)
    assert same(fit.shards.gather(), fit.model)


def test_the_model_is_left_on_the_grid_when_not_gathered():
    model, data = two_records()
    n = len(data[0]) if isinstance(data, tuple) else len(data)
    seen = []

    def callback(it, ll, result):
        seen.append(result.shards.gather())

    job = optimize(data, model, plan=grid_plan(model, n, 2, 2), executor="local", max_iter=3, tol=0.0,
                   callback=callback, gather=False)
    assert job.model is None
    whole = optimize(data, model, plan=grid_plan(model, n, 2, 2), executor="local", max_iter=3, tol=0.0)
    assert same(seen[-1], whole.model)


@pytest.mark.parametrize("grid", [(1, 1), (1, 2), (2, 2)])
def test_models_gathered_by_a_callback_stay_whole_through_later_m_steps(grid):
    # the local grid's parts take their own old subtrees apart as they re-estimate them:
    # what a callback gathered (and the caller's starting model) must not be among them
    model, data = two_records()
    start = pickle.dumps(model)
    n = len(data[0]) if isinstance(data, tuple) else len(data)
    kept, copies = [], []

    def callback(it, ll, result):
        got = result.shards.gather()
        kept.append(got)
        copies.append(pickle.dumps(got))

    optimize(data, model, plan=grid_plan(model, n, *grid), executor="local", max_iter=5, tol=0.0, callback=callback)
    assert len(kept) == 5
    assert [pickle.dumps(k) for k in kept] == copies
    assert pickle.dumps(model) == start


def test_the_coordinator_names_a_non_finite_node_on_any_shard():
    model, data = two_records()
    view = ShardView.of(model, {p: i % 2 for i, (p, _) in enumerate(model.leaves())}, 2)
    part = ShardPart(view, 1, view.model_for(1, model))
    stats = model.accumulate(data)
    p = view.roots_of(1)[0]
    poisoned = Stats({k: (tuple(np.full_like(np.asarray(a, dtype=float), np.nan) for a in v) if k == p else v)
                      for k, v in stats.items()})
    report = part.estimate(poisoned, 0.0)
    assert report.nonfinite is not None and report.nonfinite[0] == p and part.pending is None
    lead = ShardPart(view, 0, view.model_for(0, model)).estimate(shard_stats(view, stats, 0), 0.0)
    _, _, first = join_columns([lead, report])
    from emgrid.executors.loop import check_finite

    with pytest.raises(FitError, match=repr(p)):
        check_finite(first, 0.0, 1)


def test_shards_of_a_held_model_gather_it_back():
    model, _ = two_records()
    view = ShardView.of(model, {p: i % 3 for i, (p, _) in enumerate(model.leaves())}, 3)
    sh = Shards.held(view, model)
    assert same(sh.gather(), model)
    assert sum(len(part) for _, part in sh) == len(view.roots)


def test_taking_a_part_apart_keeps_the_nodes_that_keep_themselves_and_the_shared_ones():
    # a component no row reaches keeps its parameters (its estimate is itself), and one
    # component object stands at two places: neither may be emptied
    near, far = Gaussian(0.0, 1.0), Gaussian(1e6, 1.0)
    model = Mixture([near, far, far, Gaussian(0.5, 2.0)], np.full(4, 0.25))
    data = Gaussian(0.0, 1.0).sample(200, np.random.default_rng(5))
    stats = model.accumulate(data)
    assert stats["1"][0] < 1e-300  # far's weight: nothing
    whole = model.estimate(stats)
    private = pickle.loads(pickle.dumps(model))
    assert private.children[1] is private.children[2]  # pickle keeps the sharing
    new = estimate_releasing(private, dict(stats), "")
    assert same(new, whole)
    assert np.array_equal(new.log_density(data), whole.log_density(data))
