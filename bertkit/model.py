"""The BERT encoder (SPEC §2-3): embeddings, L post-LN Transformer layers, pooler.

Module and parameter names follow Hugging Face's BERT so checkpoints map one to one.
Shapes: B batch, T tokens, H hidden, A heads, D = H / A head size.
How the layers compute (oneDNN Linear, fused QKV, attention and dropout kernels, unpadding) is
set by the speed options in kernels.py; what they compute is the same either way.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import kernels
from .config import BertConfig
from .errors import BertkitError
from .hub import PreTrainedMixin
from .kernels import Dropout, Linear

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
    """Outputs by attribute (`out.loss`) or key (`out["loss"]`), like transformers'; None fields are left out."""

    def __init__(self, **fields):
        super().__init__({k: v for k, v in fields.items() if v is not None})

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self.get(name)

    def __getitem__(self, key):
        if isinstance(key, int):  # tuple-style access, as transformers allows
            return list(self.values())[key]
        return super().__getitem__(key)

    def to_tuple(self) -> tuple:
        return tuple(self.values())


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
        if T > self.position_embeddings.num_embeddings:
            raise BertkitError(f"sequence length {T} exceeds max_position_embeddings {self.position_embeddings.num_embeddings}")
        if position_ids is None:
            position_ids = torch.arange(T, device=input_ids.device)  # (T,), broadcast over B
        x = self.word_embeddings(input_ids) + self.position_embeddings(position_ids)  # (B, T, H)
        if token_type_ids is None:
            x = x + self.token_type_embeddings.weight[0]
        else:
            x = x + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_size = config.hidden_size // config.num_attention_heads
        self.query = Linear(config.hidden_size, config.hidden_size)
        self.key = Linear(config.hidden_size, config.hidden_size)
        self.value = Linear(config.hidden_size, config.hidden_size)
        self.dropout_p = config.attention_probs_dropout_prob
        self.is_causal = config.is_decoder

    def forward(self, x, attn_mask=None, unpadded=None):
        # x: (B, T, H), or (N, H): only the batch's N real tokens, which `unpadded` places.
        qkv = self.project_qkv(x)  # (..., 3H)
        dropout_p = self.dropout_p if self.training else 0.0
        if unpadded is not None and kernels.options.packed_attention:
            # Each sequence's real tokens are consecutive rows: attend within them, no re-padding.
            if kernels.grouped_attention_pays(qkv, dropout_p, self.is_causal):
                return kernels.grouped_attention(qkv, unpadded.attention_groups(), self.num_heads)
            return kernels.packed_attention(qkv, unpadded.lengths, self.num_heads, dropout_p, self.is_causal)
        if unpadded is not None:
            qkv = unpadded.pad(qkv)  # attention in the (B, T) layout
        B, T, _ = qkv.shape
        q, k, v = qkv.view(B, T, 3, self.num_heads, self.head_size).permute(2, 0, 3, 1, 4)  # 3 x (B, A, T, D)
        # attn_mask: None or bool (B, 1, 1|T, T), True = may attend. Causal + no padding uses the fast flag.
        ctx = kernels.attention(
            q, k, v,
            attn_mask=attn_mask,
            dropout_p=dropout_p,
            is_causal=self.is_causal and attn_mask is None,
        )  # (B, A, T, D)
        ctx = ctx.transpose(1, 2).reshape(B, T, -1)  # (B, T, H)
        return unpadded.unpad(ctx) if unpadded is not None else ctx

    def project_qkv(self, x):
        """Query, key and value side by side, (..., H) -> (..., 3H). With the `fused_qkv` speed option
        one GEMM on the concatenated weights; the checkpoint keeps query / key / value."""
        layers = (self.query, self.key, self.value)
        if kernels.options.fused_qkv:
            weight = torch.cat([layer.weight for layer in layers])  # (3H, H)
            bias = torch.cat([layer.bias for layer in layers])
            return kernels.linear(x, weight, bias)
        return torch.cat([layer(x) for layer in layers], -1)


class BertSelfOutput(nn.Module):
    """Projection, dropout, residual, LayerNorm (post-LN)."""

    def __init__(self, config: BertConfig, in_size: int):
        super().__init__()
        self.dense = Linear(in_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, h, residual):
        if (not self.training or self.dropout.p == 0.0) and type(self.dense) is Linear:
            # No dropout between projection and residual: the sum can be the GEMM's post-op.
            return self.LayerNorm(kernels.linear_add(h, self.dense.weight, self.dense.bias, residual))
        return self.LayerNorm(self.dropout(self.dense(h)) + residual)


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config, config.hidden_size)

    def forward(self, x, attn_mask=None, unpadded=None):
        return self.output(self.self(x, attn_mask, unpadded), x)


class BertIntermediate(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = Linear(config.hidden_size, config.intermediate_size)
        self.act = activation(config.hidden_act)
        self.exact_gelu = config.hidden_act == "gelu"

    def forward(self, x):  # (..., H) -> (..., 4H)
        if self.exact_gelu and type(self.dense) is Linear:  # a swapped-in layer (adapter, quantised) runs as is
            return kernels.linear_gelu(x, self.dense.weight, self.dense.bias)
        return self.act(self.dense(x))


class BertLayer(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertSelfOutput(config, config.intermediate_size)  # 4H -> H, residual, LayerNorm

    def forward(self, x, attn_mask=None, unpadded=None):
        x = self.attention(x, attn_mask, unpadded)
        return self.output(self.intermediate(x), x)


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))

    def forward(self, x, attn_mask=None, output_hidden_states=False, unpadded=None):
        """x: (B, T, H). With `unpadded`, the layers see only the real tokens (N, H); the result is re-padded."""
        hidden_states = [x] if output_hidden_states else None
        if unpadded is not None:
            x = unpadded.unpad(x)  # (B, T, H) -> (N, H)
        for layer in self.layer:
            x = layer(x, attn_mask, unpadded)
            if output_hidden_states:
                hidden_states.append(unpadded.pad(x) if unpadded is not None else x)
        return (unpadded.pad(x) if unpadded is not None else x), hidden_states


class BertPooler(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, x, last_index=None):
        if last_index is None:
            return torch.tanh(self.dense(x[:, 0]))  # (B, T, H) -> (B, H) from [CLS]
        # A left-to-right model's [CLS] has seen nothing: pool its last real token, as GPT does.
        return torch.tanh(self.dense(x[torch.arange(x.shape[0], device=x.device), last_index]))


def attention_mask_for_sdpa(attention_mask, is_causal: bool, T: int):
    """(B, T) 1/0 padding mask -> bool (B, 1, 1|T, T) for SDPA, or None when nothing is masked."""
    if attention_mask is None or bool(attention_mask.all()):
        return None  # no padding: SDPA's unmasked (or is_causal) fast path
    mask = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, T): keys that may be attended
    if is_causal:
        causal = torch.ones(T, T, dtype=torch.bool, device=mask.device).tril()
        mask = mask & causal  # (B, 1, T, T)
    return mask


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


class BertPreTrainedModel(PreTrainedMixin, nn.Module):
    config_class = BertConfig

    def init_weights(self):
        """SPEC §3: N(0, 0.02) truncated at 2 std, biases 0, LayerNorm weight 1."""
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
        for module in self.modules():
            if hasattr(module, "reset_extra_parameters"):
                module.reset_extra_parameters()


class BertModel(BertPreTrainedModel):
    def __init__(self, config: BertConfig, add_pooling_layer: bool = True):
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None
        self.init_weights()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None,
                output_hidden_states=False, return_dict=True, **unused):
        _reject_unknown(unused)
        x = self.embeddings(input_ids, token_type_ids, position_ids)  # (B, T, H)
        mask = attention_mask_for_sdpa(attention_mask, self.config.is_decoder, input_ids.shape[1])
        unpadded = kernels.unpadding_for(attention_mask) if mask is not None else None
        x, hidden_states = self.encoder(x, mask, output_hidden_states, unpadded)
        pooled = self.pool(x, attention_mask) if self.pooler is not None else None
        return ModelOutput(
            last_hidden_state=x,
            pooler_output=pooled,
            hidden_states=tuple(hidden_states) if hidden_states is not None else None,
        )


    def pool(self, sequence_output, attention_mask=None):
        """Pooled vector: [CLS] for the bidirectional model, the last real token for the LTR model."""
        last_index = None
        if self.config.is_decoder:
            T = sequence_output.shape[1]
            last_index = (attention_mask.sum(1) - 1).clamp(min=0) if attention_mask is not None else \
                torch.full((sequence_output.shape[0],), T - 1, device=sequence_output.device)
        return self.pooler(sequence_output, last_index)


def _reject_unknown(unused: dict):
    # transformers passes these; they do not change what we compute.
    unused = {k: v for k, v in unused.items() if k not in ("return_dict", "output_attentions") or v}
    if unused:
        raise TypeError(f"unexpected arguments: {', '.join(unused)}")


def param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


__all__ = ["BertModel", "BertPreTrainedModel", "ModelOutput", "param_count"]
