"""The mixture's log-sum-exp (``models.kernels.log_softmax_parts``) against a direct
computation in extended precision, on both of its paths: unshifted (every row's largest term
well inside exp's normal range) and shifted by the per-row maximum."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from emgrid.models.kernels import UNSHIFTED_MARGIN, _unshifted_range, log_softmax_parts


def reference(A: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(logsumexp over rows, normalized exponentials)`` in long double, the maximum shifted out."""
    a = A.astype(np.longdouble)
    m = a.max(axis=0)
    m = np.where(np.isfinite(m), m, 0)
    e = np.exp(a - m)
    s = e.sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return (m + np.log(s)).astype(np.float64), (e / s).astype(np.float64)


logs = st.floats(-3000.0, 700.0, allow_nan=False, allow_infinity=False)


@given(A=hnp.arrays(np.float64, st.tuples(st.integers(1, 6), st.integers(1, 12)), elements=logs),
       shift=st.sampled_from([0.0, -650.0, 600.0]), overwrite=st.booleans())
def test_log_sum_exp_and_weights_match_an_extended_precision_computation(A, shift, overwrite):
    A = A + shift  # rows near the floor and near overflow reach both paths
    want_ld, want_w = reference(A)
    ld, E, s = log_softmax_parts(A.copy(), overwrite=overwrite)
    np.testing.assert_allclose(ld, want_ld, rtol=1e-13, atol=1e-10)
    # a term far below its row's largest may be raised to a weight below e^-64 of it
    np.testing.assert_allclose(E / s, want_w, rtol=1e-12, atol=np.exp(-UNSHIFTED_MARGIN))


def test_both_paths_are_taken_and_agree():
    floor, safe, high = _unshifted_range(np.float64, 3)
    rng = np.random.default_rng(0)
    mild = rng.uniform(-50.0, 0.0, (3, 40))
    far = mild.copy()
    far[2] -= 2000.0  # a far component: clamped, on the unshifted path
    outlier = far.copy()
    outlier[:, 0] = floor - 100.0  # a row far from every component: the shifted path
    for A, shifted in ((mild, False), (far, False), (outlier, True)):
        ld, E, s = log_softmax_parts(A.copy())
        assert (E.max(axis=0) == 1.0).all() == shifted  # shifted: each row's largest term is exp(0)
        want_ld, want_w = reference(A)
        np.testing.assert_allclose(ld, want_ld, rtol=1e-14)
        np.testing.assert_allclose(E / s, want_w, rtol=1e-13, atol=np.exp(-UNSHIFTED_MARGIN))
        assert (E[E > 0] >= np.finfo(np.float64).tiny).all()  # no subnormal enters a product
    assert safe == floor + UNSHIFTED_MARGIN < -600.0 and high > 700.0


def test_rows_with_no_finite_term_give_minus_infinity_and_nan_stays_visible():
    A = np.array([[-np.inf, 0.0, np.nan], [-np.inf, 1.0, 0.0]])
    ld, E, s = log_softmax_parts(A.copy())
    assert ld[0] == -np.inf
    assert ld[1] == pytest.approx(np.logaddexp(0.0, 1.0))
    assert np.isnan(ld[2])


def test_float32_rows_take_float32_bounds():
    floor, safe, high = _unshifted_range(np.float32, 16)
    assert np.exp(np.float32(floor)) >= np.finfo(np.float32).tiny
    assert 16 * np.exp(np.float64(high)) < np.finfo(np.float32).max
    A = np.random.default_rng(1).uniform(-80.0, 0.0, (16, 100)).astype(np.float32)
    ld, E, s = log_softmax_parts(A.copy())
    assert ld.dtype == np.float32
    np.testing.assert_allclose(ld, reference(A)[0], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("nan_elsewhere", [False, True])
def test_a_row_with_no_finite_term_weighs_nothing_whatever_the_other_rows_hold(nan_elsewhere):
    A = np.array([[-np.inf, 0.0, 2.0], [-np.inf, 1.0, 0.0]])
    if nan_elsewhere:
        A[0, 2] = np.nan
    ld, E, s = log_softmax_parts(A.copy())
    assert ld[0] == -np.inf and s[0] == 0.0 and (E[:, 0] == 0.0).all()
    assert ld[1] == pytest.approx(np.logaddexp(0.0, 1.0))
    assert np.isnan(ld[2]) == nan_elsewhere


def test_float32_logs_on_the_shifted_path_leave_no_subnormal_weight():
    """float32's exp is subnormal below about -87: the shifted path's floor follows the type."""
    A = np.array([[-30.0, 0.0], [-125.0, -95.0], [-np.inf, -400.0]], dtype=np.float32)
    ld, E, s = log_softmax_parts(A.copy())
    assert not (E.max(axis=0) < np.finfo(np.float32).tiny).any()  # each row's largest is exp(0)
    assert (E[E > 0] >= np.finfo(np.float32).tiny).all()
    np.testing.assert_allclose(ld, reference(A)[0], rtol=1e-6)
