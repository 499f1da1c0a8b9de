"""emgrid's exact planner side by side with the mixle planner, LPT, a contiguous split and
Megatron's rule, on heterogeneous nests (``bench/planner_cases.py``).

Every plan is priced with emgrid's cost model (``planner.costing``): predicted iteration
time, busiest worker's compute time and FLOPs. Writes ``bench/results/planner.json`` and
``bench/results/planner.md``.

    python bench/planner.py            # every case, default SolverConfig
    python bench/planner.py big_tree   # the cases whose name holds "big_tree"
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# this file is named like the package it measures: import the package, not itself
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(HERE.parent))

from emgrid.planner import InfeasiblePlanError, SolverConfig, balance_plan, validate_plan  # noqa: E402
from emgrid.planner.costing import model_facts  # noqa: E402
from bench.planner_baselines import heuristic_plan, megatron_plan, mixle_plan  # noqa: E402
from bench.planner_cases import MODELS, cases  # noqa: E402

BASELINES = ("mixle", "lpt", "contiguous", "megatron")


def summary_of(plan) -> dict | None:
    if plan is None:
        return None
    return {"time_s": plan.objective_s, "compute_s": plan.breakdown.compute_s, "busiest_flops": plan.per_worker_flops,
            "grid": f"{plan.data_parallel}x{plan.model_parallel}", "fits": plan.fits,
            "coupling_s": plan.breakdown.coupling_s}


def run_case(case, model) -> dict:
    res = case.build(model)
    facts = model_facts(model)
    row = {"case": case.name, "leaves": facts.n_leaves, "workers": case.workers, "n_data": case.n_data}
    t = time.perf_counter()
    try:
        plan = balance_plan(model, res, n_data=case.n_data, solver=SolverConfig())
        validate_plan(plan, model, res, case.n_data)
        row["emgrid"] = summary_of(plan) | {"status": plan.status, "solve_s": plan.solve_time_s,
                                            "lower_bound_s": plan.lower_bound_s, "source": plan.extra["source"],
                                            "faults": plan.extra["solver_faults"]}
    except InfeasiblePlanError as e:
        row["emgrid"] = {"infeasible": str(e), "solve_s": time.perf_counter() - t,
                         "proven": "infeasibility is not proven" not in str(e)}
    mp, claims = mixle_plan(model, res, case.n_data)
    row["mixle"] = summary_of(mp) | claims
    row["lpt"] = summary_of(heuristic_plan(model, res, case.n_data, "lpt"))
    row["contiguous"] = summary_of(heuristic_plan(model, res, case.n_data, "contiguous"))
    row["megatron"] = summary_of(megatron_plan(model, res, case.n_data))
    return row


def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


def gap_of(e: dict) -> float:
    """The relative gap of an emgrid result: ``(time - lower bound) / time``."""
    return (e["time_s"] - e["lower_bound_s"]) / e["time_s"] if e["time_s"] > 0 else 0.0


def table(rows: list[dict]) -> str:
    head = ("| case | leaves | emgrid time (s) | emgrid busiest FLOPs | grid | status | gap | solve (s) | "
            "mixle time | mixle FLOPs | mixle grid | mixle fits (claimed/true) | mixle order | LPT time | LPT FLOPs | "
            "contiguous time | contiguous FLOPs | Megatron time | Megatron FLOPs |")
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        e = r["emgrid"]
        cells = [r["case"], str(r["leaves"])]
        if "infeasible" in e:
            cells += ["infeasible" + (" (proven)" if e.get("proven") else " (not proven)"), "-", "-", "-", "-",
                      f"{e['solve_s']:.2f}"]
        else:
            cells += [fmt(e["time_s"]), fmt(e["busiest_flops"]), e["grid"], e["status"], f"{gap_of(e):.2%}",
                      f"{e['solve_s']:.2f}"]
        mx = r["mixle"]
        cells += [fmt(mx["time_s"]) + ("" if mx["fits"] is not False else " (no fit)"), fmt(mx["busiest_flops"]),
                  mx["grid"], f"{mx['mixle_fits']}/{mx['fits']}", str(mx.get("mixle_order"))]
        for name in ("lpt", "contiguous", "megatron"):
            b = r[name]
            cells += ["no fit", "-"] if b is None else [fmt(b["time_s"]), fmt(b["busiest_flops"])]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def summarize(rows: list[dict]) -> dict:
    worse = []
    ratios, compute_ratios = [], []
    mixle_unfit_solved, mixle_unfit = 0, 0
    mixle_claims_unfit, mixle_claims_unfit_solved = 0, 0
    small, small_optimal, small_infeasible = 0, 0, 0
    solves = []
    gaps_small, gaps_all = [], []
    for r in rows:
        e = r["emgrid"]
        solves.append(e["solve_s"])
        feasible = "infeasible" not in e
        for name in BASELINES:
            b = r[name]
            if b is not None and b["fits"] is not False and (not feasible or e["time_s"] > b["time_s"] * (1 + 1e-9)):
                worse.append(f"{r['case']} vs {name}")
        mx = r["mixle"]
        split = feasible and (e["grid"].split("x")[1] != "1" or mx["grid"].split("x")[1] != "1")
        if split and mx["fits"] is not False:
            ratios.append(e["time_s"] / mx["time_s"])
            compute_ratios.append(e["compute_s"] / mx["compute_s"])
        if mx["mixle_fits"] is False:
            mixle_claims_unfit += 1
            mixle_claims_unfit_solved += int(feasible and e["fits"] is not False)
        if mx["mixle_fits"] is False or mx["fits"] is False:
            mixle_unfit += 1
            mixle_unfit_solved += int(feasible and e["fits"] is not False)
        if feasible:
            gaps_all.append((gap_of(e), r["case"]))
            if r["leaves"] <= 256:
                gaps_small.append(gap_of(e))
        if r["leaves"] <= 256:
            small += 1
            small_optimal += int(feasible and e["status"] == "optimal")
            small_infeasible += int(not feasible and e.get("proven", False))
    def geo(xs):
        return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None

    return {
        "cases": len(rows), "worse_than_a_baseline": worse,
        "geomean_iteration_time_vs_mixle": geo(ratios),
        "geomean_compute_term_vs_mixle": geo(compute_ratios), "split_cases_compared": len(ratios),
        "mixle_reports_unfit": mixle_claims_unfit, "mixle_reports_unfit_solved_fitting": mixle_claims_unfit_solved,
        "mixle_unfit_claimed_or_true": mixle_unfit, "mixle_unfit_claimed_or_true_solved_fitting": mixle_unfit_solved,
        "proven_optimal_up_to_256_leaves": f"{small_optimal}/{small}",
        "proven_infeasible_up_to_256_leaves": small_infeasible,
        "proven_optimal_or_infeasible_up_to_256_leaves": f"{small_optimal + small_infeasible}/{small}",
        "median_solve_s": statistics.median(solves), "max_solve_s": max(solves),
        "max_gap_up_to_256_leaves": max(gaps_small, default=None),
        "max_gap": max(gaps_all, default=None), "cases_with_gap_over_5pct": sum(g > 0.05 for g, _ in gaps_all),
        "median_gap": statistics.median([g for g, _ in gaps_all]) if gaps_all else None,
    }


def main(argv: list[str]) -> None:
    pattern = argv[1] if len(argv) > 1 else ""
    rows = []
    built: dict = {}
    for case in cases():
        if pattern not in case.name:
            continue
        model = built.setdefault(case.model, MODELS[case.model]())
        row = run_case(case, model)
        rows.append(row)
        e = row["emgrid"]
        print(f"{case.name:42s} emgrid {fmt(e.get('time_s'))} {e.get('grid', '-')} {e.get('status', 'infeasible')} "
              f"{e['solve_s']:.2f}s | mixle {fmt(row['mixle']['time_s'])} {row['mixle']['grid']} | lpt "
              f"{fmt((row['lpt'] or {}).get('time_s'))} | contiguous {fmt((row['contiguous'] or {}).get('time_s'))} | "
              f"megatron {fmt((row['megatron'] or {}).get('time_s'))}", flush=True)
    summary = summarize(rows)
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    suffix = "" if not pattern else "_" + "".join(c if c.isalnum() else "_" for c in pattern)
    (out / f"planner{suffix}.json").write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    text = ["# Planner benchmark", "", "Every plan priced with emgrid's cost model (`planner.costing`). The mixle "
            "column is mixle 0.8's own `balance_plan` on the equivalent mixle model, mapped back onto emgrid's "
            "leaves (see `bench/planner_baselines.py`), with the rows mixle's own data chunking gives (proportional to "
            "throughput: each replica's slowest worker) and the best of three worker orders (the resources' order, "
            "fastest first by replica, fastest first by shard; the column 'mixle order' names the one kept). "
            "'Busiest-worker time' is the iteration time: every "
            "worker waits for the slowest one's compute plus the synchronous exchanges; the compute term alone is "
            "reported beside it.", "", table(rows), "", "## Summary", "",
            "```", json.dumps(summary, indent=1), "```", ""]
    (out / f"planner{suffix}.md").write_text("\n".join(text))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main(sys.argv)
