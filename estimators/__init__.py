"""scikit-learn and hmmlearn estimators over emgrid's EM: the names users already know.

- :class:`GaussianMixture`: scikit-learn's ``sklearn.mixture.GaussianMixture`` (its
  parameters, defaults and fitted attributes).
- :class:`GaussianHMM`, :class:`PoissonHMM`, :class:`CategoricalHMM`: hmmlearn's
  (``fit(X, lengths)``, ``decode``, ``startprob_``, ``transmat_``, ...).
- :class:`EMEstimator`: any nested template (a spec dict or a model), so a record mixture of
  a DataFrame goes into a ``Pipeline`` and a ``GridSearchCV`` too.

Each is a thin class over :func:`emgrid.executors.optimize` and a template: one EM loop,
one initialization, on any executor (``executor=``, ``resources=``); the plan it ran is
``plan_``, the whole fit ``fit_result_``. scikit-learn is needed here (and only here);
hmmlearn is not needed at all.
"""

try:
    import sklearn  # noqa: F401
except ImportError:
    raise ImportError('emgrid.estimators needs scikit-learn: pip install "emgrid[sklearn]"') from None

from .checks import expected_failed_checks
from .hmm import CategoricalHMM, GaussianHMM, PoissonHMM
from .mixture import GaussianMixture
from .template import EMEstimator

__all__ = ["GaussianMixture", "GaussianHMM", "PoissonHMM", "CategoricalHMM", "EMEstimator",
           "expected_failed_checks"]
