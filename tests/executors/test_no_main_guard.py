"""A plain script without ``if __name__ == "__main__":`` fits with the multiprocessing executor.

The script runs in a subprocess, as a user runs it: it must run once (the workers do not
import it again), fit, and exit 0. A script whose model uses a node class of its own
(defined in ``__main__``) still needs the guard: the workers import the script to unpickle it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import os
    import numpy as np
    from emgrid.executors import get, optimize
    from emgrid.models import Gaussian, Mixture
    from emgrid.planner import Resources, balance_plan

    print("RAN", os.getpid(), flush=True)
    model = Mixture([Gaussian(-1.0, 1.0), Gaussian(1.0, 1.0)], [0.5, 0.5])
    data = Mixture([Gaussian(-3.0, 1.0), Gaussian(2.0, 0.5)], [0.3, 0.7]).sample(2000, np.random.default_rng(0))
    plan = balance_plan(model, Resources.uniform(2), n_data=2000, grid=(2, 1))
    result = optimize(data, model, plan=plan, executor=get("multiprocessing", start_method="{method}"),
                      max_iter=5, tol=0.0)
    print("FIT", result.executor, result.iterations, flush=True)
""")


def run_script(tmp_path, text: str) -> subprocess.CompletedProcess:
    path = tmp_path / "plain_script.py"
    path.write_text(text)
    return subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=120,
                          cwd=str(tmp_path), env=dict(os.environ, PYTHONUNBUFFERED="1"))


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_script_without_a_main_guard_runs_once_and_fits(tmp_path, method):
    proc = run_script(tmp_path, SCRIPT.replace("{method}", method))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert len([line for line in lines if line.startswith("RAN")]) == 1, proc.stdout
    assert "FIT multiprocessing 5" in lines, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr


def test_the_callers_main_module_is_left_as_it_was(tmp_path):
    check = SCRIPT.replace("{method}", "spawn") + textwrap.dedent("""
        import sys
        main = sys.modules["__main__"]
        print("MAIN", main.__file__ == __file__, main.__spec__ is None, flush=True)
    """)
    proc = run_script(tmp_path, check)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "MAIN True True" in proc.stdout.splitlines(), proc.stdout


def test_a_model_class_defined_in_the_script_still_reaches_the_workers_under_a_guard(tmp_path):
    guarded = textwrap.dedent("""
        import numpy as np
        from emgrid.executors import get, optimize
        from emgrid.models import Gaussian
        from emgrid.planner import Resources, balance_plan

        class MyGaussian(Gaussian):
            pass

        if __name__ == "__main__":
            model = MyGaussian(0.0, 1.0)
            data = model.sample(500, np.random.default_rng(0))
            plan = balance_plan(model, Resources.uniform(2), n_data=500, grid=(2, 1))
            result = optimize(data, model, plan=plan, executor="multiprocessing", max_iter=3, tol=0.0)
            print("FIT", result.iterations, flush=True)
    """)
    proc = run_script(tmp_path, guarded)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "FIT 3" in proc.stdout.splitlines(), proc.stdout  # the workers unpickled MyGaussian
