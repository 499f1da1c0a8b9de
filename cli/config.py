"""The TOML run configuration, read into pydantic models that reject unknown keys.

```toml
[model]              # spec = "model.json", or an inline spec table: [model.inline] family = ...
                     # (a template, with parameters left out, is filled from the data)
[data]               # paths = ["x.npz"] | path = "x.npy" | synthetic = 10000 (sampled from `truth`, default the model)
                     # path = "x.parquet" | "x.csv" (columns by name; drop_missing, sequence_id)
[resources]          # workers = 4, memory = "8GiB", flops_per_s = 2e9 | detect = "local" | "mpi" | "dask" | "ray" | "spark"
[executor]           # kind = "local" | "multiprocessing" | "mpi" | "dask" | "ray" | "spark" (master = "local[2]"), processes = 2 (as [resources] workers),
                     # blas_threads = 1 (per worker; "inherit" leaves the environment's), timeout_s,
                     # on_worker_loss = "fail" | "replan", max_replans = 3, grow_threshold = 0.2
[fit]                # max_iter, tol, checkpoint_every, output; for a template: n_init, seed,
                     # init = "auto" | "kmeans" | "random", init_iter; reg_covar, pseudo_count;
                     # dtype = "float64" | "float32" (the data and the E-step; sums stay float64)
[solver]             # time_limit_s, relative_gap, seed, num_workers
```
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, field_validator, model_validator

from emgrid.models.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
          "t": 1000**4, "tb": 1000**4, "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}


def parse_memory(value) -> int:
    """``"8GiB"``, ``"512 MB"``, ``"1.5g"`` or a number of bytes -> bytes (> 0)."""
    if isinstance(value, bool):
        raise ValueError(f"memory must be a size such as '8GiB', got {value!r}")
    if isinstance(value, (int, float)):
        n = float(value)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", str(value))
        if not m or m.group(2).lower() not in _UNITS:
            raise ValueError(f"memory must be a size such as '8GiB' or '512MB', got {value!r}")
        n = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not 0 < n < float("inf"):
        raise ValueError(f"memory must be a finite size > 0, got {value!r}")
    return int(n)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSection(_Strict):
    spec: str | None = None
    inline: dict | None = None


class DataSection(_Strict):
    path: str | None = None
    paths: list[str] | None = None
    synthetic: int | None = Field(default=None, gt=0)
    seed: int = 0
    truth: str | dict | None = None  # spec path or inline spec to sample synthetic rows from
    #: a table's rows with a missing value are dropped (a warning says how many), not refused
    drop_missing: bool = False
    #: a table's column whose runs of equal values are the sequences of an HMM or Sequence
    sequence_id: str | None = Field(default=None, min_length=1)


class ResourcesSection(_Strict):
    workers: int | None = Field(default=None, ge=1)
    memory: int | None = None
    flops_per_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    latency_s: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    bytes_per_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    #: read the workers from this machine, the MPI job, or the Dask/Ray cluster of ``[executor]``
    detect: Literal["local", "mpi", "dask", "ray", "spark"] | None = None
    file: str | None = None

    @field_validator("memory", mode="before")
    @classmethod
    def _memory(cls, v):
        return None if v is None else parse_memory(v)


class ExecutorSection(_Strict):
    kind: Literal["local", "multiprocessing", "mpi", "dask", "ray", "spark"] = "local"
    #: the cluster of the dask or ray executor (a scheduler address, ``"auto"`` or
    #: ``"ray://host:port"``); none: a local cluster started for the run and closed after
    address: str | None = None
    #: the Spark master of the spark executor's session, started for the run and stopped
    #: after (default ``"local[2]"``)
    master: str | None = None
    #: what a lost worker does to the fit: "fail" ends it (checkpoint, exit 3), "replan"
    #: re-plans on the workers left and goes on, up to max_replans times (not mpi)
    on_worker_loss: Literal["fail", "replan"] = "fail"
    max_replans: int = Field(default=3, ge=0)
    #: with "replan": the share by which a plan on workers a Dask or Ray cluster gained must
    #: beat the running one's predicted iteration time for the fit to move onto them
    grow_threshold: float = Field(default=0.2, ge=0, lt=1)
    #: worker count, another name for ``[resources] workers`` (both given: they must agree)
    processes: int | None = Field(default=None, ge=1)
    #: seconds a worker may take to reach the end of an iteration before the fit stops
    #: naming it (multiprocessing and mpi; none by default)
    timeout_s: float | None = Field(default=None, gt=0)
    #: BLAS and OpenMP threads per worker while the fit runs (``executors.threads``);
    #: ``"inherit"`` leaves them as the environment sets them
    blas_threads: StrictInt | Literal["inherit"] = Field(default=1)

    @field_validator("blas_threads")
    @classmethod
    def _threads(cls, v):
        if not isinstance(v, str) and v < 1:
            raise ValueError(f"blas_threads must be an integer >= 1 or \"inherit\", got {v!r}")
        return v

    def executor_options(self) -> dict:
        """The options of ``executors.get(kind, ...)`` this section sets."""
        options = {"blas_threads": None if self.blas_threads == "inherit" else self.blas_threads}
        if self.timeout_s is not None:
            options["timeout_s"] = self.timeout_s
        if self.address is not None:
            options["address"] = self.address
        if self.master is not None:
            options["master"] = self.master
        return options

    @model_validator(mode="after")
    def _timeout_needs_workers(self):
        if self.timeout_s is not None and self.kind == "local":
            raise ValueError(f"timeout_s={self.timeout_s} applies to the executors with workers to wait for "
                             "(multiprocessing, mpi, dask, ray, spark), not local")
        if self.address is not None and self.kind not in ("dask", "ray"):
            raise ValueError(f"address={self.address!r} applies to the dask and ray executors, not {self.kind}")
        if self.on_worker_loss == "replan" and self.kind in ("local", "mpi"):
            raise ValueError(f"on_worker_loss = \"replan\" applies to the executors whose workers can be lost and "
                             f"replaced (multiprocessing, dask, ray, spark), not {self.kind}")
        if self.master is not None and self.kind != "spark":
            raise ValueError(f"master={self.master!r} applies to the spark executor, not {self.kind}")
        return self


class FitSection(_Strict):
    max_iter: int = Field(default=100, ge=1)
    tol: float = Field(default=1e-6, ge=0)
    #: a template's starts: how many, their seed, how they are seeded, EM iterations each
    n_init: int = Field(default=1, ge=1)
    seed: int = Field(default=0, ge=0)
    init: Literal["auto", "kmeans", "random"] = "auto"
    init_iter: int = Field(default=10, ge=1)
    #: M-step regularization (``models.regularize``); 0 keeps the floors alone
    reg_covar: float = Field(default=0.0, ge=0)
    pseudo_count: float = Field(default=0.0, ge=0)
    #: the float type of the data the workers hold and of the E-step (``optimize``'s ``dtype``)
    dtype: Literal["float64", "float32"] = "float64"
    checkpoint_every: int = Field(default=0, ge=0)
    output: str = "emgrid-out"


class SolverSection(_Strict):
    time_limit_s: float | None = Field(default=None, gt=0)
    relative_gap: float | None = Field(default=None, ge=0)
    seed: int | None = None
    num_workers: int | None = Field(default=None, ge=1)


class RunConfig(_Strict):
    model: ModelSection
    data: DataSection
    resources: ResourcesSection = ResourcesSection()
    executor: ExecutorSection = ExecutorSection()
    fit: FitSection = FitSection()
    solver: SolverSection = SolverSection()
    base_dir: str = "."  # folder relative paths are read from (the config's folder)

    def resolve(self, path: str) -> Path:
        p = Path(path)
        return p if p.is_absolute() else Path(self.base_dir) / p


def _line_of(text: str, loc: tuple) -> int | None:
    """Best-effort line number of the key a pydantic error points at."""
    section = None
    for i, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if s.startswith("["):
            section = s.strip("[] ").split(".")[0]
        elif loc and section == str(loc[0]) and len(loc) > 1 and re.match(rf"{re.escape(str(loc[1]))}\s*=", s):
            return i
        elif loc and len(loc) == 1 and s.startswith(f"[{loc[0]}"):
            return i
    return None


def load_config(path) -> RunConfig:
    """Reads and validates a config file; every problem is one ConfigError line."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read config {str(p)!r}: {e.strerror}") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{p}: not valid TOML: {e}") from None
    except RecursionError:
        raise ConfigError(f"{p}: nested too deep to read (an inline spec deeper than a model may be)") from None
    return parse_config(raw, text=text, name=str(p), base_dir=str(p.parent))


def parse_config(raw: dict, *, text: str = "", name: str = "<config>", base_dir: str = ".") -> RunConfig:
    if not isinstance(raw, dict):
        raise ConfigError(f"{name}: a config must be a TOML table")
    try:
        cfg = RunConfig.model_validate({**raw, "base_dir": base_dir})
    except ValidationError as e:
        errs = e.errors()
        err = next((x for x in errs if x["type"] == "extra_forbidden"), errs[0])
        loc = tuple(err["loc"])
        where = ".".join(str(x) for x in loc) or "<root>"
        line = _line_of(text, loc)
        at = f" (line {line})" if line else ""
        if err["type"] == "extra_forbidden":
            msg = f"unknown key {where!r}{at}"
        elif err["type"] == "missing":
            msg = f"missing required section or key {where!r}"
        else:
            msg = f"{where} = {err.get('input')!r}{at}: {err['msg'].removeprefix('Value error, ')}"
        raise ConfigError(f"{name}: {msg}") from None
    if "base_dir" in raw:
        raise ConfigError(f"{name}: unknown key 'base_dir'")
    sources = [cfg.model.spec is not None, cfg.model.inline is not None]
    if sum(sources) != 1:
        raise ConfigError(f"{name}: [model] needs exactly one of 'spec' (a JSON file) or 'inline' (a spec table)")
    data_sources = [cfg.data.path is not None, cfg.data.paths is not None, cfg.data.synthetic is not None]
    if sum(data_sources) != 1:
        raise ConfigError(f"{name}: [data] needs exactly one of 'path', 'paths' or 'synthetic'")
    check_worker_count(cfg, name)
    return cfg


def check_worker_count(cfg: RunConfig, name: str = "<config>") -> None:
    """``[executor] processes`` names the worker count as ``[resources] workers`` does; given
    with a different ``workers``, or with resources that decide the count themselves (a
    file, an MPI job), it would be ignored: a ConfigError naming both instead."""
    processes, r = cfg.executor.processes, cfg.resources
    if processes is None:
        return
    if r.workers is not None and r.workers != processes:
        raise ConfigError(f"{name}: [executor] processes = {processes} disagrees with [resources] workers = "
                          f"{r.workers}; give one of them, or both alike")
    if r.file is not None:
        raise ConfigError(f"{name}: [executor] processes = {processes} conflicts with [resources] file = "
                          f"{r.file!r}, which lists the workers; remove one of them")
    if r.detect == "mpi":
        raise ConfigError(f"{name}: [executor] processes = {processes} conflicts with [resources] detect = 'mpi' "
                          f"(the MPI job's ranks are the workers); remove one of them")
