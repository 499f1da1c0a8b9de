"""What the plan runs on: workers (memory, speed) and the network between them."""

from __future__ import annotations

import json
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from emgrid.models.errors import ConfigError

#: Effective FLOP rate of one core running emgrid's E-step kernels. ``bench/cost_model.py``
#: measures it on a machine and writes ``bench/results/calibration.json``; pass
#: ``flops_per_s`` (or ``[resources] flops_per_s`` in a config) to plan for other hardware.
DEFAULT_FLOPS_PER_S = 2.8e9
#: The most workers a plan may be made for: the planner prices every worker and CP-SAT holds
#: variables per worker; 10,000 identical workers plan in about 2 s on this machine.
MAX_WORKERS = 10_000


class Worker(BaseModel):
    """One worker process: its memory (``None`` when unknown) and its effective FLOP rate."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    memory_bytes: int | None = Field(default=None, gt=0)
    flops_per_s: float = Field(default=DEFAULT_FLOPS_PER_S, gt=0, allow_inf_nan=False)


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


class Network(BaseModel):
    """Per-message latency and bandwidth between workers."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    latency_s: float = Field(default=50e-6, ge=0)
    bytes_per_s: float = Field(default=1.0e9, gt=0)


#: Worker processes of one machine joined by pipes (``multiprocessing``): 150 us a
#: collective. Inside the EM loop a broadcast or reduce costs the executor's pickling and
#: wake-ups, several times a bare pipe round trip (``bench/scaling.py`` measures both;
#: figures in ``bench/results/scaling.md``).
PIPES = Network(latency_s=150e-6, bytes_per_s=4e9)
#: MPI ranks of one machine (mpi4py's collectives over shared memory: pickled for models and
#: statistics, float64 buffers for the coupling, ``executors.coupling``): 80 us a
#: collective. Inside the EM loop the ranks arrive out of step, so a collective costs its
#: waits as well, several times what it takes in a tight loop; 80 us puts the predicted
#: iteration of a tiny model's fit within 0.8-1.3x of the measured one
#: (``bench/scaling.py``; figures in ``bench/results/scaling.md``).
SHARED_MEMORY_MPI = Network(latency_s=80e-6, bytes_per_s=5e9)


class Resources(BaseModel):
    """The workers a plan may use and the network that joins them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    workers: tuple[Worker, ...] = Field(min_length=1)
    network: Network = Network()
    #: True when the worker of grid cell ``(0, 0)`` also gathers the shards' statistics and
    #: runs the M-step (the MPI executor), which the plan then counts in its memory; False
    #: when a process outside the grid does (multiprocessing's parent, the local caller).
    coordinator_in_grid: bool = False

    @field_validator("workers", mode="before")
    @classmethod
    def _not_too_many(cls, workers):
        if hasattr(workers, "__len__") and len(workers) > MAX_WORKERS:
            raise ValueError(f"at most {MAX_WORKERS:,} workers (planner.resources.MAX_WORKERS), got {len(workers):,}")
        return workers

    @field_validator("workers")
    @classmethod
    def _unique_names(cls, workers):
        names = [w.name for w in workers]
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise ValueError(f"worker names must be unique, {dup!r} appears twice")
        return workers

    @property
    def n_workers(self) -> int:
        return len(self.workers)

    @classmethod
    def uniform(cls, n: int, memory_bytes: int | None = None, flops_per_s: float = DEFAULT_FLOPS_PER_S,
                network: Network | None = None) -> "Resources":
        """``n`` identical workers named ``w0 .. w{n-1}``."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"workers must be an integer >= 1, got {n!r}")
        if n > MAX_WORKERS:
            raise ConfigError(f"workers must be at most {MAX_WORKERS:,} (the planner's limit, "
                              f"planner.resources.MAX_WORKERS), got {n:,}")
        if memory_bytes is not None and not (_is_number(memory_bytes) and 0 < memory_bytes < float("inf")):
            raise ConfigError(f"memory_bytes must be a finite number of bytes > 0, got {memory_bytes!r}")
        if not (_is_number(flops_per_s) and 0 < flops_per_s < float("inf")):
            raise ConfigError(f"flops_per_s must be a finite number > 0, got {flops_per_s!r}")
        return cls(workers=tuple(Worker(name=f"w{i}", memory_bytes=memory_bytes, flops_per_s=flops_per_s) for i in range(n)),
                   network=network or Network())

    @classmethod
    def local(cls, n: int | None = None, flops_per_s: float = DEFAULT_FLOPS_PER_S) -> "Resources":
        """This machine: one worker per core, the available memory shared among them."""
        if n is None:
            n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        mem = available_memory_bytes()
        return cls.uniform(n, memory_bytes=None if mem is None else mem // n, flops_per_s=flops_per_s,
                           network=PIPES)

    @classmethod
    def from_mpi(cls, comm=None, flops_per_s: float = DEFAULT_FLOPS_PER_S) -> "Resources":
        """Every rank reports its host's available memory (shared by the ranks on that host)."""
        from mpi4py import MPI

        comm = comm or MPI.COMM_WORLD
        host = MPI.Get_processor_name()
        facts = comm.allgather((host, available_memory_bytes()))
        per_host: dict[str, int] = {}
        for h, _ in facts:
            per_host[h] = per_host.get(h, 0) + 1
        workers = tuple(
            Worker(name=f"rank{r}", memory_bytes=None if m is None else m // per_host[h], flops_per_s=flops_per_s)
            for r, (h, m) in enumerate(facts)
        )
        return cls(workers=workers, network=SHARED_MEMORY_MPI, coordinator_in_grid=True)

    @classmethod
    def from_file(cls, path) -> "Resources":
        """Reads a JSON file holding ``{"workers": [...], "network": {...}}``."""
        p = Path(path)
        try:
            raw = json.loads(p.read_text())
        except OSError as e:
            raise ConfigError(f"cannot read resources file {str(p)!r}: {e.strerror}") from None
        except json.JSONDecodeError as e:
            raise ConfigError(f"resources file {str(p)!r} is not valid JSON: {e.msg} at line {e.lineno}") from None
        try:
            return cls.model_validate(raw)
        except ValidationError as e:
            raise ConfigError(f"resources file {str(p)!r}: {first_error(e)}") from None


def first_error(e: ValidationError) -> str:
    """One line for a pydantic error: ``field.path: message (got value)``."""
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err["loc"]) or "<root>"
    return f"{loc}: {err['msg']} (got {err.get('input')!r})"


def available_memory_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


# ---------------------------------------------------------------- the engines' clusters
# Dask and Ray report their workers to whoever asks; the executors of the same names place
# the grid's cells with the slot names below (``executors.dask_grid``, ``executors.ray_grid``).

#: Dask and Ray cells on one machine: each actor's one long call serves its cell over
#: authenticated TCP sockets to the coordinator and to the cells it meets
#: (``executors.conns.serve_relayed``), as Spark's tasks are, with the engine's own threads
#: beside it in the worker's process: ``bench/scaling.py`` measured 1.07 ms per 2x1
#: iteration beyond ``local`` for both (Spark 0.77 ms) and a 1x2 fit's 3.2 MB of coupling per
#: iteration in the time Spark took.
DASK_ACTORS = Network(latency_s=400e-6, bytes_per_s=2e9)
RAY_ACTORS = DASK_ACTORS
#: Spark barrier tasks: authenticated TCP sockets task to task and to the driver
#: (``executors.spark_grid``); on one machine, loopback.
SPARK_TASKS = Network(latency_s=300e-6, bytes_per_s=2e9)


def dask_slots(workers: dict) -> list[tuple[str, str, int | None]]:
    """``(name, address, memory_bytes)`` of every thread of every Dask worker in
    ``scheduler_info()["workers"]``: ``"<worker name>@<host>"`` (``".<thread>"`` after the
    name when a worker runs several threads), its memory limit shared by its threads (None
    without a limit). Ordered thread by thread across the workers, so that cells placed in
    turn fill every process before a second thread of one."""
    rows = []
    for address, w in sorted(workers.items(), key=lambda kv: (str(kv[1].get("name")), kv[0])):
        n = max(1, int(w.get("nthreads") or 1))
        limit = int(w.get("memory_limit") or 0)
        host = w.get("host") or address
        for t in range(n):
            name = f"{w.get('name')}@{host}" if n == 1 else f"{w.get('name')}.{t}@{host}"
            rows.append((t, name, address, limit // n if limit > 0 else None))
    rows.sort(key=lambda r: r[0])
    return [r[1:] for r in rows]


def ray_slots(nodes: list[dict]) -> list[tuple[str, str, int | None]]:
    """``(name, node_id, memory_bytes)`` of every CPU of every live node in ``ray.nodes()``:
    ``"<node ip>/<cpu>"`` (the node id's first 8 digits after the ip when ips repeat), the
    node's ``memory`` resource shared by its CPUs. Ordered CPU by CPU across the nodes."""
    live = [n for n in nodes if n.get("Alive", n.get("alive", False))]
    ips = [n.get("NodeManagerAddress", "") for n in live]
    rows = []
    for node in sorted(live, key=lambda n: (n.get("NodeManagerAddress", ""), n["NodeID"])):
        ip = node.get("NodeManagerAddress", "")
        res = node.get("Resources", {})
        n = max(1, int(res.get("CPU", 1)))
        mem = int(res.get("memory", 0))
        label = ip if ips.count(ip) == 1 else f"{ip}-{node['NodeID'][:8]}"
        for k in range(n):
            rows.append((k, f"{label}/{k}", node["NodeID"], mem // n if mem > 0 else None))
    rows.sort(key=lambda r: r[0])
    return [r[1:] for r in rows]


def _from_dask(cls, client, flops_per_s: float = DEFAULT_FLOPS_PER_S) -> "Resources":
    """The workers of a Dask cluster (``distributed.Client``): one per worker thread, with
    its share of the worker's memory limit, named by worker and host (:func:`dask_slots`)."""
    workers = client.scheduler_info(n_workers=-1)["workers"]
    if not workers:
        raise ConfigError(f"the Dask cluster at {client.scheduler.address} has no workers")
    return cls(workers=tuple(Worker(name=name, memory_bytes=mem, flops_per_s=flops_per_s)
                             for name, _, mem in dask_slots(workers)), network=DASK_ACTORS)


def _from_ray(cls, flops_per_s: float = DEFAULT_FLOPS_PER_S) -> "Resources":
    """The CPUs of the Ray cluster this process is connected to (``ray.init`` first), one
    worker each, with its share of the node's ``memory`` resource (:func:`ray_slots`)."""
    import ray

    if not ray.is_initialized():
        raise ConfigError("Resources.from_ray() reads the Ray cluster this process is connected to: "
                          "call ray.init first")
    slots = ray_slots(ray.nodes())
    if not slots:
        raise ConfigError("the Ray cluster has no live nodes")
    return cls(workers=tuple(Worker(name=name, memory_bytes=mem, flops_per_s=flops_per_s) for name, _, mem in slots),
               network=RAY_ACTORS)


def spark_slots(sc) -> int:
    """How many tasks a SparkContext runs at once: what one barrier stage may ask for."""
    cpus = int(sc.getConf().get("spark.task.cpus", "1") or 1)
    return max(1, sc.defaultParallelism // max(1, cpus))


def spark_bytes(text: str) -> int:
    """A Spark memory setting ("2g", "512m", "1024": MiB) in bytes."""
    t = text.strip().lower().removesuffix("b")
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    if t and t[-1] in units:
        return int(float(t[:-1]) * units[t[-1]])
    return int(float(t)) << 20


def _from_spark(cls, session, flops_per_s: float = DEFAULT_FLOPS_PER_S) -> "Resources":
    """The task slots of a SparkSession's executors, one worker each, named ``host/k``,
    with their share of the memory where the rows live: on a local master the machine's
    available memory, else ``spark.executor.pyspark.memory`` (the Python workers' limit;
    unknown when unset)."""
    sc = session.sparkContext
    conf = sc.getConf()
    slots = spark_slots(sc)
    status = sc._jsc.sc().getExecutorMemoryStatus()
    keys, it = [], status.keysIterator()
    while it.hasNext():
        keys.append(str(it.next()).rsplit(":", 1)[0])
    local = sc.master.startswith("local")
    hosts = sorted(keys) or ["localhost"]
    if not local and len(hosts) > 1:  # the driver is listed too, and runs no tasks
        hosts = [h for h in hosts if h != conf.get("spark.driver.host")] or hosts
    per_host = max(1, -(-slots // len(hosts)))
    if local:
        mem = available_memory_bytes()
        share = None if mem is None else mem // slots
    else:
        py = conf.get("spark.executor.pyspark.memory")
        cores = int(conf.get("spark.executor.cores", str(per_host)) or per_host)
        share = spark_bytes(py) // max(1, cores) if py else None
    workers = [Worker(name=f"{h}/{k}", memory_bytes=share, flops_per_s=flops_per_s)
               for h in hosts for k in range(per_host)][:slots]
    return cls(workers=tuple(workers), network=SPARK_TASKS)


Resources.from_dask = classmethod(_from_dask)
Resources.from_spark = classmethod(_from_spark)
Resources.from_ray = classmethod(_from_ray)
