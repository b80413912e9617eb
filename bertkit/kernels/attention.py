"""softmax(q k^T / sqrt(D) + mask) v: torch's SDPA, the formula written out where SDPA is slow on
the CPU, and attention on packed rows sequence by sequence.

`KERNELS` names the (B, A, T, D) attention kernels; the model's one attention registry
(model.ATTENTION_IMPLEMENTATIONS) routes "auto", "sdpa" and "explicit" here through the layout, so
the option a model holds (`KernelOptions.attention`) is the only thing that picks one. A new
kernel is a function with `sdpa`'s arguments plus one line in KERNELS (and in ATTENTION_MODES)."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from .dropout import dropout
from .options import PROCESS_DEFAULT, KernelOptions


def explicit_attention_pays(q: torch.Tensor, dropout_p: float) -> bool:
    """Written-out attention where torch's CPU SDPA is slow: training with dropout (SDPA then
    takes its unfused math path) and bf16 training (its fused bf16 backward took twice as long)."""
    training = torch.is_grad_enabled() and q.requires_grad
    return q.device.type == "cpu" and training and (dropout_p > 0.0 or q.dtype == torch.bfloat16)


def sdpa(q, k, v, attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False, fast_dropout: bool = True):
    """torch's fused scaled_dot_product_attention (its own dropout)."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal)


def auto_attention(q, k, v, attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False,
                   fast_dropout: bool = True):
    """SDPA, or the written-out formula where that pays (`explicit_attention_pays`)."""
    run = explicit_attention if explicit_attention_pays(q, dropout_p) else sdpa
    return run(q, k, v, attn_mask, dropout_p, is_causal, fast_dropout)


def explicit_attention(q, k, v, attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False,
                       fast_dropout: bool = True):
    """The formula written out; rows with nothing to attend to give zeros, as in SDPA."""
    T = q.shape[-2]
    # The scale on q (T x D) rather than on the scores (T x T): a smaller pass, exact for D = 64.
    scores = (q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)  # (B, A, T, T)
    if is_causal:
        causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
        attn_mask = causal if attn_mask is None else attn_mask & causal
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
        probs = torch.ops.aten._safe_softmax(scores, -1)  # a row with nothing to attend gives zeros
    else:
        probs = torch.softmax(scores, -1)  # every row has keys (a causal row at least itself)
    return dropout(probs, dropout_p, fast=fast_dropout) @ v  # (B, A, T, D)


KERNELS = {"auto": auto_attention, "sdpa": sdpa, "explicit": explicit_attention}


def attention(q, k, v, attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False,
              options: KernelOptions | None = None):
    """softmax(q k^T / sqrt(D) + mask) v for (B, A, T, D) inputs; attn_mask bool, True = may attend.

    The kernel `options.attention` names (default: the process default options; "eager", the
    model's own formula, runs "explicit" here); rows with nothing to attend to give zeros.
    """
    options = options or PROCESS_DEFAULT
    kernel = KERNELS.get(options.attention, explicit_attention)
    return kernel(q, k, v, attn_mask, dropout_p, is_causal, options.fast_dropout)


def packed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: list[int], heads: int,
                     dropout_p: float = 0.0, is_causal: bool = False,
                     options: KernelOptions | None = None) -> torch.Tensor:
    """Attention on packed tokens: (N, H) query, key and value rows, sequence after sequence
    (`lengths` rows each, then rows belonging to none) -> (N, H) context, zeros for those last rows.

    Each sequence attends within itself (block-diagonal attention) without a mask and without
    re-padding: per-sequence work is sum(L^2) instead of B * T^2, and the unmasked kernels are
    the fast ones. Differentiable (slices and `attention`).
    """
    N, H = q.shape
    options = options or PROCESS_DEFAULT
    if options.attention_bucket and not is_causal:
        return bucketed_attention(q, k, v, lengths, heads, dropout_p, options)
    parts, start = [], 0
    for L in lengths:
        if L == 0:
            continue
        # (L, H) rows of this sequence -> (1, A, L, D)
        q_, k_, v_ = (t[start:start + L].view(1, L, heads, H // heads).transpose(1, 2) for t in (q, k, v))
        ctx = attention(q_, k_, v_, dropout_p=dropout_p, is_causal=is_causal, options=options)  # (1, A, L, D)
        parts.append(ctx.transpose(1, 2).reshape(L, H))
        start += L
    if start < N:
        parts.append(q.new_zeros(N - start, H))
    return torch.cat(parts) if len(parts) > 1 else parts[0]


@functools.lru_cache(maxsize=16)
def _bucket_plan(lengths: tuple[int, ...], multiple: int):
    """For packed rows of these sequence lengths: the groups of sequences whose lengths round up to
    the same multiple of `multiple`, each as (gather rows (G*T,): padding positions read the group's
    first row; key mask (G, 1, 1, T) or None; its real positions among the G*T; G; T), and where
    the groups' real rows, concatenated, go in the packed order."""
    starts, start = [], 0
    for L in lengths:
        starts.append(start)
        start += L
    groups: dict[int, list[int]] = {}
    for i, L in enumerate(lengths):
        if L:
            groups.setdefault(-(-L // multiple), []).append(i)
    plan, destinations = [], []
    for members in groups.values():
        T = max(lengths[i] for i in members)
        positions = torch.arange(T)
        sizes = torch.tensor([lengths[i] for i in members])
        real = positions[None] < sizes[:, None]  # (G, T)
        rows = torch.tensor([starts[i] for i in members])[:, None] + positions[None]  # (G, T)
        gather = torch.where(real, rows, rows[:, :1]).reshape(-1)
        mask = None if bool(real.all()) else real[:, None, None, :]
        plan.append((gather, mask, real.reshape(-1).nonzero().squeeze(1), len(members), T))
        destinations.append(rows[real])
    return plan, torch.cat(destinations)


def bucketed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: list[int], heads: int,
                       dropout_p: float, options: KernelOptions) -> torch.Tensor:
    """`packed_attention` with sequences of similar length run together (`options.attention_bucket`):
    one masked (G, A, T, D) attention per group instead of G calls; the same numbers (masked keys
    weigh exactly 0). Differentiable (gathers and index_copy)."""
    N, H = q.shape
    plan, destinations = _bucket_plan(tuple(lengths), options.attention_bucket)
    parts = []
    for gather, mask, real, G, T in plan:
        if q.device.type != "cpu":
            gather, real = gather.to(q.device), real.to(q.device)
            mask = None if mask is None else mask.to(q.device)
        q_, k_, v_ = (t.index_select(0, gather).view(G, T, heads, H // heads).transpose(1, 2) for t in (q, k, v))
        ctx = attention(q_, k_, v_, mask, dropout_p, False, options)  # (G, A, T, D)
        parts.append(ctx.transpose(1, 2).reshape(G * T, H).index_select(0, real))
    rows = torch.cat(parts) if len(parts) > 1 else parts[0]
    return q.new_zeros(N, H).index_copy(0, destinations.to(q.device), rows)  # rows past the sequences: zeros
