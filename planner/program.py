"""One grid layout's CP-SAT program: build it from the constraint families and solve it."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

from . import constraints
from .config import SolverConfig
from .constraints import Instance
from emgrid.models.cost import ceil_log2
from emgrid.models.units import NODE_CALL_S

from .costing import block_counts, compute_factor
from .placement import Layout
from .resources import Resources
from .scaling import Scale
from .units import UnitTree
from .variables import ShardVars


def make_instance(ut: UnitTree, resources: Resources, layout: Layout, rows, block_rows: int, scale: Scale,
                  reference_s: float, coordinator_bytes: float = 0.0, memory_d: int = 0) -> Instance:
    """The program data of ``layout`` with ``rows`` per replica; ``memory_d``: the replicas
    whose memory model applies (0: the layout's own, see ``Instance.memory_d``); ``coordinator_bytes`` come
    off the memory of cell ``(0, 0)`` (``Resources.coordinator_in_grid``), which makes
    column 0 a symmetry class of its own. ``scale`` is coarsened when the upper bound of the
    time variables (:func:`time_upper_s`) would not fit it; ``inst.scale`` is the one used."""
    g = np.asarray(layout.grid, dtype=np.int64)
    ws = resources.workers
    speed = np.array([w.flops_per_s for w in ws])[g]
    rows = np.asarray(rows, dtype=np.int64)
    blocks = block_counts(rows, block_rows)
    compute_pairs = []
    for s in range(g.shape[1]):
        pairs = sorted({(float(rows[r] / speed[r, s]), float(blocks[r])) for r in range(g.shape[0])},
                       reverse=True)
        keep: list[tuple[float, float]] = []  # by decreasing x: keep each whose y beats every kept one
        for x, y in pairs:
            if not keep or y > max(k[1] for k in keep):
                keep.append((x, y))
        compute_pairs.append(tuple(keep))
    mem_rows = []
    for s in range(g.shape[1]):
        pairs = sorted({(int(rows[r]), ws[g[r, s]].memory_bytes - (math.ceil(coordinator_bytes) if r == s == 0 else 0))
                        for r in range(g.shape[0]) if ws[g[r, s]].memory_bytes is not None},
                       key=lambda p: (p[1], -p[0]))
        keep = []  # drop pairs with no more rows and no less memory than a kept one
        for n, lim in pairs:
            if not any(n2 >= n and lim2 <= lim for n2, lim2 in keep):
                keep.append((n, lim))
        mem_rows.append(tuple(keep))
    profiles: dict[tuple, list[int]] = {}
    coordinated = coordinator_bytes > 0 and ws[g[0, 0]].memory_bytes is not None
    for s in range(g.shape[1]):
        # the coordinator's bytes make column 0 a column of its own (its cell (0, 0) has less room)
        key = tuple((ws[w].flops_per_s, ws[w].memory_bytes) for w in g[:, s]) + ((s == 0 and coordinated),)
        profiles.setdefault(key, []).append(s)
    net = resources.network
    upper = time_upper_s(ut, g.shape[0], g.shape[1], compute_pairs, net.bytes_per_s)
    scale = scale.fitting(upper)
    return Instance(ut=ut, d=g.shape[0], m=g.shape[1], rows=rows, compute_pairs=tuple(compute_pairs),
                    mem_rows=tuple(mem_rows),
                    classes=tuple(tuple(c) for c in profiles.values()), latency_s=net.latency_s,
                    bytes_per_s=net.bytes_per_s, block_rows=block_rows, scale=scale,
                    time_cap=scale.time_cap(upper), memory_d=memory_d)


def time_upper_s(ut: UnitTree, d: int, m: int, compute_pairs, bytes_per_s: float) -> float:
    """An upper bound of every time variable of the program under any assignment: every
    unit and node counted at once (the whole model on one worker of the slowest pair), and
    the whole model's statistics or parameters in one reduce or broadcast."""
    flops = float(ut.unit_cost["flops"].sum() + ut.internal_cost["flops"].sum())
    calls = float(ut.unit_cost["calls"].sum() + ut.internal_cost["calls"].sum())
    compute = max((x * flops + y * NODE_CALL_S * calls for pairs in compute_pairs for x, y in pairs), default=0.0)
    ld = ceil_log2(d)
    comm = max(float(ut.unit_cost[f].sum() + ut.internal_cost[f].sum()) for f in ("stat", "param")) * ld / bytes_per_s
    return 1.01 * max(compute * compute_factor(m), comm) + 1e-12


@dataclass(frozen=True)
class ProgramResult:
    status: str  # "optimal" | "feasible" | "infeasible" | "cutoff" | "unknown" | "model_invalid"
    unit_shard: np.ndarray | None
    objective_ticks: float | None
    bound_ticks: float | None
    wall_s: float
    deterministic_s: float


def build(inst: Instance, cutoff_ticks: int | None = None) -> tuple[cp_model.CpModel, ShardVars]:
    """The program: every constraint family, the objective the sum of their shares; with
    ``cutoff_ticks``, only assignments whose objective is at most that many ticks."""
    model = cp_model.CpModel()
    v = ShardVars(model, inst.ut, inst.m)
    objective = sum(family(model, v, inst) for family in constraints.FAMILIES)
    if cutoff_ticks is not None:
        model.add(objective <= cutoff_ticks)
    model.minimize(objective)
    return model, v


def solve_program(inst: Instance, hint: np.ndarray | None, cfg: SolverConfig, time_limit_s: float,
                  cutoff_ticks: int | None = None) -> ProgramResult:
    """Solves ``inst``. With ``cutoff_ticks`` (an incumbent's time, less the relative gap, in
    ticks) the solver searches only below it, and its proof that nothing is there ends the
    solve early: status ``"cutoff"``, bound ``cutoff_ticks + 1`` (the objective is an
    integer, so every assignment has at least that many ticks)."""
    t0 = time.perf_counter()
    model, v = build(inst, cutoff_ticks)
    if hint is not None:
        v.hint(model, hint)
    solver = cp_model.CpSolver()
    p = solver.parameters
    p.max_time_in_seconds = max(0.01, time_limit_s - (time.perf_counter() - t0))
    p.max_deterministic_time = cfg.grid_deterministic_limit
    p.num_workers = cfg.num_workers
    p.random_seed = cfg.seed
    p.relative_gap_limit = cfg.relative_gap
    if cfg.deterministic and cfg.num_workers > 1:
        # one subsolver task at a time, in a fixed order: reproducible for a fixed seed
        # (larger interleaved batches stall the core-based bound search on these programs)
        p.interleave_search = True
        p.interleave_batch_size = 1
    p.log_search_progress = cfg.log_search
    code = solver.solve(model)
    name = {cp_model.OPTIMAL: "optimal", cp_model.FEASIBLE: "feasible", cp_model.INFEASIBLE: "infeasible",
            cp_model.MODEL_INVALID: "model_invalid"}.get(code, "unknown")
    has = code in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    bound = solver.best_objective_bound if code in (cp_model.OPTIMAL, cp_model.FEASIBLE, cp_model.UNKNOWN) else None
    if code == cp_model.INFEASIBLE and cutoff_ticks is not None:
        name, bound = "cutoff", float(cutoff_ticks + 1)
    return ProgramResult(status=name, unit_shard=v.extract(solver) if has else None,
                         objective_ticks=solver.objective_value if has else None, bound_ticks=bound,
                         wall_s=time.perf_counter() - t0, deterministic_s=solver.deterministic_time)
