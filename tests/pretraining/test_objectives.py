"""Pre-training objectives are objects (bertkit/pretraining/objectives): each builds its batch, names
its head and metrics; the string spellings of the CLI resolve to the same objects and batches; a new
objective is one class, taken by get_batch, pretrain and the registry without other changes."""

import json

import numpy as np
import pytest
import torch

from bertkit.errors import BertkitError
from bertkit.heads import BertForMaskedLM, BertForPreTraining
from bertkit.pretraining import PretrainingDataset
from bertkit.pretraining.objectives import LTR, MLM_NSP, MLM_ONLY, OBJECTIVES, resolve_objective
from bertkit.pretraining.objectives.left_to_right import LeftToRight
from bertkit.pretraining.run import pretrain
from bertkit.config import BertConfig


def test_registry_and_the_cli_spellings():
    assert list(OBJECTIVES) == ["bert", "no-nsp", "ltr"]
    assert resolve_objective("mlm") is MLM_NSP and resolve_objective("mlm", nsp=False) is MLM_ONLY
    assert resolve_objective("ltr") is LTR and resolve_objective("ltr", nsp=False) is LTR
    assert resolve_objective(MLM_NSP, nsp=False) is MLM_ONLY and resolve_objective("no-nsp") is MLM_ONLY
    with pytest.raises(BertkitError, match="objective must be one of mlm, bert, no-nsp, ltr"):
        resolve_objective("span")
    config = BertConfig.preset("tiny", vocab_size=50, max_position_embeddings=32)
    assert type(MLM_NSP.build_model(config)) is BertForPreTraining
    for objective in (MLM_ONLY, LTR):
        model = objective.build_model(config)
        assert type(model) is BertForMaskedLM and model.config.is_decoder == objective.causal
    assert MLM_NSP.metrics()[-1] == "nsp_accuracy" and "nsp_accuracy" not in LTR.metrics()
    assert (MLM_NSP.flag, MLM_ONLY.flag, LTR.flag) == ("mlm", "mlm", "ltr")  # what run records store


def test_batches_asked_of_the_object_equal_the_string_spellings(dynamic_dataset):
    dataset = PretrainingDataset(dynamic_dataset[0])
    rows = np.arange(24)

    def batch(**kw):
        return dataset.get_batch(rows, generator=torch.Generator().manual_seed(3), **kw)

    for by_object, by_name in ((dict(objective=MLM_NSP), dict()), (dict(objective=MLM_ONLY), dict(nsp=False)),
                               (dict(objective=LTR), dict(objective="ltr"))):
        a, b = batch(**by_object), batch(**by_name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert "next_sentence_label" in batch(objective=MLM_NSP)
    assert "next_sentence_label" not in batch(objective=MLM_ONLY)


class LeftToRightWithNSP(LeftToRight):
    """A new objective for the test: the left-to-right LM plus next-sentence prediction (pooled from
    the last real token). One class; nothing else in bertkit changes."""

    name = "ltr+nsp"
    flag = "ltr+nsp"
    label = short_label = "LTR + NSP"
    nsp = True
    deviation = "left-to-right objective with NSP (test)"


def test_a_new_objective_is_one_class(dynamic_dataset, tmp_path, monkeypatch):
    objective = LeftToRightWithNSP()
    dataset = PretrainingDataset(dynamic_dataset[0])
    batch = dataset.get_batch(np.arange(8), objective=objective)
    ltr = dataset.get_batch(np.arange(8), objective=LTR)
    assert torch.equal(batch["labels"], ltr["labels"]) and "next_sentence_label" in batch

    result = pretrain(str(dynamic_dataset[0]), str(tmp_path / "run"), model_config="tiny", max_steps=2,
                      batch_size=8, warmup_steps=1, precision="fp32", logging_steps=1, save_steps=0,
                      eval_data=str(dynamic_dataset[0]), eval_batches=1, progress=False, objective=objective)
    assert {"mlm_accuracy", "nsp_accuracy"} <= set(result.eval_history[-1])
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["architectures"] == ["BertForPreTraining"] and config["is_decoder"] is True
    record = json.loads((tmp_path / "run" / "pretrain_args.json").read_text())
    assert record["objective"] == "ltr+nsp" and objective.deviation in record["deviations_from_paper"]

    monkeypatch.setitem(OBJECTIVES, objective.name, objective)  # the registry line
    assert resolve_objective("ltr+nsp") is objective
