"""The sharded model file (``models.sharded``): written shard by shard, read back whole equal to
the model written, one shard's part read alone, and damage named."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from emgrid.models import Composite, Gaussian, Mixture, Poisson, ShardView, load_model, save_model
from emgrid.models.errors import SpecError
from emgrid.models.shard import Elsewhere
from emgrid.models.sharded import (FORMAT, read_shard, remove_stale_shard_files, save_model_sharded,
                                   save_sharded)
from tests.strategies import models, split_in_two


def _three_shards():
    model = Composite([Mixture([Gaussian(-1.0, 1.0), Gaussian(2.0, 0.5)], [0.3, 0.7]), Poisson(3.0),
                       Mixture([Gaussian(0.0, 2.0), Gaussian(1.0, 1.0)], [0.5, 0.5])])
    # the first mixture's components on shards 0 and 1, the Poisson on 2, the last mixture on 1
    return model, ShardView.of(model, {"0.0": 0, "0.1": 1, "1": 2, "2.0": 1, "2.1": 1}, 4)


class Counting:
    """A ``Shards`` whose fetches are counted (every shard fetched once, in order)."""

    def __init__(self, view, model):
        self.view, self.model, self.skeleton, self.fetched = view, model, view.skeleton(model), []

    def __iter__(self):
        for s in range(self.view.n_shards):
            self.fetched.append(s)
            yield s, self.view.owned(s, self.model)


def test_a_split_model_is_a_root_naming_one_file_per_shard_and_reads_back_equal(tmp_path):
    model, view = _three_shards()
    shards = Counting(view, model)
    written = save_sharded(shards, tmp_path / "model.json")
    assert shards.fetched == [0, 1, 2, 3]
    root = json.loads((tmp_path / "model.json").read_text())
    assert root["format"] == FORMAT and root["skeleton"]["family"] == "Composite"
    assert [e["roots"] for e in root["shards"]] == [["0.0"], ["0.1", "2"], ["1"], []]
    assert root["shards"][3]["file"] is None  # an idle shard has no file
    assert written.files == [e["file"] for e in root["shards"][:3]]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["model.json", *written.files])
    for e in root["shards"][:3]:
        assert list(json.loads((tmp_path / e["file"]).read_text())) == e["roots"]
    stub = root["skeleton"]["children"][1]
    assert stub == {"family": "Elsewhere", "path": "1", "data_type": Poisson(3.0).data_type()}
    back = load_model(tmp_path / "model.json")
    assert back.to_spec() == model.to_spec()
    assert written.n_parameters == model.n_parameters()


def test_one_shard_reads_alone_as_the_part_that_shard_holds(tmp_path):
    model, view = _three_shards()
    save_model_sharded(model, tmp_path / "model.json", view)
    for s in range(view.n_shards):
        one = read_shard(tmp_path / "model.json", s)
        assert sorted(one.subtrees) == sorted(view.roots_of(s))
        for p, sub in one.subtrees.items():
            assert sub.to_spec() == model.node_at(p).to_spec()
        part = one.part()
        expect = view.model_for(s, model)
        for (p, a), (q, b) in zip(part.nodes(), expect.nodes()):
            assert p == q and type(a) is type(b)
            if isinstance(a, Elsewhere):
                assert a.path == b.path
            else:
                assert all(np.array_equal(x, y) for x, y in zip(a.params().values(), b.params().values()))
    skeleton = read_shard(tmp_path / "model.json", 0).skeleton
    assert [type(n) for _, n in skeleton.nodes()] == [type(n) for _, n in view.skeleton(model).nodes()]


def test_a_model_no_node_splits_is_one_plain_spec(tmp_path):
    model = Mixture([Gaussian(0.0, 1.0), Gaussian(3.0, 1.0)], [0.4, 0.6])
    for view in (ShardView.of(model, {"0": 0, "1": 0}, 1), ShardView.of(model, {"0": 1, "1": 1}, 2)):
        written = save_model_sharded(model, tmp_path / "model.json", view)
        assert written.files == [] and json.loads((tmp_path / "model.json").read_text()) == model.to_spec()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["model.json"]
        assert load_model(tmp_path / "model.json").to_spec() == model.to_spec()
        assert read_shard(tmp_path / "model.json", 0).subtrees[""].to_spec() == model.to_spec()


def test_a_rewrite_removes_the_earlier_shard_files_and_a_killed_one_keeps_the_old_root(tmp_path):
    model, view = _three_shards()
    first = save_model_sharded(model, tmp_path / "model.json", view)
    second = save_model_sharded(model, tmp_path / "model.json", view)
    assert set(first.files).isdisjoint(second.files)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["model.json", *second.files])

    def dies_at_the_root(path, text):  # the shard files land, the root does not
        if path.name == "model.json":
            raise OSError("killed")
        path.write_text(text)

    with pytest.raises(OSError):
        save_model_sharded(model, tmp_path / "model.json", view, write=dies_at_the_root)
    assert load_model(tmp_path / "model.json").to_spec() == model.to_spec()  # the previous root, whole
    remove_stale_shard_files(tmp_path, "model", second.files)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["model.json", *second.files])


def test_save_model_of_a_plain_model_still_reads(tmp_path):
    model, _ = _three_shards()
    save_model(model, tmp_path / "m.json")
    assert load_model(tmp_path / "m.json").to_spec() == model.to_spec()


@pytest.mark.parametrize("damage,words", [
    ("drop-file", ["cannot read shard 1", "No such file"]),
    ("swap-files", ["holds", "not the roots"]),
    ("bad-name", ["shards[0].file must be a file name"]),
    ("lost-root", ["stubs and the shards' roots differ"]),
    ("version", ["version 7"]),
])
def test_a_damaged_sharded_file_is_one_spec_error_naming_it(tmp_path, damage, words):
    model, view = _three_shards()
    save_model_sharded(model, tmp_path / "model.json", view)
    root = json.loads((tmp_path / "model.json").read_text())
    if damage == "drop-file":
        (tmp_path / root["shards"][1]["file"]).unlink()
    elif damage == "swap-files":
        root["shards"][0]["file"], root["shards"][2]["file"] = root["shards"][2]["file"], root["shards"][0]["file"]
    elif damage == "bad-name":
        root["shards"][0]["file"] = "../elsewhere.json"
    elif damage == "lost-root":
        root["shards"][2] = {"file": None, "roots": []}
    else:
        root["version"] = 7
    (tmp_path / "model.json").write_text(json.dumps(root))
    with pytest.raises(SpecError) as e:
        load_model(tmp_path / "model.json")
    assert all(w in str(e.value) for w in words), str(e.value)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(split=split_in_two(models(max_leaves=6)), n_extra=st.integers(0, 1))
def test_round_trip_of_any_split_nested_model(tmp_path_factory, split, n_extra):
    model, shard_of_leaf = split
    view = ShardView.of(model, shard_of_leaf, 2 + n_extra)
    folder = tmp_path_factory.mktemp("sharded")
    written = save_model_sharded(model, folder / "model.json", view)
    assert load_model(folder / "model.json").to_spec() == model.to_spec()
    assert written.n_parameters == model.n_parameters()
    for s in range(view.n_shards):
        one = read_shard(folder / "model.json", s)
        assert {p: t.to_spec() for p, t in one.subtrees.items()} == {p: t.to_spec() for p, t in
                                                                      view.owned(s, model).items()}
        assert [p for p, _ in one.part().nodes()] == [p for p, _ in view.model_for(s, model).nodes()]
