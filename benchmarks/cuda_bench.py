"""The CUDA table: bertkit against transformers (sdpa) on the same GPU, for benchmarks/cuda_check.sh.

    python benchmarks/cuda_bench.py --device cuda          # BERT-BASE, writes benchmarks/results/cuda/
    python benchmarks/cuda_bench.py --device cpu --quick   # the smoke mode a test runs (tiny model)

Rows: the pre-training step (MLM + NSP, 128 tokens, bf16 autocast on CUDA, fused AdamW, clip 1.0)
and variable-length inference (lengths uniform in 16-128, no gradients), each timed in alternated
rounds (bench_common.alternate) with the device synchronised around every call, and the
pre-training tokens per second per GPU beside the published rates.

Published per-GPU pre-training rates (BERT-BASE unless said, sequence length 128, mixed precision):
to be filled from the sources below when this runs on a lent GPU; until then the table says
"not filled" rather than carrying a number nobody checked here.
* NVIDIA DeepLearningExamples, PyTorch/LanguageModeling/BERT README, "Training performance
  results" (pre-training phase 1, seq 128; DGX A100 80GB and DGX H100 tables: sequences/s on
  8 GPUs -> divide by 8, times 128 for tokens/s; those tables are BERT-LARGE: scale by the
  FLOPs per token ratio, ~3.1x, to compare with BASE).
* MosaicBERT (Portes et al. 2023, "MosaicBERT: A Bidirectional Encoder Optimized for Fast
  Pretraining", and the MosaicML blog post): BERT-BASE to 79.6 GLUE in 1.13 h on 8 A100 80GB,
  throughput per GPU in the paper's appendix tables.
An H200 is compared with the H100 figure (same SM count and clocks; more memory bandwidth).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_common  # noqa: E402

# Published tokens/s per GPU for BERT-BASE pre-training at 128 tokens (None: not filled, see above).
PUBLISHED = {
    "NVIDIA DeepLearningExamples (A100 80GB)": None,
    "NVIDIA DeepLearningExamples (H100)": None,
    "MosaicBERT (A100 80GB)": None,
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda | cuda:N | cpu")
    parser.add_argument("--quick", action="store_true", help="tiny model, two rounds: a smoke run")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "cuda"))
    parser.add_argument("--batch-size", type=int, default=None, help="pre-training batch (default 64; quick 2)")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds (default 8; quick 2)")
    return parser.parse_args(argv)


def synchronised(device: torch.device, fn):
    """fn, timed to its end on the device (CUDA work is asynchronous)."""
    def run():
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return run


def autocast_for(device: torch.device, precision: str):
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def config_for(size: str):
    """The preset; the smoke run's tiny model with a small vocabulary (its output layer dominated)."""
    return bench_common.bench_config(size, vocab_size=2048) if size == "tiny" else bench_common.bench_config(size)


def pretraining_row(device, size, batch_size, rounds, precision):
    from bertkit.heads import BertForPreTraining
    from bertkit.train.optim import build_optimizer
    config = config_for(size)
    torch.manual_seed(0)
    ours = BertForPreTraining(config).to(device).train()
    theirs = bench_common.transformers_twin(ours).to(device).train()
    batch = {k: v.to(device) for k, v in bench_common.pretraining_batch(config, batch_size, 128).items()}
    optimizers = {"bertkit": build_optimizer(ours, 1e-4), "transformers": bench_common.transformers_optimizer(theirs)}

    def step(model, name):
        def run():
            with autocast_for(device, precision):
                loss = model(**batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizers[name].step()
            optimizers[name].zero_grad(set_to_none=True)
        return synchronised(device, run)

    times = bench_common.alternate({"bertkit": step(ours, "bertkit"), "transformers": step(theirs, "transformers")},
                                   warmup=2, repeats=rounds)
    row = bench_common.compare(times["bertkit"], times["transformers"])
    row["tokens_per_s"] = batch_size * 128 / row["bertkit_s"]
    row["transformers_tokens_per_s"] = batch_size * 128 / row["transformers_s"]
    return row


def inference_row(device, size, rounds, precision, batch_size=32, batches=8):
    from bertkit import BertModel
    config = config_for(size)
    torch.manual_seed(0)
    ours = BertModel(config).to(device).eval()
    theirs = bench_common.transformers_twin(ours).to(device).eval()
    data = [{k: v.to(device) for k, v in b.items()}
            for b in bench_common.variable_length_batches(config, batch_size, batches)]
    tokens = sum(int(b["attention_mask"].sum()) for b in data)

    def infer(model):
        def run():
            with torch.no_grad(), autocast_for(device, precision):
                for b in data:
                    model(**b)
        return synchronised(device, run)

    times = bench_common.alternate({"bertkit": infer(ours), "transformers": infer(theirs)}, warmup=1, repeats=rounds)
    row = bench_common.compare(times["bertkit"], times["transformers"])
    row["tokens_per_s"] = tokens / row["bertkit_s"]
    return row


def agreement_row(device, size, batch_size=8):
    """Do the numbers hold on this device? fp32 (TF32 off), padded variable-length inputs: bertkit's
    last hidden states at real tokens against transformers (sdpa) on the same device, and against
    bertkit on the CPU; bf16 autocast against fp32 on the device, for scale."""
    from bertkit import BertModel
    config = config_for(size)
    torch.manual_seed(0)
    cpu_model = BertModel(config).eval()
    ours = BertModel(config).to(device).eval()
    ours.load_state_dict(cpu_model.state_dict())
    theirs = bench_common.transformers_twin(ours).to(device).eval()
    batch = bench_common.variable_length_batches(config, batch_size, 1)[0]
    real = batch["attention_mask"].bool()
    on_device = {k: v.to(device) for k, v in batch.items()}
    matmul_tf32, cudnn_tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        with torch.no_grad():
            mine = ours(**on_device).last_hidden_state.float().cpu()
            reference = theirs(**on_device).last_hidden_state.float().cpu()
            on_cpu = cpu_model(**batch).last_hidden_state
            with autocast_for(device, "bf16"):
                in_bf16 = ours(**on_device).last_hidden_state.float().cpu()
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul_tf32, cudnn_tf32
    return {"max_abs_vs_transformers": float((mine - reference)[real].abs().max()),
            "max_abs_vs_cpu": float((mine - on_cpu)[real].abs().max()),
            "max_abs_bf16_vs_fp32": float((in_bf16 - mine)[real].abs().max()),
            "tokens": int(real.sum())}


def markdown(result: dict) -> str:
    pre, inf = result["pretraining"], result["inference"]
    lines = [f"# CUDA: bertkit against transformers (sdpa) on {result['device_name']}", "",
             f"torch {result['torch']}, {result['size']}, {result['precision']}, "
             f"{pre['rounds']} alternated rounds", "",
             "| case | bertkit | transformers (sdpa) | speed-up |", "|---|---|---|---|",
             f"| pre-training step (batch {result['batch_size']} x 128) | {pre['bertkit_s'] * 1e3:.1f} ms | "
             f"{pre['transformers_s'] * 1e3:.1f} ms | {pre['speedup']:.2f}x |",
             f"| variable-length inference (16-128 tokens) | {inf['bertkit_s'] * 1e3:.1f} ms | "
             f"{inf['transformers_s'] * 1e3:.1f} ms | {inf['speedup']:.2f}x |", "",
             "| pre-training tokens/s per GPU | value |", "|---|---|",
             f"| bertkit (measured) | {pre['tokens_per_s']:,.0f} |",
             f"| transformers sdpa (measured) | {pre['transformers_tokens_per_s']:,.0f} |"]
    for name, value in result["published"].items():
        lines.append(f"| {name} | {'not filled' if value is None else f'{value:,.0f}'} |")
    agree = result.get("agreement")
    if agree:
        lines += ["", f"Agreement, fp32 with TF32 off, {agree['tokens']} real tokens of padded variable-length inputs "
                  "(largest absolute difference of the last hidden states):", "",
                  "| bertkit on this device against | max abs |", "|---|---|",
                  f"| transformers (sdpa), same device | {agree['max_abs_vs_transformers']:.2e} |",
                  f"| bertkit on the CPU | {agree['max_abs_vs_cpu']:.2e} |",
                  f"| itself in bf16 autocast (for scale) | {agree['max_abs_bf16_vs_fp32']:.2e} |"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda but torch.cuda.is_available() is False")
    size = "tiny" if args.quick else "base"
    rounds = args.rounds or (2 if args.quick else 8)
    batch_size = args.batch_size or (2 if args.quick else 64)
    precision = "bf16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "fp32"
    result = {"device": str(device), "torch": torch.__version__, "size": size, "precision": precision,
              "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "batch_size": batch_size,
              "pretraining": pretraining_row(device, size, batch_size, rounds, precision),
              "inference": inference_row(device, size, rounds, precision, batch_size=4 if args.quick else 32,
                                         batches=2 if args.quick else 8),
              "agreement": agreement_row(device, size),
              "published": PUBLISHED}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cuda.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "cuda.md").write_text(markdown(result))
    print(markdown(result))
    return result


if __name__ == "__main__":
    main()
