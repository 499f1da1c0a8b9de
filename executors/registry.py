"""Executors by name: ``get("local" | "multiprocessing" | "mpi" | "dask" | "ray" | "spark", **options)``."""

from __future__ import annotations

import importlib

from emgrid.models.errors import ConfigError

from .protocol import Executor

#: name -> "module:Class", imported on first use (mpi4py, dask and ray load only when asked for).
_REGISTRY: dict[str, str] = {
    "local": "emgrid.executors.local:LocalExecutor",
    "multiprocessing": "emgrid.executors.multiproc:MultiprocessingExecutor",
    "mpi": "emgrid.executors.mpi:MpiExecutor",
    "dask": "emgrid.executors.dask_grid:DaskExecutor",
    "ray": "emgrid.executors.ray_grid:RayExecutor",
    "spark": "emgrid.executors.spark_grid:SparkExecutor",
}


def names() -> list[str]:
    """The registered executor names."""
    return sorted(_REGISTRY)


def register(name: str, target: str) -> None:
    """Registers ``"module:Class"`` under ``name`` (a class that satisfies :class:`Executor`)."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"executor name must be a non-empty string, got {name!r}")
    _REGISTRY[name] = target


def get(name: str, **options) -> Executor:
    """A new executor of the given kind; ``options`` go to its constructor.

    Raises ConfigError for an unknown name (listing the known ones) or an option the
    executor does not take.
    """
    target = _REGISTRY.get(name) if isinstance(name, str) else None
    if target is None:
        raise ConfigError(f"unknown executor {name!r}; known executors: {', '.join(names())}")
    module, cls_name = target.split(":")
    cls = getattr(importlib.import_module(module), cls_name)
    try:
        return cls(**options)
    except TypeError as e:
        raise ConfigError(f"executor {name!r}: {e}") from None
