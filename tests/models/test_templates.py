"""Templates: nodes with unset parameters, their specs, their shapes and their errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests import strategies as S

from emgrid.models import (HMM, Categorical, Composite, DiagGaussian, Exponential, FullGaussian, Gaussian, Mixture,
                           ModelError, Poisson, Sequence, SpecError, complete_shapes, from_spec, initialize, n_rows,
                           tree_costs)
from emgrid.models.errors import ConfigError
from emgrid.models.init import check_init

TEMPLATES = [
    Gaussian(), DiagGaussian(dim=3), FullGaussian(dim=2), Categorical(n_values=4), Categorical(), Poisson(),
    Exponential(), Mixture([Gaussian(), Gaussian()]), HMM([Poisson(), Poisson(), Poisson()]), Sequence(Gaussian()),
    Composite([FullGaussian(dim=2), Categorical()]),
    Mixture([Composite([DiagGaussian(dim=2), Categorical(n_values=3)]) for _ in range(4)]),
    Mixture([Gaussian(0.0, 1.0), Gaussian()]),  # partly given
]


@pytest.mark.parametrize("t", TEMPLATES, ids=lambda t: t.describe())
def test_templates_round_trip_through_specs(t):
    text = json.dumps(t.to_spec())
    again = from_spec(json.loads(text))
    assert json.dumps(again.to_spec()) == text
    assert again.is_template and again.unset_fields() == t.unset_fields()


def test_the_k_component_shorthand_expands_and_is_written_back():
    spec = {"family": "Mixture", "k": 8, "component": {"family": "DiagGaussian", "dim": 5}}
    t = from_spec(spec)
    assert len(t.children) == 8 and all(c.dim == 5 and c.mean is None for c in t.children)
    assert t.to_spec() == spec
    hmm = from_spec({"family": "HMM", "n_states": 3, "emission": {"family": "Categorical", "n_values": 6}})
    assert hmm.n_states == 3 and hmm.to_spec()["n_states"] == 3
    assert ("", "transitions") in hmm.unset_fields() and ("2", "probs") in hmm.unset_fields()


def test_a_complete_models_spec_has_no_template_keys():
    m = Mixture([DiagGaussian([0.0, 1.0], [1.0, 1.0]), DiagGaussian([0.0, 1.0], [1.0, 1.0])], [0.5, 0.5])
    assert list(m.to_spec()) == ["family", "components", "weights"]
    assert list(m.to_spec()["components"][0]) == ["family", "mean", "var"]
    assert not m.is_template and m.unset_fields() == []


@pytest.mark.parametrize(("spec", "words"), [
    ({"family": "Mixture", "k": 0, "component": {"family": "Gaussian"}}, ["Mixture", "'k'", "0"]),
    ({"family": "Mixture", "k": 2.5, "component": {"family": "Gaussian"}}, ["'k'", "2.5"]),
    ({"family": "Mixture", "k": 2}, ["'component'", "missing"]),
    ({"family": "Mixture", "k": 2, "component": {"family": "Gaussian"}, "components": []}, ["both"]),
    ({"family": "HMM", "n_states": -1, "emission": {"family": "Poisson"}}, ["'n_states'", "-1"]),
    ({"family": "DiagGaussian"}, ["DiagGaussian", "dim"]),
    ({"family": "FullGaussian", "dim": 0}, ["FullGaussian.dim", "0"]),
    ({"family": "Categorical", "n_values": 3, "probs": [0.5, 0.5]}, ["Categorical.probs", "(3,)", "(2,)"]),
])
def test_templates_that_cannot_be_completed_say_so_when_built(spec, words):
    with pytest.raises((SpecError, ModelError)) as info:
        from_spec(spec)
    for w in words:
        assert w in str(info.value)


@pytest.mark.parametrize(("verb", "call"), [
    ("sample", lambda t: t.sample(3, 0)),
    ("log density", lambda t: t.log_density(np.zeros((2, 2)))),
    ("accumulate", lambda t: t.accumulate(np.zeros((2, 2)))),
    ("estimate", lambda t: t.estimate({})),
])
def test_the_verbs_of_a_template_name_the_unset_field(verb, call):
    t = Mixture([FullGaussian(dim=2), FullGaussian([0.0, 0.0], np.eye(2))], [0.5, 0.5])
    with pytest.raises(ModelError) as info:
        call(t)
    assert "FullGaussian.mean" in str(info.value) and "'0'" in str(info.value)


def test_sampling_a_sequence_names_the_unset_mean_length():
    with pytest.raises(ModelError, match="Sequence.mean_length"):
        Sequence(Gaussian(0.0, 1.0)).sample(2, 0)


def test_complete_shapes_takes_sizes_and_lengths_from_the_data():
    t = Composite([Sequence(Categorical()), HMM([Gaussian(), Gaussian()])])
    data = t.prepare(([np.array([0, 4]), np.array([1, 2, 3, 1])], [np.zeros(3), np.ones(5)]))
    c = complete_shapes(t, data)
    assert c.children[0].child.n_values == 5 and float(c.children[0].mean_length) == 3.0
    assert float(c.children[1].mean_length) == 4.0
    costs = tree_costs(c)  # a template's cost is known once its shapes are
    assert len(costs) == len(c.nodes()) and all(p.flops_per_row > 0 for p in costs)
    assert complete_shapes(c, data) is c  # nothing left to fill


def test_a_template_without_positions_cannot_be_completed():
    t = HMM([Gaussian()])
    with pytest.raises(ModelError, match="no positions"):
        complete_shapes(t, t.prepare([np.zeros(0), np.zeros(0)]))


def test_more_components_than_sample_rows_is_an_error_naming_the_path():
    t = Composite([Mixture([Gaussian() for _ in range(5)])])
    data = t.prepare((np.arange(3.0),))
    with pytest.raises(ModelError, match="'0'.*5 components.*3 rows"):
        initialize(t, data, 3, seed=0)


def test_kmeans_init_needs_float_or_vector_components():
    with pytest.raises(ConfigError, match="init='kmeans'.*int"):
        check_init(Mixture([Poisson(), Poisson()]), "kmeans")
    with pytest.raises(ConfigError, match="init must be one of"):
        check_init(Gaussian(), "kmeans++")
    check_init(Mixture([Composite([Gaussian(), Poisson()]) for _ in range(2)]), "kmeans")  # a float field


def _params(node):
    return np.concatenate([np.ravel(v) for _, n in node.nodes() for v in n.params().values()])


@pytest.mark.parametrize("t", [
    Mixture([FullGaussian(dim=2) for _ in range(4)]),
    Mixture([Categorical() for _ in range(3)]),
    Mixture([Composite([Gaussian(), Poisson()]) for _ in range(3)]),
    HMM([DiagGaussian(dim=2) for _ in range(3)]),
    Mixture([Mixture([Gaussian(), Gaussian()]) for _ in range(2)]),
], ids=lambda t: t.describe())
def test_initial_components_are_never_equal_and_seeds_repeat(t):
    rng = np.random.default_rng(3)
    n = 3000
    if t.data_type().startswith("seq"):
        raw = [rng.normal(size=(int(k), 2)) + 3 * (i % 2) for i, k in enumerate(rng.integers(1, 9, size=n))]
    elif t.data_type() == "vec[2]":
        raw = rng.normal(size=(n, 2))
    elif t.data_type() == "int":
        raw = rng.integers(0, 6, size=n)
    elif t.data_type() == "float":
        raw = rng.normal(size=n)
    else:
        raw = (rng.normal(size=n), rng.poisson(3.0, size=n))
    data = t.prepare(raw)
    c = complete_shapes(t, data)
    a = initialize(c, data, n, seed=7)
    assert not a.is_template
    specs = [json.dumps(k.to_spec()) for k in a.children]
    assert len(set(specs)) == len(specs), "two initial components are equal"
    assert np.array_equal(_params(a), _params(initialize(c, data, n, seed=7)))
    assert not np.array_equal(_params(a), _params(initialize(c, data, n, seed=8)))
    assert not np.array_equal(_params(a), _params(initialize(c, data, n, seed=7, start=1)))


def test_given_parameters_of_a_partial_template_are_kept():
    t = Mixture([Gaussian(-1.0, 2.0), Gaussian(mean=5.0)])
    x = t.prepare(np.random.default_rng(0).normal(size=500))
    a = initialize(t, x, 500, seed=0)
    assert float(a.children[0].mean) == -1.0 and float(a.children[1].mean) == 5.0
    assert a.children[1].var is not None and a.weights is not None


def blank(node):
    """``node`` as a template: every parameter unset, a Categorical's size left to the data."""
    from emgrid.models.schema import Children, Param, Size

    values = {f.name: None for f in node.schema if isinstance(f, Param)}
    values.update({f.name: None for f in node.schema if isinstance(f, Size) and f.from_data})
    for f in node.schema:
        if isinstance(f, Children):
            kids = [blank(c) for c in node.children]
            values[f.name] = kids if f.many else kids[0]
    return node.with_fields(**values)


@settings(max_examples=40)
@given(md=S.models_with_data(min_rows=30, max_rows=60), seed=st.integers(0, 2**31 - 1))
def test_any_blanked_tree_round_trips_and_initializes_from_its_own_samples(md, seed):
    model, raw = md
    t = blank(model)
    assert json.dumps(from_spec(json.loads(json.dumps(t.to_spec()))).to_spec()) == json.dumps(t.to_spec())
    data = t.prepare(raw)
    try:
        c = complete_shapes(t, data)
        start = initialize(c, data, n_rows(data), seed=seed)
    except ModelError as e:  # too few rows or positions for the components: said by name
        assert "components" in str(e) or "no positions" in str(e) or "no weight" in str(e), str(e)
        return
    assert not start.is_template
    assert np.all(np.isfinite(start.log_density(data)))
