"""How far a pre-trained model's attention is from uniform: per layer and head, the mean entropy of
the attention distributions over held-out text against the uniform distribution's, and the share
of attention on the position itself and on its two neighbours.

Diagnoses the plateau of short pre-training runs (benchmarks/results/pretraining_budget.md):
heads that stay near uniform mean the model is still a bag of words.

    python benchmarks/attention_entropy.py RUN_DIR --text heldout.txt [--sequences 8]

bertkit computes the attention maps (`output_attentions=True`: the formula written out, equal to
transformers' eager maps); the model is read from the run's Hugging Face layout folder.
"""

from __future__ import annotations

import argparse
import math

import torch


def attention_report(model_dir: str, lines: list[str], max_length: int = 128) -> list[dict]:
    from bertkit import BertModel, BertTokenizer

    model = BertModel.from_pretrained(model_dir).eval()
    tokenizer = BertTokenizer.from_pretrained(model_dir)
    batch = tokenizer(lines, max_length=max_length, truncation=True, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model(**batch, output_attentions=True)
    mask = batch["attention_mask"].bool()
    uniform = (torch.log(mask.sum(1).float())[:, None].expand(-1, mask.shape[1]))[mask].mean().item()
    offsets = (torch.arange(mask.shape[1])[None, :] - torch.arange(mask.shape[1])[:, None]).abs()
    rows = []
    for layer, maps in enumerate(out.attentions):  # (B, heads, T, T)
        entropy = -(maps * torch.log(maps + 1e-12)).sum(-1)
        for head in range(maps.shape[1]):
            probs = maps[:, head]
            rows.append({"layer": layer, "head": head, "entropy": entropy[:, head][mask].mean().item(),
                         "uniform_entropy": uniform,
                         "self": (probs * (offsets == 0)).sum(-1)[mask].mean().item(),
                         "neighbours": (probs * (offsets == 1)).sum(-1)[mask].mean().item()})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir")
    parser.add_argument("--text", required=True, help="held-out text, one sentence or paragraph per line")
    parser.add_argument("--sequences", type=int, default=8)
    parser.add_argument("--min-chars", type=int, default=200)
    args = parser.parse_args()
    with open(args.text, encoding="utf-8") as handle:
        lines = [line.strip() for line in handle if len(line.strip()) >= args.min_chars][:args.sequences]
    torch.set_num_threads(1)
    for row in attention_report(args.model_dir, lines):
        print(f"layer {row['layer']} head {row['head']}: entropy {row['entropy']:.2f} "
              f"(uniform {row['uniform_entropy']:.2f}, {math.exp(row['entropy']):.0f} positions' worth), "
              f"on itself {row['self']:.2f}, on its neighbours {row['neighbours']:.2f}")


if __name__ == "__main__":
    main()
