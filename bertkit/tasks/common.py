"""What every fine-tuning task shares: batching features, prediction, and the paper's sweep protocol
(grid over lr / epochs / batch size, several restarts, selection on dev, statistics over seeds)."""

from __future__ import annotations

import dataclasses
import itertools
import statistics
from typing import Callable, Iterator, Sequence

import torch

from ..errors import BertkitError

PAD_VALUES = {"labels": -100, "start_positions": None, "end_positions": None}


def collate(features: Sequence[dict], pad_token_id: int = 0) -> dict[str, torch.Tensor]:
    """Stack features (dicts of lists / ints / floats), padding sequences to the longest in the batch.

    Sequence keys: input_ids, token_type_ids, attention_mask, labels (token-level, padded with -100).
    Multiple choice features hold a list of C sequences per key: padded to (B, C, T).
    """
    batch: dict[str, torch.Tensor] = {}
    for key in features[0]:
        values = [f[key] for f in features]
        first = values[0]
        if isinstance(first, (list, tuple)) and first and isinstance(first[0], (list, tuple)):
            T = max(len(seq) for v in values for seq in v)
            pad = -100 if key == "labels" else (pad_token_id if key == "input_ids" else 0)
            batch[key] = torch.tensor([[list(seq) + [pad] * (T - len(seq)) for seq in v] for v in values])
        elif isinstance(first, (list, tuple)):
            T = max(len(v) for v in values)
            pad = -100 if key == "labels" else (pad_token_id if key == "input_ids" else 0)
            batch[key] = torch.tensor([list(v) + [pad] * (T - len(v)) for v in values])
        elif isinstance(first, float):
            batch[key] = torch.tensor(values, dtype=torch.float32)
        elif isinstance(first, (int, bool)):
            batch[key] = torch.tensor(values, dtype=torch.long)
        # other values (ids, strings) are metadata, not model inputs
    return batch


class FeatureSource:
    """Batch source over in-memory features for `train.fit`: a fresh seeded shuffle per epoch,
    dynamic padding, and exact skipping for resume."""

    def __init__(self, features: Sequence[dict], batch_size: int, seed: int = 0, shuffle: bool = True,
                 pad_token_id: int = 0, model_keys: Sequence[str] | None = None):
        if not features:
            raise BertkitError("no training examples")
        self.features, self.batch_size, self.seed, self.shuffle = features, batch_size, seed, shuffle
        self.pad_token_id = pad_token_id
        self.model_keys = model_keys

    def num_batches(self, epoch: int) -> int:
        return -(-len(self.features) // self.batch_size)

    def order(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(len(self.features)))
        g = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
        return torch.randperm(len(self.features), generator=g).tolist()

    def batches(self, epoch: int, start: int = 0) -> Iterator[dict]:
        order = self.order(epoch)
        for b in range(start, self.num_batches(epoch)):
            chunk = [self.features[i] for i in order[b * self.batch_size:(b + 1) * self.batch_size]]
            if self.model_keys is not None:
                chunk = [{k: f[k] for k in self.model_keys if k in f} for f in chunk]
            yield collate(chunk, self.pad_token_id)


def length_sorted_batches(features: Sequence[dict], batch_size: int, key: str = "input_ids"):
    """Indices in batches of similar length (evaluation: far less padding); yields (indices, batch)."""

    def length(f):
        v = f[key]
        return max(len(s) for s in v) if v and isinstance(v[0], (list, tuple)) else len(v)

    order = sorted(range(len(features)), key=lambda i: length(features[i]))
    for s in range(0, len(order), batch_size):
        idx = order[s:s + batch_size]
        yield idx, [features[i] for i in idx]


@torch.no_grad()
def predict(model, features: Sequence[dict], batch_size: int = 64, output_keys=("logits",),
            input_keys=("input_ids", "token_type_ids", "attention_mask"), pad_token_id: int = 0,
            device=None, precision: str = "fp32") -> dict[str, list]:
    """Run the model over features in length-sorted batches; return per-feature outputs in input order
    (each a tensor with the padding cut off for token-level outputs)."""
    from ..device import autocast

    device = device or next(model.parameters()).device
    model.eval()
    results: dict[str, list] = {k: [None] * len(features) for k in output_keys}
    for idx, chunk in length_sorted_batches(features, batch_size):
        batch = collate([{k: f[k] for k in input_keys if k in f} for f in chunk], pad_token_id)
        batch = {k: v.to(device) for k, v in batch.items()}
        with autocast(device, precision):
            out = model(**batch)
        for k in output_keys:
            values = out[k].float().cpu()
            for row, i in enumerate(idx):
                v = values[row]
                if v.ndim >= 1 and "input_ids" in chunk[row] and v.shape[0] == batch["input_ids"].shape[1] \
                        and batch["input_ids"].ndim == 2:
                    v = v[: len(chunk[row]["input_ids"])]  # token-level: drop padding positions
                results[k][i] = v
    return results


# ---- the paper's fine-tuning protocol: grid x restarts, select on dev ----

@dataclasses.dataclass
class RunResult:
    config: dict  # {"learning_rate", "epochs", "batch_size", "seed"}
    metrics: dict  # dev metrics
    score: float  # the selection score (task score on dev)
    seconds: float = 0.0
    artifacts: object = None  # e.g. the trained model, kept only for the best run


def parse_list(text, cast=float) -> list:
    """'5e-5,3e-5' -> [5e-05, 3e-05]; a single value -> [value]."""
    if isinstance(text, (list, tuple)):
        return [cast(t) for t in text]
    try:
        return [cast(t) for t in str(text).split(",") if t.strip()]
    except ValueError:
        raise BertkitError(f"cannot read {text!r} as a comma-separated list of {cast.__name__}") from None


def grid(learning_rates, epochs, batch_sizes, seeds) -> list[dict]:
    return [dict(learning_rate=lr, epochs=ep, batch_size=bs, seed=s)
            for lr, ep, bs, s in itertools.product(learning_rates, epochs, batch_sizes, seeds)]


def summarize(runs: list[RunResult]) -> list[dict]:
    """Per hyper-parameter configuration (seeds pooled): mean, sd, median of the score and each metric."""
    groups: dict[tuple, list[RunResult]] = {}
    for r in runs:
        key = tuple((k, v) for k, v in sorted(r.config.items()) if k != "seed")
        groups.setdefault(key, []).append(r)
    table = []
    for key, rs in groups.items():
        row = {"config": dict(key), "n": len(rs), "seeds": [r.config.get("seed") for r in rs]}
        names = ["score"] + sorted({m for r in rs for m in r.metrics if isinstance(r.metrics[m], (int, float))})
        for name in names:
            vals = [r.score if name == "score" else r.metrics[name] for r in rs if name == "score" or name in r.metrics]
            row[name] = {"mean": statistics.fmean(vals), "sd": statistics.stdev(vals) if len(vals) > 1 else 0.0,
                         "median": statistics.median(vals)}
        table.append(row)
    return table


def run_sweep(configs: list[dict], run_one: Callable[[dict], RunResult], keep_best_artifacts=True,
              on_run: Callable[[RunResult], None] | None = None):
    """Run every configuration; the best dev score wins (the paper's selection). Returns (best, runs).
    Only the best run keeps its artifacts, so a large grid does not hold every model in memory."""
    best, runs = None, []
    for config in configs:
        result = run_one(config)
        runs.append(result)
        if on_run is not None:
            on_run(result)
        if best is None or result.score > best.score:
            if best is not None:
                best.artifacts = None
            best = result
        elif keep_best_artifacts:
            result.artifacts = None
    return best, runs
