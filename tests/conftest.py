"""Test configuration shared by every test package.

The default hypothesis profile ``emgrid`` has no deadline (the first call of a numpy kernel
can be slow) and few examples, so the whole suite runs in well under a minute on two cores.
``HYPOTHESIS_PROFILE=thorough`` runs many more examples.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from hypothesis import HealthCheck, settings

# The repository root is importable, for the `tests` and `bench` helpers (emgrid itself is
# imported as the installed `emgrid` package).
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

_COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("emgrid", max_examples=30, **_COMMON)
settings.register_profile("thorough", max_examples=400, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "emgrid"))
