"""Fixtures shared by the executor tests."""

from __future__ import annotations

import pytest

from .sample_models import nested_data, nested_model


@pytest.fixture(scope="session")
def nested():
    """``(model, data)``: a composite of a mixture, a sequence of a mixture, an HMM and a Poisson."""
    model = nested_model()
    return model, nested_data(model)
