"""Bad input across the layers: one row per input, the error class and the words it must say.

Model and data rows live in ``tests/models/test_bad_input.py`` and config rows in
``tests/cli/test_config.py``; this table covers resources, plans and ``optimize``.
"""

import numpy as np
import pytest

from emgrid.models import FullGaussian, Gaussian, Mixture
from emgrid.models.errors import ConfigError, DataError, EmgridError, InfeasiblePlanError, PlanError
from emgrid.planner import Resources, balance_plan, validate_plan
from emgrid.executors import optimize

MIX = Mixture([Gaussian(0.0, 1.0), Gaussian(1.0, 1.0)], [0.5, 0.5])
MIX3 = Mixture([Gaussian(0.0, 1.0), Gaussian(1.0, 1.0), Gaussian(2.0, 1.0)], [0.3, 0.3, 0.4])


def plan100():
    return balance_plan(MIX, Resources.uniform(2), n_data=100)


ROWS = [
    ("zero-workers", lambda: Resources.uniform(0), ConfigError, ["workers", "0"]),
    ("negative-memory", lambda: Resources.uniform(2, memory_bytes=-5), ConfigError, ["memory_bytes", "-5"]),
    ("n-data-zero", lambda: balance_plan(MIX, Resources.uniform(2), n_data=0), PlanError, ["n_data", "0"]),
    ("n-data-float", lambda: balance_plan(MIX, Resources.uniform(2), n_data=2.5), PlanError, ["n_data", "2.5"]),
    ("plan-for-other-model", lambda: validate_plan(plan100(), MIX3, Resources.uniform(2), 100), PlanError,
     ["another model"]),
    ("plan-for-other-resources", lambda: validate_plan(plan100(), MIX, Resources.uniform(3), 100), PlanError,
     ["other resources"]),
    ("plan-for-other-n", lambda: validate_plan(plan100(), MIX, Resources.uniform(2), 50), PlanError, ["n_data=100", "50"]),
    ("plan-from-json-other-model",
     lambda: validate_plan(type(plan100()).from_json(plan100().to_json()), MIX3, Resources.uniform(2), 100),
     PlanError, ["another model"]),
    ("cannot-fit-anywhere",
     lambda: balance_plan(FullGaussian(np.zeros(400), np.eye(400)), Resources.uniform(4, memory_bytes=10**6), n_data=10),
     InfeasiblePlanError, ["FullGaussian d=400", "needs", "MiB", "largest worker", "KiB"]),
    ("optimize-nan-data", lambda: optimize(np.array([0.0, np.nan, 1.0]), MIX, executor="local", max_iter=2), DataError,
     ["NaN"]),
    ("optimize-empty-data", lambda: optimize(np.array([]), MIX, executor="local", max_iter=2), DataError, ["no rows"]),
    ("optimize-wrong-shape", lambda: optimize(np.zeros((5, 2)), MIX, executor="local", max_iter=2), DataError,
     ["shape"]),
    ("optimize-plan-other-model",
     lambda: optimize(MIX3.sample(100, 0), MIX3, plan=plan100(), executor="local", max_iter=2), PlanError,
     ["model"]),
    ("optimize-unknown-executor", lambda: optimize(MIX.sample(10, 0), MIX, executor="flink", max_iter=2),
     EmgridError, ["flink", "local"]),
]


@pytest.mark.parametrize("make, error, words", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_bad_input_is_refused_with_a_clear_error(make, error, words):
    with pytest.raises(error) as e:
        make()
    assert isinstance(e.value, ValueError)
    for w in words:
        assert w in str(e.value), (w, str(e.value))
