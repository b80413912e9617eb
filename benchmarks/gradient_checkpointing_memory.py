"""Peak memory of one training step (forward + backward) with and without gradient checkpointing,
each in a fresh subprocess: BERT-BASE (BertForMaskedLM), fp32, CPU, batch 8 x 512 by default. The
peak is the process's resident high-water mark (VmHWM, bench_memory.py); the figure reported is
that peak minus the resident set after the model and its gradients exist (weights, gradients and
the batch are the same in both runs), i.e. what the step's activations cost.

    python benchmarks/gradient_checkpointing_memory.py [--batch-size 8] [--length 512]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_memory import status_mb  # noqa: E402


def child(checkpointing: bool, batch_size: int, length: int) -> dict:
    import torch

    from bertkit import BertConfig
    from bertkit.heads import BertForMaskedLM

    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                        intermediate_size=3072, max_position_embeddings=512)
    model = BertForMaskedLM(config).train()
    if checkpointing:
        model.gradient_checkpointing_enable()
    for p in model.parameters():  # gradients allocated up front: equal in both runs
        p.grad = torch.zeros_like(p)
    input_ids = torch.randint(1000, 30000, (batch_size, length))
    labels = torch.full_like(input_ids, -100)
    labels[:, ::7] = input_ids[:, ::7]  # ~15% predicted, as pre-training
    baseline = status_mb("VmRSS")
    model(input_ids, torch.ones_like(input_ids), labels=labels).loss.backward()
    return {"checkpointing": checkpointing, "baseline_mb": round(baseline), "peak_mb": round(status_mb("VmHWM")),
            "step_mb": round(status_mb("VmHWM") - baseline)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--child", choices=("on", "off"))
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child == "on", args.batch_size, args.length)))
        return
    results = []
    for mode in ("off", "on"):
        out = subprocess.run([sys.executable, __file__, "--child", mode, "--batch-size", str(args.batch_size),
                              "--length", str(args.length)], check=True, capture_output=True, text=True).stdout
        results.append(json.loads(out.strip().splitlines()[-1]))
        print(json.dumps(results[-1]))
    off, on = results
    print(f"activation memory of one step, {args.batch_size} x {args.length}: {off['step_mb']} MB -> {on['step_mb']} MB "
          f"({off['step_mb'] / max(on['step_mb'], 1):.1f}x less); process peak {off['peak_mb']} MB -> {on['peak_mb']} MB")


if __name__ == "__main__":
    main()
