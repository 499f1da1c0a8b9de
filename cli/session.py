"""Turns a validated RunConfig into the objects a run needs: model, data, resources, solver."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from emgrid.models import Node, Ragged, complete_shapes, concat_rows, from_spec, load_model
from emgrid.models.errors import ConfigError, DataError
from emgrid.models.files import load_npy, load_npz
from emgrid.models.tables import FILE_SUFFIXES, Table, bind

from .config import RunConfig


def build_model(cfg: RunConfig) -> Node:
    """The config's model; when its data are a table, every ``Categorical`` without a value
    list takes its column's (``models.tables.bind``: only those columns are read)."""
    if cfg.model.spec is not None:
        path = cfg.resolve(cfg.model.spec)
        if not path.exists():
            raise ConfigError(f"[model] spec file {str(path)!r} does not exist")
        model = load_model(path)
    else:
        model = from_spec(cfg.model.inline)
    tables = _tables(cfg)
    if tables and spark_table(cfg) is None:  # Spark binds a Parquet file it reads itself
        try:
            model = bind(model, tables[0])
        except DataError as e:
            raise DataError(f"[data] {e}") from None
    return model


def _tables(cfg: RunConfig) -> list[Table]:
    """The config's data files that are tables, with its ``drop_missing`` and ``sequence_id``."""
    d = cfg.data
    paths = [d.path] if d.path is not None else list(d.paths or [])
    out = [Table(str(cfg.resolve(p)), sequence_id=d.sequence_id, drop_missing=d.drop_missing)
           for p in paths if Path(p).suffix.lower() in FILE_SUFFIXES]
    if (d.sequence_id is not None or d.drop_missing) and len(out) != len(paths):
        raise ConfigError("[data] sequence_id and drop_missing apply to .parquet and .csv files only")
    return out


def spark_table(cfg: RunConfig) -> Table | None:
    """The config's one ``.parquet`` file when the spark executor runs it: read by Spark
    (``executors.spark_data``), its rows going from its partitions to the tasks."""
    tables = _tables(cfg)
    if cfg.executor.kind != "spark" or len(tables) != 1 or (cfg.data.paths is not None and len(cfg.data.paths) != 1):
        return None
    return tables[0] if str(tables[0].source).lower().endswith(".parquet") else None


def table_dataset(cfg: RunConfig, model: Node, directory):
    """The config's one ``.parquet`` / ``.csv`` file as a dataset whose workers read only
    their rows (``NpyDataset.from_table``), or None when the data are something else."""
    from emgrid.executors import NpyDataset

    tables = _tables(cfg)
    if len(tables) != 1 or cfg.data.paths is not None and len(cfg.data.paths) != 1 or tables[0].drop_missing:
        return None
    return NpyDataset.from_table(tables[0], model, directory)


def _load_file(path: Path, cfg: RunConfig, model: Node):
    if not path.exists():
        raise ConfigError(f"[data] file {str(path)!r} does not exist")
    if path.suffix.lower() in FILE_SUFFIXES:
        d = cfg.data
        return model.prepare(Table(str(path), sequence_id=d.sequence_id, drop_missing=d.drop_missing))
    if path.suffix == ".npy":
        return load_npy(path)
    if path.suffix == ".npz":
        return load_npz(path)
    raise ConfigError(f"[data] file {str(path)!r} must be .npy, .npz, .parquet or .csv")


def row_shapes(data) -> list:
    """The shape of one row of every column (a signature two parts of one dataset share)."""
    if data is None:
        return [None]
    if isinstance(data, tuple):
        return [("tuple", len(data))] + [s for d in data for s in row_shapes(d)]
    if isinstance(data, Ragged):
        return [("ragged",)] + row_shapes(data.values)
    return [tuple(np.shape(data)[1:])]


def _shape_text(part) -> str:
    shapes = [s for s in row_shapes(part) if not (isinstance(s, tuple) and s and isinstance(s[0], str))]
    return ", ".join(str(s) for s in shapes) if len(shapes) > 1 else str(shapes[0])


def build_data(cfg: RunConfig, model: Node):
    """Prepared data (validated against the model) and its row count."""
    d = cfg.data
    if d.synthetic is not None:
        truth = model
        if isinstance(d.truth, str):
            truth = load_model(cfg.resolve(d.truth))
        elif isinstance(d.truth, dict):
            truth = from_spec(d.truth)
        if truth.is_template:
            path, name = truth.unset_fields()[0]
            raise ConfigError(f"[data] synthetic = {d.synthetic} samples from a complete model, but "
                              f"{'the truth' if d.truth is not None else 'the model'} is a template "
                              f"({truth.node_at(path).family}.{name} at path {path or '<root>'!r} is unset); "
                              f"give [data] truth = a complete spec (file or inline table)")
        if truth.data_type() != model.data_type():
            raise ConfigError(f"[data] truth reads {truth.data_type()} but the model reads {model.data_type()}")
        raw = truth.sample(d.synthetic, np.random.default_rng(d.seed))
    else:
        paths = [d.path] if d.path is not None else list(d.paths)
        if not paths:
            raise ConfigError("[data] paths is empty")
        _tables(cfg)
        try:
            parts = [_load_file(cfg.resolve(p), cfg, model) for p in paths]
        except DataError as e:
            raise DataError(f"[data] {e}") from None
        for p, part in zip(paths[1:], parts[1:]):
            if row_shapes(part) != row_shapes(parts[0]):
                raise DataError(f"[data] paths: {p!r} has rows of shape {_shape_text(part)}, "
                                f"{paths[0]!r} of shape {_shape_text(parts[0])}; every file must hold rows of one kind")
        raw = parts[0] if len(parts) == 1 else concat_rows(parts)
    try:
        return model.prepare(raw)
    except DataError as e:
        raise DataError(f"[data] {e}") from None


def shaped_model(cfg: RunConfig, model: Node) -> tuple[Node, int]:
    """The model with the sizes the data decide filled in (``models.complete_shapes``) and
    the rows the run fits; the data are read (or sampled) only when a size needs them."""
    from emgrid.models.init import data_shapes_unset

    if cfg.data.synthetic is not None and not data_shapes_unset(model):
        return model, cfg.data.synthetic
    data = build_data(cfg, model)
    from emgrid.models import n_rows

    return complete_shapes(model, data), n_rows(data)


def dropped_rows(cfg: RunConfig, model: Node):
    """The mask of the rows ``[data] drop_missing`` leaves out of the config's one table
    (None when it drops nothing or does not apply), so that a fit can say which."""
    d = cfg.data
    tables = _tables(cfg)
    if not d.drop_missing or len(tables) != 1:
        return None
    from .badrows import missing_mask

    mask = missing_mask(model, tables[0].source, d.sequence_id)
    return mask if mask.any() else None


def spec_files(path: Path) -> list[Path]:
    """A model spec file and, for a sharded root (``models.sharded``), the shard files it names."""
    import json

    from emgrid.models.sharded import is_sharded

    files = [Path(path)]
    if not Path(path).is_file() or Path(path).stat().st_size > 2**26:  # what load_model refuses, it refuses
        return files
    try:
        spec = json.loads(Path(path).read_text())
    except (OSError, ValueError, RecursionError):
        return files
    if is_sharded(spec):
        for entry in spec.get("shards") or []:
            name = entry.get("file") if isinstance(entry, dict) else None
            if isinstance(name, str):
                files.append(Path(path).parent / name)
    return files


def config_inputs(cfg: RunConfig, config_path) -> list[tuple[str, Path]]:
    """Every file a run of ``cfg`` reads, as ``(what, path)``: the config itself, the model
    spec (and its shard files), the data files, the synthetic data's truth and the
    resources file. An output that is one of them is refused (``cli.outdir.refuse_inputs``)."""
    out: list[tuple[str, Path]] = [("the config", Path(config_path))]
    if cfg.model.spec is not None:
        out += [("the [model] spec", p) for p in spec_files(cfg.resolve(cfg.model.spec))]
    d = cfg.data
    for p in [d.path] if d.path is not None else list(d.paths or []):
        out.append(("the [data] file", cfg.resolve(p)))
    if isinstance(d.truth, str):
        out += [("the [data] truth", p) for p in spec_files(cfg.resolve(d.truth))]
    if cfg.resources.file is not None:
        out.append(("the [resources] file", cfg.resolve(cfg.resources.file)))
    return out


def build_resources(cfg: RunConfig):
    """The config's resources; under the MPI executor the rank of cell (0, 0) also
    coordinates (``Resources.coordinator_in_grid``), whatever the resources' source."""
    res = _config_resources(cfg)
    if cfg.executor.kind == "mpi" and not res.coordinator_in_grid:
        res = res.model_copy(update={"coordinator_in_grid": True})
    return res


def _cluster_resources(cfg: RunConfig, engine: str):
    """The workers of the ``[executor]``'s Dask, Ray or Spark cluster as that engine reports them."""
    from emgrid.executors import get

    if cfg.executor.kind != engine:
        raise ConfigError(f"[resources] detect = {engine!r} needs [executor] kind = {engine!r}, "
                          f"got {cfg.executor.kind!r}")
    options = {k: v for k, v in cfg.executor.executor_options().items() if k in ("address", "master")}
    return get(engine, **options).default_resources()


def _config_resources(cfg: RunConfig):
    from emgrid.planner import Network, Resources
    from emgrid.planner.resources import DEFAULT_FLOPS_PER_S

    r = cfg.resources
    flops = r.flops_per_s or DEFAULT_FLOPS_PER_S
    if r.file is not None:
        return Resources.from_file(cfg.resolve(r.file))
    if r.detect == "mpi":
        return Resources.from_mpi(flops_per_s=flops)
    if r.detect in ("dask", "ray", "spark"):
        return _cluster_resources(cfg, r.detect)
    workers = r.workers or cfg.executor.processes
    if r.detect == "local" or (workers is None and r.memory is None):
        res = Resources.local(workers, flops_per_s=flops)
        if r.memory is None and r.latency_s is None and r.bytes_per_s is None:
            return res
        workers = res.n_workers
    net = Network(**{k: v for k, v in {"latency_s": r.latency_s, "bytes_per_s": r.bytes_per_s}.items() if v is not None})
    return Resources.uniform(workers or 1, memory_bytes=r.memory, flops_per_s=flops, network=net)


def build_solver(cfg: RunConfig):
    from emgrid.planner import SolverConfig

    s = cfg.solver
    return SolverConfig(**{k: v for k, v in s.model_dump().items() if v is not None})
