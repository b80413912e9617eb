"""The one training loop: pre-training and every fine-tuning task call `fit`.

It owns device and precision, gradient accumulation, clipping, AdamW + linear schedule,
metrics.jsonl, the progress bar, atomic checkpoints with exact resume, DDP under torchrun, and
wall-clock budgets. Data comes from a *batch source*: `num_batches(epoch)` and
`batches(epoch, start)`, deterministic given its seed and the epoch, so a resumed run sees
exactly the batches it would have seen.

`fit` reads as the steps of a run: plan (`plan.py`), resume (`checkpoint.py`), then for every
micro-batch `micro_batch`, for every group of them `optimizer_step`, with logging
(`metrics_log.py`), evaluation and checkpoints at the planned steps. A wall-clock budget's
decisions (stop, re-plan, where a phase ends) are the `BudgetPlanner`'s, consulted after every step.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import logging
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator, Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm

from ..device import autocast, pick_device, resolve_precision
from ..errors import BertkitError
from ..finite import check_finite_loss, check_finite_weights
from .checkpoint import (STATE_NAME, Checkpointer, latest_checkpoint, read_training_state, rng_state,
                         set_rng_state, set_seed)
from .metrics_log import MetricsLog, MetricsWindow
from .optim import build_optimizer, linear_factor
from .plan import BudgetPlanner, Calibration, Plan, plan_fixed, plan_for_budget

log = logging.getLogger("bertkit")

# What marks a folder as holding a run (refused without resume / overwrite).
RUN_MARKERS = ("metrics.jsonl", "train_summary.json", "model.safetensors")


def _destroy_process_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


class BatchSource(Protocol):
    def num_batches(self, epoch: int) -> int: ...

    def batches(self, epoch: int, start: int = 0) -> Iterator[dict[str, torch.Tensor]]: ...


@dataclasses.dataclass
class Phase:
    """A stretch of training on one source (pre-training phase 1 at length 128, phase 2 at 512).
    Give `steps` (optimizer steps), `epochs`, or with a time budget `fraction` (of all steps)."""

    source: BatchSource
    steps: int | None = None
    epochs: float | None = None
    name: str = "train"
    fraction: float | None = None


@dataclasses.dataclass
class TrainArgs:
    output_dir: str | None = None  # None: nothing written (e.g. one run of a sweep)
    learning_rate: float = 1e-4
    warmup_steps: int | None = None  # absolute; else warmup_ratio of all steps
    warmup_ratio: float = 0.0
    min_warmup_steps: int = 0  # with warmup_ratio: at least this many, while under a third of the steps
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
    # Wall-clock budget in seconds: the step count is measured to fit it (see plan.py).
    time_budget: float | None = None
    clock_start: float | None = None  # time.time() when the run began (data loading counts)
    eval_points: int = 10  # with a budget: evaluations spread over the run, the last at its end
    save_points: int = 4  # with a budget: checkpoints spread over the run
    # A folder that already holds a run: "refuse" (unless resuming) or "overwrite" it.
    existing_output: str = "overwrite"
    # What the run was started with (data, model, seed, schedule): a resumed run must match it.
    identity: dict | None = None


@dataclasses.dataclass
class TrainResult:
    global_step: int
    train_seconds: float
    sequences: int
    last_logs: dict
    eval_history: list
    resumed_from: int | None = None
    elapsed_seconds: float = 0.0  # wall-clock of the whole run, resumed segments added up
    plan: Plan | None = None
    stopped_early: bool = False  # a budgeted run that ran out of time before its last planned step

    @property
    def sequences_per_second(self) -> float:
        return self.sequences / max(self.train_seconds, 1e-9)


def dist_info() -> tuple[int, int]:
    """(rank, world_size) under torchrun, else (0, 1)."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def fit(model: nn.Module, phases: Phase | list[Phase], args: TrainArgs,
        evaluate: Callable[[nn.Module], dict] | None = None,
        batch_metrics: Callable[[dict, dict], dict] | None = None,
        stop_after_eval: Callable[[dict], bool] | None = None) -> TrainResult:
    """Train `model` through `phases`; the learning-rate schedule spans all of them.

    `evaluate(model) -> dict` runs every `eval_steps` and at the end (on rank 0, in eval mode).
    `batch_metrics(batch, outputs) -> {name: (correct, total)}` adds running accuracies to the logs.
    `stop_after_eval(metrics) -> bool` ends training after an evaluation that returns True (early
    stopping, decided by the caller); that evaluation is then the run's last.
    """
    return Trainer(model, phases, args, evaluate, batch_metrics, stop_after_eval).run()


class Trainer:
    def __init__(self, model, phases, args: TrainArgs, evaluate=None, batch_metrics=None, stop_after_eval=None):
        self.model = model
        self.stop_after_eval = stop_after_eval
        self.stop_requested = False
        self.phases = [phases] if isinstance(phases, Phase) else list(phases)
        self.args = args
        self.evaluate = evaluate
        self.batch_metrics = batch_metrics
        self.rank, self.world = dist_info()
        self.is_main = self.rank == 0
        self.device = pick_device(args.device)
        self.precision = resolve_precision(args.precision, self.device)
        # fp16 (a GPU without bf16) scales the loss so that small gradients do not flush to zero.
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.precision == "fp16")
        self.accum = max(1, args.grad_accum)
        self.clock_start = args.clock_start if args.clock_start is not None else time.time()
        self.out_dir = Path(args.output_dir) if args.output_dir else None
        self.checkpointer = Checkpointer(self.out_dir, args.save_total_limit, args.tokenizer) if self.out_dir else None
        # Position in the data: phase, epoch, next micro-batch; global optimizer step.
        self.position = {"phase": 0, "epoch": 0, "batch": 0}
        self.global_step = 0
        self.elapsed_before = 0.0  # wall-clock of earlier segments of a resumed run
        self.paused = 0.0  # seconds of evaluations and checkpoints since training began
        self.train_seconds = 0.0
        self.sequences = 0
        self.eval_history: list[dict] = []
        self.last_logs: dict = {}
        # Made by run(): the model as trained (DDP-wrapped on several ranks), the optimizer and its
        # schedule, the planner holding the plan, the metrics log.
        self.train_model: nn.Module = model
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: torch.optim.lr_scheduler.LambdaLR | None = None
        self.planner: BudgetPlanner | None = None
        self.log: MetricsLog | None = None

    @property
    def plan(self) -> Plan | None:
        return self.planner.plan if self.planner is not None else None

    # -- plan -------------------------------------------------------------------------------
    def elapsed(self) -> float:
        return self.elapsed_before + time.time() - self.clock_start

    def fixed_phase_steps(self) -> list[int]:
        steps = []
        for ph in self.phases:
            if ph.steps is not None:
                steps.append(int(ph.steps))
                continue
            n = ph.source.num_batches(0)
            if n == 0:
                raise BertkitError(f"phase {ph.name!r} has no batches (is the data set empty?)")
            steps.append(math.ceil(math.ceil(n / self.accum) * (ph.epochs or 1)))
        return steps

    def budget_fractions(self) -> list[float]:
        fractions = [ph.fraction for ph in self.phases]
        if len(self.phases) == 1 and fractions[0] is None:
            return [1.0]
        if any(f is None or f <= 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-6:
            raise BertkitError("with a time budget every phase needs a fraction of the steps, summing to 1")
        return fractions

    # -- run --------------------------------------------------------------------------------
    def run(self) -> TrainResult:
        args = self.args
        if self.world > 1 and not dist.is_initialized():
            dist.init_process_group("nccl" if self.device.type == "cuda" else "gloo")
            # Torn down before the interpreter: left to its shutdown, gloo's threads are destroyed while
            # still joinable and a rank aborts (SIGABRT) after finishing its work.
            atexit.register(_destroy_process_group)
            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)
        self.prepare_output()
        set_seed(args.seed)
        self.model.to(self.device)
        if self.world > 1:
            self.train_model = DistributedDataParallel(
                self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        self.optimizer = build_optimizer(self.model, args.learning_rate, args.weight_decay)
        checkpoint = latest_checkpoint(self.out_dir) if args.resume and self.out_dir else None
        state = read_training_state(checkpoint) if checkpoint else None
        if state is not None and (state.get("plan") or {}).get("time_budget"):
            plan = Plan.from_dict(state["plan"])  # a budgeted run keeps the step count it measured
        elif args.time_budget:
            plan = self.share(self.calibrate_and_plan())  # every rank follows rank 0's measurement
        else:
            plan = plan_fixed(self.fixed_phase_steps(), args.warmup_steps, args.warmup_ratio,
                              args.eval_steps, args.save_steps, args.min_warmup_steps)
        self.planner = BudgetPlanner(plan, self.elapsed, resumed=state is not None, evaluates=self.evaluate is not None,
                                     share=self.share, announce=self.is_main)
        # The factor reads the plan at every step: a budgeted run may re-plan its length (BudgetPlanner).
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: linear_factor(step, self.plan.warmup_steps, self.plan.total_steps))
        resumed_from = self.resume(checkpoint, state) if state is not None else None
        self.log = MetricsLog(self.out_dir, self.is_main, resumed_from)
        if self.eval_history and resumed_from is None:
            for record in self.eval_history:  # the step-0 evaluation made while calibrating
                self.log.write(record)
        stopped_early = self.train_all_phases()
        if not self.stop_requested:  # an early stop has just evaluated this model
            self.run_eval()
        if self.out_dir is not None and self.is_main and args.save_final_model:
            self.model.save_pretrained(self.out_dir, tokenizer=args.tokenizer)
        self.write_summary(stopped_early)
        if self.world > 1:  # no rank leaves (and tears down its process group) while rank 0 still writes
            dist.barrier()
            self.train_model = self.model
        return TrainResult(self.global_step, self.train_seconds, self.sequences, self.last_logs, self.eval_history,
                           resumed_from, self.elapsed(), self.plan, stopped_early)

    def share(self, plan: Plan) -> Plan:
        """Rank 0's plan on every rank."""
        if self.world > 1:
            shared = [plan]
            dist.broadcast_object_list(shared, src=0)
            return shared[0]
        return plan

    def prepare_output(self) -> None:
        if self.out_dir is None or not self.is_main:
            return
        if self.out_dir.exists() and not self.out_dir.is_dir():
            raise BertkitError("output path exists and is not a directory", path=str(self.out_dir))
        holds_run = any((self.out_dir / m).exists() for m in RUN_MARKERS) or any(self.out_dir.glob("checkpoint-*"))
        if holds_run and not self.args.resume:
            if self.args.existing_output == "refuse":
                raise BertkitError("output folder already holds a run; pass --resume to continue it or "
                                   "--overwrite to replace it", path=str(self.out_dir))
            for d in self.out_dir.glob("checkpoint-*"):  # never resume into another run's checkpoints later
                shutil.rmtree(d, ignore_errors=True)
        self.out_dir.mkdir(parents=True, exist_ok=True)

    def calibrate_and_plan(self) -> Plan:
        """Measure a step of every phase, one evaluation and one checkpoint, then fit the budget."""
        args = self.args
        fractions = self.budget_fractions()
        started = time.time()
        saved_lr = [g["lr"] for g in self.optimizer.param_groups]
        for group in self.optimizer.param_groups:
            group["lr"] = 0.0  # measuring steps: real work, no change to the weights
        per_step, measured = [], []
        # Each phase gets ~1.5% of the budget (its share of it), at least 4 steps after 2 warm-up steps.
        for phase, fraction in zip(self.phases, fractions):
            times, target = [], 0.015 * args.time_budget * fraction
            t0 = time.perf_counter()
            for i, group in enumerate(self.groups_of(phase.source, 0, 0)):
                self.step_on(group)
                now = time.perf_counter()
                if i >= 2:
                    times.append(now - t0)  # the batch's loading included
                t0 = now
                if len(times) >= 4 and (sum(times) >= target or len(times) >= 200):
                    break
            if not times:
                raise BertkitError(f"phase {phase.name!r} has too few batches to measure a step")
            times.sort()
            per_step.append(times[len(times) // 2])
            measured.append(len(times) + 2)
        for group, lr in zip(self.optimizer.param_groups, saved_lr):
            group["lr"] = lr
        t0 = time.perf_counter()
        self.run_eval()
        eval_seconds = time.perf_counter() - t0 if self.evaluate is not None else 0.0
        save_seconds = 0.0
        if self.out_dir is not None and self.is_main:
            t0 = time.perf_counter()
            with tempfile.TemporaryDirectory(dir=self.out_dir) as tmp:
                Checkpointer(Path(tmp), 1, self.args.tokenizer).save(self.model, 0, self.training_state())
            save_seconds = time.perf_counter() - t0
        calibration = Calibration(per_step, eval_seconds, save_seconds, time.time() - started, measured)
        plan = plan_for_budget(args.time_budget, self.elapsed(), fractions, calibration, args.warmup_ratio,
                               args.eval_points if self.evaluate is not None else 1,
                               args.save_points if self.out_dir is not None else 0,
                               margin=min(30.0, 0.01 * args.time_budget), min_warmup_steps=args.min_warmup_steps)
        if self.is_main:
            log.info(f"time budget {args.time_budget:.0f} s: {plan.total_steps} steps "
                     f"({', '.join(f'{t:.3f}' for t in per_step)} s/step measured, {self.elapsed():.0f} s used so far)")
        return plan

    def resume(self, checkpoint: Path, state: dict) -> int:
        expected = self.args.identity
        recorded = state.get("identity")
        if expected is not None and recorded is not None:
            differ = [k for k in sorted(set(expected) | set(recorded)) if expected.get(k) != recorded.get(k)]
            if differ:
                shown = "; ".join(f"{k}: checkpoint {recorded.get(k)!r}, now {expected.get(k)!r}" for k in differ)
                raise BertkitError(f"--resume: the checkpoint belongs to another run ({shown})", path=str(checkpoint))
        if state["global_step"] > self.plan.total_steps:
            raise BertkitError(f"--resume: the checkpoint is at step {state['global_step']}, beyond this run's "
                               f"{self.plan.total_steps} steps", path=str(checkpoint))
        Checkpointer.load_weights(self.model, checkpoint)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.position = state["position"]
        self.global_step = state["global_step"]
        self.elapsed_before = float(state.get("elapsed", 0.0))
        rng = state["rng"]
        set_rng_state(rng[self.rank] if isinstance(rng, list) else rng)
        if self.is_main:
            log.info(f"resuming from {checkpoint} (step {self.global_step}/{self.plan.total_steps})")
        return self.global_step

    # -- the steps of training -----------------------------------------------------------------
    def groups_of(self, source: BatchSource, epoch: int, start: int) -> Iterator[list[dict]]:
        """Micro-batches from `start`, grouped into the accumulation groups of one optimizer step."""
        n = source.num_batches(epoch)
        group: list[dict] = []
        micro = start
        for batch in source.batches(epoch, start=start):
            group.append(batch)
            micro += 1
            group_start = ((micro - 1) // self.accum) * self.accum
            if micro == min(group_start + self.accum, n):
                yield group
                group = []
        # A source that yields fewer batches than num_batches() promised: the partial group is dropped.

    def micro_batch(self, batch: dict, group_len: int, sync: bool):
        batch = {k: (v.to(self.device, non_blocking=True) if torch.is_tensor(v) else v) for k, v in batch.items()}
        context = contextlib.nullcontext() if (sync or self.world == 1) else self.train_model.no_sync()
        with context:
            with autocast(self.device, self.precision):
                out = self.train_model(**batch)
            # Before backward: a non-finite loss stops the run here, the weights and checkpoints untouched.
            check_finite_loss(float(out["loss"].detach()), self.global_step + 1)
            self.scaler.scale(out["loss"] / group_len).backward()
        return batch, out

    def optimizer_step(self) -> float:
        grad_norm = float("nan")
        if self.scaler.is_enabled():
            self.scaler.unscale_(self.optimizer)  # clip the true gradients
        if self.args.max_grad_norm and self.args.max_grad_norm > 0:
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.args.max_grad_norm))
        self.scaler.step(self.optimizer)  # without fp16 optimizer.step(); with it, skipped on inf / NaN gradients
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def step_on(self, group: list[dict], window: MetricsWindow | None = None) -> float:
        """One optimizer step over a group of micro-batches."""
        for i, batch in enumerate(group):
            batch, out = self.micro_batch(batch, len(group), sync=i == len(group) - 1)
            if window is not None:
                window.add_losses(out)
                window.add_batch(batch, self.world)
                if self.batch_metrics is not None:
                    with torch.no_grad():
                        window.add_hits(self.batch_metrics(batch, out))
                self.sequences += int(batch["input_ids"].shape[0]) * self.world
        return self.optimizer_step()

    def train_all_phases(self) -> bool:
        """Train to the end of the plan; True when a budgeted run had to stop early."""
        self.model.train()
        window = MetricsWindow()
        self.planner.start(self.global_step, self.paused)
        ends = self.plan.phase_ends()
        total = self.plan.total_steps
        bar = None
        if self.is_main and (self.args.progress if self.args.progress is not None else sys.stderr.isatty()):
            bar = tqdm(total=total, initial=self.global_step, unit="step", dynamic_ncols=True)
        try:
            while self.global_step < total:
                ph_idx, epoch, start = self.position["phase"], self.position["epoch"], self.position["batch"]
                phase = self.phases[ph_idx]
                n = phase.source.num_batches(epoch)
                if n == 0:
                    raise BertkitError(f"phase {phase.name!r} has no batches (is the data set empty?)")
                if bar is not None:
                    bar.set_description(phase.name)
                t0 = time.perf_counter()
                micro = start
                for group in self.groups_of(phase.source, epoch, start):
                    grad_norm = self.step_on(group, window)
                    self.scheduler.step()
                    self.global_step += 1
                    micro += len(group)
                    if bar is not None:
                        bar.update(1)
                    if self.global_step % max(1, self.args.logging_steps) == 0 or self.global_step == total:
                        self.log_window(window, phase.name, epoch, grad_norm, bar)
                    pause = time.perf_counter()
                    self.train_seconds += pause - t0
                    if self.planner.out_of_time(self.global_step):
                        return True
                    # The planner may move this phase's end (re-planned while it is still running).
                    ending = ph_idx if self.global_step == ends[ph_idx] and ph_idx < len(ends) - 1 else None
                    if self.planner.after_step(self.global_step, self.paused, ending):
                        total, ends = self.plan.total_steps, self.plan.phase_ends()
                        if bar is not None:
                            bar.total = total
                    self.position = {"phase": ph_idx, "epoch": epoch, "batch": micro}
                    if micro >= n:
                        self.position = {"phase": ph_idx, "epoch": epoch + 1, "batch": 0}
                    if self.global_step >= ends[ph_idx]:
                        self.position = {"phase": ph_idx + 1, "epoch": 0, "batch": 0}
                    if self.plan.eval_steps and self.global_step % self.plan.eval_steps == 0 \
                            and self.global_step < total:
                        self.run_eval()
                        if self.stop_requested:
                            return False
                    if self.plan.save_steps and self.global_step % self.plan.save_steps == 0 \
                            and self.global_step < total:
                        self.save_checkpoint()
                    t0 = time.perf_counter()
                    self.paused += t0 - pause
                    if self.global_step >= total or self.position["phase"] != ph_idx or self.position["batch"] == 0:
                        break
                else:  # the source yielded fewer batches than it promised: on to the next epoch
                    self.position = {"phase": ph_idx, "epoch": epoch + 1, "batch": 0}
        finally:
            if bar is not None:
                bar.close()
        return False

    # -- logging, evaluation, checkpoints ----------------------------------------------------------
    def log_window(self, window: MetricsWindow, phase: str, epoch: int, grad_norm: float, bar) -> None:
        record = {"step": self.global_step, "phase": phase, "epoch": epoch, **window.summary(),
                  "learning_rate": self.scheduler.get_last_lr()[0], "grad_norm": grad_norm,
                  "elapsed_s": round(self.elapsed(), 3)}
        if self.world > 1:
            record = average_across_ranks(record, self.device)
        if self.is_main:
            self.log.write(record)
        self.last_logs = record
        if bar is not None:
            bar.set_postfix(loss=f"{record.get('loss', float('nan')):.3f}", seq_s=f"{record['seq_per_s']:.1f}")
        elif self.is_main and self.out_dir is not None:
            log.info(f"step {self.global_step}/{self.plan.total_steps} loss {record.get('loss', float('nan')):.4f} "
                     f"lr {record['learning_rate']:.2e} {record['seq_per_s']:.1f} seq/s")
        window.reset()

    def run_eval(self) -> None:
        if self.evaluate is None or not self.is_main:
            return
        self.model.eval()
        with torch.no_grad(), autocast(self.device, self.precision):
            metrics = self.evaluate(self.model)
        self.model.train()
        record = {"step": self.global_step, "eval": True, **metrics, "elapsed_s": round(self.elapsed(), 3)}
        self.eval_history.append(record)
        if self.log is not None:  # None while calibrating: the step-0 record is written once the log opens
            self.log.write(record)
        if self.stop_after_eval is not None and self.stop_after_eval(metrics):
            self.stop_requested = True

    def training_state(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
                "position": self.position, "global_step": self.global_step, "rng": [rng_state()],
                "scaler": self.scaler.state_dict(),
                "total_steps": self.plan.total_steps if self.plan is not None else None,
                "plan": self.plan.to_dict() if self.plan is not None else None,
                "elapsed": self.elapsed(), "identity": self.args.identity}

    def save_checkpoint(self) -> None:
        if self.checkpointer is None:
            return
        state = self.training_state()
        if self.world > 1:
            rngs = [None] * self.world
            dist.all_gather_object(rngs, rng_state())
            state["rng"] = rngs
        if self.is_main:
            check_finite_weights(self.model, self.global_step)  # a diverged model never replaces a good checkpoint
            self.checkpointer.save(self.model, self.global_step, state)

    def write_summary(self, stopped_early: bool) -> None:
        if self.out_dir is None or not self.is_main:
            return
        plan = self.plan
        summary = {"global_step": self.global_step, "train_seconds": self.train_seconds, "sequences": self.sequences,
                   "sequences_per_second": self.sequences / max(self.train_seconds, 1e-9),
                   "elapsed_seconds": self.elapsed(), "precision": self.precision, "device": str(self.device),
                   "world_size": self.world, "total_steps": plan.total_steps}
        if plan.time_budget:
            summary.update(time_budget_seconds=plan.time_budget, stopped_early=stopped_early,
                           calibration=dataclasses.asdict(plan.calibration))
        (self.out_dir / "train_summary.json").write_text(json.dumps(summary, indent=2) + "\n")


def average_across_ranks(record: dict, device: torch.device | None = None) -> dict:
    """The record's losses and accuracies averaged over the ranks; the tensor on the training device
    (NCCL, the backend on CUDA, reduces only CUDA tensors)."""
    keys = [k for k, v in record.items()
            if isinstance(v, float) and k not in ("learning_rate", "seq_per_s", "tokens_per_s", "elapsed_s")]
    t = torch.tensor([record[k] for k in keys], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    world = dist.get_world_size()
    return {**record, **{k: float(v) / world for k, v in zip(keys, t)}}


__all__ = ["BatchSource", "Phase", "TrainArgs", "TrainResult", "Trainer", "fit", "dist_info", "latest_checkpoint",
           "set_seed", "STATE_NAME"]
