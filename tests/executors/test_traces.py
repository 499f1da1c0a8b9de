"""Every grid of a model gives the trace of the single-process E-step, to 1e-9 relative."""

from __future__ import annotations

import numpy as np
from hypothesis import assume, given, note
from hypothesis import strategies as st

from emgrid.executors import optimize
from emgrid.models import DiagGaussian, FullGaussian, Gaussian, n_rows
from emgrid.models.engine import e_step

from .. import strategies as S
from .plans import assert_same_trace, grid_plan, hand_plan

ITERATIONS = 4


#: Below this variance, EM is collapsing a component onto a few points: the likelihood is
#: unbounded there and rounding differences of 1e-16 grow by the inverse variance.
COLLAPSED_VAR = 1e-3


def oracle_trace(model, data, iterations: int = ITERATIONS) -> list[float]:
    """EM with the models package alone: the reference every executor must match."""
    return oracle_fit(model, data, iterations)[0]


def oracle_fit(model, data, iterations: int = ITERATIONS) -> tuple[list[float], float]:
    """The oracle's trace and the smallest variance any Gaussian leaf took on the way."""
    prepared = model.prepare(data)
    out, smallest = [], smallest_variance(model)
    for _ in range(iterations):
        stats, ll = e_step(model, prepared)
        out.append(ll)
        model = model.estimate(stats)
        smallest = min(smallest, smallest_variance(model))
    return out, smallest


def smallest_variance(model) -> float:
    low = np.inf
    for _, leaf in model.leaves():
        if isinstance(leaf, FullGaussian):
            low = min(low, float(np.linalg.eigvalsh(leaf.cov)[0]))
        elif isinstance(leaf, (Gaussian, DiagGaussian)):
            low = min(low, float(np.min(leaf.var)))
    return low


@st.composite
def grids(draw, model, n: int):
    """A ``(D, M, shard_of_leaf)`` with every shard holding at least one leaf."""
    leaves = [p for p, _ in model.leaves()]
    d = draw(st.integers(1, min(3, n)))
    m = draw(st.integers(1, min(3, len(leaves))))
    order = draw(st.permutations(range(len(leaves))))
    return d, m, {leaves[i]: k % m for k, i in enumerate(order)}


@given(S.models_with_data(min_rows=6, max_rows=50), st.data())
def test_every_grid_gives_the_single_process_trace(model_data, draw):
    model, data = model_data
    n = n_rows(model.prepare(data))
    expected, smallest = oracle_fit(model, data)
    assume(smallest > COLLAPSED_VAR)  # a collapsing fit is ill-conditioned on any executor
    for d, m, sol in [draw.draw(grids(model, n)) for _ in range(2)]:
        note(f"grid {d}x{m}, placement {sol}")
        res = optimize(data, model, plan=grid_plan(model, n, d, m, sol), max_iter=ITERATIONS, tol=0.0)
        # tol=0 stops only at an exact fixed point (a tiny model can reach one)
        assert res.iterations == ITERATIONS or res.converged
        assert_same_trace(res.log_likelihood, expected[:res.iterations])


def test_named_grids_on_a_deep_model(nested):
    model, data = nested
    n = n_rows(model.prepare(data))
    expected = oracle_trace(model, data)
    for d, m in [(3, 1), (1, 2), (1, 4), (2, 3), (3, 5)]:
        res = optimize(data, model, plan=grid_plan(model, n, d, m), max_iter=ITERATIONS, tol=0.0)
        assert_same_trace(res.log_likelihood, expected)
        assert res.plan.data_parallel == d and res.plan.model_parallel == m


def test_a_tree_held_whole_by_one_of_two_shards_runs_on_that_shard(nested):
    """A placement with an idle shard (the planner never makes one; hand-built here)."""
    model, data = nested
    n = n_rows(model.prepare(data))
    everything_on_1 = {p: 1 for p, _ in model.leaves()}
    res = optimize(data, model, plan=hand_plan(model, n, 2, 2, everything_on_1), max_iter=3, tol=0.0)
    assert_same_trace(res.log_likelihood, oracle_trace(model, data, 3))
    assert all(b["coupling"] == 0 for b in res.bytes_moved)


def test_blocks_within_a_worker_do_not_change_the_trace(nested, monkeypatch):
    """Many small row blocks (the exchange runs once per block) give the same trace."""
    import emgrid.models.engine as engine

    model, data = nested
    n = n_rows(model.prepare(data))
    expected = oracle_trace(model, data)
    monkeypatch.setattr("emgrid.executors.step.block_rows", lambda model: 37)
    for d, m in [(1, 1), (2, 3)]:
        res = optimize(data, model, plan=grid_plan(model, n, d, m), max_iter=ITERATIONS, tol=0.0)
        assert_same_trace(res.log_likelihood, expected)
    assert engine.block_rows(model) > 37


def test_the_trace_of_exact_em_does_not_decrease(nested):
    model, data = nested
    n = n_rows(model.prepare(data))
    res = optimize(data, model, plan=grid_plan(model, n, 2, 2), max_iter=10, tol=0.0)
    ll = np.array(res.log_likelihood)
    assert np.all(np.diff(ll) >= -1e-9 * np.abs(ll[1:]))


def test_shards_hold_what_their_leaves_read_and_every_offsets_level():
    """Shared columns stay where any reader lives; a shard evaluating a split sequence
    above leaves it does not hold still gets that sequence's offsets at every level."""
    from emgrid.models import Composite, Mixture, Poisson, Sequence

    shared = Mixture([Composite([Gaussian(0.0, 1.0), Poisson(1.0)]), Composite([Gaussian(2.0, 1.0), Poisson(3.0)])],
                     [0.5, 0.5])
    nested_seq = Composite([Sequence(Composite([Sequence(Gaussian(0.0, 1.0), 3.0), Gaussian(1.0, 2.0)]), 3.0),
                            Poisson(2.0)])
    cases = [(shared, {"0.0": 0, "0.1": 1, "1.0": 1, "1.1": 0}),
             (nested_seq, {"0.0.0.0": 0, "0.0.1": 1, "1": 2})]
    for model, placement in cases:
        data = model.sample(80, np.random.default_rng(5))
        m = max(placement.values()) + 1
        res = optimize(data, model, plan=grid_plan(model, 80, 2, m, placement), max_iter=ITERATIONS, tol=0.0)
        assert_same_trace(res.log_likelihood, oracle_trace(model, data)[:res.iterations])
