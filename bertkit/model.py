"""The BERT encoder (paper §3, "Model Architecture"): embeddings, L post-LN Transformer layers, pooler.

This file says what BERT computes; how fast it runs sits behind one seam (the kernels package,
docs/speed.md), chosen when the model is built and held by it (`kernels=KernelOptions(...)`): a
`layout` decided once per batch in BertModel.forward (the padded batch with its mask, or only its
real tokens packed) runs attention, and the Linear / Dropout modules route their matmuls and masks
to the kernels that pay on this machine. `eager_attention` below is the formula written out; the
default ("auto") computes the same with torch's fused kernels (ATTENTION_IMPLEMENTATIONS).

Module and parameter names follow Hugging Face's BERT so checkpoints map one to one.
Shapes: B batch, T tokens, N real tokens of a packed batch, H hidden, A heads, D = H / A head size.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from .config import BertConfig
from .embedding_resize import resize_token_embeddings
from .errors import BertkitError
from .hub.checkpoints import PreTrainedMixin
from .kernels import (ATTENTION_KERNELS, Dropout, HoldsKernelOptions, KernelOptions, Linear, Padded, add_norm,
                      default_options, layout_for, linear_act, padding_mask, project_qkv)

ACTIVATIONS = {
    "gelu": F.gelu,  # exact (erf) GELU, as the paper
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
}


def activation(name: str):
    if name not in ACTIVATIONS:
        raise BertkitError(f"hidden_act {name!r} is not supported; choose from {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]


class ModelOutput(dict):
    """Outputs by attribute (`out.loss`), key (`out["loss"]`) or position (`out[0]`, `out[:2]`), like
    transformers'; None fields are left out. `to_tuple()` (what `return_dict=False` returns) keeps
    the field order: loss first."""

    def __init__(self, **fields):
        super().__init__({k: v for k, v in fields.items() if v is not None})

    def __getitem__(self, key):
        return super().__getitem__(key) if isinstance(key, str) else self.to_tuple()[key]

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self.get(name)

    def to_tuple(self) -> tuple:
        return tuple(self.values())


def eager_attention(q, k, v, layout: Padded, heads: int, dropout: nn.Dropout, return_probs: bool = False):
    """softmax(q k^T / sqrt(D)) v per head (Vaswani et al. 2017, §3.2), written out.

    q, k, v: (B, T, H), or (N, H) for a packed layout (padded back here); returns the same shape,
    and with `return_probs` the (B, A, T, T) attention probabilities too (after dropout, as
    transformers returns them). Masked keys get the dtype's lowest value before the softmax, as
    transformers' eager attention.
    """
    packed = q.dim() == 2
    if packed:
        q, k, v = (layout.unpadded.pad(t) for t in (q, k, v))  # (N, H) -> (B, T, H)
    B, T, H = q.shape
    q, k, v = (t.view(B, T, heads, H // heads).transpose(1, 2) for t in (q, k, v))  # (B, T, H) -> (B, A, T, D)
    scores = q @ k.transpose(-2, -1) / math.sqrt(H // heads)  # (B, A, T, T)
    mask = layout.full_mask(T, q.device)  # None or bool (B|1, 1, 1|T, T), True = may attend
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    probs = dropout(torch.softmax(scores, -1))  # (B, A, T, T)
    ctx = (probs @ v).transpose(1, 2).reshape(B, T, H)  # (B, A, T, D) -> (B, T, H)
    ctx = layout.unpadded.unpad(ctx) if packed else ctx
    return (ctx, probs) if return_probs else ctx


def kernel_attention(q, k, v, layout: Padded, heads: int, dropout: nn.Dropout) -> torch.Tensor:
    """The same with the layout's kernels: the one the model's options name (kernels.ATTENTION_KERNELS:
    "sdpa", "explicit", or "auto", which picks between them), per sequence on packed rows."""
    return layout.attention(q, k, v, heads, dropout.p if dropout.training else 0.0)


# The one attention registry, as transformers' attention-implementation registry: the model's
# `kernels.attention` names the entry (chosen at construction: `attn_implementation=` or `kernels=`).
ATTENTION_IMPLEMENTATIONS = {"eager": eager_attention, **{name: kernel_attention for name in ATTENTION_KERNELS}}


def kernel_options(kernels: KernelOptions | None = None, attn_implementation: str | None = None) -> KernelOptions:
    """The options a model is built with: `kernels` (default: kernels.default_options()), with the
    attention implementation `attn_implementation` when given."""
    kernels = kernels or default_options()
    if attn_implementation is None:
        return kernels
    if attn_implementation not in ATTENTION_IMPLEMENTATIONS:
        raise BertkitError(f"attention implementation {attn_implementation!r} is unknown; choose from "
                           f"{', '.join(ATTENTION_IMPLEMENTATIONS)}")
    return kernels.replace(attention=attn_implementation)


class BertEmbeddings(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids, token_type_ids=None, position_ids=None):
        T = input_ids.shape[1]
        limit = self.position_embeddings.num_embeddings
        if T > limit:
            raise BertkitError(f"sequence length {T} exceeds max_position_embeddings {limit}")
        if position_ids is None:
            position_ids = torch.arange(T, device=input_ids.device)  # (T,), broadcast over B
        x = self.word_embeddings(input_ids) + self.position_embeddings(position_ids)  # (B, T, H)
        if token_type_ids is None:
            x = x + self.token_type_embeddings.weight[0]
        else:
            x = x + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(HoldsKernelOptions, nn.Module):
    """Multi-head self-attention: A heads of scaled dot-product attention over D = H / A dimensions."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.query = Linear(config.hidden_size, config.hidden_size)
        self.key = Linear(config.hidden_size, config.hidden_size)
        self.value = Linear(config.hidden_size, config.hidden_size)
        self.dropout = Dropout(config.attention_probs_dropout_prob)  # on the attention probabilities

    def forward(self, x, layout: Padded, output_attentions: bool = False):
        # x: (B, T, H), or (N, H) when the layout packs the real tokens; the same shape comes out,
        # with the (B, A, T, T) attention maps when asked (they exist only in the formula written out).
        q, k, v = project_qkv(x, self.query, self.key, self.value, self.kernels)  # 3 x (..., H)
        if output_attentions:
            return eager_attention(q, k, v, layout, self.num_heads, self.dropout, return_probs=True)
        attend = ATTENTION_IMPLEMENTATIONS[self.kernels.attention]
        return attend(q, k, v, layout, self.num_heads, self.dropout), None  # (..., H)


class BertSelfOutput(nn.Module):
    """Projection, dropout, residual, LayerNorm (post-LN)."""

    def __init__(self, config: BertConfig, in_size: int):
        super().__init__()
        self.dense = Linear(in_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, h, residual):  # (..., in) , (..., H) -> (..., H)
        return add_norm(self.LayerNorm, self.dropout(self.dense(h)), residual)  # LayerNorm(... + residual)


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config, config.hidden_size)

    def forward(self, x, layout: Padded, output_attentions: bool = False):
        context, probs = self.self(x, layout, output_attentions)
        return self.output(context, x), probs


class BertIntermediate(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = Linear(config.hidden_size, config.intermediate_size)
        self.act = activation(config.hidden_act)

    def forward(self, x):  # (..., H) -> (..., 4H)
        return linear_act(self.dense, self.act, x)  # act(dense(x)); one fused GEMM where it pays


class BertLayer(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertSelfOutput(config, config.intermediate_size)  # 4H -> H, residual, LayerNorm

    def forward(self, x, layout: Padded, output_attentions: bool = False):
        x, probs = self.attention(x, layout, output_attentions)
        return self.output(self.intermediate(x), x), probs


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))
        # Keep only each layer's input for the backward pass and recompute the rest there
        # (Chen et al. 2016): activation memory O(L) layers' inputs instead of everything.
        self.gradient_checkpointing = False

    def forward(self, x, layout: Padded, output_hidden_states=False, output_attentions=False):
        """(B, T, H) -> (B, T, H), the hidden states and the attention maps (lists when asked);
        the layers see the layout's rows ((N, H) when packed)."""
        hidden_states = [x] if output_hidden_states else None
        attentions = [] if output_attentions else None
        x = layout.enter(x)
        for layer in self.layer:
            if self.gradient_checkpointing and torch.is_grad_enabled():
                x, probs = checkpoint(layer, x, layout, output_attentions, use_reentrant=False)
            else:
                x, probs = layer(x, layout, output_attentions)
            if output_hidden_states:
                hidden_states.append(layout.leave(x))
            if output_attentions:
                attentions.append(probs)
        return layout.leave(x), hidden_states, attentions


class BertPooler(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, x, last_index=None):
        if last_index is None:
            return torch.tanh(self.dense(x[:, 0]))  # (B, T, H) -> (B, H) from [CLS]
        # A left-to-right model's [CLS] has seen nothing: pool its last real token, as GPT does.
        return torch.tanh(self.dense(x[torch.arange(x.shape[0], device=x.device), last_index]))


def truncated_normal_(weight: torch.Tensor, std: float) -> torch.Tensor:
    """N(0, std^2) truncated at +-2 std, by redrawing the ~4.6% of draws that land outside.

    The same distribution as nn.init.trunc_normal_, whose inverse-CDF sampling is several times
    slower on CPU (it took most of the time to build BERT-BASE).
    """
    with torch.no_grad():
        weight.normal_(0.0, std)
        if weight.is_meta:
            return weight
        flat = weight.view(-1)
        redraw = (flat.abs() > 2 * std).nonzero().squeeze(1)
        while redraw.numel():
            flat[redraw] = flat.new_empty(redraw.numel()).normal_(0.0, std)
            redraw = redraw[flat[redraw].abs() > 2 * std]
    return weight


class BertPreTrainedModel(HoldsKernelOptions, PreTrainedMixin, nn.Module):
    config_class = BertConfig

    def post_init(self, kernels: KernelOptions):
        """The end of every model class's __init__: weights initialised once, kernel options held."""
        self.init_weights()
        self.hold_kernels(kernels)

    def hold_kernels(self, kernels: KernelOptions):
        """Compute with these kernel options from now on: every module that runs through the kernels
        (this model's and its encoder's) holds them; no other model is affected."""
        for module in self.modules():
            if isinstance(module, HoldsKernelOptions):
                module.kernels = kernels
        return self

    def init_weights(self):
        """As the released BERT: N(0, 0.02) truncated at 2 std, biases 0, LayerNorm weight 1.
        Each model class calls it once, at the end of its own __init__."""
        std = self.config.initializer_range
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                truncated_normal_(module.weight, std)
                if isinstance(module, nn.Linear) and module.bias is not None:
                    nn.init.zeros_(module.bias)
                if isinstance(module, nn.Embedding) and module.padding_idx is not None:
                    with torch.no_grad():
                        module.weight[module.padding_idx].zero_()
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def num_parameters(self, only_trainable: bool = False, exclude_embeddings: bool = False) -> int:
        """Parameter count, as transformers' (tied matrices once)."""
        skip = {id(m.weight) for m in self.modules() if isinstance(m, nn.Embedding)} if exclude_embeddings else set()
        return sum(p.numel() for p in self.parameters()
                   if id(p) not in skip and (p.requires_grad or not only_trainable))

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(p.dtype for p in self.parameters() if p.is_floating_point())

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict | None = None):
        """Recompute each layer's activations in the backward pass instead of keeping them
        (torch.utils.checkpoint, non-reentrant): the same gradients, less memory, one more forward pass.
        docs/speed.md has the measured saving."""
        if gradient_checkpointing_kwargs and gradient_checkpointing_kwargs.get("use_reentrant", False):
            raise BertkitError("only non-reentrant checkpointing is supported (use_reentrant=False)")
        self._set_gradient_checkpointing(True)

    def gradient_checkpointing_disable(self):
        self._set_gradient_checkpointing(False)

    def _set_gradient_checkpointing(self, enabled: bool):
        for module in self.modules():
            if isinstance(module, BertEncoder):
                module.gradient_checkpointing = enabled

    @property
    def is_gradient_checkpointing(self) -> bool:
        return any(m.gradient_checkpointing for m in self.modules() if isinstance(m, BertEncoder))

    def get_input_embeddings(self) -> nn.Embedding:
        return next(m for m in self.modules() if isinstance(m, BertEmbeddings)).word_embeddings

    def resize_token_embeddings(self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None,
                                mean_resizing: bool = True) -> nn.Embedding:
        """Grow (or cut) the vocabulary, as transformers: the tied MLM decoder and its bias follow
        (embedding_resize.py says how new rows start)."""
        return resize_token_embeddings(self, new_num_tokens, pad_to_multiple_of, mean_resizing)

    def set_attention_implementation(self, name: str):
        """"auto" (default: torch's fused SDPA, the written-out formula where SDPA is slow on the CPU,
        unpadding), "sdpa" (SDPA only), "explicit" (kernels' formula) or "eager" (model.py's formula)."""
        return self.hold_kernels(kernel_options(self.kernels, name))


class BertModel(BertPreTrainedModel):
    def __init__(self, config: BertConfig, add_pooling_layer: bool = True, attn_implementation: str | None = None,
                 initialize: bool = True, kernels: KernelOptions | None = None):
        """`kernels`: how it computes (default: kernels.default_options()); `initialize=False` when a
        head model builds it and initialises everything once itself."""
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None
        kernels = kernel_options(kernels, attn_implementation)
        if initialize:
            self.post_init(kernels)
        else:
            self.hold_kernels(kernels)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None,
                output_hidden_states=None, return_dict=True, output_attentions=None, pooled_tokens=None, **unused):
        _reject_unknown(unused)
        output_hidden_states = self.config.output_hidden_states if output_hidden_states is None else output_hidden_states
        output_attentions = self.config.output_attentions if output_attentions is None else output_attentions
        x = self.embeddings(input_ids, token_type_ids, position_ids)  # (B, T, H)
        T, causal = input_ids.shape[1], self.config.is_decoder
        # Decided once per batch. Attention maps are made on the padded batch, as transformers'.
        layout = Padded(padding_mask(attention_mask, causal, T), causal, self.kernels) if output_attentions \
            else layout_for(attention_mask, causal, T, self.kernels)
        x, hidden_states, attentions = self.encoder(x, layout, output_hidden_states, output_attentions)
        pooled = self.pool(x, attention_mask, pooled_tokens) if self.pooler is not None else None
        output = ModelOutput(
            last_hidden_state=x,
            pooler_output=pooled,
            hidden_states=tuple(hidden_states) if hidden_states is not None else None,
            attentions=tuple(attentions) if attentions is not None else None,
        )
        return output if return_dict else output.to_tuple()

    def pool(self, sequence_output, attention_mask=None, pooled_tokens=None):
        """Pooled vector: [CLS] for the bidirectional model, the last real token for the LTR model.
        `pooled_tokens` (S,): the tokens to pool instead, as positions in the flattened (B * T) rows
        (several inputs packed one after another in a row: inference/engine.py) -> (S, H)."""
        if pooled_tokens is not None:
            return self.pooler(sequence_output.reshape(1, -1, sequence_output.shape[-1]), pooled_tokens)
        last_index = None
        if self.config.is_decoder:
            T = sequence_output.shape[1]
            last_index = (attention_mask.sum(1) - 1).clamp(min=0) if attention_mask is not None else \
                torch.full((sequence_output.shape[0],), T - 1, device=sequence_output.device)
        return self.pooler(sequence_output, last_index)


def _reject_unknown(unused: dict):
    if unused:
        raise TypeError(f"unexpected arguments: {', '.join(unused)}")


__all__ = ["BertModel", "BertPreTrainedModel", "ModelOutput", "ATTENTION_IMPLEMENTATIONS", "eager_attention",
           "kernel_options"]
