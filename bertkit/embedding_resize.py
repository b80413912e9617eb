"""`resize_token_embeddings`: a model's vocabulary grown (or cut) after tokens are added to its
tokenizer, the way transformers does it for BERT."""

from __future__ import annotations

import torch
from torch import nn

from .errors import BertkitError


def resize_token_embeddings(model: nn.Module, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None,
                            mean_resizing: bool = True) -> nn.Embedding:
    """Resize `model`'s word embeddings to `new_num_tokens` rows (rounded up to `pad_to_multiple_of`)
    in place, so that the tied MLM decoder (the same module) follows; its output bias is resized
    too and config.vocab_size updated. Returns the embedding module.

    New rows: with `mean_resizing` (transformers' default) drawn around the mean of the old rows,
    N(mean, 1e-9 * their covariance) (the mean itself if that covariance is not positive definite),
    so that new tokens start as the average token (Hewitt 2021); otherwise as initialisation does,
    N(0, initializer_range) truncated at 2 std. New output-bias entries are 0, as transformers pads
    a tied decoder's bias."""
    embeddings = model.get_input_embeddings()
    old_num_tokens, hidden = embeddings.weight.shape
    if new_num_tokens is None:
        new_num_tokens = old_num_tokens
    if pad_to_multiple_of is not None:
        if not isinstance(pad_to_multiple_of, int) or pad_to_multiple_of < 1:
            raise BertkitError(f"pad_to_multiple_of must be a positive integer, not {pad_to_multiple_of!r}")
        new_num_tokens = -(-new_num_tokens // pad_to_multiple_of) * pad_to_multiple_of
    if not isinstance(new_num_tokens, int) or new_num_tokens < 1:
        raise BertkitError(f"new_num_tokens must be a positive integer, not {new_num_tokens!r}")
    if embeddings.padding_idx is not None and embeddings.padding_idx >= new_num_tokens:
        raise BertkitError(f"{new_num_tokens} tokens would drop the padding token (id {embeddings.padding_idx})")
    kept = min(old_num_tokens, new_num_tokens)
    old = embeddings.weight.detach()
    weight = old.new_empty(new_num_tokens, hidden)  # (V', H)
    weight[:kept] = old[:kept]
    if new_num_tokens > old_num_tokens:
        weight[old_num_tokens:] = new_embedding_rows(old, new_num_tokens - old_num_tokens, mean_resizing,
                                                     model.config.initializer_range)
    embeddings.weight = nn.Parameter(weight, requires_grad=embeddings.weight.requires_grad)
    embeddings.num_embeddings = new_num_tokens
    for module in model.modules():
        # An MLM head (BertLMPredictionHead) decodes with `embeddings` and adds its own (V,) bias.
        bias = getattr(module, "bias", None)
        if getattr(module, "word_embeddings", None) == [embeddings] and isinstance(bias, nn.Parameter):
            new_bias = bias.detach().new_zeros(new_num_tokens)
            new_bias[:kept] = bias.detach()[:kept]
            module.bias = nn.Parameter(new_bias, requires_grad=bias.requires_grad)
    model.config.vocab_size = new_num_tokens
    return embeddings


def new_embedding_rows(old: torch.Tensor, count: int, mean_resizing: bool, std: float) -> torch.Tensor:
    """`count` new (count, H) embedding rows for `resize_token_embeddings` (see there)."""
    if not mean_resizing:
        # (count, H), truncated at 2 std as initialisation (a few rows: torch's slower sampler is fine)
        return nn.init.trunc_normal_(old.new_empty(count, old.shape[1]), 0.0, std, -2 * std, 2 * std)
    rows = old.float()
    mean = rows.mean(0)  # (H,)
    centered = rows - mean
    covariance = 1e-9 * (centered.T @ centered) / rows.shape[0]  # (H, H)
    if torch.distributions.constraints.positive_definite.check(covariance).item():
        sample = torch.distributions.MultivariateNormal(mean, covariance_matrix=covariance).sample((count,))
    else:
        sample = mean.expand(count, -1)
    return sample.to(old.dtype)


__all__ = ["resize_token_embeddings", "new_embedding_rows"]
