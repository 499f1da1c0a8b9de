"""The Spark task of one grid cell: the worker side of :mod:`executors.spark_grid` (whose
docstring says how the tasks and the driver connect), served as every connection-linked cell
is (:func:`executors.conns.serve`).
"""

from __future__ import annotations

import json
import os
import pickle
import threading
from multiprocessing.connection import Client, Connection, Listener

from .cell import Cell
from .conns import serve
from .spark_data import cell_rows


def no_delay(conn: Connection) -> Connection:
    """``conn`` (a TCP connection) with Nagle's algorithm off: a message's header and its
    body are two writes, which Nagle would hold back for the peer's delayed ACK (40 ms)."""
    import socket

    s = socket.socket(fileno=os.dup(conn.fileno()))
    try:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    finally:
        s.close()
    return conn


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
        d, m = len(specs) // spec.view.n_shards, spec.view.n_shards
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
            return cell, _link(ctx, i, spec, d, m, host, authkey)

        serve(make_cell, d, control)
        control.close()
        return iter(())

    return run


def _link(ctx, i: int, spec, d: int, m: int, host: str, authkey: bytes) -> dict[tuple[int, int], Connection]:
    """The task's connections to the cells it sends to: it listens, the tasks exchange their
    addresses (``allGather``), each connects to the cells after it in grid order and accepts
    those before it (on a thread, while it connects)."""
    targets = Cell.targets(spec, d)
    listener = Listener((host, 0), authkey=authkey)
    try:
        addresses = [tuple(json.loads(a)) for a in ctx.allGather(json.dumps(list(listener.address)))]
        links: dict[tuple[int, int], Connection] = {}
        before = [t for t in targets if t[0] * m + t[1] < i]
        failure: list[BaseException] = []

        def accept():
            try:
                for _ in before:
                    conn = no_delay(listener.accept())
                    j = conn.recv()
                    links[(j // m, j % m)] = conn
            except BaseException as e:  # noqa: BLE001 - raised on the task's thread
                failure.append(e)

        acceptor = threading.Thread(target=accept, daemon=True, name=f"emgrid-{spec.name}-accept")
        acceptor.start()
        for t in targets:
            j = t[0] * m + t[1]
            if j > i:
                conn = no_delay(Client(addresses[j], authkey=authkey))
                conn.send(i)
                links[t] = conn
        acceptor.join()
        if failure:
            raise failure[0]
        return links
    finally:
        listener.close()
