"""Each constraint family alone: feasible and infeasible, and its share equal to the cost model."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from ortools.sat.python import cp_model

from emgrid.planner import constraints as C
from emgrid.planner.costing import SYNC_WAIT_SHARE, mstep_s, price, shard_sums
from emgrid.planner.facts import model_facts
from emgrid.planner.placement import make_layout
from emgrid.planner.program import make_instance
from emgrid.planner.scaling import Scale
from emgrid.planner.units import build_units
from emgrid.planner.variables import ShardVars
from tests.planner.helpers import mixed, small_nest, uniform

N_DATA = 5000


def program(model, res, d, m, families, fix=None, reference=0.02):
    """A program holding only ``families`` (and ``fix``: unit -> shard); returns the solve.

    ``reference`` (seconds) sets the tick scale; the time variables are capped by an upper bound
    of every assignment (``program.time_upper_s``), whatever the reference.
    """
    facts = model_facts(model)
    ut = build_units(facts, 64)
    layout = make_layout(res, d, m)
    speeds = np.array([w.flops_per_s for w in res.workers])[np.asarray(layout.grid)]
    from emgrid.planner.costing import replica_rows

    rows = replica_rows(N_DATA, speeds.min(axis=1))
    scale = Scale.for_instance(reference, max([w.memory_bytes or 0 for w in res.workers] + [1]))
    inst = make_instance(ut, res, layout, rows, facts.block_rows, scale, reference)
    model_cp = cp_model.CpModel()
    v = ShardVars(model_cp, ut, m)
    shares = [f(model_cp, v, inst) for f in families]
    for u, s in (fix or {}).items():
        model_cp.add(v.x[u][s] == 1)
    model_cp.minimize(sum(shares))
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = 0
    status = solver.solve(model_cp)
    return status, solver, v, inst, facts, layout, rows, scale


def assignment_of(solver, v):
    return v.extract(solver)


def test_assignment_feasible_and_infeasible():
    model = small_nest()  # 5 leaves
    status, solver, v, *_ = program(model, uniform(8), 1, 5, [C.assignment])
    assert status == cp_model.OPTIMAL
    assert sorted(set(assignment_of(solver, v).tolist())) == [0, 1, 2, 3, 4]
    status, *_ = program(model, uniform(8), 1, 6, [C.assignment])
    assert status == cp_model.INFEASIBLE  # six shards, five units: one would be empty


def test_ownership_marks_exactly_the_spanning_nodes():
    model = small_nest()
    facts = model_facts(model)
    for combo in [(0, 0, 0, 1, 1), (0, 1, 0, 1, 0), (1, 1, 1, 1, 0)]:
        fix = dict(enumerate(combo))
        status, solver, v, inst, *_ = program(model, uniform(2), 1, 2, [C.assignment, C.ownership], fix=fix)
        assert status == cp_model.OPTIMAL
        spanning = {facts.paths[inst.ut.internal[i]] for i in range(inst.ut.n_internal)
                 if isinstance(v.spanning[i], int) and v.spanning[i] or not isinstance(v.spanning[i], int)
                 and solver.boolean_value(v.spanning[i])}
        want = shard_sums(facts, list(combo), 2).spanning
        assert spanning == {facts.paths[i] for i in np.flatnonzero(want)}


def test_first_fit_keeps_one_labelling_per_partition():
    model = small_nest()
    res = uniform(3)

    def count(families):
        status, solver, v, inst, *_ = program(model, res, 1, 3, families)
        cp = cp_model.CpModel()
        vv = ShardVars(cp, inst.ut, 3)
        for f in families:
            f(cp, vv, inst)
        solver = cp_model.CpSolver()
        solver.parameters.enumerate_all_solutions = True
        n = [0]

        class Counter(cp_model.CpSolverSolutionCallback):
            def on_solution_callback(self):
                n[0] += 1

        solver.solve(cp, Counter())
        return n[0]

    without = count([C.assignment, C.ownership])
    with_ff = count([C.assignment, C.ownership, C.first_fit_symmetry])
    assert without == 6 * with_ff  # 3! labellings of every partition into three shards
    assert with_ff == 25  # Stirling S(5, 3)


def test_first_fit_does_not_merge_different_columns():
    model = small_nest()
    res = mixed([2e9, 1e9, 1e9], [None, None, None])
    inst = program(model, res, 1, 3, [C.assignment])[3]
    assert sorted(map(len, inst.classes)) == [1, 2]


@pytest.mark.parametrize("family, term", [(C.compute_term, "compute_s"), (C.coupling_term, "coupling_s"),
                                          (C.reduce_term, "reduce_s"), (C.broadcast_term, "broadcast_s")])
@pytest.mark.parametrize("combo", [(0, 0, 0, 1, 1), (0, 1, 0, 1, 0), (1, 0, 0, 0, 0)])
def test_each_time_term_equals_the_cost_model(family, term, combo):
    model = small_nest()
    res = mixed([2e9, 1e9, 2e9, 1e9], [None] * 4)
    status, solver, v, inst, facts, layout, rows, scale = program(
        model, res, 2, 2, [C.assignment, C.ownership, family], fix=dict(enumerate(combo)))
    assert status == cp_model.OPTIMAL
    bd = price(facts, res, N_DATA, shard_sums(facts, list(combo), 2), layout.grid, rows).breakdown
    want = getattr(bd, term)
    # the shards' per-block wait is priced in the coupling term, programmed in the compute family
    want += {"compute_s": 1, "coupling_s": -1}.get(term, 0) * SYNC_WAIT_SHARE * bd.compute_s
    got = scale.seconds(solver.objective_value)
    assert got <= want + 1e-15  # coefficients round down
    assert got == pytest.approx(want, rel=1e-6, abs=20 / scale.ticks_per_s)


@pytest.mark.parametrize("below, feasible", [(0, True), (1, False)])
def test_compute_term_is_infeasible_below_the_busiest_worker(below, feasible):
    model = small_nest()
    fix = dict(enumerate([0, 0, 1, 1, 1]))
    status, solver, v, inst, *_ = program(model, uniform(2), 1, 2, [C.assignment, C.ownership, C.compute_term],
                                          fix=fix)
    assert status == cp_model.OPTIMAL
    busiest = int(solver.objective_value)
    cp = cp_model.CpModel()
    vv = ShardVars(cp, inst.ut, 2)
    C.assignment(cp, vv, inst)
    C.ownership(cp, vv, inst)
    t = C.compute_term(cp, vv, inst)
    cp.add(t <= busiest - below)
    for u, sh in fix.items():
        cp.add(vv.x[u][sh] == 1)
    got = cp_model.CpSolver().solve(cp)
    assert got == (cp_model.OPTIMAL if feasible else cp_model.INFEASIBLE)


@pytest.mark.parametrize("slack, feasible", [(1.0, True), (0.999, False)])
def test_memory_holds_exactly_at_the_cost_model_limit(slack, feasible):
    model = small_nest()
    facts = model_facts(model)
    combo = [0, 0, 0, 1, 1]
    probe = uniform(2)
    layout = make_layout(probe, 1, 2)
    p = price(facts, probe, N_DATA, shard_sums(facts, combo, 2), layout.grid)
    need = int(np.ceil(p.memory.max()))
    # both workers get the larger need: the fixed assignment fits at slack 1 (memory
    # coefficients round up by at most 1/64 byte each)
    res = mixed([1e9, 1e9], [int(need * slack) + (1 if slack == 1.0 else 0)] * 2)
    status, *_ = program(model, res, 1, 2, [C.assignment, C.ownership, C.memory], fix=dict(enumerate(combo)))
    if feasible:
        assert status == cp_model.OPTIMAL
    else:
        # the fixed assignment does not fit; check the cost model agrees
        q = price(facts, res, N_DATA, shard_sums(facts, combo, 2), layout.grid)
        assert q.fits is False
        assert status == cp_model.INFEASIBLE


def test_memory_alone_feasible_with_room_and_infeasible_without():
    model = small_nest()
    status, *_ = program(model, uniform(4, memory=2**30), 2, 2, [C.assignment, C.ownership, C.memory])
    assert status == cp_model.OPTIMAL
    status, *_ = program(model, uniform(4, memory=1000), 2, 2, [C.assignment, C.ownership, C.memory])
    assert status == cp_model.INFEASIBLE


def test_full_program_objective_equals_cost_model_on_every_assignment():
    """The sum of every family's share, on every fixed assignment of a small nest."""
    model = small_nest()
    res = mixed([2e9, 1e9, 1e9, 2e9], [None] * 4)
    for combo in itertools.islice((c for c in itertools.product(range(2), repeat=5) if len(set(c)) == 2), 0, 30, 3):
        status, solver, v, inst, facts, layout, rows, scale = program(
            model, res, 2, 2, [C.assignment, C.ownership, C.compute_term, C.coupling_term, C.reduce_term,
                               C.broadcast_term], fix=dict(enumerate(combo)))
        want = price(facts, res, N_DATA, shard_sums(facts, list(combo), 2), layout.grid, rows).breakdown.total_s
        got = scale.seconds(solver.objective_value) + mstep_s(facts)  # the constant is not in the program
        assert got <= want + 1e-15
        assert got == pytest.approx(want, rel=1e-6)


def test_ownership_is_infeasible_when_a_node_is_whole_on_a_shard_it_does_not_hold():
    model = small_nest()
    facts = model_facts(model)
    ut = build_units(facts, 64)
    res = uniform(2)
    layout = make_layout(res, 1, 2)
    scale = Scale.for_instance(1e-3, 1)
    inst = make_instance(ut, res, layout, [N_DATA], facts.block_rows, scale, 1e-3)
    for force_whole, feasible in ((0, False), (1, True)):
        cp = cp_model.CpModel()
        v = ShardVars(cp, ut, 2)
        C.assignment(cp, v, inst)
        C.ownership(cp, v, inst)
        mixture = ut.internal.index(facts.paths.index("0"))
        cp.add(v.own[mixture][force_whole] == 1)
        cp.add(v.x[0][1] == 1)  # a component of the mixture on shard 1
        got = cp_model.CpSolver().solve(cp)
        assert got == (cp_model.OPTIMAL if feasible else cp_model.INFEASIBLE)


@pytest.mark.parametrize("family", [C.first_fit_symmetry, C.identical_units])
def test_symmetry_families_forbid_the_non_canonical_labelling(family):
    from emgrid.models import Mixture

    from tests.planner.helpers import dg, probs

    model = Mixture([dg(4), dg(4), dg(4)], probs(3))  # three identical units
    facts = model_facts(model)
    ut = build_units(facts, 64)
    res = uniform(3)
    inst = make_instance(ut, res, make_layout(res, 1, 3), [N_DATA], facts.block_rows, Scale.for_instance(1e-3, 1),
                         1e-3)
    for first_shard, feasible in ((2, False), (0, True)):
        cp = cp_model.CpModel()
        v = ShardVars(cp, ut, 3)
        C.assignment(cp, v, inst)
        family(cp, v, inst)
        cp.add(v.x[0][first_shard] == 1)
        cp.add(v.x[2][0] == 1) if first_shard == 2 else None
        got = cp_model.CpSolver().solve(cp)
        assert got == (cp_model.OPTIMAL if feasible else cp_model.INFEASIBLE)
