"""Bad input raises the documented error class with a message that names what broke.

Each row: an id, a thunk that makes the bad call, the exact error class and words the
message must contain.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from emgrid.models import (HMM, Categorical, Composite, DiagGaussian, Exponential, FullGaussian, Gaussian, Mixture,
                    Node, Poisson, Ragged, Sequence, load_model)
from emgrid.models.errors import DataError, ModelError, SpecError

G = Gaussian(0.0, 1.0)
DG = DiagGaussian([0.0, 0.0], [1.0, 1.0])
FG = FullGaussian([0.0, 0.0], [[1.0, 0.2], [0.2, 1.0]])
CAT = Categorical([0.2, 0.3, 0.5])
POI = Poisson(2.0)
EXP = Exponential(1.0)
COMP = Composite([G, CAT])
SEQ = Sequence(G, 3.0)
HMM2 = HMM([G, Gaussian(3.0, 1.0)], [[0.9, 0.1], [0.1, 0.9]], [0.5, 0.5], 3.0)
MIX = Mixture([G, Gaussian(3.0, 1.0)], [0.5, 0.5])
NAN, INF = math.nan, math.inf




def case(id_, thunk, error, *words, marks=()):
    return pytest.param(thunk, error, words, id=id_, marks=marks)


DATA = [
    # non-finite values
    case("gaussian-nan", lambda: G.log_density(np.array([0.0, NAN])), DataError, "Gaussian", "NaN or inf", "row 1"),
    case("gaussian-inf", lambda: G.accumulate(np.array([INF, 0.0])), DataError, "NaN or inf"),
    case("exponential-nan", lambda: EXP.log_density([1.0, NAN]), DataError, "Exponential", "NaN or inf"),
    case("diag-nan", lambda: DG.log_density(np.array([[0.0, NAN]])), DataError, "DiagGaussian", "NaN or inf"),
    case("full-inf", lambda: FG.log_density(np.array([[INF, 0.0]])), DataError, "FullGaussian", "NaN or inf"),
    case("categorical-nan", lambda: CAT.log_density(np.array([0.0, NAN])), DataError, "Categorical", "NaN or inf"),
    case("poisson-inf", lambda: POI.log_density(np.array([1.0, INF])), DataError, "Poisson", "NaN or inf"),
    case("composite-field-nan", lambda: COMP.log_density((np.array([NAN]), np.array([1]))), DataError,
         "data[0]", "NaN or inf"),
    case("sequence-nan", lambda: SEQ.log_density([np.array([0.0, NAN])]), DataError, "data.values", "NaN or inf"),
    case("mixture-nan", lambda: MIX.accumulate(np.array([NAN])), DataError, "NaN or inf"),
    # wrong dtype
    case("gaussian-strings", lambda: G.log_density(np.array(["a", "b"])), DataError, "Gaussian", "dtype"),
    case("gaussian-numeric-strings", lambda: G.log_density(np.array(["1.5", "2"])), DataError, "Gaussian", "dtype"),
    case("gaussian-complex", lambda: G.log_density(np.array([1 + 2j])), DataError, "Gaussian", "dtype"),
    case("diag-complex", lambda: DG.log_density(np.array([[1 + 2j, 0]])), DataError, "DiagGaussian", "dtype"),
    case("full-numeric-strings", lambda: FG.log_density(np.array([["1.5", "2"]])), DataError, "FullGaussian",
         "dtype"),
    case("categorical-fractional", lambda: CAT.log_density(np.array([0.5, 1.0])), DataError,
         "Categorical", "non-integral", "0.5"),
    case("categorical-strings", lambda: CAT.log_density(np.array(["a"])), DataError, "Categorical", "dtype"),
    case("poisson-fractional", lambda: POI.log_density([1.0, 2.5]), DataError, "Poisson", "non-integral"),
    case("poisson-complex", lambda: POI.log_density(np.array([1j])), DataError, "Poisson", "dtype"),
    case("gaussian-given-tuple", lambda: G.log_density((np.zeros(2),)), DataError, "Gaussian", "tuple"),
    case("gaussian-given-ragged", lambda: G.log_density(Ragged(np.zeros(2), np.array([0, 2]))), DataError,
         "Gaussian", "Ragged"),
    # wrong shape / number of fields
    case("gaussian-2d", lambda: G.log_density(np.zeros((3, 2))), DataError, "Gaussian", "shape (n,)", "(3, 2)"),
    case("gaussian-scalar", lambda: G.log_density(1.0), DataError, "Gaussian", "shape (n,)"),
    case("diag-wrong-dim", lambda: DG.log_density(np.zeros((4, 3))), DataError, "DiagGaussian", "(n, 2)", "(4, 3)"),
    case("full-1d", lambda: FG.log_density(np.zeros(4)), DataError, "FullGaussian", "(n, 2)", "(4,)"),
    case("categorical-2d", lambda: CAT.log_density(np.zeros((2, 2), dtype=int)), DataError, "shape (n,)"),
    case("composite-too-many-fields", lambda: COMP.log_density((np.zeros(2), np.zeros(2, int), np.zeros(2))),
         DataError, "Composite", "2 fields", "got 3"),
    case("composite-too-few-fields", lambda: COMP.log_density((np.zeros(2),)), DataError, "2 fields", "got 1"),
    case("composite-not-a-tuple", lambda: COMP.log_density(np.zeros(2)), DataError, "Composite", "tuple"),
    case("composite-unequal-rows", lambda: COMP.log_density((np.zeros(3), np.zeros(2, int))), DataError,
         "equal row counts", "[3, 2]"),
    case("composite-field-wrong-type", lambda: COMP.log_density((np.zeros(2), np.array([0.5, 1.0]))), DataError,
         "data[1]", "Categorical"),
    case("sequence-given-2d-array", lambda: SEQ.log_density(np.zeros((3, 4))), DataError, "Sequence",
         "list of per-row arrays", "2-D"),
    case("sequence-rows-are-scalars", lambda: SEQ.log_density([1.0, 2.0]), DataError, "Sequence", "row 0"),
    case("sequence-given-a-number", lambda: SEQ.log_density(5), DataError, "Sequence", "int"),
    case("hmm-rows-are-scalars", lambda: HMM2.log_density([0.5]), DataError, "HMM", "row 0"),
    case("sequence-values-wrong-type", lambda: Sequence(CAT, 2.0).log_density(Ragged(np.array([0.5]), np.array([0, 1]))),
         DataError, "data.values", "non-integral"),
    # outside the support
    case("categorical-too-large", lambda: CAT.log_density(np.array([0, 3])), DataError,
         "Categorical", "value 3", "outside", "0..2"),
    case("categorical-negative", lambda: CAT.accumulate(np.array([-1, 0])), DataError, "value -1", "outside"),
    case("categorical-under-sequence", lambda: Sequence(CAT, 2.0).log_density([np.array([1, 7])]), DataError,
         "value 7", "outside"),
    case("poisson-negative", lambda: POI.log_density(np.array([2, -1])), DataError, "Poisson", ">= 0", "-1"),
    case("exponential-negative", lambda: EXP.log_density(np.array([1.0, -0.5])), DataError,
         "Exponential", ">= 0", "-0.5"),
    case("mixture-outside-every-support", lambda: Mixture([Categorical([0.5, 0.5]), Categorical([0.2, 0.3, 0.5])],
                                                         [0.5, 0.5]).log_density(np.array([3])), DataError, "outside"),
    # no rows
    case("gaussian-empty", lambda: G.log_density(np.zeros(0)), DataError, "no rows"),
    case("categorical-empty", lambda: CAT.accumulate(np.zeros(0, dtype=int)), DataError, "no rows"),
    case("composite-empty", lambda: COMP.log_density((np.zeros(0), np.zeros(0, int))), DataError, "no rows"),
    case("sequence-no-rows", lambda: SEQ.log_density([]), DataError, "no rows"),
    case("hmm-no-rows", lambda: HMM2.accumulate(Ragged(np.zeros(0), np.array([0]))), DataError, "no rows"),
    # Ragged offsets
    case("ragged-negative-length", lambda: Ragged(np.zeros(2), np.array([0, 3, 2])), DataError,
         "non-decreasing", "row 1", "negative length"),
    case("ragged-negative-offset", lambda: Ragged(np.zeros(0), np.array([0, -1])), DataError, "non-decreasing"),
    case("ragged-not-from-zero", lambda: Ragged(np.zeros(2), np.array([1, 2])), DataError, "start at 0", "1"),
    case("ragged-end-mismatch", lambda: Ragged(np.zeros(3), np.array([0, 1, 2])), DataError,
         "end at 2", "3 positions"),
    case("ragged-float-offsets", lambda: Ragged(np.zeros(2), np.array([0.0, 2.0])), DataError, "integers", "float64"),
    case("ragged-2d-offsets", lambda: Ragged(np.zeros(2), np.array([[0, 2]])), DataError, "1-D", "(1, 2)"),
    case("ragged-empty-offsets", lambda: Ragged(np.zeros(0), np.array([], dtype=int)), DataError, "length n+1"),
    # weights
    case("weights-negative", lambda: G.accumulate(np.zeros(3), np.array([1.0, -0.5, 1.0])), DataError,
         "weights", ">= 0", "-0.5"),
    case("weights-nan", lambda: G.accumulate(np.zeros(3), np.array([1.0, NAN, 1.0])), DataError, "weights", "finite"),
    case("weights-inf", lambda: G.accumulate(np.zeros(3), np.array([1.0, INF, 1.0])), DataError, "weights", "finite"),
    case("weights-all-zero", lambda: G.accumulate(np.zeros(3), np.zeros(3)), DataError, "weights", "all zero"),
    case("weights-too-short", lambda: G.accumulate(np.zeros(3), np.ones(2)), DataError, "weights", "(3,)", "(2,)"),
    case("weights-2d", lambda: G.accumulate(np.zeros(3), np.ones((3, 1))), DataError, "weights", "(3,)", "(3, 1)"),
    case("weights-per-position-not-per-row", lambda: SEQ.accumulate([np.zeros(2), np.zeros(3)], np.ones(5)),
         DataError, "weights", "(2,)", "(5,)"),
]

MODELS = [
    # leaf parameters
    case("gaussian-negative-var", lambda: Gaussian(0.0, -1.0), ModelError, "Gaussian.var", "> 0", "-1"),
    case("gaussian-zero-var", lambda: Gaussian(0.0, 0.0), ModelError, "Gaussian.var", "> 0"),
    case("gaussian-nan-mean", lambda: Gaussian(NAN, 1.0), ModelError, "Gaussian.mean", "finite"),
    case("gaussian-string-mean", lambda: Gaussian("zero", 1.0), ModelError, "Gaussian.mean", "numeric"),
    case("gaussian-vector-mean", lambda: Gaussian([0.0, 1.0], 1.0), ModelError, "Gaussian.mean", "dimension"),
    case("diag-negative-var", lambda: DiagGaussian([0.0, 0.0], [1.0, -2.0]), ModelError, "DiagGaussian.var", "> 0"),
    case("diag-shape-mismatch", lambda: DiagGaussian([0.0, 0.0], [1.0]), ModelError, "DiagGaussian.var", "shape"),
    case("diag-empty", lambda: DiagGaussian([], []), ModelError, "DiagGaussian"),
    case("full-not-positive-definite", lambda: FullGaussian([0.0, 0.0], [[1.0, 2.0], [2.0, 1.0]]), ModelError,
         "FullGaussian.cov", "positive definite"),
    case("full-negative-variance", lambda: FullGaussian([0.0], [[-1.0]]), ModelError, "positive definite"),
    case("full-not-symmetric", lambda: FullGaussian([0.0, 0.0], [[1.0, 0.5], [0.0, 1.0]]), ModelError,
         "FullGaussian.cov", "symmetric"),
    case("full-wrong-shape", lambda: FullGaussian([0.0, 0.0], np.eye(3)), ModelError, "FullGaussian.cov", "(2, 2)"),
    case("categorical-not-summing-to-one", lambda: Categorical([0.2, 0.3]), ModelError,
         "Categorical.probs", "sum to 1", "0.5"),
    case("categorical-negative-prob", lambda: Categorical([1.5, -0.5]), ModelError, "Categorical.probs", ">= 0"),
    case("categorical-empty", lambda: Categorical([]), ModelError, "Categorical.probs", "empty"),
    case("poisson-zero-rate", lambda: Poisson(0.0), ModelError, "Poisson.rate", "> 0"),
    case("exponential-negative-rate", lambda: Exponential(-2.0), ModelError, "Exponential.rate", "> 0"),
    # internal nodes
    case("mixture-no-components", lambda: Mixture([], []), ModelError, "Mixture.components", "at least one"),
    case("mixture-mixed-data-types", lambda: Mixture([G, DG], [0.5, 0.5]), ModelError,
         "Mixture.components", "share one data type", "float", "vec[2]"),
    case("mixture-float-and-int", lambda: Mixture([G, POI], [0.5, 0.5]), ModelError, "share one data type"),
    case("mixture-weights-not-summing", lambda: Mixture([G, G], [0.5, 0.6]), ModelError,
         "Mixture.weights", "sum to 1"),
    case("mixture-weights-wrong-length", lambda: Mixture([G, G], [1.0]), ModelError, "Mixture.weights", "(2,)"),
    case("mixture-component-not-a-node", lambda: Mixture([G, "Gaussian"], [0.5, 0.5]), ModelError,
         "Mixture.components[1]", "model node"),
    case("hmm-no-states", lambda: HMM([], np.zeros((0, 0)), []), ModelError, "HMM.emissions", "at least one"),
    case("hmm-mixed-data-types", lambda: HMM([G, CAT], np.full((2, 2), 0.5), [0.5, 0.5]), ModelError,
         "HMM.emissions", "share one data type"),
    case("hmm-transitions-not-stochastic", lambda: HMM([G, G], [[0.5, 0.5], [0.5, 0.6]], [0.5, 0.5]), ModelError,
         "HMM.transitions", "sum to 1"),
    case("hmm-transitions-wrong-shape", lambda: HMM([G, G], np.full((3, 3), 1 / 3), [0.5, 0.5]), ModelError,
         "HMM.transitions", "(2, 2)"),
    case("hmm-initial-not-summing", lambda: HMM([G, G], np.full((2, 2), 0.5), [0.5, 0.2]), ModelError,
         "HMM.initial", "sum to 1"),
    case("hmm-zero-mean-length", lambda: HMM([G], [[1.0]], [1.0], 0.0), ModelError, "HMM.mean_length", "> 0"),
    case("sequence-child-not-a-node", lambda: Sequence(np.zeros(3)), ModelError, "Sequence.child", "model node"),
    case("sequence-negative-mean-length", lambda: Sequence(G, -1.0), ModelError, "Sequence.mean_length", "> 0"),
    case("composite-no-children", lambda: Composite([]), ModelError, "Composite.children", "at least one"),
    case("composite-child-not-a-node", lambda: Composite([G, 3]), ModelError, "Composite.children[1]", "model node"),
    case("sample-negative-n", lambda: G.sample(-1), ModelError, "integer >= 0", "-1"),
    case("sample-float-n", lambda: G.sample(2.5), ModelError, "integer >= 0"),
    case("node-at-missing-path", lambda: COMP.node_at("0.1"), ModelError, "'0.1'", "does not exist"),
]

SPECS = [
    case("spec-unknown-family", lambda: Node.from_spec({"family": "Gausian", "mean": 0, "var": 1}), SpecError,
         "unknown model family", "'Gausian'", "Gaussian"),
    case("spec-no-family", lambda: Node.from_spec({"mean": 0.0, "var": 1.0}), SpecError, "missing field 'family'"),
    case("spec-not-a-mapping", lambda: Node.from_spec(["Gaussian"]), SpecError, "mapping", "list"),
    # an omitted parameter is unset (a template): the verbs that need it name it
    case("spec-missing-field", lambda: Node.from_spec({"family": "Gaussian", "mean": 0.0}).log_density([0.0]),
         ModelError, "Gaussian.var", "unset"),
    case("spec-unknown-field", lambda: Node.from_spec({"family": "Gaussian", "mean": 0.0, "var": 1.0, "sd": 1.0}),
         SpecError, "Gaussian", "unknown field", "'sd'"),
    case("spec-nested-unknown-field", lambda: Node.from_spec(
        {"family": "Composite", "children": [{"family": "Poisson", "rate": 1.0, "lambda": 2.0}]}), SpecError,
         "Poisson", "'lambda'"),
    case("spec-nested-missing-field", lambda: Node.from_spec(
        {"family": "HMM", "emissions": [{"family": "Categorical"}], "transitions": [[1.0]], "initial": [1.0]})
         .log_density([np.array([0, 1])]), ModelError, "Categorical.n_values", "'0'", "unset"),
    case("spec-sequence-missing-child", lambda: Node.from_spec({"family": "Sequence", "mean_length": 3.0}),
         SpecError, "Sequence", "missing field 'child'"),
    case("spec-mixture-missing-weights", lambda: Node.from_spec({"family": "Mixture", "components": [G.to_spec()]})
         .log_density([0.0]), ModelError, "Mixture.weights", "unset"),
    case("spec-composite-children-not-a-list", lambda: Node.from_spec({"family": "Composite", "children": 5}),
         SpecError, "Composite", "'children'", "list"),
    case("spec-hmm-emissions-not-a-list", lambda: Node.from_spec(
        {"family": "HMM", "emissions": {"family": "Gaussian"}, "transitions": [[1.0]], "initial": [1.0]}),
         SpecError, "HMM", "'emissions'", "list"),
    case("spec-mixture-components-not-a-list", lambda: Node.from_spec(
        {"family": "Mixture", "components": 7, "weights": [1.0]}), SpecError, "Mixture", "'components'", "list"),
    case("spec-bad-parameter-value", lambda: Node.from_spec({"family": "Gaussian", "mean": 0.0, "var": -1.0}),
         ModelError, "Gaussian.var", "> 0"),
]


@pytest.mark.parametrize(("thunk", "error", "words"), DATA + MODELS + SPECS)
def test_bad_input_raises_a_named_error(thunk, error, words):
    with pytest.raises(error) as info:
        thunk()
    assert type(info.value) is error, f"raised {type(info.value).__name__}, expected exactly {error.__name__}"
    message = str(info.value)
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"


def test_every_error_is_a_value_error():
    for error in (DataError, ModelError, SpecError):
        assert issubclass(error, ValueError)
    assert issubclass(SpecError, ModelError)


@pytest.mark.parametrize(("text", "words"), [
    ("{not json", ["not valid JSON", "line 1"]),
    (json.dumps({"family": "Nope"}), ["unknown model family", "'Nope'"]),
], ids=["bad-json", "unknown-family"])
def test_load_model_names_the_file_problem(tmp_path, text, words):
    path = tmp_path / "model.json"
    path.write_text(text)
    with pytest.raises(SpecError) as info:
        load_model(path)
    for word in words:
        assert word in str(info.value)


def test_load_model_of_a_missing_file(tmp_path):
    with pytest.raises(SpecError, match="cannot read model spec"):
        load_model(tmp_path / "absent.json")


def test_bad_rows_are_not_half_folded():
    """A failing call leaves no partial state: the model still fits good data afterwards."""
    with pytest.raises(DataError):
        MIX.accumulate(np.array([0.0, NAN]))
    got = MIX.estimate(MIX.accumulate(np.array([0.0, 0.5, 3.0, 3.5])))
    assert np.all(np.isfinite(got.weights))
