"""What the Dask and Ray tests check alike: an actor grid's fit against the local executor's."""

from __future__ import annotations

import numpy as np

from emgrid.executors import optimize
from emgrid.models import n_rows

from .plans import assert_same_bytes, grid_plan
from .test_threads import probed

#: The grids every actor engine runs against local: data-parallel, model-parallel, both.
GRIDS = [(2, 1), (1, 2), (2, 2)]


def grid_id(grid) -> str:
    return f"{grid[0]}x{grid[1]}"


def local_fits(model, data, grids=GRIDS, max_iter: int = 4) -> dict:
    """The local executor's fit of every grid (the reference)."""
    n = n_rows(model.prepare(data))
    return {g: optimize(data, model, plan=grid_plan(model, n, *g), max_iter=max_iter, tol=0.0) for g in grids}


def assert_same_model(actual, expected) -> None:
    """The same tree with bit-identical parameters."""
    got, want = actual.nodes(), expected.nodes()
    assert [p for p, _ in got] == [p for p, _ in want]
    for (path, a), (_, b) in zip(got, want):
        assert type(a) is type(b), path
        pa, pb = a.params(), b.params()
        assert list(pa) == list(pb), path
        for name in pa:
            assert np.array_equal(pa[name], pb[name]), f"{path or '<root>'}.{name} differs"


def assert_same_fit(res, reference, executor: str, probe_dir, cells: int) -> None:
    """``res`` (an actor grid's fit) is the local ``reference`` to the last bit: the trace and
    the gathered model; the bytes it moved match; every one of its ``cells`` reported its
    BLAS pools from inside the fit (to ``probe_dir``): one thread each."""
    assert res.log_likelihood == reference.log_likelihood
    assert res.model is not None
    assert_same_model(res.model, reference.model)
    assert_same_bytes(res.bytes_moved, reference.bytes_moved)
    assert res.executor == executor
    threads = probed(probe_dir)
    assert sorted(threads) == [f"w{i}" for i in range(cells)]
    assert all(t == {1} for t in threads.values()), threads
