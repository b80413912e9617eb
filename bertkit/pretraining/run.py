"""`bertkit pretrain`: MLM + NSP pre-training by the paper's recipe (SPEC §4-6), or its ablations.

Objectives (configuration on the one model and loop, not forks):
  bert     BertForPreTraining: MLM + NSP
  no-nsp   BertForMaskedLM: MLM only
  ltr      BertForMaskedLM with causal attention, predicting the next token at every position
Two phases: phase 1 on `--data` (length 128), the last `--phase2-fraction` of the steps on
`--phase2-data` (length 512); one linear warm-up/decay schedule spans both.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


from ..config import BertConfig
from ..errors import BertkitError
from ..heads import BertForMaskedLM, BertForPreTraining
from ..metrics import perplexity
from ..train import Phase, TrainArgs, fit
from ..train.loop import dist_info, set_seed
from .shards import PretrainingBatchSource, PretrainingDataset


def build_pretraining_model(model_config: str | BertConfig, vocab_size: int, pad_id: int, objective: str,
                            nsp: bool):
    config = model_config if isinstance(model_config, BertConfig) else BertConfig.from_name_or_file(model_config)
    config.vocab_size, config.pad_token_id = vocab_size, pad_id
    if objective == "ltr":
        config.is_decoder = True
        return BertForMaskedLM(config)
    return BertForPreTraining(config) if nsp else BertForMaskedLM(config)


def pretraining_batch_metrics(batch: dict, out) -> dict:
    """Running MLM and NSP accuracy for the training logs: (correct, total) pairs."""
    metrics = {}
    labels = batch.get("labels")
    logits = out.get("prediction_logits")
    if labels is not None and logits is not None:
        targets = labels[labels != -100]
        metrics["mlm_accuracy"] = (int((logits.argmax(-1) == targets).sum()), targets.numel())
    if "next_sentence_label" in batch and out.get("seq_relationship_logits") is not None:
        nsp = batch["next_sentence_label"]
        metrics["nsp_accuracy"] = (int((out["seq_relationship_logits"].argmax(-1) == nsp).sum()), nsp.numel())
    return metrics


def make_evaluator(eval_source: PretrainingBatchSource, max_batches: int):
    """Held-out MLM loss / accuracy / perplexity and NSP accuracy, on the same masks every time."""

    def evaluate(model) -> dict:
        device = next(model.parameters()).device
        mlm_loss_sum = mlm_correct = mlm_total = nsp_correct = nsp_total = 0.0
        for i, batch in enumerate(eval_source.batches(0)):
            if i >= max_batches:
                break
            batch = {k: v.to(device) for k, v in batch.items()}
            out = model(**batch)
            n = int((batch["labels"] != -100).sum())
            mlm_loss_sum += float(out["mlm_loss"]) * n
            correct, total = pretraining_batch_metrics(batch, out)["mlm_accuracy"]
            mlm_correct, mlm_total = mlm_correct + correct, mlm_total + total
            if "nsp_accuracy" in (m := pretraining_batch_metrics(batch, out)):
                nsp_correct, nsp_total = nsp_correct + m["nsp_accuracy"][0], nsp_total + m["nsp_accuracy"][1]
        mean_loss = mlm_loss_sum / max(mlm_total, 1)
        result = {"mlm_loss": mean_loss, "mlm_accuracy": mlm_correct / max(mlm_total, 1),
                  "mlm_perplexity": perplexity(mean_loss), "eval_predictions": int(mlm_total)}
        if nsp_total:
            result["nsp_accuracy"] = nsp_correct / nsp_total
        return result

    return evaluate


def pretrain(data: str, output: str, model_config: str | BertConfig = "mini", max_steps: int = 1000,
             batch_size: int = 256, grad_accum: int = 1, learning_rate: float = 1e-4, warmup_steps: int = 10000,
             weight_decay: float = 0.01, max_grad_norm: float = 1.0, precision: str = "auto", seed: int = 12345,
             logging_steps: int = 50, save_steps: int = 1000, eval_steps: int = 0, eval_data: str | None = None,
             eval_batches: int = 20, resume: bool = False, nsp: bool = True, objective: str = "mlm",
             mask_mix=None, masking: str | None = None, phase2_data: str | None = None,
             phase2_fraction: float = 0.1, device: str = "auto", progress: bool | None = None):
    """Pre-train and return the TrainResult; the model lands in `output` in the Hugging Face layout."""
    if objective not in ("mlm", "ltr"):
        raise BertkitError(f"--objective must be mlm or ltr, not {objective!r}")
    nsp = nsp and objective == "mlm"
    rank, world = dist_info()
    per_rank, rest = divmod(batch_size, world * grad_accum)
    if rest or per_rank < 1:
        raise BertkitError(f"--batch-size {batch_size} must be a multiple of ranks x grad-accum = {world * grad_accum}")
    source_options = dict(objective=objective, nsp=nsp, mask_mix=mask_mix, masking=masking)

    def source(directory, seed_offset=0):
        dataset = PretrainingDataset(directory)
        return dataset, PretrainingBatchSource(dataset, per_rank, seed + seed_offset, rank=rank, world_size=world,
                                               **source_options)

    dataset1, source1 = source(data)
    phases = [Phase(source1, steps=max_steps, name=f"phase1 (len {dataset1.max_seq_length})")]
    if phase2_data:
        if not 0 < phase2_fraction < 1:
            raise BertkitError("--phase2-fraction must be between 0 and 1")
        dataset2, source2 = source(phase2_data, seed_offset=1)
        if dataset2.manifest["vocab"]["sha256"] != dataset1.manifest["vocab"]["sha256"]:
            raise BertkitError("phase-2 data was built with a different vocabulary than phase-1 data",
                               path=phase2_data)
        steps2 = max(1, round(max_steps * phase2_fraction))
        phases = [Phase(source1, steps=max_steps - steps2, name=phases[0].name),
                  Phase(source2, steps=steps2, name=f"phase2 (len {dataset2.max_seq_length})")]

    set_seed(seed)  # the initial weights too are a function of --seed
    model = build_pretraining_model(model_config, dataset1.vocab_size, dataset1.pad_id, objective, nsp)
    evaluate = None
    if eval_data:
        eval_dataset = PretrainingDataset(eval_data)
        eval_source = PretrainingBatchSource(eval_dataset, min(64, max(1, len(eval_dataset))), seed=0,
                                             drop_last=False, **source_options)
        evaluate = make_evaluator(eval_source, eval_batches)

    tokenizer = None
    try:
        from ..tokenizer import BertTokenizer

        tokenizer = BertTokenizer.from_pretrained(dataset1.directory / dataset1.manifest["vocab"]["file"])
        if "do_lower_case" in dataset1.manifest["vocab"]:
            tokenizer.do_lower_case = dataset1.manifest["vocab"]["do_lower_case"]
    except BertkitError:
        raise
    except Exception:  # a model without a tokenizer is still a usable checkpoint
        tokenizer = None

    args = TrainArgs(output_dir=output, learning_rate=learning_rate, warmup_steps=warmup_steps,
                     weight_decay=weight_decay, max_grad_norm=max_grad_norm, grad_accum=grad_accum,
                     precision=precision, device=device, seed=seed, logging_steps=logging_steps,
                     save_steps=save_steps, eval_steps=eval_steps, resume=resume, progress=progress,
                     tokenizer=tokenizer)
    if rank == 0:
        Path(output).mkdir(parents=True, exist_ok=True)
        (Path(output) / "pretrain_args.json").write_text(json.dumps({
            "data": str(data), "phase2_data": phase2_data, "model_config": model.config.to_dict(),
            "max_steps": max_steps, "batch_size": batch_size, "grad_accum": grad_accum, "world_size": world,
            "learning_rate": learning_rate, "warmup_steps": warmup_steps, "objective": objective, "nsp": nsp,
            "mask_mix": mask_mix, "seed": seed, "precision": precision}, indent=2) + "\n")
    return fit(model, phases, args, evaluate=evaluate, batch_metrics=pretraining_batch_metrics)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", required=True, help="pre-training data directory (bertkit create-pretraining-data)")
    p.add_argument("--output", required=True, help="run directory: model, checkpoints, metrics.jsonl")
    p.add_argument("--model-config", default="mini", help="size preset (tiny, mini, small, medium, base, large) or config.json")
    p.add_argument("--vocab", help="ignored unless it disagrees with the data's vocabulary (the data carries its own)")
    p.add_argument("--max-steps", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=256, help="global batch: per-rank batch x ranks x grad-accum")
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--learning-rate", type=float, default=1e-4)
    p.add_argument("--warmup-steps", type=int, default=10000)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    p.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"])
    p.add_argument("--device", default="auto")
    p.add_argument("--seed", type=int, default=12345)
    p.add_argument("--logging-steps", type=int, default=50)
    p.add_argument("--save-steps", type=int, default=1000)
    p.add_argument("--eval-steps", type=int, default=0)
    p.add_argument("--eval-data", help="held-out pre-training data directory for MLM/NSP evaluation")
    p.add_argument("--eval-batches", type=int, default=20)
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --output")
    p.add_argument("--no-nsp", action="store_true", help="MLM only (the paper's No-NSP ablation)")
    p.add_argument("--objective", default="mlm", choices=["mlm", "ltr"], help="ltr: left-to-right LM, no NSP")
    p.add_argument("--mask-mix", help="[MASK]/same/random percentages, e.g. 80,10,10 (dynamic masking)")
    p.add_argument("--masking", choices=["static", "dynamic"], help="override the data's masking mode")
    p.add_argument("--phase2-data", help="data directory for phase 2 (length 512)")
    p.add_argument("--phase2-fraction", type=float, default=0.1)
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None)


def run_from_args(args) -> int:
    if args.vocab:
        dataset = PretrainingDataset(args.data)
        data_vocab = (dataset.directory / dataset.manifest["vocab"]["file"]).read_bytes()
        vocab_path = Path(args.vocab) / "vocab.txt" if Path(args.vocab).is_dir() else Path(args.vocab)
        if not vocab_path.is_file():
            raise BertkitError("vocabulary file not found", path=str(vocab_path))
        if vocab_path.read_bytes() != data_vocab:
            raise BertkitError("--vocab differs from the vocabulary the data was built with", path=str(vocab_path))
    result = pretrain(
        data=args.data, output=args.output, model_config=args.model_config, max_steps=args.max_steps,
        batch_size=args.batch_size, grad_accum=args.grad_accum, learning_rate=args.learning_rate,
        warmup_steps=args.warmup_steps, weight_decay=args.weight_decay, max_grad_norm=args.max_grad_norm,
        precision=args.precision, seed=args.seed, logging_steps=args.logging_steps, save_steps=args.save_steps,
        eval_steps=args.eval_steps, eval_data=args.eval_data, eval_batches=args.eval_batches, resume=args.resume,
        nsp=not args.no_nsp, objective=args.objective, mask_mix=args.mask_mix, masking=args.masking,
        phase2_data=args.phase2_data, phase2_fraction=args.phase2_fraction, device=args.device,
        progress=args.progress,
    )
    rank, _ = dist_info()
    if rank == 0:
        final = result.eval_history[-1] if result.eval_history else result.last_logs
        shown = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in final.items()}
        print(json.dumps({"global_step": result.global_step, "seq_per_s": round(result.sequences_per_second, 2),
                          **shown}))
    return 0


__all__ = ["pretrain", "build_pretraining_model", "make_evaluator"]
