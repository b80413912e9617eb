"""Model speed, bertkit vs transformers on the same config, weights, inputs and optimizer, alternated
in one process: (a) pre-training step, (b) variable-length inference, (c) SQuAD-shaped fine-tuning
step; and the lever ablation (bertkit against itself with one speed option switched off)."""

from __future__ import annotations

import gc

import torch
import torch.nn.functional as F

import bench_common as C

# (batch size, timed rounds, timed rounds with --quick) per size for the length-128 training step.
PRETRAIN_PLAN = {"tiny": (32, 8, 4), "mini": (32, 6, 3), "small": (32, 4, 2), "medium": (16, 3, 2),
                 "base": (8, 3, 2), "large": (4, 2, 1)}
INFERENCE_PLAN = {"tiny": (32, 8, 4), "mini": (32, 8, 4), "small": (32, 6, 3), "medium": (32, 4, 3),
                  "base": (32, 4, 2), "large": (16, 2, 2)}
SQUAD_PLAN = {"tiny": (16, 4, 2), "mini": (16, 4, 2), "small": (16, 3, 2), "medium": (8, 2, 1),
              "base": (4, 2, 1), "large": (2, 2, 1)}


def _free():
    gc.collect()


def pretraining_case(size: str, precision: str, quick: bool, log=print, rounds: int | None = None) -> dict:
    from bertkit import BertForPreTraining

    batch_size, plan_rounds, quick_rounds = PRETRAIN_PLAN[size]
    rounds = rounds or (quick_rounds if quick else plan_rounds)
    config = C.bench_config(size)
    torch.manual_seed(0)
    ours = BertForPreTraining(config).train()
    theirs = C.transformers_twin(ours).train()
    batch = C.pretraining_batch(config, batch_size, 128)
    check = _loss_check(ours, theirs, batch, precision)
    opt_ours, opt_theirs = C.bertkit_optimizer(ours), C.transformers_optimizer(theirs)
    times = C.alternate({"bertkit": lambda: C.training_step(ours, opt_ours, batch, precision),
                         "transformers": lambda: C.training_step(theirs, opt_theirs, batch, precision)},
                        warmup=1 if size in ("base", "large") else 2, repeats=rounds)
    predicted = int((batch["labels"] != -100).sum())
    flops = C.pretraining_step_flops(config, [128] * batch_size, predicted)
    row = _row("a: pre-training step", size, precision, f"batch {batch_size} x 128", batch_size, flops, times)
    row["loss_check"] = check
    log(_line(row))
    del ours, theirs, opt_ours, opt_theirs
    _free()
    return row


def inference_case(size: str, precision: str, quick: bool, log=print, rounds: int | None = None) -> dict:
    from bertkit import BertModel

    batch_size, plan_rounds, quick_rounds = INFERENCE_PLAN[size]
    rounds = rounds or (quick_rounds if quick else plan_rounds)
    config = C.bench_config(size)
    torch.manual_seed(0)
    ours = BertModel(config).eval()
    theirs = C.transformers_twin(ours).eval()
    batches = C.variable_length_batches(config, batch_size, count=rounds + 2)
    with torch.no_grad(), C.precision_context(precision):
        b = batches[0]
        real = b["attention_mask"].bool()
        diff = (ours(**b).last_hidden_state.float() - theirs(**b).last_hidden_state.float())[real].abs().max()
    check = {"max_abs_diff_real_positions": float(diff)}
    position = {"bertkit": 0, "transformers": 0}

    def run(name, model):
        def step():
            with torch.no_grad(), C.precision_context(precision):
                model(**batches[position[name] % len(batches)])
            position[name] += 1
        return step

    times = C.alternate({"bertkit": run("bertkit", ours), "transformers": run("transformers", theirs)},
                        warmup=2, repeats=rounds)
    used = batches[2:2 + rounds]  # the batches of the timed rounds (both systems see the same ones)
    lengths = [int(n) for b in used for n in b["attention_mask"].sum(1)]
    padded = sum(b["attention_mask"].numel() for b in used)
    flops = C.encoder_forward_flops(config, lengths) // len(used)
    row = _row("b: inference, lengths 16-128", size, precision, f"batch {batch_size}, padded to batch max",
               batch_size, flops, times)
    row["padding_fraction"] = round(1 - sum(lengths) / padded, 3)
    row["loss_check"] = check
    log(_line(row))
    del ours, theirs
    _free()
    return row


def squad_case(size: str, precision: str, quick: bool, log=print, rounds: int | None = None) -> dict:
    from bertkit import BertForQuestionAnswering

    batch_size, plan_rounds, quick_rounds = SQUAD_PLAN[size]
    rounds = rounds or (quick_rounds if quick else plan_rounds)
    config = C.bench_config(size)
    torch.manual_seed(0)
    ours = BertForQuestionAnswering(config).train()
    theirs = C.transformers_twin(ours).train()
    batch = C.qa_batch(config, batch_size, 384)
    check = _loss_check(ours, theirs, batch, precision)
    opt_ours, opt_theirs = C.bertkit_optimizer(ours, 3e-5), C.transformers_optimizer(theirs, 3e-5)
    times = C.alternate({"bertkit": lambda: C.training_step(ours, opt_ours, batch, precision),
                         "transformers": lambda: C.training_step(theirs, opt_theirs, batch, precision)},
                        warmup=1, repeats=rounds)
    flops = C.qa_step_flops(config, [384] * batch_size)
    row = _row("c: SQuAD fine-tuning step", size, precision, f"batch {batch_size} x 384", batch_size, flops, times)
    row["loss_check"] = check
    log(_line(row))
    del ours, theirs, opt_ours, opt_theirs
    _free()
    return row


# (lever, options with it, options without it); "with" is bertkit's default unless marked.
TRAINING_LEVERS = [
    ("oneDNN fp32 Linear", {}, {"onednn_linear": "never"}),
    ("fused QKV projection", {}, {"fused_qkv": False}),
    ("written-out attention (vs SDPA)", {}, {"attention": "sdpa"}),
    ("fast dropout masks", {}, {"fast_dropout": False}),
]
INFERENCE_LEVERS = [
    ("unpadding (with packed attention)", {}, {"unpad": "never"}),
    ("packed attention (vs re-padding for attention)", {}, {"packed_attention": False}),
    ("oneDNN fp32 Linear in inference", {}, {"onednn_linear": "training"}),
]


def _lever_applies(lever: str, precision: str) -> bool:
    """Levers that act in one precision only: oneDNN fp32 Linear and the fused residual in fp32
    (autocast matmuls already go through oneDNN), grouped attention in bf16."""
    if precision == "bf16":
        return "oneDNN" not in lever and "in fp32" not in lever
    return "in bf16" not in lever


def lever_case(size: str, precision: str, quick: bool, log=print) -> list[dict]:
    """bertkit against itself with one speed option switched: what each lever buys."""
    from bertkit import BertForPreTraining, BertModel, kernels

    rows = []
    config = C.bench_config(size)
    rounds = (2 if quick else 3) if size in ("base", "large") else (3 if quick else 5)
    torch.manual_seed(0)
    trained = BertForPreTraining(config).train()
    optimizer = C.bertkit_optimizer(trained)
    batch = C.pretraining_batch(config, PRETRAIN_PLAN[size][0], 128)

    def step(changes):
        options = kernels.PROCESS_DEFAULT.replace(**changes)

        def run():
            trained.hold_kernels(options)  # the same model and optimizer, built with these options
            C.training_step(trained, optimizer, batch, precision)
        return run

    for lever, on, off in TRAINING_LEVERS:
        if precision == "bf16" and "oneDNN" in lever:
            continue  # autocast matmuls already go through oneDNN
        times = C.alternate({"on": step(on), "off": step(off)}, warmup=1, repeats=rounds)
        rows.append(_lever_row("a: pre-training step", size, precision, lever, times))
        log(_lever_line(rows[-1]))
    del trained, optimizer
    _free()

    encoder = BertModel(config).eval()
    batch_size = INFERENCE_PLAN[size][0]
    batches = C.variable_length_batches(config, batch_size, count=4)
    # The same sequences regrouped by length: what length-grouped batching adds on top.
    rows_by_length = sorted((b["attention_mask"][i].sum().item(), n, i) for n, b in enumerate(batches)
                            for i in range(batch_size))
    grouped = []
    for start in range(0, len(rows_by_length), batch_size):
        chunk = rows_by_length[start:start + batch_size]
        T = int(max(length for length, _, _ in chunk))
        grouped.append({k: torch.stack([F.pad(batches[n][k][i], (0, T - batches[n][k].shape[1]))[:T]
                                        for _, n, i in chunk])
                        for k in ("input_ids", "attention_mask", "token_type_ids")})

    def infer(changes, data):
        position = [0]
        options = kernels.PROCESS_DEFAULT.replace(**changes)

        def run():
            encoder.hold_kernels(options)
            with torch.no_grad(), C.precision_context(precision):
                encoder(**data[position[0] % len(data)])
            position[0] += 1
        return run

    levers = [(lever, on, off, batches, batches) for lever, on, off in INFERENCE_LEVERS
              if _lever_applies(lever, precision)]
    levers.append(("length-grouped batches (data side, not in the model)", {}, {}, grouped, batches))
    for lever, on, off, data_on, data_off in levers:
        # Timed rounds cover every batch once (grouped batches differ in length: a subset would bias).
        times = C.alternate({"on": infer(on, data_on), "off": infer(off, data_off)}, warmup=2, repeats=len(batches))
        rows.append(_lever_row("b: inference, lengths 16-128", size, precision, lever, times))
        log(_lever_line(rows[-1]))
    return rows


def _loss_check(ours, theirs, batch, precision) -> dict:
    """The two models compute the same thing: losses in eval mode (no dropout) agree."""
    ours.eval(), theirs.eval()
    with torch.no_grad(), C.precision_context(precision):
        a, b = float(ours(**batch).loss), float(theirs(**batch).loss)
    ours.train(), theirs.train()
    return {"bertkit_loss": round(a, 5), "transformers_loss": round(b, 5), "abs_diff": abs(a - b)}


def _row(case, size, precision, shape, batch_size, flops, times) -> dict:
    cmp = C.compare(times["bertkit"], times["transformers"])
    return {"case": case, "size": size, "precision": precision, "shape": shape,
            "bertkit_seq_per_s": batch_size / cmp["bertkit_s"],
            "transformers_seq_per_s": batch_size / cmp["transformers_s"],
            "bertkit_gflops": flops / cmp["bertkit_s"] / 1e9,
            "transformers_gflops": flops / cmp["transformers_s"] / 1e9,
            "useful_gflop_per_step": flops / 1e9, **cmp, "times": times}


def _line(row) -> str:
    return (f"{row['case']} {row['size']} {row['precision']}: bertkit {row['bertkit_seq_per_s']:.2f} seq/s, "
            f"transformers {row['transformers_seq_per_s']:.2f} seq/s, speed-up {row['speedup']:.2f}x "
            f"(paired {row['speedup_paired_median']:.2f}x), bertkit {row['bertkit_gflops']:.0f} GFLOP/s")


def _lever_row(case, size, precision, lever, times) -> dict:
    import statistics

    paired = [off / on for on, off in zip(times["on"], times["off"])]
    return {"case": case, "size": size, "precision": precision, "lever": lever,
            "on_s": statistics.median(times["on"]), "off_s": statistics.median(times["off"]),
            "gain": statistics.median(times["off"]) / statistics.median(times["on"]),
            "gain_paired_median": statistics.median(paired), "times": times}


def _lever_line(row) -> str:
    return (f"lever {row['lever']} ({row['case']}, {row['size']} {row['precision']}): "
            f"{row['gain']:.2f}x (paired {row['gain_paired_median']:.2f}x)")
