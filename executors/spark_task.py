"""The Spark task of one grid cell: the worker side of :mod:`executors.spark_grid` (whose
docstring says how the tasks and the driver connect), served as every connection-linked cell
is (:func:`executors.conns.serve`).
"""

from __future__ import annotations

import json
import pickle
from multiprocessing.connection import Client

from .cell import Cell
from .conns import link_cells, no_delay, serve
from .spark_data import cell_rows


def cell_task(coordinator, authkey: bytes, local: bool, specs, source: str, reader, directory, blas_threads, env):
    """The barrier task of every cell (its index the task's partition): ``source`` says what
    its partition holds, ``"frame"`` a DataFrame's ``(first, blob)`` blocks, ``"rows"`` its
    rows, ``"directory"`` nothing (it maps its rows from ``directory``). Its shard's part of
    the starting model comes down its control connection once it connected (not with the
    task: every task would receive every shard's)."""

    def run(partition):
        from pyspark import BarrierTaskContext

        ctx = BarrierTaskContext.get()
        i = ctx.partitionId()
        spec = specs[i]
        d = len(specs) // spec.view.n_shards
        # a local master's tasks listen on loopback, a cluster's on their executor's address
        host = "127.0.0.1" if local else ctx.getTaskInfos()[i].address.rsplit(":", 1)[0]
        control = no_delay(Client(coordinator, authkey=authkey))
        control.send(i)
        part_blob = control.recv_bytes()

        def make_cell():
            part = pickle.loads(part_blob)
            if source == "frame":
                rows = cell_rows(reader, spec, part, partition)
            elif source == "rows":
                rows = next(iter(partition))
            else:
                rows = None
            cell = Cell(spec, part, directory if source == "directory" else None, rows, blas_threads, env)
            return cell, link_cells(lambda mine: _all_gather(ctx, mine), i, spec, d, host, authkey)

        serve(make_cell, d, control)
        control.close()
        return iter(())

    return run


def _all_gather(ctx, address) -> list:
    """Every task's listening address, by task, through the barrier (``allGather``)."""
    return [tuple(json.loads(a)) for a in ctx.allGather(json.dumps(list(address)))]
