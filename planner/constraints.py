"""The constraint families of one grid layout's program, one function each.

Every function adds its constraints to ``model`` and returns its share of the objective
(integer ticks, ``planner.scaling``), so the objective is the sum of the returned shares
and equals, up to rounding down, ``planner.costing``'s iteration time of the assignment.
Notation as in ``planner.variables``; ``e[v][s]`` is 1 when shard ``s`` evaluates ``v``
(``x[u][s]`` for a unit, ``own[i][s] + spanning[i]`` for an internal node); ``K(t)`` is
``t`` seconds in ticks, rounded down.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

from emgrid.models.cost import ceil_log2

from emgrid.models.units import NODE_CALL_S

from .costing import COUPLING_COPIES, WORKER_BASE_BYTES, compute_factor, fixed_bytes
from .scaling import Scale
from .units import UnitTree, unit_order, unit_signature
from .variables import ShardVars


@dataclass(frozen=True, eq=False)
class Instance:
    """The data of one program: a unit tree on one ``d x m`` layout with fixed rows."""

    ut: UnitTree
    d: int
    m: int
    rows: np.ndarray  # per replica
    #: per column: ``(rows_r / speed(r, s), blocks_r)`` of every replica whose
    #: compute time may be the column's largest (no other has both at least as large)
    compute_pairs: tuple[tuple[tuple[float, float], ...], ...]
    mem_rows: tuple[tuple[tuple[int, int], ...], ...]  # per column: binding (rows_r, memory limit) pairs
    classes: tuple[tuple[int, ...], ...]  # groups of interchangeable columns
    latency_s: float
    bytes_per_s: float
    block_rows: int
    scale: Scale
    time_cap: int
    #: the replicas whose memory model applies (``costing.fixed_bytes``): ``d``, or the
    #: grid's when the program is a one-replica relaxation of it (``Search.relax``)
    memory_d: int = 0

    @property
    def replicas_for_memory(self) -> int:
        return self.memory_d or self.d

    @property
    def rows_max(self) -> int:
        return int(self.rows.max())

    def couple_coef(self) -> np.ndarray:
        """Coupling bytes per row as ``sum_i coef_i spanning[i]`` (the root's ``spanning`` is the
        constant 1 when ``M > 1``)."""
        ut = self.ut
        coef = np.zeros(ut.n_internal)
        for i in range(ut.n_internal):
            below = sum(ut.unit_couple[u] for u in ut.child_units[i]) + sum(
                ut.internal_couple[c] for c in ut.child_internal[i])
            coef[i] = below - (ut.internal_couple[i] if i > 0 else 0.0)
        return coef


def assignment(model: cp_model.CpModel, v: ShardVars, inst: Instance) -> int:
    """``sum_s x[u][s] = 1`` for every unit; ``sum_u x[u][s] >= 1`` for every shard (a
    shard without a unit would be a wasted worker)."""
    for row in v.x:
        model.add_exactly_one(row)
    for s in range(inst.m):
        model.add_bool_or([row[s] for row in v.x])
    return 0


def ownership(model: cp_model.CpModel, v: ShardVars, inst: Instance) -> int:
    """``own[i][s] = AND_{c child of i} e_c[s]`` (units ``x``, internal nodes ``own``) and
    ``spanning[i] = 1 - sum_s own[i][s]``: a node is whole on a shard exactly when all of its
    children are, and spanning when it is whole on none."""
    ut = inst.ut
    for i in range(ut.n_internal):
        if i == 0 and inst.m > 1:
            continue
        for s in range(inst.m):
            kids = [v.x[u][s] for u in ut.child_units[i]] + [v.own[c][s] for c in ut.child_internal[i]]
            model.add_bool_and(kids).only_enforce_if(v.own[i][s])
            model.add_bool_or([v.own[i][s]] + [k.negated() for k in kids])
        model.add(v.spanning[i] + sum(v.own[i]) == 1)
    return 0


def first_fit_symmetry(model: cp_model.CpModel, v: ShardVars, inst: Instance) -> int:
    """Interchangeable columns ``s_0 < s_1 < ...`` (same speed and memory in every
    replica; column 0 is never interchangeable when it holds the coordinator's bytes,
    ``program.make_instance``) are used in first-fit order: with units in :func:`unit_order`,
    ``x[u_k][s_j] <= OR_{k' < k} x[u_k'][s_{j-1}]``. Every assignment has a relabelling
    of equal cost that satisfies this."""
    order = unit_order(inst.ut)
    for cls in inst.classes:
        if len(cls) < 2:
            continue
        prefix = [[None] * len(cls) for _ in order]
        for k, u in enumerate(order):
            for j, s in enumerate(cls):
                if k == 0:
                    prefix[k][j] = v.x[u][s]
                    continue
                p = model.new_bool_var(f"ff[{k},{s}]")
                prev = prefix[k - 1][j]
                model.add_implication(prev, p)
                model.add_implication(v.x[u][s], p)
                model.add_bool_or([prev, v.x[u][s], p.negated()])
                prefix[k][j] = p
        for k, u in enumerate(order):
            for j in range(1, len(cls)):
                if k == 0:
                    model.add(v.x[u][cls[j]] == 0)
                else:
                    model.add_implication(v.x[u][cls[j]], prefix[k - 1][j - 1])
    return 0


def identical_units(model: cp_model.CpModel, v: ShardVars, inst: Instance) -> int:
    """Identical units ``u < u'`` (same parent, costs and data columns), adjacent in
    :func:`unit_order`, take non-decreasing shard indices:
    ``sum_s s x[u][s] <= sum_s s x[u'][s]``. Exchanging two identical units changes no
    cost, and sorting the shards of a run of them keeps the first-fit order above, so
    every assignment has an equal-cost one that satisfies both."""
    order = unit_order(inst.ut)
    idx = list(range(inst.m))
    for a, b in zip(order, order[1:]):
        if unit_signature(inst.ut, a) == unit_signature(inst.ut, b):
            model.add(cp_model.LinearExpr.weighted_sum(v.x[a], idx) <= cp_model.LinearExpr.weighted_sum(v.x[b], idx))
    return 0


def compute_term(model: cp_model.CpModel, v: ShardVars, inst: Instance):
    """``T_c >= K(w (rows_r F_v / speed(r, s) + blocks_r K_v c)) e[v][s]`` summed over nodes,
    for every column ``s`` and every replica ``r`` of its ``compute_pairs``: the busiest
    worker (``K_v`` the node's visits per block, ``c = NODE_CALL_S``). With ``M > 1``,
    ``w = compute_factor(M)`` carries the coupling term's wait, a share of the compute."""
    ut, sc = inst.ut, inst.scale
    t = model.new_int_var(0, inst.time_cap, "T_compute")
    top = inst.time_cap + 1  # a larger coefficient forbids its variable just the same
    w = compute_factor(inst.m)

    def coef(cost, x, y):
        return np.array([min(top, sc.time_down(w * (x * f + y * NODE_CALL_S * k)))
                         for f, k in zip(cost["flops"], cost["calls"])])

    for s in range(inst.m):
        for x, y in inst.compute_pairs[s]:
            model.add(t >= v.evaluated_sum(coef(ut.unit_cost, x, y), coef(ut.internal_cost, x, y), s))
    return t


def coupling_term(model: cp_model.CpModel, v: ShardVars, inst: Instance):
    """``ceil(rows_max / B) L(M) lat + rows_max (M-1)/M C / bw`` with
    ``C = sum_{w != root} couple_w (spanning[parent(w)] - spanning[w])``: the owned roots are
    exactly the non-spanning children of spanning nodes. (The wait for each block's slowest shard,
    a share of the compute, is in :func:`compute_term`.)"""
    if inst.m == 1:
        return 0
    sc, n = inst.scale, inst.rows_max
    const = -(-n // inst.block_rows) * ceil_log2(inst.m) * inst.latency_s
    k = n * (inst.m - 1) / inst.m / inst.bytes_per_s
    coef = inst.couple_coef()
    ticks = np.array([sc.time_down(k * c) for c in coef])
    return v.spanning_sum(ticks) + sc.time_down(const)


def reduce_term(model: cp_model.CpModel, v: ShardVars, inst: Instance):
    """``L(D) lat + T_r`` with ``T_r >= K(L(D) S_v / bw) e[v][s]`` for every column: the
    tree reduce of each shard's statistics over the replicas."""
    ld = ceil_log2(inst.d)
    if not ld:
        return 0
    return _per_shard_max(model, v, inst, "stat", ld / inst.bytes_per_s, "T_reduce") + inst.scale.time_down(
        ld * inst.latency_s)


def broadcast_term(model: cp_model.CpModel, v: ShardVars, inst: Instance):
    """``L(D) lat + T_b`` with ``T_b >= K(L(D) P_v / bw) e[v][s]``, plus with ``M > 1``
    ``L(M) (lat + sum_i P_i spanning[i] / bw)``: new parameters to every replica, and the
    spanning nodes' parameters to every shard."""
    sc = inst.scale
    out = 0
    ld = ceil_log2(inst.d)
    if ld:
        out = _per_shard_max(model, v, inst, "param", ld / inst.bytes_per_s, "T_broadcast") + sc.time_down(
            ld * inst.latency_s)
    if inst.m > 1:
        lm = ceil_log2(inst.m)
        ticks = np.array([sc.time_down(lm * p / inst.bytes_per_s) for p in inst.ut.internal_cost["param"]])
        out = out + v.spanning_sum(ticks) + sc.time_down(lm * inst.latency_s)
    return out


def _per_shard_max(model, v: ShardVars, inst: Instance, field: str, k: float, name: str):
    ut, sc = inst.ut, inst.scale
    top = inst.time_cap + 1
    uc = np.array([min(top, sc.time_down(k * x)) for x in ut.unit_cost[field]])
    ic = np.array([min(top, sc.time_down(k * x)) for x in ut.internal_cost[field]])
    t = model.new_int_var(0, inst.time_cap, name)
    for s in range(inst.m):
        model.add(t >= v.evaluated_sum(uc, ic, s))
    return t


def memory(model: cp_model.CpModel, v: ShardVars, inst: Instance) -> int:
    """For every column ``s`` and binding replica ``r`` (rows ``n``, block ``b = min(n, B)``):
    ``sum_g data_g n z[g][s] + sum_v (work_v b + H_v(D)) e[v][s] + b X + [M > 1] 2 b C
    <= limit - A(D)`` (``H`` and ``A``: ``costing.fixed_bytes`` and ``costing.base_bytes``), coefficients rounded up, where ``z[g][s] >= e[v][s]`` for every node ``v``
    reading data column ``g`` (one copy of a column per shard) and ``X >= scratch_v e[v][s]``
    (the shard's largest scratch)."""
    ut, sc = inst.ut, inst.scale
    # costing.base_bytes, from the unit tree's copy of the model's largest M-step
    one = inst.replicas_for_memory
    base = WORKER_BASE_BYTES + (ut.mstep_peak if one == 1 else 0.0)
    coef = inst.couple_coef()
    members: dict[int, list[tuple[str, int]]] = {}
    for u, groups in enumerate(ut.unit_groups):
        for g in groups:
            members.setdefault(g, []).append(("u", u))
    for i, g in enumerate(ut.internal_group):
        if g >= 0:
            members.setdefault(int(g), []).append(("i", i))
    for s, pairs in enumerate(inst.mem_rows):
        if not pairs:
            continue
        column_terms = []  # (group bytes per row, [(var, coefficient sign)...] or a z variable)
        for g, items in members.items():
            if len(items) == 1:
                kind, k = items[0]
                lits = [v.x[k][s]] if kind == "u" else [v.own[k][s], v.spanning[k]]
            else:
                z = model.new_bool_var(f"z[{g},{s}]")
                for kind, k in items:
                    if kind == "u":
                        model.add_implication(v.x[k][s], z)
                    else:
                        for lit in (v.own[k][s], v.spanning[k]):
                            if isinstance(lit, int):
                                if lit:
                                    model.add(z == 1)
                            else:
                                model.add_implication(lit, z)
                lits = [z]
            column_terms.append((float(ut.group_data[g]), lits))
        for n, limit in pairs:
            b = min(n, inst.block_rows)
            cap = max(-1, sc.bytes_limit(limit - base))  # -1: nothing fits
            couple = (np.array([sc.bytes_up(COUPLING_COPIES * b * c) for c in coef]) if inst.m > 1
                      else np.zeros(0, dtype=np.int64))
            top = cap + 1 - int(couple[couple < 0].sum())  # a larger coefficient forbids its variable just the same

            def need(cost):
                return cost["work"] * b + fixed_bytes(cost["param"], cost["stat"], cost["cache"], one)

            def coefs(values):
                return np.array([min(top, sc.bytes_up(x)) for x in values])

            ic = ut.internal_cost
            spanning_need = ic["work_spanning"] * b + fixed_bytes(ic["param"], ic["stat"], ic["cache"], one)
            expr = v.evaluated_sum(coefs(need(ut.unit_cost)), coefs(need(ic)), s, coefs(spanning_need)) + v.evaluated_max(
                model, coefs(ut.unit_cost["scratch"] * b), coefs(ic["scratch"] * b), s, f"scratch[{s},{n}]",
                coefs(ic["scratch_spanning"] * b))
            for per_row, lits in column_terms:
                c = min(top, sc.bytes_up(per_row * n))
                expr = expr + sum(c * lit for lit in lits)
            if inst.m > 1:
                expr = expr + v.spanning_sum(np.minimum(couple, top))
            model.add(expr <= cap)
    return 0


#: The families in the order the program is built.
FAMILIES = (assignment, ownership, first_fit_symmetry, identical_units, compute_term, coupling_term, reduce_term, broadcast_term,
            memory)
