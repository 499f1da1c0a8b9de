"""Config parsing: valid files load, every bad one fails with one ConfigError line."""

import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from emgrid.cli.config import load_config, parse_config, parse_memory
from emgrid.models.errors import ConfigError

GOOD = """
[model]
inline = { family = "Gaussian", mean = 0.0, var = 1.0 }

[data]
synthetic = 100

[resources]
workers = 2
memory = "8GiB"

[executor]
kind = "local"

[fit]
max_iter = 5
"""


def write(tmp_path, text):
    p = tmp_path / "run.toml"
    p.write_text(text)
    return p


def test_good_config_loads(tmp_path):
    cfg = load_config(write(tmp_path, GOOD))
    assert cfg.resources.memory == 8 * 1024**3
    assert cfg.executor.kind == "local"
    assert cfg.fit.max_iter == 5


@pytest.mark.parametrize(
    "text, words",
    [
        (GOOD.replace("max_iter = 5", "max_iters = 5"), ["unknown key", "fit.max_iters", "line"]),
        (GOOD.replace('kind = "local"', 'kind = "flink"'), ["executor.kind", "flink"]),
        (GOOD.replace('memory = "8GiB"', 'memory = "eight"'), ["memory", "eight"]),
        (GOOD.replace('memory = "8GiB"', 'memory = -3'), ["memory", "-3"]),
        (GOOD.replace("workers = 2", "workers = 0"), ["resources.workers", "0"]),
        (GOOD.replace("max_iter = 5", 'max_iter = "five"'), ["fit.max_iter", "five"]),
        (GOOD.replace("[data]\nsynthetic = 100", "[data]"), ["[data]", "exactly one"]),
        (GOOD.replace("[model]\n", "[modle]\n"), ["modle"]),
        ("this is = = not toml", ["not valid TOML"]),
        (GOOD.replace('kind = "local"', 'kind = "local"\ntimeout_s = 5'), ["timeout_s=5", "not local"]),
        (GOOD.replace('kind = "local"', 'kind = "mpi"\ntimeout_s = 0'), ["executor.timeout_s", "0"]),
    ],
    ids=["unknown-key", "bad-executor", "memory-unparsable", "memory-negative", "zero-workers",
         "wrong-type", "no-data-source", "misspelt-section", "not-toml", "timeout-on-local", "timeout-zero"],
)
def test_bad_config_names_the_problem(tmp_path, text, words):
    with pytest.raises(ConfigError) as e:
        load_config(write(tmp_path, text))
    msg = str(e.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, (w, msg)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "nope.toml")


@pytest.mark.parametrize("text, expected", [("8GiB", 8 * 2**30), ("512 MB", 512 * 10**6), ("1.5g", 1_500_000_000),
                                            (1024, 1024), ("2kib", 2048)])
def test_parse_memory(text, expected):
    assert parse_memory(text) == expected


toml_scalars = st.one_of(st.integers(-5, 10**6), st.floats(allow_nan=False, allow_infinity=False), st.booleans(),
                         st.text(string.ascii_letters + string.digits + " .", max_size=8))
keys = st.sampled_from(["model", "data", "resources", "executor", "fit", "solver", "spec", "inline", "synthetic",
                        "workers", "memory", "kind", "max_iter", "tol", "seed", "path", "paths", "detect",
                        "time_limit_s", "checkpoint_every", "junk"])
tables = st.recursive(toml_scalars, lambda inner: st.dictionaries(keys, inner, max_size=4), max_leaves=12)


@given(st.dictionaries(keys, tables, max_size=6))
def test_any_parsed_toml_validates_or_fails_cleanly(raw):
    try:
        parse_config(raw)
    except ConfigError as e:
        assert str(e) and "\n" not in str(e)


@pytest.mark.parametrize("kind, coordinates", [("local", False), ("multiprocessing", False), ("mpi", True)])
def test_under_mpi_the_plan_counts_the_coordinating_worker(tmp_path, kind, coordinates):
    """The MPI executor's rank of cell (0, 0) also runs the M-step; the others run it apart."""
    from emgrid.cli.session import build_resources

    cfg = load_config(write(tmp_path, GOOD.replace('kind = "local"', f'kind = "{kind}"')))
    assert build_resources(cfg).coordinator_in_grid is coordinates
