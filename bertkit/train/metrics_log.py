"""Training metrics: a window that accumulates losses and accuracies between log lines, and the
metrics.jsonl file (+ TensorBoard when installed) they are written to."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch


class MetricsWindow:
    """Losses are averaged over micro-batches; accuracies are (correct, total) summed over them."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.losses: dict[str, list[float]] = {}  # name -> [sum, micro-batches]
        self.hits: dict[str, list[float]] = {}  # name -> [correct, total]
        self.sequences = self.tokens = 0
        self.started = time.perf_counter()

    def add_losses(self, out) -> None:
        for k, v in out.items():
            if k.endswith("loss") and torch.is_tensor(v) and v.ndim == 0:
                entry = self.losses.setdefault(k, [0.0, 0])
                entry[0] += float(v.detach())
                entry[1] += 1

    def add_hits(self, metrics: dict) -> None:
        for k, (correct, total) in metrics.items():
            entry = self.hits.setdefault(k, [0.0, 0.0])
            entry[0] += float(correct)
            entry[1] += float(total)

    def add_batch(self, batch: dict, world: int) -> None:
        self.sequences += int(batch["input_ids"].shape[0]) * world
        if "attention_mask" in batch:
            self.tokens += int(batch["attention_mask"].sum()) * world

    def summary(self) -> dict:
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        record = {k: s / max(1, n) for k, (s, n) in self.losses.items()}
        record.update({k: c / max(1.0, t) for k, (c, t) in self.hits.items()})
        record.update(seq_per_s=self.sequences / elapsed, tokens_per_s=self.tokens / elapsed)
        return record


class MetricsLog:
    """metrics.jsonl (+ TensorBoard when installed), written by rank 0 only."""

    def __init__(self, output_dir: str | Path | None, enabled: bool, resume_step: int | None):
        self.path = Path(output_dir) / "metrics.jsonl" if output_dir and enabled else None
        self.tb = None
        if self.path is None:
            return
        if resume_step is not None and self.path.exists():
            # Records written after the checkpoint we resume from are dropped: the resumed run rewrites them.
            kept = [line for line in self.path.read_text().splitlines()
                    if line and json.loads(line).get("step", 0) <= resume_step]
            self.path.write_text("".join(line + "\n" for line in kept))
        elif resume_step is None and self.path.exists():
            self.path.unlink()
        try:  # optional: tensorboard curves when the package is installed (not a dependency)
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(Path(output_dir) / "tensorboard"))
        except ImportError:
            pass

    def write(self, record: dict) -> None:
        if self.path is None:
            return
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        if self.tb is not None:
            prefix = "eval/" if record.get("eval") else "train/"
            for k, v in record.items():
                if isinstance(v, (int, float)) and k not in ("step", "eval"):
                    self.tb.add_scalar(prefix + k, v, record["step"])
            self.tb.flush()


__all__ = ["MetricsLog", "MetricsWindow"]
