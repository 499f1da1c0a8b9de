"""The family contract: schemas, specs, parameter counts, batched kernels, the statistics
accumulator and the import structure of ``models/``."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given

from emgrid.models import (FAMILIES, HMM, Categorical, Composite, DiagGaussian, Exponential, FullGaussian, Gaussian,
                           Internal, Leaf, Mixture, Poisson, Sequence, Stats, from_spec)
from emgrid.models.engine import e_step
from emgrid.models.schema import Children, Param
from emgrid.models.stats import StatsAccumulator
from emgrid.models.support import Interval, leaf_accumulate, leaf_log_density, leaf_rows, outside

from tests import strategies as S

MODELS_DIR = Path(__file__).resolve().parents[2] / "models"

G = Gaussian(0.5, 2.0)
DG = DiagGaussian([0.0, 1.0, 2.0], [1.0, 2.0, 3.0])
FG = FullGaussian([0.0, 1.0], [[2.0, 0.5], [0.5, 1.0]])
CAT = Categorical([0.25, 0.25, 0.5])
POI = Poisson(3.0)
EXP = Exponential(0.5)


# ---------------------------------------------------------------- parameter counts
@pytest.mark.parametrize(("model", "count"), [
    (G, 2),  # mean, var
    (DG, 3 + 3),  # mean, diagonal
    (FG, 2 + 3),  # mean, d (d + 1) / 2
    (FullGaussian(np.zeros(4), np.eye(4)), 4 + 10),
    (CAT, 2),  # V - 1
    (POI, 1),
    (EXP, 1),
    (Mixture([G, Gaussian(1.0, 1.0), Gaussian(2.0, 1.0)], [0.2, 0.3, 0.5]), 2 + 3 * 2),
    (HMM([G, Gaussian(1.0, 1.0)], [[0.9, 0.1], [0.2, 0.8]], [0.5, 0.5], 4.0), 2 * 1 + 1 + 2 * 2),  # no mean_length
    (HMM([CAT, CAT, CAT], np.full((3, 3), 1 / 3), np.full(3, 1 / 3)), 3 * 2 + 2 + 3 * 2),
    (Sequence(POI, 7.0), 1),  # lengths are given: mean_length is not a free parameter
    (Composite([G, CAT, Sequence(DG, 2.0)]), 2 + 2 + 6),
    (Mixture([Composite([G, POI]), Composite([Gaussian(3.0, 1.0), Poisson(1.0)])], [0.5, 0.5]), 1 + 2 * 3),
], ids=lambda x: x if isinstance(x, int) else x.describe())
def test_n_parameters_matches_hand_counts(model, count):
    assert model.n_parameters() == count


# ---------------------------------------------------------------- schema and specs
def test_every_family_declares_its_fields_in_one_schema():
    for name, cls in FAMILIES.items():
        assert cls.schema, name
        assert cls.spec_fields == tuple(f.name for f in cls.schema)
        kids = [f for f in cls.schema if isinstance(f, Children)]
        assert len(kids) == (1 if issubclass(cls, Internal) else 0), name
        assert issubclass(cls, (Leaf, Internal))


def test_params_are_the_schemas_numeric_fields():
    for model in (G, DG, FG, CAT, POI, EXP, Sequence(G, 3.0),
                  HMM([G, G], np.full((2, 2), 0.5), [0.5, 0.5], 3.0), Mixture([G, G], [0.5, 0.5])):
        names = [f.name for f in model.schema if isinstance(f, Param)]
        assert list(model.params()) == names
        for v in model.params().values():
            assert v.dtype == np.float64 and not v.flags.writeable


SPECS = [
    (G, '{"family": "Gaussian", "mean": 0.5, "var": 2.0}'),
    (DG, '{"family": "DiagGaussian", "mean": [0.0, 1.0, 2.0], "var": [1.0, 2.0, 3.0]}'),
    (FG, '{"family": "FullGaussian", "mean": [0.0, 1.0], "cov": [[2.0, 0.5], [0.5, 1.0]]}'),
    (CAT, '{"family": "Categorical", "probs": [0.25, 0.25, 0.5]}'),
    (POI, '{"family": "Poisson", "rate": 3.0}'),
    (EXP, '{"family": "Exponential", "rate": 0.5}'),
    (Mixture([POI, Poisson(1.0)], [0.5, 0.5]),
     '{"family": "Mixture", "components": [{"family": "Poisson", "rate": 3.0}, {"family": "Poisson", "rate": 1.0}],'
     ' "weights": [0.5, 0.5]}'),
    (HMM([POI], [[1.0]], [1.0], 4.0),
     '{"family": "HMM", "emissions": [{"family": "Poisson", "rate": 3.0}], "transitions": [[1.0]],'
     ' "initial": [1.0], "mean_length": 4.0}'),
    (Sequence(EXP, 2.5), '{"family": "Sequence", "child": {"family": "Exponential", "rate": 0.5}, "mean_length": 2.5}'),
    (Composite([POI, EXP]),
     '{"family": "Composite", "children": [{"family": "Poisson", "rate": 3.0}, {"family": "Exponential", "rate": 0.5}]}'),
]


@pytest.mark.parametrize(("model", "text"), SPECS, ids=[m.family for m, _ in SPECS])
def test_specs_keep_their_json_format(model, text):
    """The keys, their order and the values of saved models (files written before stay loadable)."""
    assert json.dumps(model.to_spec()) == text
    assert json.dumps(from_spec(json.loads(text)).to_spec()) == text


def test_a_spec_may_omit_the_mean_length_which_the_data_then_give():
    """An omitted ``mean_length`` is unset: densities do not read it, and the fit (through
    ``complete_shapes``) takes the data's mean length."""
    from emgrid.models import complete_shapes

    seq = from_spec({"family": "Sequence", "child": POI.to_spec()})
    hmm = from_spec({"family": "HMM", "emissions": [POI.to_spec()], "transitions": [[1.0]], "initial": [1.0]})
    rows = [np.array([1, 2]), np.array([0, 1, 2, 3])]
    for node in (seq, hmm):
        assert node.mean_length is None and node.unset_fields() == [("", "mean_length")]
        assert np.all(np.isfinite(node.log_density(rows)))
        assert float(complete_shapes(node, node.prepare(rows)).mean_length) == 3.0


@given(m=S.models())
def test_every_tree_survives_its_spec_exactly(m):
    text = json.dumps(m.to_spec())
    assert json.dumps(from_spec(json.loads(text)).to_spec()) == text
    assert m.copy().n_parameters() == m.n_parameters()


# ---------------------------------------------------------------- batched kernels
SIBLINGS = [
    (Gaussian(0.0, 1.0), Gaussian(2.0, 0.5), Gaussian(-1.0, 3.0)),
    (DiagGaussian([0.0, 1.0], [1.0, 2.0]), DiagGaussian([3.0, -1.0], [0.5, 0.5])),
    (FullGaussian([0.0, 1.0], [[1.0, 0.3], [0.3, 2.0]]), FullGaussian([2.0, 0.0], [[0.5, 0.0], [0.0, 0.5]])),
    (FullGaussian(np.zeros(34), np.eye(34)), FullGaussian(np.ones(34), 2 * np.eye(34))),  # no feature block
    (Categorical([0.2, 0.8]), Categorical([0.6, 0.4])),
    (Categorical([0.2, 0.8]), Categorical([0.3, 0.3, 0.4])),  # different supports: the default kernel
    (Poisson(1.0), Poisson(5.0)),
    (Exponential(1.0), Exponential(0.2)),
]


@pytest.mark.parametrize("leaves", SIBLINGS, ids=lambda ls: f"{ls[0].describe()} x{len(ls)}")
def test_a_batched_kernel_agrees_with_its_leaves_alone(leaves):
    """The batched interface gives each leaf's own log density and statistics; offsets go in
    only where the kernel declares it adds them. Kernels see rows inside every leaf's
    support only (the engine's support rule sees to the others)."""
    cls = type(leaves[0])
    mix = Mixture(leaves, np.full(len(leaves), 1.0 / len(leaves)))
    x = mix.prepare(mix.sample(300, np.random.default_rng(3)))
    masks = [m for m in (outside(leaf, x) for leaf in leaves) if m is not None]
    if masks:
        x = x[~np.any(masks, axis=0)]
    work = cls.batch_prepare(leaves, x)
    alone = np.stack([leaf._log_density(x) for leaf in leaves])
    np.testing.assert_allclose(cls.batch_log_density(leaves, x, work, None), alone, rtol=1e-10, atol=1e-10)
    if cls.batch_takes_offsets:
        offsets = np.log(np.arange(1.0, len(leaves) + 1.0))
        np.testing.assert_allclose(cls.batch_log_density(leaves, x, work, offsets), alone + offsets[:, None],
                                   rtol=1e-10, atol=1e-10)
    assert (work is None) == (cls.batch_cost(leaves) is None)
    W = np.random.default_rng(4).random((len(leaves), x.shape[0]))
    for got, leaf, w in zip(cls.batch_accumulate(leaves, x, W, work), leaves, W):
        for a, b in zip(got, leaf._accumulate(x, w)):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-9)


@pytest.mark.parametrize("interval", [Interval(0), Interval(0, 3), Interval(0.0, open_low=True),
                                      Interval(-1.0, 2.0, open_low=True, open_high=True), Interval(high=5.0)])
def test_an_interval_finds_the_rows_outside_and_stands_in_for_them(interval):
    x = np.array([-3.0, -1.0, 0.0, 0.5, 2.0, 3.0, 5.0, 9.0])
    inside = np.array([(v > interval.low if interval.open_low else v >= interval.low)
                       and (v < interval.high if interval.open_high else v <= interval.high) for v in x])
    np.testing.assert_array_equal(interval.outside(x), ~inside)
    assert interval.outside(x[inside]) is None and interval.outside(x[:0]) is None
    filled = interval.stand_in(x, ~inside)
    assert interval.outside(filled) is None and np.array_equal(filled[inside], x[inside])
    codes = Interval(0, 3).stand_in(np.array([7, 1]), np.array([True, False]))
    assert codes.dtype == np.int64 and codes.tolist() == [0, 1]  # integer data keep their dtype


def test_the_support_rule_gives_rows_outside_no_density_and_no_weight():
    """Rows outside a leaf's support reach it from its siblings; the engine gives them log
    density -inf and weight 0, for a leaf alone and for a batch of one support."""
    x = np.array([0, 3, 1, 7, 2, 1])
    narrow = Categorical([0.2, 0.3, 0.5])
    rows = leaf_rows(narrow, x)
    out = rows.out
    assert out.tolist() == [False, True, False, True, False, False] and np.array_equal(outside(narrow, x), out)
    assert rows.data.tolist() == [0, 0, 1, 0, 2, 1]  # stand-ins inside the support where rows are outside
    ld = leaf_log_density(narrow, rows)
    assert np.all(np.isneginf(ld[out])) and np.array_equal(ld[~out], narrow.log_density(x[~out]))
    w = np.arange(1.0, 7.0)
    (counts,) = leaf_accumulate(narrow, rows, w)
    np.testing.assert_array_equal(counts, narrow.accumulate(x[~out], w[~out])[""][0])
    # a batch of one support inside a mixture whose other child reads the rest
    inner = Mixture([Categorical([0.2, 0.3, 0.5]), Categorical([0.6, 0.2, 0.2])], [0.5, 0.5])
    model = Mixture([inner, Poisson(2.0)], [0.5, 0.5])
    stats = model.accumulate(x)
    resp = model.predict_proba(x)[:, 0]
    assert np.all(resp[out] < 1e-300)  # clamped responsibilities, not exactly 0
    within = inner.predict_proba(x[~out])
    for k in range(2):
        want = np.bincount(x[~out], weights=resp[~out] * within[:, k], minlength=3)
        np.testing.assert_allclose(stats[f"0.{k}"][0], want, rtol=1e-12)


# ---------------------------------------------------------------- the statistics accumulator
def test_the_accumulator_sums_blocks_as_stats_add_does():
    model = Mixture([DG, DiagGaussian([1.0, 1.0, 1.0], [1.0, 1.0, 1.0])], [0.4, 0.6])
    data = model.prepare(model.sample(500, np.random.default_rng(0)))
    blocks = [model.accumulate(data[a:a + 100]) for a in range(0, 500, 100)]
    acc = StatsAccumulator()
    for b in blocks:
        acc.add(b)
    total = acc.result()
    by_add = blocks[0]
    for b in blocks[1:]:
        by_add = by_add + b
    assert set(total) == set(by_add)
    for key in total:
        for a, b in zip(total[key], by_add[key]):
            assert np.array_equal(a, b)  # the same sums in the same order
    assert e_step(model, data, rows_per_block=100)[0].allclose(total, rtol=0, atol=0)
    # the first part's arrays are copied, not added into
    first, again = model.accumulate(data[:100]), StatsAccumulator()
    again.add(first)
    again.add(blocks[1])
    assert np.array_equal(first["0"][1], blocks[0]["0"][1])


def test_stats_of_different_shards_add_by_union():
    a, b = Stats({"0": (1.0, np.ones(2))}), Stats({"1": (2.0,)})
    both = a + b
    assert set(both) == {"0", "1"} and both["1"] == (2.0,)
    assert sum([a, a]).allclose(Stats({"0": (2.0, 2 * np.ones(2))}))


# ---------------------------------------------------------------- import structure
def _module_imports(path: Path) -> tuple[set[str], list[str]]:
    """Sibling modules a module imports at run time, and imports inside functions."""
    tree = ast.parse(path.read_text())
    top: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            top.update([node.module] if node.module else [a.name for a in node.names])
    nested = [f"{path.name}:{n.lineno}" for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
              for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))]
    return top, nested


def test_models_imports_form_a_dag_without_function_level_imports():
    graph, nested = {}, []
    for path in sorted(MODELS_DIR.glob("*.py")):
        deps, inner = _module_imports(path)
        graph[path.stem] = {d.split(".")[0] for d in deps}
        nested += inner
    assert not nested, f"imports inside functions: {nested}"
    state: dict[str, int] = {}

    def visit(m, trail):
        if state.get(m) == 1:
            raise AssertionError(f"import cycle: {' -> '.join(trail + [m])}")
        if state.get(m) == 2:
            return
        state[m] = 1
        for d in sorted(graph.get(m, ())):
            visit(d, trail + [m])
        state[m] = 2

    for m in graph:
        visit(m, [])
    leaf_modules = {"tree", "units", "errors", "floors", "stats", "special"}
    for m in leaf_modules:
        assert graph[m] <= {"errors"}, (m, graph[m])
    for family in ("gaussian", "categorical", "poisson", "exponential", "mixture", "hmm", "sequence", "composite"):
        assert "engine" not in graph[family], family


def test_importing_models_loads_neither_planner_nor_executors_nor_ortools():
    code = ("import sys, emgrid.models; bad = [m for m in sys.modules if m.startswith(('ortools', "
            "'emgrid.planner', 'emgrid.executors'))]; print(bad); sys.exit(1 if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
