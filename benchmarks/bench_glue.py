"""(f) End-to-end fine-tuning wall time on one GLUE task: `bertkit.tasks.glue.finetune_glue`
against a plain transformers loop with the same hyper-parameters.

transformers' Trainer needs the `accelerate` package, which this project does not install, so the
reference is the plain loop of benchmarks/finetune_glue_vs_transformers.py:
transformers' BertForSequenceClassification, its fast tokenizer, DataCollatorWithPadding, AdamW
with Trainer's decay groups, linear warm-up/decay, clipping at 1.0, shuffled batches, evaluation
on the full dev set. Wall time covers reading, tokenising, training and evaluating.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time


def has_accelerate() -> bool:
    return importlib.util.find_spec("accelerate") is not None


def glue_case(data_dir, task: str = "mrpc", max_train_examples: int = 800, epochs: int = 1, batch_size: int = 32,
              learning_rate: float = 5e-5, precision: str = "auto", repeats: int = 1, log=print) -> dict:
    import finetune_glue_vs_transformers as reference
    from bertkit.tasks.glue import finetune_glue

    model = reference.default_model_dir()
    args = argparse.Namespace(data_dir=str(data_dir), max_train_examples=max_train_examples, model=model,
                              max_seq_length=128, device="cpu", precision=precision, epochs=epochs,
                              batch_size=batch_size, learning_rate=learning_rate)

    def bertkit_run():
        start = time.perf_counter()
        results = finetune_glue(task, model, data_dir, None, learning_rates=[learning_rate], epochs=[epochs],
                                batch_sizes=[batch_size], seeds=[1], max_seq_length=128,
                                max_train_examples=max_train_examples, precision=precision, device="cpu")
        return time.perf_counter() - start, results.document["runs"][0]["score"]

    def transformers_run():
        scores, seconds = reference.run_transformers_glue(task, args, [1])
        return seconds, scores[0]

    # ABBA order over repeats, so that a load change during the run falls on both alike.
    order = []
    for r in range(repeats):
        order += [("bertkit", bertkit_run), ("transformers", transformers_run)][:: 1 if r % 2 == 0 else -1]
    seconds = {"bertkit": [], "transformers": []}
    scores = {"bertkit": [], "transformers": []}
    for name, run in order:
        s, score = run()
        seconds[name].append(s)
        scores[name].append(score)
        log(f"f: {task} {name}: {s:.1f} s, dev score {100 * score:.1f}")
    ours, theirs = statistics.median(seconds["bertkit"]), statistics.median(seconds["transformers"])
    row = {"case": f"f: fine-tune {task.upper()} end to end", "task": task, "model": "all-MiniLM-L6-v2",
           "train_examples": max_train_examples, "epochs": epochs, "batch_size": batch_size, "precision": precision,
           "reference": "plain transformers loop with Trainer's recipe (Trainer needs accelerate: "
                        + ("installed, but the loop is kept for comparability)" if has_accelerate() else "not installed)"),
           "bertkit_s": ours, "transformers_s": theirs, "speedup": theirs / ours,
           "bertkit_scores": scores["bertkit"], "transformers_scores": scores["transformers"], "seconds": seconds}
    log(f"{row['case']}: bertkit {ours:.1f} s, transformers {theirs:.1f} s, speed-up {row['speedup']:.2f}x")
    return row
