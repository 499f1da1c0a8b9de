"""Tables read by column name: named records, categorical value lists, missing values and
sequences from a long table, each against the positional encoding it must equal."""

from __future__ import annotations

import numpy as np
import pytest

from emgrid.models import (HMM, Categorical, Composite, DiagGaussian, Gaussian, Mixture, Poisson, Ragged, Sequence,
                           from_spec, load_model, save_model)
from emgrid.models.errors import DataError, ModelError
from emgrid.models.tables import Table, bind

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pcsv = pytest.importorskip("pyarrow.csv")

COLORS = ["red", "green", "blue"]


def record(mean=0.0):
    return Composite({"x": Gaussian(mean, 1.0), "color": Categorical([0.5, 0.3, 0.2], values=COLORS),
                      "pos": DiagGaussian([0.0, 1.0], [1.0, 2.0]), "n": Poisson(3.0)},
                     columns={"pos": ["px", "py"]})


def columns(n=50, seed=0):
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 3, n)
    cols = {"x": rng.normal(size=n), "color": np.array(COLORS, dtype=object)[codes], "px": rng.normal(size=n),
            "py": rng.normal(size=n), "n": rng.poisson(3, n), "unused": np.arange(n)}
    positional = (cols["x"], codes, np.column_stack([cols["px"], cols["py"]]), cols["n"])
    return cols, positional


def assert_same(a, b):
    if isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    elif isinstance(a, Ragged):
        np.testing.assert_array_equal(a.offsets, b.offsets)
        assert_same(a.values, b.values)
    else:
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_named_record_spec_round_trips_and_positional_spec_is_unchanged():
    m = record()
    spec = m.to_spec()
    assert spec["fields"] == ["x", "color", "pos", "n"] and spec["columns"] == {"pos": ["px", "py"]}
    assert from_spec(spec).to_spec() == spec
    assert from_spec(spec).data_type() == m.data_type()
    plain = Composite([Gaussian(0.0, 1.0), Poisson(2.0)])
    assert set(plain.to_spec()) == {"family", "children"}
    assert Composite({"a": Gaussian(), "b": Poisson()}).data_type() != Composite({"b": Gaussian(), "a": Poisson()}).data_type()


def test_named_record_refuses_bad_names():
    with pytest.raises(ModelError, match="'a' twice"):
        Composite([Gaussian(), Gaussian()], fields=["a", "a"])
    with pytest.raises(ModelError, match="'z'"):
        Composite({"a": DiagGaussian(dim=2)}, columns={"z": ["p", "q"]})
    with pytest.raises(ModelError, match="needs named fields"):
        Composite([Gaussian()], columns={"a": ["b"]})


@pytest.mark.parametrize("kind", ["dict", "pyarrow", "pandas", "parquet", "csv"])
def test_every_kind_of_table_gives_the_positional_data(kind, tmp_path):
    cols, positional = columns()
    table = pa.table(cols)
    if kind == "dict":
        src = cols
    elif kind == "pyarrow":
        src = table
    elif kind == "pandas":
        pd = pytest.importorskip("pandas")
        src = pd.DataFrame(cols)
    elif kind == "parquet":
        src = tmp_path / "t.parquet"
        pq.write_table(table, src, row_group_size=7)
    else:
        src = tmp_path / "t.csv"
        pcsv.write_csv(table, src)
    model = Mixture([record(0.0), record(2.0)], [0.5, 0.5])
    assert_same(model.prepare(src), model.prepare(positional))
    assert np.allclose(model.log_density(src), model.log_density(positional))


def test_a_table_needs_named_fields_and_its_columns():
    cols, _ = columns()
    with pytest.raises(DataError, match="positional fields"):
        Composite([Gaussian(0.0, 1.0)]).prepare(cols)
    with pytest.raises(DataError, match="no column 'y'"):
        Composite({"y": Gaussian(0.0, 1.0)}).prepare(cols)


@pytest.mark.parametrize("values, column", [
    (["b", "a", "c"], ["c", "a", "a", "b"]),
    ([10, -3, 7], [7, 7, -3, 10]),
    ([True, False], [False, True, True, False]),
])
def test_categorical_values_of_any_type_encode_once_and_round_trip(values, column, tmp_path):
    template = Composite({"v": Categorical(), "x": Gaussian()})
    data = {"v": np.array(column, dtype=object), "x": np.linspace(0, 1, len(column))}
    bound = bind(template, data)
    assert list(bound.children[0].values) == sorted(set(column))
    fitted = Composite({"v": Categorical(np.full(len(values), 1 / len(values)), values=values), "x": Gaussian(0., 1.)})
    save_model(fitted, tmp_path / "m.json")
    again = load_model(tmp_path / "m.json")
    assert again.children[0].values == tuple(values) and again.to_spec() == fitted.to_spec()
    codes = again.prepare(data)[0]
    np.testing.assert_array_equal(codes, [values.index(v) for v in column])
    with pytest.raises(DataError, match=r"column 'v': value .*99.* was not seen"):
        again.prepare({"v": np.array([column[0], 99], dtype=object), "x": np.zeros(2)})


def test_predict_on_new_data_uses_the_fitted_codes():
    model = Mixture([Composite({"c": Categorical([0.9, 0.1], values=["u", "v"])}),
                     Composite({"c": Categorical([0.1, 0.9], values=["u", "v"])})], [0.5, 0.5])
    np.testing.assert_array_equal(model.predict({"c": np.array(["v", "u", "v"])}), [1, 0, 1])
    np.testing.assert_array_equal(model.predict({"c": np.array(["u"])}), [0])


def test_categorical_floats_only_when_integral_and_codes_kept_when_in_range():
    t = Composite({"v": Categorical()})
    with pytest.raises(DataError, match="column 'v'.*0.5"):
        bind(t, {"v": np.array([1.0, 0.5])})
    assert bind(t, {"v": np.array([3.0, 1.0])}).children[0].values == (1, 3)
    sized = bind(Composite({"v": Categorical(n_values=4)}), {"v": np.array([0, 3, 3])})
    assert sized.children[0].values == (0, 1, 2, 3)
    with pytest.raises(ModelError, match="distinct"):
        Categorical(values=["a", "a"])
    with pytest.raises(ModelError, match="2 value"):
        Categorical([0.2, 0.3, 0.5], values=["a", "b"])


@pytest.mark.parametrize("kind", ["nan", "null", "csv-empty"])
def test_missing_values_are_refused_naming_column_and_row_or_dropped(kind, tmp_path):
    x = np.arange(8, dtype=np.float64)
    c = np.array(list("abababab"), dtype=object)
    if kind == "nan":
        x[5] = np.nan
        src, col = {"x": x, "c": c}, "x"
    elif kind == "null":
        src, col = pa.table({"x": x, "c": pa.array([*c[:5], None, *c[6:]])}), "c"
    else:
        path = tmp_path / "t.csv"
        path.write_text("x,c\n" + "".join(f"{v:g},{'' if i == 5 else c[i]}\n" for i, v in enumerate(x)))
        src, col = path, "c"
    model = Composite({"x": Gaussian(), "c": Categorical(values=["a", "b"])})
    with pytest.raises(DataError, match=rf"column '{col}' has a missing value .* at row 5"):
        model.prepare(src)
    with pytest.warns(UserWarning, match="dropped 1 of 8 rows"):
        kept = model.prepare(Table(src, drop_missing=True))
    np.testing.assert_array_equal(kept[0], np.delete(np.arange(8.0), 5))


def test_long_table_grouped_by_id_equals_the_ragged():
    rows = [np.array([0.1, 0.5]), np.array([2.0]), np.array([1.0, 1.5, -1.0])]
    cats = [np.array([0, 1]), np.array([1]), np.array([0, 0, 1])]
    ids = np.repeat(np.array(["u7", "u2", "u9"], dtype=object), [2, 1, 3])
    table = {"user": ids, "x": np.concatenate(rows), "c": np.array(["a", "b"], dtype=object)[np.concatenate(cats)]}
    emission = lambda m: Composite({"x": Gaussian(m, 1.0), "c": Categorical([0.5, 0.5], values=["a", "b"])})  # noqa: E731
    for model in [Sequence(emission(0.0), 2.0), HMM([emission(0.0), emission(1.0)], [[0.9, 0.1], [0.2, 0.8]], [0.5, 0.5])]:
        ragged = Ragged((np.concatenate(rows), np.concatenate(cats)), np.array([0, 2, 3, 6]))
        got = model.prepare(Table(table, sequence_id="user"))
        assert_same(got, model.prepare(ragged))
        np.testing.assert_allclose(model.log_density(Table(table, sequence_id="user")), model.log_density(ragged))
    with pytest.raises(DataError, match="sequence_id"):
        Sequence(emission(0.0), 2.0).prepare(table)
    split = dict(table, user=np.array(["u7", "u2", "u7", "u9", "u9", "u9"], dtype=object))
    with pytest.raises(DataError, match=r"'u7' appears in separate runs \(rows 0 and 2\)"):
        Sequence(emission(0.0), 2.0).prepare(Table(split, sequence_id="user"))
