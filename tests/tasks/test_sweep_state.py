"""A sweep's best artifacts are saved as files bertkit reads without unpickling (JSON and
safetensors), and come back equal: models as their class with the same weights, plain data with
its types (tuples, int dict keys, NaN), declared dataclasses as themselves; anything else is refused."""

import json
import math

import pytest
import torch

from bertkit import BertConfig, BertForTokenClassification
from bertkit.tasks.runs import RunResult
from bertkit.tasks.squad import SquadPredictions
from bertkit.tasks.sweep_state import SweepState

CONFIG = dict(learning_rate=2e-5, epochs=2, batch_size=16, seed=3)


def _tiny_tagger():
    torch.manual_seed(0)
    return BertForTokenClassification(BertConfig(vocab_size=40, hidden_size=8, num_hidden_layers=1,
                                                 num_attention_heads=2, intermediate_size=16, num_labels=3))


def test_models_plain_data_and_declared_dataclasses_round_trip(tmp_path):
    model = _tiny_tagger()
    predictions = SquadPredictions(predictions={"q1": "Denver"}, nbest={"q1": [{"text": "Denver", "probability": 0.9}]},
                                   version_2_with_negative=True, null_odds={"q1": -1.5}, best_non_null={"q1": "Denver"})
    artifacts = {"model": model, "scores": {"valid": {"f1": 0.5, "nan": math.nan}}, "by_id": {3: (1, "x")},
                 "predictions": predictions}
    state = SweepState(tmp_path, identity=None)
    state.clear()
    state.save_best(RunResult(CONFIG, {"f1": 0.5}, 0.5, artifacts=artifacts))
    assert not list(tmp_path.rglob("*.pt")) and not list(tmp_path.rglob("*.bin"))
    assert json.loads((tmp_path / "best" / "artifacts.json").read_text())["run"] == "lr2e-05_ep2_bs16_seed3"
    back = state.load_best()["artifacts"]
    assert type(back["model"]) is BertForTokenClassification
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), back["model"].state_dict().values()))
    assert back["by_id"] == {3: (1, "x")} and math.isnan(back["scores"]["valid"]["nan"])
    assert back["predictions"] == predictions


def test_an_undeclared_object_is_refused(tmp_path):
    class Opaque:
        pass

    state = SweepState(tmp_path, identity=None)
    state.clear()
    with pytest.raises(TypeError, match="cannot save a Opaque"):
        state.save_best(RunResult(CONFIG, {}, 0.0, artifacts=(Opaque(), {})))


def test_a_saved_name_outside_the_table_is_not_imported(tmp_path):
    from bertkit.errors import BertkitError

    (tmp_path / "best").mkdir(parents=True)
    (tmp_path / "best" / "artifacts.json").write_text(json.dumps(
        {"run": "r", "artifacts": {"$dataclass": "os.system", "fields": {"$dict": []}}}))
    with pytest.raises(BertkitError, match="unknown saved type 'os.system'"):
        SweepState(tmp_path, identity=None).load_best()
