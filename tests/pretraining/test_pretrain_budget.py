"""`bertkit pretrain --time-budget` and `--init-from`: a complete model on time, the recipe named,
continued pre-training from a checkpoint with its own vocabulary."""

import json
import logging
import math
import time

import pytest
import torch

from bertkit import BertConfig, BertForPreTraining, BertModel
from bertkit.cli import main
from bertkit.errors import BertkitError
from bertkit.pretraining import create_pretraining_data
from bertkit.pretraining.recipe import BUDGET_RECIPES, resolve_recipe
from bertkit.pretraining.run import pretrain
from bertkit.tokenizer import BertTokenizer


@pytest.fixture(scope="module")
def data32(mini_corpus, uncased_vocab, tmp_path_factory):
    out = tmp_path_factory.mktemp("dynamic32")
    create_pretraining_data([mini_corpus], uncased_vocab, out, max_seq_length=32, max_predictions_per_seq=5,
                            dupe_factor=1, seed=3, masking="dynamic", progress=False, overwrite=True)
    return out


def test_recipe_fills_what_is_not_given_and_names_deviations():
    recipe, deviations = resolve_recipe({"learning_rate": 3e-4}, 15 * 60)
    assert recipe.learning_rate == 3e-4 and recipe.max_steps is None and recipe.warmup_steps is None
    assert recipe.model_config == BUDGET_RECIPES[0][1].model_config and recipe.dropout == 0.0
    assert any("learning rate 0.0003" in d for d in deviations) and any("wall-clock budget" in d for d in deviations)
    assert recipe.min_warmup_steps == 150 and any("at least 150" in d for d in deviations)
    given, named = resolve_recipe({"warmup_ratio": 0.01}, 15 * 60)  # a share the user gives has no floor
    assert given.min_warmup_steps == 0 and any("warm-up 1% of the steps (paper" in d for d in named)
    paper, none = resolve_recipe({"model_config": "base", "max_steps": 1_000_000}, None)
    assert paper.warmup_steps == 10000 and paper.batch_size == 256 and none == []


def test_budgeted_pretrain_ends_on_time_with_a_complete_model(data32, tmp_path):
    out = tmp_path / "run"
    started = time.time()
    rc = main(["pretrain", "--train-data", str(data32), "--eval-data", str(data32), "--eval-batches", "2", "--output",
               str(out), "--time-budget", "25s", "--model-config", "tiny", "--batch-size", "16", "--precision",
               "fp32", "--no-progress"])
    wall = time.time() - started
    assert rc == 0 and wall < 25 + 10, wall
    for name in ("config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json", "pretrain_args.json"):
        assert (out / name).is_file(), name
    config = json.loads((out / "config.json").read_text())
    assert config["hidden_dropout_prob"] == 0.1 and config["attention_probs_dropout_prob"] == 0.1
    named = config["bertkit_pretraining"]
    assert named["dropout_while_pretraining"] == 0.0 and any("budget" in d for d in named["deviations_from_paper"])
    # The recipe's short phase (64 tokens) has nothing to cut in pairs of at most 32: not run, not named.
    assert not any("cut to" in d for d in named["deviations_from_paper"])
    args = json.loads((out / "pretrain_args.json").read_text())
    assert args["time_budget_seconds"] == 25 and args["plan"]["time_budget"] == 25
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if r.get("eval")]
    assert evals[0]["step"] == 0 and evals[-1]["step"] == args["steps"] and all("elapsed_s" in r for r in evals)
    assert [r for r in records if not r.get("eval")][-1]["learning_rate"] == 0.0
    # A BERT that transformers' BertForPreTraining loads: post-LN, the paper's layer layout.
    transformers = pytest.importorskip("transformers")
    theirs = transformers.BertForPreTraining.from_pretrained(out)
    ours = BertForPreTraining.from_pretrained(out).eval()
    theirs.eval()
    ids = torch.tensor([[2, 1996, 4937, 103, 3, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]])
    a = ours(input_ids=ids, attention_mask=mask).prediction_logits[0, :5]
    b = theirs(input_ids=ids, attention_mask=mask).prediction_logits[0, :5]
    assert torch.allclose(a, b, atol=1e-4)


def _encoder_checkpoint(tmp_path, uncased_vocab, **overrides):
    directory = tmp_path / "encoder"
    config = BertConfig.preset("tiny", max_position_embeddings=64, **overrides)
    torch.manual_seed(5)
    BertModel(config).save_pretrained(directory, tokenizer=BertTokenizer.from_pretrained(uncased_vocab))
    return directory


def test_init_from_starts_from_the_checkpoint_and_lists_new_heads(data32, tmp_path, uncased_vocab, caplog):
    init = _encoder_checkpoint(tmp_path, uncased_vocab)
    with caplog.at_level(logging.WARNING, logger="bertkit"):
        pretrain(str(data32), str(tmp_path / "run"), init_from=str(init), max_steps=2, batch_size=8,
                 learning_rate=0.0, warmup_steps=0, precision="fp32", progress=False)
    assert "cls.predictions" in caplog.text and "cls.seq_relationship" in caplog.text
    start = BertModel.from_pretrained(init).state_dict()
    after = BertForPreTraining.from_pretrained(tmp_path / "run").bert.state_dict()
    for key, tensor in start.items():  # learning rate 0: the encoder is the checkpoint's
        assert torch.equal(after[key], tensor), key
    assert (tmp_path / "run" / "vocab.txt").read_text() == (init / "vocab.txt").read_text()


def test_init_from_refuses_another_vocabulary_and_a_second_config(data32, tmp_path, uncased_vocab):
    init = _encoder_checkpoint(tmp_path, uncased_vocab)
    tokens = (init / "vocab.txt").read_text().splitlines()
    (init / "vocab.txt").write_text("\n".join(tokens[:-1] + ["[unused-x]"]) + "\n")
    with pytest.raises(BertkitError, match="another vocabulary"):
        pretrain(str(data32), str(tmp_path / "a"), init_from=str(init), max_steps=1, batch_size=8, progress=False)
    with pytest.raises(BertkitError, match="not both"):
        pretrain(str(data32), str(tmp_path / "b"), init_from=str(init), model_config="tiny", max_steps=1,
                 batch_size=8, progress=False)
    with pytest.raises(BertkitError, match="--position-init, not both"):
        pretrain(str(data32), str(tmp_path / "c"), init_from=str(init), position_init="neighbours", max_steps=1,
                 batch_size=8, progress=False)


def test_pretrain_refuses_an_existing_run_and_a_foreign_resume(data32, tmp_path, capsys):
    common = ["pretrain", "--train-data", str(data32), "--output", str(tmp_path / "run"), "--model-config", "tiny",
              "--max-steps", "4", "--batch-size", "8", "--save-steps", "2", "--precision", "fp32", "--no-progress"]
    assert main(common + ["--seed", "1"]) == 0
    assert main(common + ["--seed", "1"]) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert main(common + ["--seed", "2", "--resume"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "seed" in err[0]
    assert main(common + ["--seed", "2", "--overwrite"]) == 0


def test_sinusoidal_position_init_has_a_relative_geometry():
    """Dot products of the initial position vectors depend only on the offset between positions (the
    property that lets attention find neighbours), at the configured initializer std."""
    from bertkit.pretraining.init import sinusoidal_positions_

    table = sinusoidal_positions_(torch.nn.Embedding(128, 64), 0.02).weight.double()
    assert abs(table.std().item() - 0.02) < 1e-6
    gram = table @ table.T
    for offset in (1, 5, 30):
        diagonal = torch.diagonal(gram, offset)
        assert torch.allclose(diagonal, diagonal[0].expand_as(diagonal), atol=1e-9)
    assert gram[10, 11] > gram[10, 40]  # nearby positions are more alike than distant ones


def test_neighbour_heads_start_on_the_previous_and_next_token(tmp_path):
    """At step 0 the first layer's even heads look at the previous token and its odd heads at the
    next one; attention maps from transformers' eager attention on the saved weights (an
    independent computation), on random tokens so that only positions can explain it."""
    from transformers import BertModel as HFBertModel

    from bertkit.pretraining.init import neighbour_heads_, neighbour_rates

    torch.manual_seed(0)
    config = BertConfig.from_name_or_file("tiny").replace(vocab_size=500)
    model = BertForPreTraining(config)
    before = model.bert.encoder.layer[1].attention.self.query.weight.clone()
    neighbour_heads_(model, config.initializer_range)
    assert torch.equal(model.bert.encoder.layer[1].attention.self.query.weight, before)  # later layers untouched
    table = model.bert.embeddings.position_embeddings.weight.double()
    assert abs(table.std().item() - config.initializer_range) < 1e-6
    assert neighbour_rates(128)[:32].max() < torch.pi  # the sharp half stays below the Nyquist rate
    model.save_pretrained(tmp_path)
    reference = HFBertModel.from_pretrained(tmp_path, attn_implementation="eager").eval()
    ids = torch.randint(5, 500, (4, 96))
    with torch.no_grad():
        maps = reference(input_ids=ids, output_attentions=True).attentions  # layers x (B, A, T, T)
    first = maps[0]
    previous = torch.diagonal(first, -1, dim1=-2, dim2=-1).mean((0, 2))  # (A,): share on position p - 1
    following = torch.diagonal(first, 1, dim1=-2, dim2=-1).mean((0, 2))
    assert previous[0] > 0.6 and following[1] > 0.6
    assert previous[1] < 0.05 and following[0] < 0.05
    uniform = 1 / 96
    assert abs(torch.diagonal(maps[1], -1, dim1=-2, dim2=-1).mean().item() - uniform) < 0.5 * uniform


def test_cls_starts_attending_over_the_whole_pair(tmp_path):
    """With the [CLS] id given, [CLS]'s first-layer attention starts near-uniform over the pair (the
    summary NSP reads) while every other position keeps its previous/next-token head; attention
    maps from transformers' eager attention on the saved weights."""
    from transformers import BertModel as HFBertModel

    from bertkit.pretraining.init import neighbour_heads_

    torch.manual_seed(0)
    config = BertConfig.from_name_or_file("tiny").replace(vocab_size=500)
    model = BertForPreTraining(config)
    neighbour_heads_(model, config.initializer_range, cls_token_id=2)
    model.save_pretrained(tmp_path)
    reference = HFBertModel.from_pretrained(tmp_path, attn_implementation="eager").eval()
    ids = torch.randint(5, 500, (4, 96))
    ids[:, 0] = 2
    token_types = torch.zeros_like(ids)
    token_types[:, 48:] = 1
    with torch.no_grad():
        first = reference(input_ids=ids, token_type_ids=token_types, output_attentions=True).attentions[0]
    cls_rows = first[:, :, 0, :]  # (B, A, T)
    entropy = -(cls_rows * cls_rows.clamp_min(1e-12).log()).sum(-1)
    assert entropy.min() > 0.9 * math.log(96)
    previous = torch.diagonal(first, -1, dim1=-2, dim2=-1).mean((0, 2))
    following = torch.diagonal(first, 1, dim1=-2, dim2=-1)[..., 1:].mean((0, 2))  # queries past [CLS]
    assert previous[0] > 0.6 and following[1] > 0.6


def test_short_sequence_phase_and_position_init(data32, tmp_path):
    out = tmp_path / "run"
    rc = main(["pretrain", "--train-data", str(data32), "--output", str(out), "--model-config", "tiny", "--batch-size",
               "8", "--max-steps", "6", "--short-seq-length", "16", "--short-seq-fraction", "0.5",
               "--position-init", "sinusoidal", "--precision", "fp32", "--save-steps", "0", "--no-progress"])
    assert rc == 0
    args = json.loads((out / "pretrain_args.json").read_text())
    assert args["plan"]["steps_per_phase"] == [3, 3]
    deviations = json.loads((out / "config.json").read_text())["bertkit_pretraining"]["deviations_from_paper"]
    assert any("cut to 16 tokens" in d for d in deviations) and any("sinusoidal" in d for d in deviations)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r][-1] == 6


@pytest.mark.parametrize("flags,message", [
    (["--short-seq-length", "16"], "needs --short-seq-fraction"),
    (["--short-seq-fraction", "0.5"], "needs --short-seq-length"),
    (["--short-seq-length", "16", "--short-seq-fraction", "0.5", "--phase2-data", "{data}", "--phase2-fraction",
      "0.6"], "add up to"),
    (["--short-seq-length", "32", "--short-seq-fraction", "0.5"], "cuts nothing: the data's pairs are at most 32"),
])
def test_short_sequence_phase_flags_are_checked(data32, tmp_path, capsys, flags, message):
    flags = [f.format(data=data32) for f in flags]
    rc = main(["pretrain", "--train-data", str(data32), "--output", str(tmp_path / "run"), "--model-config", "tiny",
               "--max-steps", "4", "--no-progress", *flags])
    assert rc != 0 and message in capsys.readouterr().err
