"""The Dask and Ray executors without their optional dependencies: one line naming the extra."""

from __future__ import annotations

import sys

import pytest

from emgrid.executors import get
from emgrid.models.errors import ConfigError


@pytest.mark.parametrize("engine, module", [("dask", "distributed"), ("ray", "ray")])
def test_a_missing_extra_is_named_with_its_install_line(monkeypatch, engine, module):
    monkeypatch.setitem(sys.modules, module, None)  # `import module` now raises ImportError
    with pytest.raises(ImportError, match=rf'pip install "emgrid\[{engine}\]"') as e:
        get(engine)
    assert isinstance(e.value, ConfigError)
    assert "\n" not in str(e.value)
