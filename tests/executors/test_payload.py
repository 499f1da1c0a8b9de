"""What moves per iteration: statistics O(model) and coupling exactly as the planner predicts."""

from __future__ import annotations

import numpy as np
import pytest

from emgrid.executors import optimize
from emgrid.models import HMM, Categorical, Composite, DiagGaussian, Exponential, Gaussian, Mixture, Poisson, coupling_bytes_per_row

from .plans import grid_plan

RNG = np.random.default_rng(3)


def diag_mixture(k: int, d: int = 3) -> Mixture:
    return Mixture([DiagGaussian(np.full(d, float(i)), np.ones(d)) for i in range(k)], np.full(k, 1.0 / k))


PAYLOAD_MODELS = {
    "gaussian": Gaussian(0.0, 1.0),
    "mixture": Mixture([Gaussian(-2.0, 1.0), Gaussian(2.0, 1.0)], [0.4, 0.6]),
    "composite": Composite([Gaussian(0.0, 1.0), Categorical([0.2, 0.8]), Poisson(2.0)]),
    "hmm": HMM([Gaussian(-1.0, 1.0), Gaussian(1.0, 1.0)], [[0.9, 0.1], [0.1, 0.9]], [0.5, 0.5], 6.0),
}


def reduce_bytes(model, n: int, d: int = 2, m: int = 1) -> int:
    data = model.sample(n, RNG)
    res = optimize(data, model, plan=grid_plan(model, n, d, m), max_iter=1, tol=0.0)
    return res.bytes_moved[0]["reduce"]


@pytest.mark.parametrize("name", sorted(PAYLOAD_MODELS))
def test_the_statistics_payload_is_flat_when_n_grows_tenfold(name):
    model = PAYLOAD_MODELS[name]
    small, large = reduce_bytes(model, 400), reduce_bytes(model, 4000)
    assert small > 0
    assert large == pytest.approx(small, rel=0.01)


def test_larger_models_have_larger_payloads():
    sizes = [reduce_bytes(diag_mixture(k), 500) for k in (2, 4, 8)]
    assert sizes[0] < sizes[1] < sizes[2]
    assert reduce_bytes(Gaussian(0.0, 1.0), 500) < reduce_bytes(PAYLOAD_MODELS["mixture"], 500)


def test_the_payload_grows_with_the_replicas_not_the_rows():
    # the column's tree reduce moves one partial sum per replica but the head, each the size
    # of one replica's statistics; the head's report to the coordinator is the same for every D
    model = diag_mixture(4)
    one, two, four = (reduce_bytes(model, 800, d=d) for d in (1, 2, 4))
    share = two - one
    assert share > 0
    assert four - one == pytest.approx(3 * share, rel=0.01)


SPLIT_MODELS = {
    "composite": Composite([Gaussian(0.0, 1.0), Exponential(1.0), Categorical([0.5, 0.5]), DiagGaussian([0.0, 0.0], [1.0, 1.0])]),
    "mixture": diag_mixture(5),
    "nested": Mixture([Composite([Gaussian(0.0, 1.0), Poisson(1.0)]), Composite([Gaussian(2.0, 1.0), Poisson(4.0)])],
                      [0.5, 0.5]),
}


@pytest.mark.parametrize("name", sorted(SPLIT_MODELS))
@pytest.mark.parametrize("grid", [(1, 2), (2, 3)])
def test_coupling_bytes_equal_the_planners_prediction(name, grid):
    model = SPLIT_MODELS[name]
    d, m = grid
    n = 700
    plan = grid_plan(model, n, d, m)
    res = optimize(model.sample(n, RNG), model, plan=plan, max_iter=2, tol=0.0)
    predicted = n * plan.extra["coupling_bytes_per_row"]
    assert predicted == n * coupling_bytes_per_row(model, plan.shard_of_leaf()) > 0
    assert [b["coupling"] for b in res.bytes_moved] == [predicted, predicted]


def test_an_unsplit_plan_moves_no_coupling_bytes():
    model = SPLIT_MODELS["mixture"]
    res = optimize(model.sample(300, RNG), model, plan=grid_plan(model, 300, 3, 1), max_iter=2, tol=0.0)
    assert all(b["coupling"] == 0 for b in res.bytes_moved)


def test_the_report_a_worker_sends_carries_its_share():
    """One message for every transport: the figures travel in a ``ShareReport``, the
    statistics as their pickle beside it, whose length is what the reduce counts."""
    import pickle

    from emgrid.executors.step import ShareReport, WorkerShare
    from emgrid.models import Stats

    stats = Stats({"": (np.arange(3.0), 2.5), "0": (np.ones(2),)})
    share = WorkerShare(stats=stats, loglik=-12.5, compute_s=0.25, coupling_s=0.125, coupling_bytes=4096,
                        receive_s=0.0625, peak_bytes=1 << 20)
    blob = share.payload()
    report = pickle.loads(pickle.dumps(share.report("w3", len(blob), 777)))
    assert isinstance(report, ShareReport) and report.worker == "w3"
    assert (report.stats_bytes, report.baseline_bytes) == (len(blob), 777)
    assert pickle.loads(blob).allclose(stats)
    for name in ("loglik", "compute_s", "coupling_s", "coupling_bytes", "receive_s", "peak_bytes"):
        assert getattr(report, name) == getattr(share, name)
