"""What importing emgrid loads: OR-Tools only for the solver, nothing from the working
folder, and planner modules that import one another one way."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import emgrid.planner
from emgrid.models import Gaussian, Mixture
from emgrid.planner import Resources, balance_plan

MODEL = Mixture([Gaussian(0.0, 1.0), Gaussian(2.0, 1.0)], [0.5, 0.5])


def run_fresh(code: str, cwd: Path | None = None) -> str:
    """Runs ``code`` in a new interpreter; returns its stdout, failing with its stderr."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


LOADED_ORTOOLS = "sorted(m for m in sys.modules if m == 'ortools' or m.startswith('ortools.'))"


def test_validating_a_plan_and_importing_the_executors_do_not_load_ortools(tmp_path):
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(balance_plan(MODEL, Resources.uniform(2), n_data=100).to_json())
    out = run_fresh(f"""
        import sys
        import emgrid.executors, emgrid.models, emgrid.planner, emgrid.planner.validate
        from emgrid.models import Gaussian, Mixture
        from emgrid.planner import BalancePlan, Resources, plan_from_assignment, validate_plan

        model = Mixture([Gaussian(0.0, 1.0), Gaussian(2.0, 1.0)], [0.5, 0.5])
        res = Resources.uniform(2)
        validate_plan(BalancePlan.from_json(open({str(plan_file)!r}).read()), model, res, 100)
        own = plan_from_assignment(model, res, 100, data_parallel=1, model_parallel=2,
                                   shard_of_leaf={{"0": 0, "1": 1}})
        validate_plan(own, model, res, 100)
        print("ok", own.explain().count("shard"), {LOADED_ORTOOLS})
    """)
    assert out.split()[0] == "ok" and out.rstrip().endswith("[]"), out


def test_balance_plan_loads_ortools():
    """The check above can fail: the solver's module does load OR-Tools."""
    out = run_fresh(f"""
        import sys
        from emgrid.planner import balance_plan
        print({LOADED_ORTOOLS})
    """)
    assert "'ortools'" in out, out


def test_a_users_own_modules_do_not_shadow_emgrid(tmp_path):
    for name in ("models", "planner", "executors", "cli"):
        (tmp_path / f"{name}.py").write_text(f"raise ImportError('the working folder\\'s {name}.py was imported')\n")
    out = run_fresh("""
        from emgrid.models import Mixture
        from emgrid.planner import Resources, validate_plan
        from emgrid.executors import optimize
        import emgrid.cli
        print(Mixture.__module__)
    """, cwd=tmp_path)
    assert out.startswith("emgrid.models"), out


def _planner_imports() -> dict[str, tuple[set[str], list[str]]]:
    """Per planner module: the planner modules it imports at module level (type-checking
    blocks left out) and the planner imports it makes anywhere else (inside functions)."""
    folder = Path(emgrid.planner.__file__).parent
    out = {}
    for path in sorted(folder.glob("*.py")):
        tree = ast.parse(path.read_text())
        top: set[str] = set()
        inner: list[str] = []

        def targets(node) -> list[str]:
            if isinstance(node, ast.ImportFrom):
                if node.level == 1:
                    return [node.module] if node.module else [a.name for a in node.names]
                if node.module and node.module.startswith("emgrid.planner."):
                    return [node.module.split(".")[2]]
            if isinstance(node, ast.Import):
                return [a.name.split(".")[2] for a in node.names if a.name.startswith("emgrid.planner.")]
            return []

        for stmt in tree.body:
            if isinstance(stmt, ast.If) and "TYPE_CHECKING" in ast.unparse(stmt.test):
                continue
            top.update(targets(stmt))
            if not isinstance(stmt, (ast.Import, ast.ImportFrom)):
                for node in ast.walk(stmt):
                    inner.extend(targets(node))
        out[path.stem] = (top, inner)
    return out


def test_planner_imports_form_a_dag():
    imports = _planner_imports()
    lazy = {name: inner for name, (_, inner) in imports.items() if inner}
    assert lazy == {"__init__": ["solve"]}, f"imports inside functions: {lazy}"
    graph = {name: top - {"__init__"} for name, (top, _) in imports.items()}
    state: dict[str, str] = {}

    def visit(name: str, trail: list[str]) -> None:
        if state.get(name) == "done":
            return
        assert state.get(name) != "open", "import cycle: " + " -> ".join(trail + [name])
        state[name] = "open"
        for dep in sorted(graph.get(name, ())):
            visit(dep, trail + [name])
        state[name] = "done"

    for name in graph:
        visit(name, [])
