"""Human-readable accounts of a plan: the one-line rationale and ``plan.explain()``.

Functions over a plan's own fields, with no other planner module imported at run time, so
``BalancePlan.explain`` can call :func:`explain` without an import cycle. Why the planner
chose a grid, or why nothing fits, is told by :mod:`planner.rationale`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .plan import BalancePlan, WorkerLoad


def fmt_s(x: float) -> str:
    if x == 0:
        return "0 s"
    if x < 1e-3:
        return f"{x * 1e6:.3g} us"
    if x < 1:
        return f"{x * 1e3:.3g} ms"
    return f"{x:.3g} s"


def fmt_bytes(b: float | None) -> str:
    if b is None:
        return "unknown"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= size:
            return f"{b / size:.3g} {unit}"
    return f"{int(b)} B"


def share(part: float, total: float) -> str:
    return f"{100.0 * part / total:.0f}%" if total > 0 else "0%"


def straggler(plan: BalancePlan) -> WorkerLoad:
    """The worker whose compute time sets the compute term."""
    return max(plan.per_worker, key=lambda w: (w.compute_s, w.flops))


def default_rationale(plan: BalancePlan) -> str:
    """A one-line account of a plan built from a given assignment."""
    b = plan.breakdown
    slow = straggler(plan)
    return (f"grid {plan.data_parallel}x{plan.model_parallel} on {plan.workers_used}/{plan.workers_total} workers; "
            f"straggler {slow.name} ({fmt_s(slow.compute_s)} of compute); coupling {share(b.coupling_s, b.total_s)} "
            f"and reduce+broadcast {share(b.reduce_s + b.broadcast_s, b.total_s)}, M-step {share(b.mstep_s, b.total_s)} "
            f"of {fmt_s(b.total_s)}")


def explain(plan: BalancePlan) -> str:
    """Why this grid, what it costs term by term, who the straggler is, and every shard."""
    b = plan.breakdown
    gap = (plan.objective_s - plan.lower_bound_s) / plan.objective_s if plan.objective_s > 0 else 0.0
    fit = {True: "fits", False: "DOES NOT FIT", None: "fit unknown (a worker's memory is unknown)"}[plan.fits]
    lines = [
        f"Plan: {plan.data_parallel} replica(s) x {plan.model_parallel} shard(s) on {plan.workers_used} of "
        f"{plan.workers_total} workers, {plan.n_data} rows; memory {fit}.",
        f"Status {plan.status}: predicted {fmt_s(plan.objective_s)} per iteration, lower bound "
        f"{fmt_s(plan.lower_bound_s)} (gap {100 * gap:.2g}%), planned in {fmt_s(plan.solve_time_s)}.",
        f"Terms: compute {fmt_s(b.compute_s)} ({share(b.compute_s, b.total_s)}), coupling {fmt_s(b.coupling_s)} "
        f"({share(b.coupling_s, b.total_s)}), reduce {fmt_s(b.reduce_s)} ({share(b.reduce_s, b.total_s)}), "
        f"broadcast {fmt_s(b.broadcast_s)} ({share(b.broadcast_s, b.total_s)}), M-step {fmt_s(b.mstep_s)} "
        f"({share(b.mstep_s, b.total_s)}).",
        f"Why: {plan.rationale}",
    ]
    slow = straggler(plan)
    lines.append(
        f"Straggler: {slow.name} (replica {slow.replica}, shard {slow.shard}) runs {slow.rows} rows, "
        f"{slow.flops:.3g} FLOPs = {fmt_s(slow.compute_s)}; memory {fmt_bytes(slow.memory_bytes)} of "
        f"{fmt_bytes(slow.memory_limit)}."
    )
    lines.append("Shards:")
    for cut in plan.model_cuts:
        leaves = ", ".join(cut.leaves[:6]) + (f", ... ({len(cut.leaves)} leaves)" if len(cut.leaves) > 6 else "")
        workers = ", ".join(cut.workers[:4]) + (", ..." if len(cut.workers) > 4 else "")
        lines.append(f"  shard {cut.shard}: {cut.flops_per_row:.4g} FLOPs/row, params {fmt_bytes(cut.param_bytes)}, "
                     f"leaves [{leaves or '<root>'}] on [{workers}]")
    return "\n".join(lines)
