"""The batch layout BertModel decides once per batch: padded (B, T) rows with a key mask, or only
the real tokens packed (N, H); each runs attention for its own shape."""

from __future__ import annotations

import torch

from .attention import attention, packed_attention
from .graph_gemm import eager_attention, eager_ops, graph_attention, is_recording_attention, is_recording_bf16
from .options import PROCESS_DEFAULT, KernelOptions, exporting


class Padded:
    """The batch as it comes, (B, T, H) rows; attention masks the padding keys.

    mask: None (nothing to mask) or bool (B, 1, 1|T, T), True = may attend, causal part included;
    `causal` alone (no mask) lets SDPA take its fast causal path. `options`: the model's kernels
    (while exporting: the plain ones, whatever the model holds).
    """

    def __init__(self, mask: torch.Tensor | None, causal: bool, options: KernelOptions = PROCESS_DEFAULT,
                 segments: torch.Tensor | None = None):
        self.mask = mask
        self.causal = causal
        self.options = options
        self.segments = segments  # while exporting: the (B, T) attention mask as given (see attention)

    def enter(self, x: torch.Tensor) -> torch.Tensor:
        return x  # (B, T, H)

    def leave(self, x: torch.Tensor) -> torch.Tensor:
        return x  # (B, T, H)

    def full_mask(self, T: int, device) -> torch.Tensor | None:
        """The whole mask, causal part included, for attention written out: None when nothing is masked."""
        if self.causal and self.mask is None:
            return torch.ones(T, T, dtype=torch.bool, device=device).tril()
        return self.mask

    def attention_op_applies(self, q: torch.Tensor, dropout_p: float) -> bool:
        """Whether bertkit's attention op computes this call (`options.attention_op`): fp32 inference
        on the CPU, bidirectional, no dropout, the op built (graph_gemm.eager_ops)."""
        return self.options.attention_op and not self.causal and dropout_p == 0.0 and q.dtype == torch.float32 \
            and q.device.type == "cpu" and not torch.is_grad_enabled() and not exporting() \
            and not torch.is_autocast_enabled("cpu") and eager_ops()

    def attention(self, q, k, v, heads: int, dropout_p: float) -> torch.Tensor:
        """(B, T, H) query, key, value -> (B, T, H) context."""
        B, T, H = q.shape
        if is_recording_attention() and exporting() and not self.causal and dropout_p == 0.0 \
                and (q.dtype == torch.float32 or (q.dtype == torch.bfloat16 and is_recording_bf16())) \
                and (self.segments is not None or self.mask is None):
            # a graph compiled ahead (graph_gemm.py): the mask's values are segment ids, so that
            # inputs packed one after another in a row attend each within itself; the bf16 graph's
            # projections are bf16, its attention computed in fp32 and rounded back
            if q.dtype == torch.bfloat16:
                return graph_attention(q.float(), k.float(), v.float(), self.segments, heads).to(q.dtype)
            return graph_attention(q, k, v, self.segments, heads)
        if self.mask is None and self.attention_op_applies(q, dropout_p):  # no padding: one sequence a row
            return eager_attention(q, k, v, None, heads)
        q, k, v = (t.view(B, T, heads, H // heads).transpose(1, 2) for t in (q, k, v))  # (B, A, T, D)
        causal_flag = self.causal and self.mask is None
        ctx = attention(q, k, v, self.mask, dropout_p, causal_flag, self.options)  # (B, A, T, D)
        return ctx.transpose(1, 2).reshape(B, T, H)


class Unpadded:
    """Where the real tokens of a padded (B, T) batch sit: `unpad` gathers them, `pad` puts them back.

    Packed order: sequence 0's real tokens, then sequence 1's, ... (`lengths` tokens each), then
    the few padding positions that round the row count up to a multiple of `multiple`: those
    rows are computed like tokens, never attended to, and dropped again.
    """

    def __init__(self, attention_mask: torch.Tensor, multiple: int = 1):
        self.batch, self.length = attention_mask.shape
        real = attention_mask.reshape(-1) != 0
        index = real.nonzero().squeeze(1)
        self.lengths = (attention_mask != 0).sum(1).tolist()  # real tokens per sequence, in packed order
        extra = (-index.numel()) % max(1, multiple)
        if extra:
            index = torch.cat([index, (~real).nonzero().squeeze(1)[:extra]])
        self.index = index  # (N,) positions in the flattened (B*T) batch
        self.tokens = index.numel()
        self._segment_ids = None

    def segment_ids(self) -> torch.Tensor:
        """(1, N): each packed row's sequence numbered from 1, 0 for the rounding rows (the attention op's mask)."""
        if self._segment_ids is None:
            ids = torch.repeat_interleave(torch.arange(1, len(self.lengths) + 1), torch.tensor(self.lengths))
            self._segment_ids = torch.cat([ids, ids.new_zeros(self.tokens - ids.numel())])[None]
        return self._segment_ids

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, ...) -> (N, ...)"""
        return x.reshape(self.batch * self.length, *x.shape[2:]).index_select(0, self.index)

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """(N, ...) -> (B, T, ...), zeros at the positions left out."""
        full = x.new_zeros(self.batch * self.length, *x.shape[1:])
        return full.index_copy(0, self.index, x).view(self.batch, self.length, *x.shape[1:])


class Packed(Padded):
    """Only the real tokens, (N, H) rows sequence after sequence (`Unpadded`): the token-wise work
    (projections, feed-forward, LayerNorm, dropout) skips the padding. Attention runs on the
    packed rows sequence by sequence (`options.packed_attention`), or on them padded back."""

    def __init__(self, unpadded: Unpadded, mask: torch.Tensor, causal: bool, options: KernelOptions = PROCESS_DEFAULT):
        super().__init__(mask, causal, options)
        self.unpadded = unpadded
        self.per_sequence = options.packed_attention

    def enter(self, x: torch.Tensor) -> torch.Tensor:
        return self.unpadded.unpad(x)  # (B, T, H) -> (N, H)

    def leave(self, x: torch.Tensor) -> torch.Tensor:
        return self.unpadded.pad(x)  # (N, H) -> (B, T, H), zeros at padding

    def attention(self, q, k, v, heads: int, dropout_p: float) -> torch.Tensor:
        """(N, H) query, key, value -> (N, H) context."""
        if self.attention_op_applies(q, dropout_p):  # the sequences one after another in one row
            return eager_attention(q[None], k[None], v[None], self.unpadded.segment_ids(), heads)[0]
        if self.per_sequence:
            return packed_attention(q, k, v, self.unpadded.lengths, heads, dropout_p, self.causal, self.options)
        padded = super().attention(*(self.unpadded.pad(t) for t in (q, k, v)), heads, dropout_p)
        return self.unpadded.unpad(padded)


# A small unpadded count (at most `unpad_fine_rows`) is rounded up to a multiple of this, as the
# engine pads a lone input (batching.SINGLE_LENGTH_BUCKET): the GEMMs meet row counts they have met.
UNPAD_FINE_MULTIPLE = 8


def padding_mask(attention_mask: torch.Tensor | None, causal: bool, T: int, skip_if_full: bool = True):
    """(B, T) 1/0 padding mask -> bool (B, 1, 1|T, T) for SDPA, or None when nothing is masked
    (`skip_if_full`: a data-dependent check, left out when tracing so the mask is always built)."""
    if attention_mask is None or (skip_if_full and bool(attention_mask.all())):
        return None  # no padding: SDPA's unmasked (or is_causal) fast path
    mask = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, T): keys that may be attended
    if causal:
        mask = mask & torch.ones(T, T, dtype=torch.bool, device=mask.device).tril()  # (B, 1, T, T)
    return mask


def layout_for(attention_mask: torch.Tensor | None, causal: bool, T: int,
               options: KernelOptions = PROCESS_DEFAULT) -> Padded:
    """The layout for this batch: packed when `options.unpad` says it pays, padded otherwise, and
    always padded with the plain kernels (mask built unconditionally) while the model is being
    traced or exported, whatever options it holds."""
    if exporting():
        plain = KernelOptions.plain()
        segments = attention_mask if attention_mask is not None and attention_mask.dim() == 2 else None
        return Padded(padding_mask(attention_mask, causal, T, skip_if_full=False), causal, plain, segments)
    mask = padding_mask(attention_mask, causal, T)
    unpadded = unpadding_for(attention_mask, options) if mask is not None else None
    return Padded(mask, causal, options) if unpadded is None else Packed(unpadded, mask, causal, options)


def unpadding_for(attention_mask: torch.Tensor | None, options: KernelOptions = PROCESS_DEFAULT) -> Unpadded | None:
    """An Unpadded for this batch when `options.unpad` says so, else None (run padded). "auto" unpads
    only on the CPU: on a GPU SDPA takes the padded batch with its mask in one fused call, where
    packed attention launches kernels per sequence, and deciding would read the mask back to the host."""
    if attention_mask is None or options.unpad == "never" or attention_mask.dim() != 2:
        return None
    if options.unpad == "auto" and attention_mask.device.type != "cpu":
        return None
    padding = attention_mask.numel() - int(attention_mask.count_nonzero())
    if padding == 0:
        return None
    if options.unpad == "auto" and padding < options.unpad_min_saved_tokens:
        return None
    real = attention_mask.numel() - padding
    multiple = max(1, UNPAD_FINE_MULTIPLE if real <= options.unpad_fine_rows else options.unpad_multiple)
    if -(-real // multiple) * multiple >= attention_mask.numel():
        return None  # the rounded token count saves nothing (a lone padded input): not worth the gathers
    return Unpadded(attention_mask, multiple)
