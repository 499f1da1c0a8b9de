"""What the cluster engines' executors (Dask, Ray, Spark) share beyond the cell
(:mod:`executors.cell`) and the coordinator's grid (:mod:`executors.cellgrid`): their optional
imports, the testing hooks their cells need, the rows shipped to a cell.

The testing hooks (``EMGRID_FAULT``, ``EMGRID_THREAD_PROBE``) travel to the cells explicitly:
an engine's worker processes were started before the fit, with their own environment.
"""

from __future__ import annotations

import importlib
import os
import re

from emgrid.models import Node
from emgrid.models.data import Data
from emgrid.models.errors import ConfigError

from . import faults
from .step import WorkerSpec
from .threads import PROBE_ENV

#: The environment variables of the testing hooks that the coordinator forwards to its cells.
FORWARDED_ENV = (faults.ENV, PROBE_ENV)


def forwarded_env() -> dict[str, str]:
    """The testing hooks set in this (the coordinator's) environment, for the cells."""
    return {k: os.environ[k] for k in FORWARDED_ENV if os.environ.get(k)}


class MissingExtraError(ConfigError, ImportError):
    """An executor whose optional dependency is not installed (a configuration error that
    is also an ImportError)."""


def import_extra(engine: str, package: str):
    """The module ``package`` of an engine's optional dependency, or the one-line error that
    names its install line when it is not installed."""
    try:
        return importlib.import_module(package)
    except ImportError:
        raise MissingExtraError(f'the "{engine}" executor needs {package}, which is not installed: '
                                f'pip install "emgrid[{engine}]"') from None


def last_exception_line(report: str, otherwise: str) -> str:
    """The ``Name: message`` line of the last exception in an engine's error report (a Ray
    actor's, a Spark task's), or ``otherwise`` when it names none: a line naming an error or
    exception class first, a JVM's own lines last."""
    lines = [ln.strip() for ln in report.splitlines() if re.match(r"^[A-Za-z_][\w.]*(: |$)", ln.strip())]
    python = [ln for ln in lines if not ln.startswith(("py4j.", "org.apache.", "java.", "scala."))]
    named = [ln for ln in python if re.match(r"^[\w.]*(Error|Exception|Fault|Exit|Interrupt)(: |$)", ln)]
    found = named or python or lines
    return found[-1] if found else otherwise


def shipped_rows(spec: WorkerSpec, model_part: Node, data: Data) -> Data:
    """What the coordinator ships a cell of in-memory data: its replica's rows, only the
    columns its shard reads (views; the engine serializes them once)."""
    from emgrid.models import take_rows

    return spec.view.columns_for(spec.shard, model_part, take_rows(data, spec.start, spec.stop))
