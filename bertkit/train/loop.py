"""The one training loop: pre-training and every fine-tuning task call `fit`.

It owns device and precision, gradient accumulation, clipping, AdamW + linear schedule,
metrics.jsonl, the progress bar, atomic checkpoints with exact resume, and DDP under torchrun.
Data comes from a *batch source*: `num_batches(epoch)` and `batches(epoch, start)`, deterministic
given its seed and the epoch, so a resumed run sees exactly the batches it would have seen.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Callable, Iterator, Protocol

import numpy as np
import torch
from torch import nn

from ..device import autocast, pick_device, resolve_precision
from ..errors import BertkitError
from .optim import build_optimizer, linear_schedule

STATE_NAME = "training_state.pt"


class BatchSource(Protocol):
    def num_batches(self, epoch: int) -> int: ...

    def batches(self, epoch: int, start: int = 0) -> Iterator[dict[str, torch.Tensor]]: ...


@dataclasses.dataclass
class Phase:
    """A stretch of training on one source (pre-training phase 1 at length 128, phase 2 at 512).
    Give `steps` (optimizer steps) or `epochs`."""

    source: BatchSource
    steps: int | None = None
    epochs: float | None = None
    name: str = "train"


@dataclasses.dataclass
class TrainArgs:
    output_dir: str | None = None  # None: nothing written (e.g. one run of a sweep)
    learning_rate: float = 1e-4
    warmup_steps: int | None = None  # absolute; else warmup_ratio of all steps
    warmup_ratio: float = 0.0
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    grad_accum: int = 1
    precision: str = "auto"
    device: str = "auto"
    seed: int = 42
    logging_steps: int = 50
    save_steps: int = 0
    eval_steps: int = 0
    save_total_limit: int = 2
    resume: bool = False
    progress: bool | None = None  # None: a bar when stderr is a terminal
    save_final_model: bool = True
    tokenizer: object = None  # saved beside every checkpoint when given


@dataclasses.dataclass
class TrainResult:
    global_step: int
    train_seconds: float
    sequences: int
    last_logs: dict
    eval_history: list
    resumed_from: int | None = None

    @property
    def sequences_per_second(self) -> float:
        return self.sequences / max(self.train_seconds, 1e-9)


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def dist_info() -> tuple[int, int]:
    """(rank, world_size) under torchrun, else (0, 1)."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def _init_distributed(device: torch.device):
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    if device.type == "cuda":
        torch.cuda.set_device(device)


def _rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": _numpy_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _numpy_state():
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return [kind, keys.tolist(), pos, has_gauss, cached]  # plain types: loadable with weights_only


def _set_rng_state(state: dict) -> None:
    random.setstate(_as_tuple(state["python"]))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _as_tuple(x):
    return tuple(_as_tuple(i) for i in x) if isinstance(x, (list, tuple)) else x


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The newest complete checkpoint-N directory (complete = its training state was renamed in)."""
    out = Path(output_dir)
    found = []
    for d in out.glob("checkpoint-*"):
        suffix = d.name.split("-", 1)[1]
        if suffix.isdigit() and (d / STATE_NAME).is_file():
            found.append((int(suffix), d))
    return max(found)[1] if found else None


class _Logger:
    """metrics.jsonl (+ TensorBoard when installed), written by rank 0 only."""

    def __init__(self, output_dir: str | None, enabled: bool, resume_step: int | None):
        self.path = Path(output_dir) / "metrics.jsonl" if output_dir and enabled else None
        self.tb = None
        if self.path is None:
            return
        if resume_step is not None and self.path.exists():
            # Drop records written after the checkpoint we resume from: the resumed run rewrites them.
            kept = [l for l in self.path.read_text().splitlines() if l and json.loads(l).get("step", 0) <= resume_step]
            self.path.write_text("".join(l + "\n" for l in kept))
        elif resume_step is None and self.path.exists():
            self.path.unlink()
        try:
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


def _to_device(batch: dict, device: torch.device) -> dict:
    return {k: (v.to(device, non_blocking=True) if torch.is_tensor(v) else v) for k, v in batch.items()}


def _scalar_outputs(out) -> dict[str, torch.Tensor]:
    """The losses a model reports (loss, mlm_loss, nsp_loss, ...): averaged into the logs."""
    return {k: v.detach() for k, v in out.items() if k.endswith("loss") and torch.is_tensor(v) and v.ndim == 0}


def fit(
    model: nn.Module,
    phases: Phase | list[Phase],
    args: TrainArgs,
    evaluate: Callable[[nn.Module], dict] | None = None,
    batch_metrics: Callable[[dict, dict], dict] | None = None,
) -> TrainResult:
    """Train `model` through `phases`; the learning-rate schedule spans all of them.

    `evaluate(model) -> dict` runs every `eval_steps` and at the end (on rank 0, in eval mode).
    `batch_metrics(batch, outputs) -> {name: (correct, total)}` adds running accuracies to the logs.
    """
    phases = [phases] if isinstance(phases, Phase) else list(phases)
    rank, world = dist_info()
    device = pick_device(args.device)
    precision = resolve_precision(args.precision, device)
    if world > 1:
        _init_distributed(device)
    is_main = rank == 0
    out_dir = Path(args.output_dir) if args.output_dir else None
    if out_dir is not None and is_main:
        out_dir.mkdir(parents=True, exist_ok=True)

    accum = max(1, args.grad_accum)
    steps_per_phase = []
    for ph in phases:
        if ph.steps is not None:
            steps_per_phase.append(int(ph.steps))
        else:
            n = ph.source.num_batches(0)
            if n == 0:
                raise BertkitError(f"phase {ph.name!r} has no batches (is the data set empty?)")
            steps_per_phase.append(math.ceil(math.ceil(n / accum) * (ph.epochs or 1)))
    total_steps = sum(steps_per_phase)
    warmup = args.warmup_steps if args.warmup_steps is not None else int(args.warmup_ratio * total_steps)

    set_seed(args.seed)
    model.to(device)
    optimizer = build_optimizer(model, args.learning_rate, args.weight_decay)
    scheduler = linear_schedule(optimizer, warmup, total_steps)

    # Position in the data: phase, epoch, next micro-batch; global optimizer step.
    position = {"phase": 0, "epoch": 0, "batch": 0}
    global_step = 0
    resumed_from = None
    if args.resume and out_dir is not None:
        ckpt = latest_checkpoint(out_dir)
        if ckpt is not None:
            from ..hub import WEIGHTS_NAME, read_safetensors

            model.load_checkpoint_state(read_safetensors(ckpt / WEIGHTS_NAME), source=str(ckpt))
            state = torch.load(ckpt / STATE_NAME, map_location="cpu", weights_only=True)
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
            position = state["position"]
            global_step = resumed_from = state["global_step"]
            _set_rng_state(state["rng"][rank] if isinstance(state["rng"], list) else state["rng"])
            if is_main:
                print(f"resuming from {ckpt} (step {global_step}/{total_steps})", file=sys.stderr)

    train_model = model
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP

        train_model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)

    logger = _Logger(str(out_dir) if out_dir else None, is_main, resumed_from)
    show_bar = args.progress if args.progress is not None else sys.stderr.isatty()
    bar = None
    if is_main and show_bar:
        from tqdm.auto import tqdm

        bar = tqdm(total=total_steps, initial=global_step, desc=phases[position["phase"]].name,
                   unit="step", dynamic_ncols=True)

    sums: dict[str, float] = {}
    counts: dict[str, list] = {}
    window_seqs = window_tokens = 0
    window_start = time.perf_counter()
    train_seconds, total_seqs = 0.0, 0
    eval_history: list = []
    last_logs: dict = {}

    def save_checkpoint():
        if out_dir is None:
            return
        rngs = [_rng_state()]
        if world > 1:
            import torch.distributed as dist

            rngs = [None] * world
            dist.all_gather_object(rngs, _rng_state())
        if not is_main:
            return
        final = out_dir / f"checkpoint-{global_step}"
        tmp = out_dir / f".checkpoint-{global_step}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp, tokenizer=args.tokenizer)
        torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                    "position": position, "global_step": global_step, "rng": rngs,
                    "total_steps": total_steps}, tmp / STATE_NAME)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)  # atomic: the checkpoint appears complete or not at all
        old = sorted((int(d.name.split("-")[1]), d) for d in out_dir.glob("checkpoint-*")
                     if d.name.split("-")[1].isdigit())
        for _, d in old[: max(0, len(old) - args.save_total_limit)]:
            shutil.rmtree(d, ignore_errors=True)

    def run_eval():
        if evaluate is None or not is_main:
            return
        model.eval()
        with torch.no_grad(), autocast(device, precision):
            metrics = evaluate(model)
        model.train()
        record = {"step": global_step, "eval": True, **metrics}
        eval_history.append(record)
        logger.write(record)

    model.train()
    done = global_step >= total_steps
    phase_end = np.cumsum(steps_per_phase).tolist()
    while not done:
        ph_idx = position["phase"]
        phase = phases[ph_idx]
        epoch = position["epoch"]
        n = phase.source.num_batches(epoch)
        if n == 0:
            raise BertkitError(f"phase {phase.name!r} has no batches (is the data set empty?)")
        if bar is not None:
            bar.set_description(phase.name)
        t0 = time.perf_counter()
        micro = position["batch"]
        for batch in phase.source.batches(epoch, start=micro):
            group_start = (micro // accum) * accum
            group_len = min(accum, n - group_start)
            last_in_group = micro == group_start + group_len - 1
            batch = _to_device(batch, device)
            sync = contextlib.nullcontext() if (last_in_group or world == 1) else train_model.no_sync()
            with sync:
                with autocast(device, precision):
                    out = train_model(**batch)
                (out["loss"] / group_len).backward()
            for k, v in _scalar_outputs(out).items():
                sums[k] = sums.get(k, 0.0) + float(v)
                counts.setdefault(k + "_n", [0])[0] += 1
            if batch_metrics is not None:
                with torch.no_grad():
                    for k, (correct, total) in batch_metrics(batch, out).items():
                        c = counts.setdefault(k, [0, 0])
                        c[0] += float(correct)
                        c[1] += float(total)
            n_seq = int(batch["input_ids"].shape[0])
            window_seqs += n_seq * world
            total_seqs += n_seq * world
            if "attention_mask" in batch:
                window_tokens += int(batch["attention_mask"].sum()) * world
            micro += 1
            if not last_in_group:
                continue

            if args.max_grad_norm and args.max_grad_norm > 0:
                grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm))
            else:
                grad_norm = float("nan")
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            global_step += 1
            position = {"phase": ph_idx, "epoch": epoch, "batch": micro}
            if micro >= n:
                position = {"phase": ph_idx, "epoch": epoch + 1, "batch": 0}
            if global_step >= phase_end[ph_idx]:
                position = {"phase": ph_idx + 1, "epoch": 0, "batch": 0}
            if bar is not None:
                bar.update(1)

            if global_step % max(1, args.logging_steps) == 0 or global_step == total_steps:
                elapsed = time.perf_counter() - window_start
                record = {"step": global_step, "phase": phase.name, "epoch": epoch}
                for k, v in sums.items():
                    record[k] = v / max(1, counts[k + "_n"][0])
                for k, c in counts.items():
                    if not k.endswith("_n"):
                        record[k] = c[0] / max(1.0, c[1])
                record.update(learning_rate=scheduler.get_last_lr()[0], grad_norm=grad_norm,
                              seq_per_s=window_seqs / max(elapsed, 1e-9),
                              tokens_per_s=window_tokens / max(elapsed, 1e-9))
                if world > 1:
                    record = _average_across_ranks(record)
                if is_main:
                    logger.write(record)
                last_logs = record
                if bar is not None:
                    bar.set_postfix(loss=f"{record.get('loss', float('nan')):.3f}",
                                    seq_s=f"{record['seq_per_s']:.1f}")
                elif is_main and out_dir is not None:
                    print(f"step {global_step}/{total_steps} loss {record.get('loss', float('nan')):.4f} "
                          f"lr {record['learning_rate']:.2e} {record['seq_per_s']:.1f} seq/s", file=sys.stderr)
                sums.clear()
                counts.clear()
                window_seqs = window_tokens = 0
                window_start = time.perf_counter()
            if args.eval_steps and global_step % args.eval_steps == 0 and global_step < total_steps:
                train_seconds += time.perf_counter() - t0
                run_eval()
                t0 = time.perf_counter()
            if args.save_steps and global_step % args.save_steps == 0 and global_step < total_steps:
                train_seconds += time.perf_counter() - t0
                save_checkpoint()
                t0 = time.perf_counter()
            if global_step >= total_steps or position["phase"] != ph_idx or position["batch"] == 0:
                break
        else:
            # The source yielded fewer batches than num_batches() promised: drop the partial group.
            optimizer.zero_grad(set_to_none=True)
            position = {"phase": ph_idx, "epoch": epoch + 1, "batch": 0}
        train_seconds += time.perf_counter() - t0
        done = global_step >= total_steps

    if bar is not None:
        bar.close()
    run_eval()
    if out_dir is not None and is_main and args.save_final_model:
        model.save_pretrained(out_dir, tokenizer=args.tokenizer)
    if out_dir is not None and is_main:
        (out_dir / "train_summary.json").write_text(json.dumps({
            "global_step": global_step, "train_seconds": train_seconds, "sequences": total_seqs,
            "sequences_per_second": total_seqs / max(train_seconds, 1e-9), "precision": precision,
            "device": str(device), "world_size": world, "total_steps": total_steps,
        }, indent=2) + "\n")
    return TrainResult(global_step, train_seconds, total_seqs, last_logs, eval_history, resumed_from)


def _average_across_ranks(record: dict) -> dict:
    import torch.distributed as dist

    keys = [k for k, v in record.items() if isinstance(v, float) and k not in ("learning_rate", "seq_per_s", "tokens_per_s")]
    t = torch.tensor([record[k] for k in keys], dtype=torch.float64)
    dist.all_reduce(t)
    world = dist.get_world_size()
    return {**record, **{k: float(v) / world for k, v in zip(keys, t)}}
