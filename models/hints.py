"""Hints in error messages, written in the language of the place they are read: Python
(``Table(path, drop_missing=True)``) from the library, TOML (``[data] drop_missing = true``)
while the command line runs a config (``emgrid.cli.main`` wraps each command in
:func:`spoken_as`). The choice is kept in the environment, so worker processes a command
starts write their errors' hints in its language too.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

_VAR = "EMGRID_HINTS"
LANGUAGES = ("python", "toml")


def language() -> str:
    """The language hints are written in now: ``"python"`` or ``"toml"``."""
    lang = os.environ.get(_VAR, "python")
    return lang if lang in LANGUAGES else "python"


@contextmanager
def spoken_as(lang: str):
    """Within it, hints are written in ``lang`` (``"python"`` or ``"toml"``)."""
    if lang not in LANGUAGES:
        raise ValueError(f"hint language must be one of {LANGUAGES}, got {lang!r}")
    before = os.environ.get(_VAR)
    os.environ[_VAR] = lang
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(_VAR, None)
        else:
            os.environ[_VAR] = before


def hint(python: str, toml: str) -> str:
    """The hint in the language of the place the error is read."""
    return toml if language() == "toml" else python
