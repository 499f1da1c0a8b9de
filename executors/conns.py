"""Grid cells reached over :mod:`multiprocessing.connection` connections, both sides: what
the multiprocessing executor (pipes) and the Spark executor (TCP sockets between barrier
tasks) share; only how the connections are made differs.

The worker side (:func:`serve`, :class:`ConnLink`; :func:`link_cells` makes TCP links between
cells that find each other's addresses through a barrier or the coordinator):

- **control**: one connection to the coordinator, whose calls arrive on it in order and
  whose awaited answers go back up it; bytes-like arguments (a shard's pickled part, a
  skeleton) travel as they are, after the call (:func:`executors.cellgrid.split_raw`);
- **links**: one connection per cell this one sends to (:meth:`executors.cell.Cell.targets`),
  each read by a thread that delivers what arrives into the cell's mailbox, so that a sender
  never waits for its receiver's step; a broken link aborts the cell naming the peer
  (:class:`executors.cell.PeerLost`).

The coordinator's side (:class:`ConnGrid`): calls go down each cell's control connection in
order, so the model and the updates are sent without waiting; a cell's end is noticed by its
connection's end of file or by a transport's *sentinel* (a process's, a job's).
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from contextlib import suppress
from multiprocessing.connection import Client, Connection, Listener, wait
from time import perf_counter

from emgrid.models.errors import FitError

from .cell import Cell, PeerLost
from .cellgrid import CellGrid, Died, Failed, Lost, describe_error, join_raw, split_raw
from .mstep import tree_role


def serve(make_cell: Callable[[], tuple[Cell, dict[tuple[int, int], Connection]]], d: int,
          control: Connection) -> None:
    """Builds the cell and its links (``make_cell``: it opens its rows and returns the cell
    and its connections to the cells it sends to, by ``(replica, shard)``), links it and
    serves the coordinator's calls until told to stop; an error goes up the control
    connection as ``("error", (summary, traceback))``, a lost peer as ``("lost", index)``."""
    try:
        cell, links = make_cell()
        ConnLink(cell, links, d)
        control.send(("ok", None))
        while True:
            method, args = control.recv()
            if method == "stop":
                return
            args = join_raw(args, iter(control.recv_bytes, None))
            if method in ("load", "update"):  # the calls sent without waiting
                getattr(cell, method)(*args)
            else:  # the calls the coordinator waits for
                control.send(("ok", getattr(cell, method)(*args)))
    except PeerLost as e:
        tell(control, ("lost", e.index))
    except (EOFError, BrokenPipeError, ConnectionResetError, KeyboardInterrupt):
        return  # the coordinator went away
    except BaseException as e:
        tell(control, ("error", describe_error(e)))


def tell(control: Connection, message) -> None:
    """Sends ``message`` to the coordinator unless it is gone."""
    with suppress(OSError):
        control.send(message)


def no_delay(conn: Connection) -> Connection:
    """``conn`` (a TCP connection) with Nagle's algorithm off: a message's header and its
    body are two writes, which Nagle would hold back for the peer's delayed ACK (40 ms)."""
    s = socket.socket(fileno=os.dup(conn.fileno()))
    try:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    finally:
        s.close()
    return conn


def hang_up(conn: Connection) -> None:
    """Shuts a TCP connection down, then closes it: a thread blocked reading it gets its end of
    file (closing alone does not wake it)."""
    with suppress(OSError):  # closed already, or the peer went first
        with socket.socket(fileno=os.dup(conn.fileno())) as s:
            s.shutdown(socket.SHUT_RDWR)
    conn.close()


def link_cells(gather: Callable[[tuple], list], i: int, spec, d: int, host: str,
               authkey: bytes) -> dict[tuple[int, int], Connection]:
    """Cell ``i``'s TCP connections to the cells it sends to: it listens on ``host``, the cells
    exchange their addresses (``gather``: this cell's address -> every cell's, in grid order;
    a barrier's ``allGather``, or the coordinator relaying them), and each connects to the
    cells after it in grid order and accepts those before it (on a thread, while it connects)."""
    m = spec.view.n_shards
    targets = Cell.targets(spec, d)
    listener = Listener((host, 0), authkey=authkey)
    try:
        addresses = [tuple(a) for a in gather(listener.address)]
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


def serve_relayed(cell: Cell, coordinator, authkey: bytes, d: int, host: str) -> None:
    """A cell already built, served over TCP for the whole fit (an actor's one long call: Ray's,
    Dask's): it connects to the coordinator, gets every cell's address through it (the relay
    of :meth:`ConnGrid.accept_relayed`), links to the cells it meets (:func:`link_cells`,
    listening on ``host``) and serves until told to stop."""
    spec = cell.spec
    control = no_delay(Client(coordinator, authkey=authkey))
    links: dict[tuple[int, int], Connection] = {}

    def gather(address):
        control.send((spec.index, address))
        return control.recv()

    def make_cell():
        links.update(link_cells(gather, spec.index, spec, d, host, authkey))
        return cell, links

    try:
        serve(make_cell, d, control)
    finally:  # the process lives on (a Dask worker): its reader threads end with their links
        for conn in (control, *links.values()):
            hang_up(conn)


class ConnLink:
    """A cell's connections to the cells it sends to: a reader thread per connection
    delivers what arrives, and a broken one aborts the cell naming the peer."""

    def __init__(self, cell: Cell, conns: dict[tuple[int, int], Connection], d: int):
        self.cell, self.conns = cell, conns
        self.m = cell.spec.view.n_shards
        for target, conn in conns.items():
            threading.Thread(target=self._read, args=(target, conn), daemon=True,
                             name=f"emgrid-{cell.spec.name}-from-{target[0]}x{target[1]}").start()
        cell.connect(self.send, d)

    def send(self, target: tuple[int, int], key: tuple, payload, extra) -> None:
        conn = self.conns[target]
        try:
            conn.send((key, extra))
            conn.send_bytes(payload)
        except OSError:
            raise PeerLost(target[0] * self.m + target[1]) from None

    def _read(self, target: tuple[int, int], conn: Connection) -> None:
        try:
            while True:
                key, extra = conn.recv()
                self.cell.deliver(key, conn.recv_bytes(), extra)
        except (EOFError, OSError):
            self.cell.abort(lost=target[0] * self.m + target[1])


class ConnGrid(CellGrid):
    """The coordinator's side: ``conns[i]`` is cell ``i``'s control connection (grid order)."""

    conns: list[Connection]

    def sentinel(self, i: int):
        """What becomes ready when cell ``i`` ends beside its connection (a process's
        sentinel), or None."""
        return None

    def accept(self, listener: Listener, greet: Callable[[Connection], int],
               ended_early: Callable[[], BaseException | None], late: str) -> None:
        """Accepts every cell's control connection on ``listener`` into :attr:`conns` (on a
        thread; ``greet(conn)``, the first exchange on a connection, returns its cell's grid
        index). Raises what ``ended_early`` returns (a cell whose engine call or task ended
        while the cells started; it waits about 50 ms), or after the startup timeout a
        FitError naming the cells that did not connect, ``late`` saying why that may be."""
        n = len(self.cells)
        got: set[int] = set()

        def accept():
            with suppress(OSError, EOFError):
                for _ in range(n):
                    conn = no_delay(listener.accept())
                    i = greet(conn)
                    self.conns[i] = conn
                    got.add(i)

        threading.Thread(target=accept, daemon=True, name="emgrid-accept").start()
        deadline = perf_counter() + self.startup_timeout_s
        while len(got) < n:
            ended = ended_early()
            if ended is not None:
                raise ended
            if perf_counter() > deadline:
                missing = [i for i in range(n) if i not in got]
                raise FitError(f"no answer within {self.startup_timeout_s:g} s while starting from "
                               f"{', '.join(self.who(i) for i in missing)}: {late}")

    def accept_relayed(self, listener: Listener, ended_early: Callable[[], BaseException | None], engine: str) -> None:
        """The coordinator's side of :func:`serve_relayed`: :meth:`accept` (``engine`` names
        the engine that did not start a cell's call), then every cell's address to all."""
        addresses: dict[int, tuple] = {}

        def greet(conn: Connection) -> int:
            i, addresses[i] = conn.recv()
            return i

        self.accept(listener, greet, ended_early, f"{engine} did not start their call")
        for c in self.conns:
            c.send([addresses[i] for i in range(len(self.cells))])

    def ask_to_stop(self) -> None:
        """Tells every cell still connected to stop (it returns from :func:`serve`)."""
        for c in self.conns:
            if c is not None:
                with suppress(OSError):  # the worker is gone already
                    c.send(("stop", None))

    def call(self, i: int, method: str, *args) -> None:
        marked, bodies = split_raw(args)
        with suppress(OSError):  # the worker is gone: the next answers awaited name it (its sentinel)
            self.conns[i].send((method, marked))
            for body in bodies:
                self.conns[i].send_bytes(body)

    def poll(self, calls: dict[int, object], wait_s: float, when: str) -> list[tuple[int, object]]:
        conns = {self.conns[i]: i for i in calls}
        sentinels = [(self.sentinel(i), i) for i in calls]
        ready = wait([*conns, *{s for s, _ in sentinels if s is not None}], wait_s)
        out: dict[int, object] = {}
        for obj in ready:
            i = conns.get(obj)
            if i is not None:
                try:
                    kind, body = obj.recv()
                except (EOFError, OSError):
                    out[i] = Died(self.ended(i))
                    continue
                out[i] = Failed(*body) if kind == "error" else Lost(body) if kind == "lost" else body
        for obj, i in sentinels:
            if obj is not None and obj in ready and i not in out and not self.conns[i].poll():
                out[i] = Died(self.ended(i))
        return list(out.items())

    def waits(self, cells: list[int]) -> dict[int, str]:
        """Of the ``cells`` late, those that may only be waiting for their column: a cell
        reports after the partial sums of its subtree of the column's reduce
        (:func:`executors.mstep.tree_rounds`), so one with a late cell below it waits."""
        d, m = self.shape

        def below(r: int) -> set[int]:  # replica r's whole subtree
            return set().union(*({s} | below(s) for s in tree_role(r, d)[0]))

        late = set(cells)
        out = {}
        for i in cells:
            waited = sorted(r for r in below(i // m) if r * m + i % m in late)
            if waited:
                out[i] = f"waits for the partial sums of its column's replica(s) {waited}"
        return out

