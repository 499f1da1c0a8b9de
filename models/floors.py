"""The documented floors that keep every M-step finite.

- ``VAR_FLOOR``: a fitted variance (Gaussian, DiagGaussian) is at least this; a fitted
  covariance's smallest eigenvalue is lifted to it (the same role as scikit-learn's
  ``reg_covar``, applied only when needed, so well-posed fits are the exact MLE).
- ``PROB_FLOOR``: fitted categorical probabilities, mixture weights and HMM
  initial/transition probabilities are at least this (then renormalized), so a value or
  state never seen in one iteration keeps a finite log density.
- ``RATE_FLOOR``: fitted Poisson rates and exponential means are at least this.
- ``MIN_WEIGHT``: a node whose total weight is below this keeps its previous parameters
  (a component that received no rows is left unchanged rather than turned into NaN).
- ``LOG_CLAMP``: log responsibilities are clamped below at this before ``exp`` so no
  subnormal number enters a matrix product (they make it several times slower).
"""

VAR_FLOOR = 1e-6
PROB_FLOOR = 1e-12
RATE_FLOOR = 1e-12
MIN_WEIGHT = 1e-10
LOG_CLAMP = -700.0
