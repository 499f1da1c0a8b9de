"""Why the planner chose a grid (:func:`grid_rationale`) and why no plan fits
(:func:`infeasible_message`): the accounts that need the cost model beside the plan."""

from __future__ import annotations

from .bounds import Bounds
from .costing import fixed_bytes, leaf_bytes, least_fixed_bytes
from .explain import fmt_bytes, fmt_s, share, straggler
from .facts import ModelFacts
from .plan import BalancePlan
from .resources import Resources


def grid_rationale(plan: BalancePlan, facts: ModelFacts, resources: Resources, best_by_m: dict[int, float],
                   bound_by_m: dict[int, float], unfit_m: set[int], *, pinned: bool) -> str:
    """Why this grid: what set M, what limited D, the straggler and the coupling share.

    ``best_by_m`` holds the best fitting plan found for each shard count, ``bound_by_m``
    the least lower bound of the grids pruned without a fitting plan, ``unfit_m`` the
    shard counts whose replicas cannot fit any grid's workers."""
    d, m, p, n = plan.data_parallel, plan.model_parallel, plan.workers_total, plan.n_data
    b = plan.breakdown
    parts = []

    def best_other(keep):
        found = {k: v for k, v in best_by_m.items() if keep(k)}
        if found:
            k, v = min(found.items(), key=lambda kv: kv[1])
            return f"the best plan with M={k} predicts {fmt_s(v)}"
        pruned = {k: v for k, v in bound_by_m.items() if keep(k) and k not in best_by_m}
        if pruned:
            k, v = min(pruned.items(), key=lambda kv: kv[1])
            return f"M={k} cannot beat it (its lower bound is {fmt_s(v)})"
        return None

    if pinned:
        parts.append(f"grid {d}x{m} pinned by the caller")
    elif m == 1:
        other = best_other(lambda k: k > 1)
        if facts.n_leaves == 1:
            parts.append("M=1: the model is a single leaf and cannot be split")
        elif other:
            parts.append(f"M=1: the model fits one worker and splitting it does not pay ({other}, "
                         f"against {fmt_s(plan.objective_s)} whole)")
        else:
            parts.append("M=1: the model fits one worker and data parallelism needs no coupling")
    else:
        other = best_other(lambda k: k < m)
        too_few = sorted(k for k in unfit_m if k < m)
        if too_few and other is not None:
            contiguous = too_few == list(range(too_few[0], too_few[-1] + 1))
            span = (f"M={too_few[0]}..{too_few[-1]}" if contiguous and len(too_few) > 2
                    else "M=" + ", ".join(map(str, too_few)))
            other = f"{span} cannot hold a replica in memory; {other}"
        if other is None:
            largest = max((w.memory_bytes for w in resources.workers if w.memory_bytes is not None), default=None)
            need = float(least_fixed_bytes(facts.param.sum(), facts.stat.sum(), facts.cache.sum()))
            parts.append(f"M={m} forced by memory: no plan with fewer shards fits (parameters and statistics "
                         f"alone need {fmt_bytes(need)} per replica; the largest worker has {fmt_bytes(largest)})")
        elif d == n and n * m < p:
            parts.append(f"M={m}: n_data={n} allows at most {n} replica(s), so the other workers split the "
                         f"model ({other}, against {fmt_s(plan.objective_s)})")
        else:
            parts.append(f"M={m} is faster than fewer shards ({other}, against {fmt_s(plan.objective_s)})")
    if d == n and d * m < p:
        parts.append(f"D={d} limited by n_data={n}")
    elif d * m == p:
        parts.append(f"D={d} fills the {p} workers")
    elif d * m > p - m:
        parts.append(f"D={d}: another replica of {m} shards needs more than the {p - d * m} idle worker(s)")
    else:
        used = {w.name for w in plan.per_worker}
        idle_fast = max((w.flops_per_s for w in resources.workers if w.name not in used), default=0.0)
        slow_used = min(w.flops_per_s for w in resources.workers if w.name in used)
        why = "they are slower than the workers used" if idle_fast < slow_used else \
            "more replicas cost more in reduce and broadcast (or rows) than they save"
        parts.append(f"D={d}: {p - d * m} worker(s) left idle because {why}")
    slow = straggler(plan)
    parts.append(f"straggler {slow.name} (replica {slow.replica}, shard {slow.shard}, {fmt_s(slow.compute_s)})")
    parts.append(f"coupling {share(b.coupling_s, b.total_s)}, reduce+broadcast "
                 f"{share(b.reduce_s + b.broadcast_s, b.total_s)}, M-step {share(b.mstep_s, b.total_s)} of "
                 f"{fmt_s(b.total_s)}")
    return "; ".join(parts)


def infeasible_message(facts: ModelFacts, resources: Resources, n_data: int, grid: tuple[int, int] | None,
                       bounds: Bounds) -> str:
    """Names the binding memory constraint when no plan fits (``grid``: the pinned grid, if any)."""
    p = resources.n_workers
    largest = bounds.mem_max
    grids = [tuple(grid)] if grid is not None else [
        (d, m) for m in range(1, min(p, facts.n_leaves) + 1) for d in range(1, min(n_data, p // m) + 1)]
    where = f" on grid {grid[0]}x{grid[1]}" if grid is not None else ""
    d_best = max(d for d, _ in grids)
    rows = -(-n_data // d_best)
    block = min(rows, facts.block_rows)
    lv = facts.leaf_nodes
    need = leaf_bytes(facts, rows, block, d_best)
    k = int(need.argmax())
    v = int(lv[k])
    if need[k] > largest:
        return (f"leaf {facts.paths[v] or '<root>'} ({facts.descriptions[v]}) needs {fmt_bytes(need[k])}{where} (parameters and "
                f"statistics {fmt_bytes(fixed_bytes(facts.param[v], facts.stat[v], facts.cache[v], d_best))}, {rows} row(s) of data "
                f"{fmt_bytes(facts.data[v] * rows)}, working arrays {fmt_bytes((facts.work[v] + facts.scratch[v]) * block)}); the largest "
                f"worker has {fmt_bytes(largest)}: add memory, or more workers to spread the rows")

    def ratio(g):
        d, m = g
        cap = bounds.mem_prefix[min(m, len(bounds.mem_prefix) - 1)]
        return bounds.replica_need(-(-n_data // d), m, d) / cap

    d, m = min(grids, key=ratio)
    r = -(-n_data // d)
    cap = bounds.mem_prefix[min(m, len(bounds.mem_prefix) - 1)]
    b = min(r, facts.block_rows)
    head = (f"one replica of {r} row(s) needs at least {fmt_bytes(bounds.replica_need(r, m, d))} (parameters and statistics "
            f"{fmt_bytes(bounds.fixed[d == 1])}, data {fmt_bytes(bounds.data_row * r)}, working arrays "
            f"{fmt_bytes(bounds.work_row * b)})")
    if ratio((d, m)) > 1:
        return (f"no grid{where} fits: even on the most favourable, {d}x{m}, {head}, but the {m} largest worker(s) "
                f"hold {fmt_bytes(cap)} (largest {fmt_bytes(largest)}): add workers or memory")
    return (f"no grid{where} fits: on {d}x{m} {head} and the {m} largest worker(s) hold {fmt_bytes(cap)}, but no "
            f"split of the leaves over the workers of a replica fits each worker, with rows following worker speed "
            f"(largest {fmt_bytes(largest)}): add memory")
