"""Every transport names the same fault with the same words: the fault rule is written once
(:mod:`executors.cellgrid`), and only where a cell runs (its pid, host, rank or Dask worker)
is the transport's own."""

from __future__ import annotations

import re

import pytest

from emgrid.executors import get, optimize
from emgrid.executors.faults import ENV
from emgrid.models.errors import FitError

from .fault_models import ROWS, blocky_data, blocky_model
from .plans import grid_plan
from .test_faults import deadline, fit_errors, needs_mpiexec, run_mpi

FAULT = "raise:worker=w1:iteration=2:block=1"
#: The words every transport uses for that fault, once where the cell runs is left out.
EXPECTED = ("worker 'w1' (replica 0, shard 1) failed in iteration 2: emgrid.executors.faults.InjectedFault: "
            "injected fault (EMGRID_FAULT: worker 'w1' raise at iteration 2)")


def without_place(text: str) -> str:
    """The message with the cell's place (``, pid 123 on ...``) left out of its name."""
    return re.sub(r"\((replica \d+, shard \d+)[^)]*\)", r"(\1)", text, count=1)


def in_process(executor, monkeypatch) -> str:
    model = blocky_model()
    monkeypatch.setenv(ENV, FAULT)
    with deadline(), pytest.raises(FitError) as info:
        optimize(blocky_data(model), model, plan=grid_plan(model, ROWS, 1, 2), executor=executor, max_iter=4,
                 tol=0.0)
    return str(info.value)


def test_multiprocessing_names_the_fault_in_the_shared_words(monkeypatch):
    assert without_place(in_process("multiprocessing", monkeypatch)) == EXPECTED


def test_dask_names_the_fault_in_the_shared_words(monkeypatch):
    pytest.importorskip("distributed")
    assert without_place(in_process(get("dask", n_workers=2), monkeypatch)) == EXPECTED


def test_ray_names_the_fault_in_the_shared_words(monkeypatch):
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        pytest.skip("this process is connected to another Ray instance")
    assert without_place(in_process(get("ray", num_cpus=2), monkeypatch)) == EXPECTED


@needs_mpiexec
def test_mpi_names_the_fault_in_the_shared_words_on_every_rank():
    proc, _ = run_mpi(FAULT, 1, 2)
    errors = fit_errors(proc)
    assert sorted(errors) == [0, 1], proc.stdout + proc.stderr
    assert {without_place(text) for text in errors.values()} == {EXPECTED}
