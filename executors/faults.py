"""Fault injection for tests: make one worker fail on purpose, in any executor, by environment.

**A testing hook, not a feature.** When the environment variable ``EMGRID_FAULT`` is set,
every worker reads it once when it sets up its rows, and the worker it names misbehaves in
the iteration it names. Because it travels in the environment, it reaches worker processes
started by ``multiprocessing`` (spawned children inherit the parent's environment) and the
ranks of an ``mpiexec`` job (hydra passes the environment on) without monkeypatching
anything across processes. Unset (the normal case), it costs one dictionary lookup per fit.

Syntax: ``KIND[:key=value]...``, several faults separated by ``;``::

    EMGRID_FAULT="raise:worker=w1:iteration=2"          # raise inside the E-step
    EMGRID_FAULT="exit:worker=1:iteration=5:code=13"    # os._exit(13), no cleanup
    EMGRID_FAULT="kill:worker=w0:iteration=3:block=1"   # SIGKILL itself at its 2nd block
    EMGRID_FAULT="nan:worker=w0:iteration=2:node=0.1"   # a NaN in node 0.1's statistics
    EMGRID_FAULT="hang:worker=w1:iteration=2:seconds=60"  # sleep (tests timeouts)

Kinds: ``raise`` (raises :class:`InjectedFault`, a RuntimeError), ``exit`` (``os._exit(code)``,
default code 1), ``kill`` (``SIGKILL`` to itself), ``nan`` (one NaN written into the worker's
statistics of ``node``, default: the first node it folds, in sorted path order), ``hang``
(``time.sleep(seconds)``, default 3600).

Keys: ``worker`` names the worker: its name in the plan (``w1``, ``rank1``, ...) or its
grid index ``r * M + s``; omitted, every worker fails. ``iteration``: the EM iteration,
counted from 1 as ``FitResult.iterations`` counts (default 1). ``block``: the row block at
whose start the fault fires (default 0, before any work of that iteration; a worker with
fewer blocks fires at its last); ``nan`` applies to the finished statistics instead.

Under the in-process ``local`` executor the faults run in the calling process: ``raise``
propagates as it is, and ``exit``/``kill`` end the caller.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass

import numpy as np

from emgrid.models import Stats
from emgrid.models.errors import ConfigError

ENV = "EMGRID_FAULT"
KINDS = ("raise", "exit", "kill", "nan", "hang")
#: Every key and how its value is read.
_KEYS = {"worker": str, "iteration": int, "block": int, "code": int, "node": str, "seconds": float}


class InjectedFault(RuntimeError):
    """What a ``raise`` fault raises."""


@dataclass(frozen=True)
class Fault:
    kind: str
    worker: str | None = None  # name or grid index; None = every worker
    iteration: int = 1
    block: int = 0
    code: int = 1
    node: str | None = None
    seconds: float = 3600.0

    def targets(self, name: str, index: int) -> bool:
        return self.worker is None or self.worker == name or self.worker == str(index)

    def describe(self) -> str:
        return f"{self.kind} at iteration {self.iteration}"


def parse(text: str) -> tuple[Fault, ...]:
    """The faults of an ``EMGRID_FAULT`` value; ConfigError naming what is wrong."""
    faults = []
    for item in filter(None, (part.strip() for part in text.split(";"))):
        kind, *pairs = item.split(":")
        if kind not in KINDS:
            raise ConfigError(f"{ENV}={text!r}: unknown fault kind {kind!r}; kinds: {', '.join(KINDS)}")
        fields: dict = {}
        for pair in pairs:
            key, sep, value = pair.partition("=")
            if not sep or key not in _KEYS:
                raise ConfigError(f"{ENV}={text!r}: {pair!r} is not key=value with a key in {sorted(_KEYS)}")
            try:
                fields[key] = _KEYS[key](value)
            except ValueError:
                raise ConfigError(f"{ENV}={text!r}: {key} must be a number, got {value!r}") from None
        faults.append(Fault(kind=kind, **fields))
    return tuple(faults)


def from_env(name: str, index: int) -> tuple[Fault, ...]:
    """The faults that target worker ``name`` (grid index ``index``); empty when unset."""
    text = os.environ.get(ENV)
    if not text:
        return ()
    return tuple(f for f in parse(text) if f.targets(name, index))


def fire(faults: tuple[Fault, ...], name: str, iteration: int, block: int, last_block: bool) -> None:
    """Runs the process-level faults due at ``block`` of ``iteration`` (``nan`` is separate)."""
    for f in faults:
        if f.kind == "nan" or f.iteration != iteration or not (f.block == block or (last_block and f.block > block)):
            continue
        what = f"{ENV}: worker {name!r} {f.describe()}"
        if f.kind == "raise":
            raise InjectedFault(f"injected fault ({what})")
        if f.kind == "hang":
            time.sleep(f.seconds)
        elif f.kind in ("exit", "kill"):
            how = f"exits with code {f.code}" if f.kind == "exit" else "kills itself (SIGKILL)"
            sys.stderr.write(f"{ENV}: worker {name!r} (pid {os.getpid()}) {how} in iteration {iteration}\n")
            sys.stderr.flush()
            if f.kind == "exit":
                os._exit(f.code)
            os.kill(os.getpid(), signal.SIGKILL)


def poison(faults: tuple[Fault, ...], iteration: int, stats: Stats) -> Stats:
    """``stats`` with a NaN in the node a due ``nan`` fault names."""
    for f in faults:
        if f.kind != "nan" or f.iteration != iteration or not len(stats):
            continue
        node = f.node if f.node is not None else sorted(stats)[0]
        if node not in stats:
            raise ConfigError(f"{ENV}: node {node!r} is not among this worker's statistics {sorted(stats)}")
        own = list(stats[node])
        first = own[0]
        own[0] = np.full_like(np.asarray(first, dtype=float), np.nan) if isinstance(first, np.ndarray) else float("nan")
        entries = dict(stats.items())
        entries[node] = tuple(own)
        stats = Stats(entries)
    return stats
