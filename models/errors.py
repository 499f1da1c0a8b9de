"""Every error emgrid raises on bad input, in one place.

All are ``ValueError`` subclasses so callers can catch one type; each message names the
field, the value received and what is allowed.
"""

from __future__ import annotations


class EmgridError(ValueError):
    """Base class of every input error emgrid raises."""


class ModelError(EmgridError):
    """A model's parameters or structure are invalid."""


class SpecError(ModelError):
    """A model spec (JSON/TOML) names an unknown family or lacks a field."""


class DataError(EmgridError):
    """Data does not match the model it is given to."""


class PlanError(EmgridError):
    """A balance plan is invalid for its model and resources."""


class InfeasiblePlanError(PlanError):
    """No plan fits the resources; the message names the binding constraint."""


class ConfigError(EmgridError):
    """A configuration file or option is invalid."""


class FitError(RuntimeError):
    """A fit stopped: a worker died or the statistics became non-finite."""


class ConvergenceWarning(UserWarning):
    """A fit ended in a state worth a look: ``max_iter`` reached unconverged, a component
    whose weight collapsed, a variance held at its floor. The message names the node path."""
