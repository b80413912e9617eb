"""Shared pieces of the benchmark suite: the machine, its matmul peak, alternating timers, FLOP
counts, and bertkit / transformers model pairs built from one config with the same weights."""

from __future__ import annotations

import contextlib
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bertkit import BertConfig  # noqa: E402


# ---------------------------------------------------------------- the machine


def machine_description() -> dict:
    import transformers

    info = {"cpu": platform.processor() or platform.machine(), "logical_cpus": os.cpu_count(),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "torch_threads": torch.get_num_threads(),
            "load_average_at_start": [round(x, 2) for x in os.getloadavg()]}
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        lscpu = ""
    for line in lscpu.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "Model name":
            info["cpu"] = value
        elif key in ("CPU family", "Model", "Stepping"):
            info["cpu_" + key.split()[-1].lower()] = value
        elif key == "Core(s) per socket":
            info["cores_per_socket"] = int(value)
        elif key == "Socket(s)":
            info["sockets"] = int(value)
        elif key == "Flags":
            flags = set(value.split())
            info["isa"] = sorted(flags & {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "avx512_vnni"})
    from bertkit.device import bf16_supported, cpu_features
    from bertkit.kernels import PROCESS_DEFAULT as options

    features = cpu_features()
    info["bf16_supported"] = bf16_supported(torch.device("cpu"))
    info["cpu_class"] = features.cpu_class
    info["cpu_vendor"] = features.vendor
    info["emulation"] = emulation()
    info["default_speed_options"] = {"onednn_linear": options.onednn_linear}
    return info


EMULATION_VARIABLES = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS")


def emulation() -> str:
    """The instruction-set caps in force ("" when none): a CPU class emulated on a larger CPU."""
    return " ".join(f"{name}={os.environ[name]}" for name in EMULATION_VARIABLES if os.environ.get(name))


def matmul_peak(size: int = 2048, repeats: int = 7) -> dict[str, float]:
    """GFLOP/s of one large square GEMM: torch's default fp32 path, fp32 through oneDNN, and bf16."""
    from bertkit.kernels import _onednn_matmul, onednn_available

    from bertkit.device import cpu_features

    a, b = torch.randn(size, size), torch.randn(size, size)
    a16, b16 = a.bfloat16(), b.bfloat16()
    flops = 2 * size**3
    cases = {"fp32_default": lambda: torch.mm(a, b)}
    if cpu_features().bf16:  # emulated bf16 GEMMs take minutes at this size and mean nothing
        cases["bf16"] = lambda: torch.mm(a16, b16)
    if onednn_available():
        cases["fp32_onednn"] = lambda: _onednn_matmul(a, b.t())
    times = alternate(cases, warmup=1, repeats=repeats)
    return {name: round(flops / min(ts) / 1e9, 1) for name, ts in times.items()}


# ---------------------------------------------------------------- timing


def alternate(steps: dict, warmup: int, repeats: int, shuffle_seed: int | None = None,
              settle: float = 0.0) -> dict[str, list[float]]:
    """Run each callable once per round, rotating the order, so that load on a shared machine falls
    on all of them alike; returns each one's seconds per round (warm-up rounds dropped).

    Rotation keeps every callable behind the same predecessor. With `shuffle_seed` each round's order
    is a fresh (seeded) permutation instead: for engines whose worker threads keep spinning after a
    call (OpenMP's KMP_BLOCKTIME, ONNX Runtime's spinning pool), so that no engine always runs
    right after the same spinning one. `settle`: seconds of rest (untimed) before each call, for the
    spinning threads of the one before it to go quiet."""
    names = list(steps)
    times = {name: [] for name in names}
    rng = random.Random(shuffle_seed)
    for round_index in range(warmup + repeats):
        shift = round_index % len(names)
        order = names[shift:] + names[:shift]
        if shuffle_seed is not None:
            rng.shuffle(order)
        for name in order:
            if settle:
                time.sleep(settle)
            start = time.perf_counter()
            steps[name]()
            elapsed = time.perf_counter() - start
            if round_index >= warmup:
                times[name].append(elapsed)
    return times


def compare(ours: list[float], theirs: list[float]) -> dict:
    """Medians and the speed ratio theirs / ours (>1: bertkit faster), with the median of the
    per-round ratios as a check that is robust to load drifting during the run."""
    paired = [t / o for o, t in zip(ours, theirs)]
    return {"bertkit_s": statistics.median(ours), "transformers_s": statistics.median(theirs),
            "speedup": statistics.median(theirs) / statistics.median(ours),
            "speedup_paired_median": statistics.median(paired),
            "rounds": len(ours)}


@contextlib.contextmanager
def precision_context(precision: str):
    if precision == "bf16":
        with torch.autocast("cpu", dtype=torch.bfloat16):
            yield
    else:
        yield


# ---------------------------------------------------------------- FLOPs (useful work, the same for both)


def layer_flops_per_token(config: BertConfig) -> int:
    """Forward matmul FLOPs of one encoder layer per token, excluding attention scores."""
    H, I = config.hidden_size, config.intermediate_size
    return 2 * (4 * H * H + 2 * H * I)


def encoder_forward_flops(config: BertConfig, lengths) -> int:
    """Forward FLOPs of the encoder over sequences of these real lengths (padding not counted):
    projections and feed-forward per token, QK^T and AV per (query, key) pair."""
    L, H = config.num_hidden_layers, config.hidden_size
    tokens = sum(lengths)
    pairs = sum(n * n for n in lengths)
    return L * (layer_flops_per_token(config) * tokens + 4 * H * pairs)


def pretraining_step_flops(config: BertConfig, lengths, predicted: int) -> int:
    """Training FLOPs (forward + backward = 3x forward) of an MLM + NSP step that needs vocabulary
    logits only at the `predicted` positions, plus pooler and NSP."""
    H, V = config.hidden_size, config.vocab_size
    forward = encoder_forward_flops(config, lengths) + predicted * 2 * (H * H + H * V)
    forward += len(lengths) * 2 * (H * H + 2 * H)
    return 3 * forward


def qa_step_flops(config: BertConfig, lengths) -> int:
    return 3 * (encoder_forward_flops(config, lengths) + sum(lengths) * 2 * 2 * config.hidden_size)


# ---------------------------------------------------------------- models and inputs


def bench_config(size: str, **overrides) -> BertConfig:
    return BertConfig.preset(size, **overrides)


def transformers_twin(ours, attn_implementation: str = "sdpa"):
    """The transformers model of the same class and config, holding our weights."""
    import transformers

    transformers.logging.set_verbosity_error()
    config_dict = {k: v for k, v in ours.config.to_dict().items() if k != "bilstm_hidden_size"}
    config = transformers.BertConfig(**config_dict)
    config._attn_implementation = attn_implementation
    cls = getattr(transformers, type(ours).__name__)
    theirs = cls(config)
    result = theirs.load_state_dict(ours.state_dict(), strict=False)
    missing = [k for k in result.missing_keys if not k.startswith("cls.predictions.decoder")]
    if missing or result.unexpected_keys:
        raise RuntimeError(f"weights do not map: missing {missing}, unexpected {result.unexpected_keys}")
    theirs.tie_weights()
    return theirs


def pretraining_batch(config: BertConfig, batch_size: int, length: int, seed: int = 0,
                      mask_rate: float = 0.15) -> dict[str, torch.Tensor]:
    """Full-length pairs with realistic labels: ~15% of the non-special positions predicted
    (as create_pretraining_data: round(0.15 * length), at most 20 at length 128), NSP labels."""
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1000, config.vocab_size, (batch_size, length), generator=g)
    split = length // 2
    input_ids[:, 0], input_ids[:, split - 1], input_ids[:, -1] = 101, 102, 102  # [CLS] A [SEP] B [SEP]
    token_type_ids = (torch.arange(length) >= split).long().expand(batch_size, length).clone()
    labels = torch.full_like(input_ids, -100)
    predictions = min(max(1, round(mask_rate * length)), 20 if length <= 128 else 80)
    candidates = torch.tensor([i for i in range(1, length - 1) if i != split - 1])
    for row in range(batch_size):
        chosen = candidates[torch.randperm(len(candidates), generator=g)[:predictions]]
        labels[row, chosen] = input_ids[row, chosen]
        input_ids[row, chosen] = 103  # [MASK]
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "token_type_ids": token_type_ids,
            "labels": labels, "next_sentence_label": torch.randint(0, 2, (batch_size,), generator=g)}


def variable_length_batches(config: BertConfig, batch_size: int, count: int, low: int = 16, high: int = 128,
                            seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """Batches of lengths uniform in [low, high], right-padded to each batch's longest row."""
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(count):
        lengths = torch.tensor([rng.randint(low, high) for _ in range(batch_size)])
        T = int(lengths.max())
        mask = (torch.arange(T)[None] < lengths[:, None]).long()
        ids = torch.randint(1000, config.vocab_size, (batch_size, T), generator=g) * mask
        types = ((torch.arange(T)[None] >= lengths[:, None] // 2).long() * mask)
        batches.append({"input_ids": ids, "attention_mask": mask, "token_type_ids": types})
    return batches


def qa_batch(config: BertConfig, batch_size: int, length: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, config.vocab_size, (batch_size, length), generator=g)
    question = 24  # [CLS] question [SEP] context [SEP]
    types = (torch.arange(length) > question).long().expand(batch_size, length).clone()
    start = torch.randint(question + 1, length - 10, (batch_size,), generator=g)
    end = start + torch.randint(0, 8, (batch_size,), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": types,
            "start_positions": start, "end_positions": end}


def bertkit_optimizer(model, lr=1e-4):
    from bertkit.train.optim import build_optimizer

    return build_optimizer(model, lr)


def transformers_optimizer(model, lr=1e-4):
    """What transformers' Trainer builds by default with torch >= 2.8 (`adamw_torch_fused`):
    AdamW, decay 0.0 on biases and LayerNorm weights, fused kernel."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if name.endswith("bias") or "LayerNorm" in name else decay).append(p)
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, eps=1e-8, fused=True)


def training_step(model, optimizer, batch, precision: str):
    """One optimizer step as both training loops take it: forward (autocast for bf16), backward,
    clip at 1.0, AdamW, zero the gradients."""
    with precision_context(precision):
        loss = model(**batch).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss


def fmt_rate(x: float) -> str:
    return f"{x:.3g}" if x < 100 else f"{x:.0f}"
