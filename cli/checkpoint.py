"""Checkpoints: the model and the trace so far, written atomically (temp file + rename)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from emgrid.models import Node, from_spec
from emgrid.models.errors import ConfigError

CHECKPOINT = "checkpoint.json"


def write_checkpoint(folder: Path, iteration: int, model: Node, trace: list[float]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    payload = json.dumps({"iteration": iteration, "model": model.to_spec(), "log_likelihood": list(trace)})
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".checkpoint-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, folder / CHECKPOINT)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return folder / CHECKPOINT


def read_checkpoint(folder: Path) -> tuple[int, Node, list[float]]:
    path = folder / CHECKPOINT
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"--resume: no checkpoint at {str(path)!r}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"--resume: checkpoint {str(path)!r} is damaged: {e.msg}") from None
    return int(raw["iteration"]), from_spec(raw["model"]), [float(x) for x in raw["log_likelihood"]]
