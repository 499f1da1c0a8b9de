"""``emgrid plan --picture``: per-worker compute and memory against their limits (matplotlib)."""

from __future__ import annotations

from pathlib import Path

from emgrid.models.errors import ConfigError


def draw_plan(plan, path: str) -> Path:
    """Draws ``plan`` to the PNG ``path``; returns the file written (absolute)."""
    target = Path(path).resolve()
    if not target.parent.is_dir():
        raise ConfigError(f"--picture {path!r}: the folder {str(target.parent)!r} does not exist")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--picture needs matplotlib: pip install 'emgrid[picture]'") from None
    names = [w.name for w in plan.per_worker]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 0.35 * len(names) + 1.5), sharey=True)
    ax1.barh(names, [w.compute_s * 1e3 for w in plan.per_worker], color="tab:blue")
    ax1.axvline(plan.breakdown.compute_s * 1e3, color="k", ls="--", lw=1)
    ax1.set_xlabel("compute per iteration (ms)")
    ax2.barh(names, [w.memory_bytes / 2**20 for w in plan.per_worker], color="tab:orange")
    for i, w in enumerate(plan.per_worker):
        if w.memory_limit:
            ax2.plot([w.memory_limit / 2**20] * 2, [i - 0.4, i + 0.4], color="r")
    ax2.set_xlabel("memory (MiB); red: limit")
    fig.suptitle(f"{plan.data_parallel} x {plan.model_parallel} grid, {plan.status}, "
                 f"{plan.predicted_iteration_s * 1e3:.3g} ms/iter")
    fig.tight_layout()
    try:
        fig.savefig(target, dpi=100, format="png")
    except OSError as e:
        raise ConfigError(f"--picture {path!r}: cannot write it: {e.strerror or e}") from None
    finally:
        plt.close(fig)
    return target
