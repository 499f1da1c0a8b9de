"""The scikit-learn estimator checks that cannot apply to an estimator here, with the reason:
pass ``expected_failed_checks`` to ``sklearn.utils.estimator_checks.parametrize_with_checks``
or ``check_estimator`` (scikit-learn >= 1.6), so each is marked, never skipped silently."""

from __future__ import annotations

#: check name -> why it cannot apply, per estimator class name
EXPECTED_FAILED: dict[str, dict[str, str]] = {}


def expected_failed_checks(estimator) -> dict[str, str]:
    """``{check name: reason}`` of the checks ``estimator`` is known not to pass."""
    return dict(EXPECTED_FAILED.get(type(estimator).__name__, {}))
