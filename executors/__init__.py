"""Interchangeable EM engines that realize a balance plan's whole ``D x M`` grid.

``optimize`` plans when needed and runs EM on an executor chosen by name (``get``):
``"local"`` (in-process), ``"multiprocessing"`` (worker processes on this machine),
``"mpi"`` (one rank per worker under ``mpiexec``), ``"dask"`` or ``"ray"`` (one actor per
worker on a cluster of that engine), ``"spark"`` (one task of a Spark barrier stage per worker;
the extras ``emgrid[dask]``, ``emgrid[ray]``, ``emgrid[spark]``). Every executor runs the same
grid cell (:mod:`executors.cell`) over its own transport; they differ only in how bytes move.
"""

from .api import optimize
from .datafiles import NpyDataset
from .protocol import Executor, FitJob
from .registry import get, names, register
from .result import PHASES, FitResult

__all__ = ["optimize", "get", "names", "register", "FitResult", "Executor", "FitJob", "NpyDataset", "PHASES"]
