"""Elastic fits: a worker killed at a random moment is re-planned around, and the fit ends
where the uninterrupted one does (to 1e-9 relative: the grid changes, so the sums' order does);
what is not a loss, or one too many, still ends the fit."""

from __future__ import annotations

import os
import random
import signal
import time

import numpy as np
import pytest

from emgrid.executors import get, optimize
from emgrid.executors.warden import pid_alive
from emgrid.models import n_rows
from emgrid.models.errors import ConfigError, FitError
from emgrid.planner import Resources

from .fault_models import ROWS, blocky_data, blocky_model
from .plans import grid_plan
from .test_faults import deadline

#: (grid, the resources the fit is planned for): after a loss the plan is made for the rest
CASES = [((2, 1), 2), ((1, 2), 2), ((3, 1), 3)]



def assert_close_models(a, b, rtol: float = 1e-9) -> None:
    for (path, x), (_, y) in zip(a.nodes(), b.nodes()):
        for name, value in x.params().items():
            np.testing.assert_allclose(value, y.params()[name], rtol=rtol, atol=1e-12, err_msg=f"{path}.{name}")


class Killer:
    """Kills the process of one cell (chosen by ``rng``) after iteration ``at``, once."""

    def __init__(self, ex, at: int, cells: int, rng: random.Random):
        self.ex, self.at, self.cell = ex, at, rng.randrange(cells)
        self.pids: list[int] = []

    def __call__(self, it, ll, result):
        self.pids.extend(p for p in self.ex.worker_pids if p not in self.pids)
        if it == self.at and not result.replans:
            os.kill(self.ex.worker_pids[self.cell], signal.SIGKILL)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0][0]}x{c[0][1]}")
@pytest.mark.parametrize("seed", [0, 1])
def test_a_killed_worker_is_replanned_and_the_fit_ends_as_the_uninterrupted_one(nested, case, seed):
    (d, m), workers = case
    model, data = nested
    n = n_rows(model.prepare(data))
    resources = Resources.uniform(workers)
    plan = grid_plan(model, n, d, m)
    want = optimize(data, model, plan=plan, resources=resources, executor="multiprocessing", max_iter=40, tol=1e-7)
    rng = random.Random(f"{d}x{m}-{seed}")
    ex = get("multiprocessing")
    kill = Killer(ex, rng.randint(1, min(4, want.iterations - 1)), d * m, rng)
    with deadline(240):
        got = optimize(data, model, plan=plan, resources=resources, executor=ex, max_iter=40, tol=1e-7,
                       callback=kill, on_worker_loss="replan")
    (replan,) = got.replans
    assert replan["iteration"] == kill.at + 1 and replan["old_grid"] == [d, m]
    assert replan["worker"] == plan.per_worker[kill.cell].name and replan["seconds_lost"] > 0
    assert got.plan.data_parallel * got.plan.model_parallel <= workers - 1
    assert got.converged == want.converged and got.iterations == want.iterations
    np.testing.assert_allclose(got.log_likelihood, want.log_likelihood, rtol=1e-9)
    assert_close_models(got.model, want.model)
    end = time.monotonic() + 30
    while time.monotonic() < end and any(map(pid_alive, kill.pids)):
        time.sleep(0.1)
    assert not [p for p in kill.pids if pid_alive(p)], "workers left running"


def test_a_loss_beyond_max_replans_ends_the_fit_saying_why():
    model = blocky_model()
    data = blocky_data(model)
    ex = get("multiprocessing")
    kills = []

    def kill_each_time(it, ll, result):
        if it in (1, 2) and len(kills) == len(result.replans):
            kills.append(ex.worker_pids[-1])
            os.kill(kills[-1], signal.SIGKILL)

    with deadline(120), pytest.raises(FitError, match=r"worker 'w\d' .* was killed by signal 9") as e:
        optimize(data, model, plan=grid_plan(model, ROWS, 3, 1), resources=Resources.uniform(3), executor=ex,
                 max_iter=6, tol=0.0, callback=kill_each_time, on_worker_loss="replan", max_replans=1)
    assert any("max_replans=1" in note for note in e.value.__notes__)


def test_a_workers_own_error_is_not_replanned(monkeypatch):
    model = blocky_model()
    data = blocky_data(model)
    monkeypatch.setenv("EMGRID_FAULT", "raise:worker=w1:iteration=2:block=1")
    with deadline(120), pytest.raises(FitError, match=r"worker 'w1' .* failed in iteration 2: .*InjectedFault"):
        optimize(data, model, plan=grid_plan(model, ROWS, 2, 1), executor="multiprocessing", max_iter=4, tol=0.0,
                 on_worker_loss="replan")


def test_bad_elastic_options_are_refused_by_name():
    model = blocky_model()
    data = blocky_data(model)
    with pytest.raises(ConfigError, match="on_worker_loss must be one of fail, replan, got 'retry'"):
        optimize(data, model, executor="multiprocessing", on_worker_loss="retry")
    with pytest.raises(ConfigError, match="max_replans must be an integer >= 0, got -1"):
        optimize(data, model, executor="multiprocessing", on_worker_loss="replan", max_replans=-1)
    with pytest.raises(ConfigError, match=r"grow_threshold must be a number in \[0, 1\) or None, got 1.5"):
        optimize(data, model, executor="multiprocessing", on_worker_loss="replan", grow_threshold=1.5)
    with pytest.raises(ConfigError, match="not 'local'"):
        optimize(data, model, on_worker_loss="replan")


def test_a_model_the_coordinator_cannot_keep_is_refused_before_any_work(monkeypatch):
    """The coordinator keeps each iteration's model of an elastic fit: one larger than a
    quarter of its free memory is refused by name, not found out by running out of it."""
    import emgrid.executors.loop as loop

    monkeypatch.setattr(loop, "fits_here", lambda model: False)
    model = blocky_model()
    data = blocky_data(model)
    with deadline(120), pytest.raises(ConfigError, match=r"on_worker_loss='replan' keeps each iteration's model "
                                                          r"on the coordinator \(\d+ bytes of parameters\)"):
        optimize(data, model, plan=grid_plan(model, ROWS, 2, 1), executor="multiprocessing", max_iter=3,
                 on_worker_loss="replan", gather=True)
