"""Human-readable plan tables and the fitted-versus-truth comparison."""

from __future__ import annotations

import numpy as np


def human_bytes(n: float | None) -> str:
    if n is None:
        return "unknown"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def bar(value: float, limit: float, width: int = 20) -> str:
    if not limit or limit <= 0:
        return " " * width
    filled = int(round(width * min(value / limit, 1.0)))
    return "#" * filled + "." * (width - filled) + ("!" if value > limit else " ")


def plan_table(plan) -> str:
    b = plan.breakdown
    lines = [
        f"grid      {plan.data_parallel} data replicas x {plan.model_parallel} model shards "
        f"= {plan.workers_used}/{plan.workers_total} workers ({plan.workers_idle} idle)",
        f"status    {plan.status}   predicted {plan.predicted_iteration_s * 1e3:.3f} ms/iter   "
        f"lower bound {plan.lower_bound_s * 1e3:.3f} ms   solved in {plan.solve_time_s:.2f} s",
        f"terms     compute {b.compute_s * 1e3:.3f} ms   coupling {b.coupling_s * 1e3:.3f} ms   "
        f"reduce {b.reduce_s * 1e3:.3f} ms   broadcast {b.broadcast_s * 1e3:.3f} ms   M-step {b.mstep_s * 1e3:.3f} ms"
        + (f"   (coupling {100 * b.coupling_s / b.total_s:.0f}%)" if b.total_s > 0 else ""),
        f"fits      {'yes' if plan.fits else ('unknown (some worker memory not given)' if plan.fits is None else 'NO')}",
        "",
        f"{'worker':<10} {'rep':>3} {'shard':>5} {'rows':>9}  {'compute (vs busiest)':<22} {'memory (vs limit)':<22} mem",
    ]
    busiest = max((w.compute_s for w in plan.per_worker), default=0.0)
    for w in plan.per_worker:
        lim = w.memory_limit
        lines.append(
            f"{w.name:<10} {w.replica:>3} {w.shard:>5} {w.rows:>9}  {bar(w.compute_s, busiest):<22} "
            f"{bar(w.memory_bytes, lim) if lim else '(no limit)':<22} {human_bytes(w.memory_bytes)}"
            + (f" / {human_bytes(lim)}" if lim else "")
        )
    lines.append("")
    for cut in plan.model_cuts:
        leaves = ", ".join(cut.leaves[:8]) + (f", ... ({len(cut.leaves)} leaves)" if len(cut.leaves) > 8 else "")
        lines.append(f"shard {cut.shard}: {cut.flops_per_row:.4g} FLOP/row, params {human_bytes(cut.param_bytes)}; leaves {leaves or '<root>'}")
    lines.append("")
    lines.append("why: " + plan.explain())
    return "\n".join(lines)


def compare_models(fitted, truth) -> str:
    """Leaf by leaf: the fitted parameters next to the true ones (components matched greedily)."""
    lines = [f"{'leaf':<12} {'family':<14} {'fitted':<38} truth"]
    for (path, f), (_, t) in zip(fitted.leaves(), truth.leaves()):
        for name, value in f.params().items():
            tv = t.params()[name]
            lines.append(f"{path:<12} {f.family:<14} {name + ' ' + _fmt(value):<38} {_fmt(tv)}")
    for (path, node), (_, t) in zip(fitted.nodes(), truth.nodes()):
        if not node.is_leaf:
            for name, value in node.params().items():
                lines.append(f"{path or '<root>':<12} {node.family:<14} {name + ' ' + _fmt(value):<38} {_fmt(t.params()[name])}")
    return "\n".join(lines)


def _fmt(v) -> str:
    return np.array2string(np.asarray(v), precision=2, threshold=4, edgeitems=2, suppress_small=True).replace("\n", "")
