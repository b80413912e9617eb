"""The losses `bertkit finetune sentence-embeddings` trains with, as sentence-transformers defines them.

Each loss reads the batch's embeddings by column, `embeddings[c]` (B, D) for column c of the
training file (anchor, positive, then any negatives), and the batch's labels, and returns a scalar:

- `mnrl`: MultipleNegativesRankingLoss (van den Oord et al., 2018; Henderson et al., 2017): for
  each anchor, cross-entropy over `scale` x cosine against every positive and negative of the
  batch, its own positive the target; `symmetric` adds the positive -> anchors direction and
  averages the two (MultipleNegativesSymmetricRankingLoss).
- `cached-mnrl`: the same loss and gradients in the memory of a mini-batch (GradCache, Gao et al.,
  2021; CachedMultipleNegativesRankingLoss): `CachedEmbeddings` embeds mini-batches without
  gradients, takes the loss's gradient with respect to the embeddings, then, when the training loop
  calls backward, embeds each mini-batch again with gradients (dropout replayed) and back-propagates
  the cached gradient through it.
- `cosent`: CoSENTLoss (Su, 2022): log(1 + sum over pairs with gold_i > gold_j of
  exp(scale (cos_j - cos_i))).
- `cosine`: CosineSimilarityLoss: mean squared error of cos(anchor, other) against the score.
- `mse`: MSELoss: the student's embeddings against the teacher's (one teacher vector per column,
  or one for every column).
- `margin-mse`: MarginMSELoss (Hofstätter et al., 2020): (dot(q, p) - dot(q, n_k)) against the
  teacher's margins (given as margins, or as positive and negative scores).
- `matryoshka(loss, dims, weights)`: MatryoshkaLoss (Kusupati et al., 2022): the weighted sum of
  the inner loss on the embeddings cut to each dimension and re-normalised.

sentence-transformers' own classes compute the same values on the same batch and weights
(tests/tasks/test_embedding_losses.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from ..errors import BertkitError

LossFn = Callable[[list, torch.Tensor | None], torch.Tensor]

SCORED_LOSSES = ("cosent", "cosine")  # (text, text, score) rows
RANKING_LOSSES = ("mnrl", "cached-mnrl")  # (anchor, positive[, negatives...]) rows
DISTILLATION_LOSSES = ("mse", "margin-mse")  # a teacher's embeddings or margins as labels
LOSSES = RANKING_LOSSES + SCORED_LOSSES + DISTILLATION_LOSSES


def cosine_matrix(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(N, D), (M, D) -> (N, M) cosine similarities (sentence-transformers' cos_sim)."""
    return F.normalize(a, p=2, dim=1) @ F.normalize(b, p=2, dim=1).T


def mnrl(embeddings: list, labels=None, scale: float = 20.0, symmetric: bool = False) -> torch.Tensor:
    """Multiple-negatives ranking: anchors (B, D) against all candidates of the batch, the positives
    (B, D) then each hard-negative column; row i's target is column i."""
    if len(embeddings) < 2:
        raise BertkitError("mnrl needs an anchor and a positive column")
    anchors, positives = embeddings[0], embeddings[1]
    scores = cosine_matrix(anchors, torch.cat(embeddings[1:], dim=0)) * scale  # (B, B x (C - 1))
    rows = torch.arange(anchors.shape[0], device=anchors.device)
    positive = scores[rows, rows]
    log_z = torch.logsumexp(scores, dim=1)
    if symmetric:  # and each positive against every anchor, averaged with the forward direction
        log_z = (log_z + torch.logsumexp(cosine_matrix(positives, anchors) * scale, dim=1)) / 2
    return (log_z - positive).mean()


def cosent(embeddings: list, labels: torch.Tensor, scale: float = 20.0) -> torch.Tensor:
    """CoSENT: every pair of batch rows whose gold scores differ, ranked by their cosines."""
    cosines = F.cosine_similarity(embeddings[0], embeddings[1], dim=-1).float() * scale  # (B,)
    differences = cosines[None, :] - cosines[:, None]  # [i, j] = cos_j - cos_i
    higher = labels.view(-1)[:, None] > labels.view(-1)[None, :]  # gold_i > gold_j
    differences = differences.masked_fill(~higher, float("-inf")).view(-1)
    return torch.logsumexp(torch.cat([differences.new_zeros(1), differences]), dim=0)


def cosine(embeddings: list, labels: torch.Tensor) -> torch.Tensor:
    """Mean squared error of cos(text, pair) against the gold score."""
    return F.mse_loss(F.cosine_similarity(embeddings[0], embeddings[1], dim=-1), labels.float().view(-1))


def mse(embeddings: list, labels: torch.Tensor) -> torch.Tensor:
    """Student embeddings against teacher embeddings: labels (B, D) for every column, or (B, C, D)
    one per column; the mean over columns of each column's mean squared error."""
    labels = labels.detach()
    teachers = [labels] * len(embeddings) if labels.dim() == 2 else list(labels.unbind(1))
    if len(teachers) != len(embeddings):
        raise BertkitError(f"{len(teachers)} teacher embeddings per row for {len(embeddings)} text columns")
    if teachers[0].shape[-1] != embeddings[0].shape[-1]:
        raise BertkitError(f"the teacher's embeddings have {teachers[0].shape[-1]} dimensions, the student's "
                           f"{embeddings[0].shape[-1]}: mse needs a teacher of the student's size")
    return torch.stack([F.mse_loss(e, t.to(e.dtype)) for e, t in zip(embeddings, teachers)]).mean()


def margin_mse(embeddings: list, labels: torch.Tensor) -> torch.Tensor:
    """(dot(q, p) - dot(q, n_k)) against the teacher's margins: labels (B, K) margins, (B, K + 1)
    the teacher's positive then negative scores, or (B,) with one negative."""
    query, positive, negatives = embeddings[0], embeddings[1], embeddings[2:]
    if not negatives:
        raise BertkitError("margin-mse needs a query, a positive and at least one negative column")
    labels = labels.detach().float()
    if labels.dim() == 1:
        labels = labels[:, None]
    if labels.shape[1] == len(negatives) + 1:
        labels = labels[:, :1] - labels[:, 1:]
    if labels.shape[1] != len(negatives):
        raise BertkitError(f"margin-mse needs {len(negatives)} margins (or {len(negatives) + 1} scores) per row, "
                           f"not {labels.shape[1]}")
    positive_score = (query * positive).sum(-1)
    margins = torch.stack([positive_score - (query * n).sum(-1) for n in negatives], dim=1)
    return F.mse_loss(margins.float(), labels)


def shrink(embedding: torch.Tensor, dim: int) -> torch.Tensor:
    """The first `dim` components, re-normalised (sentence-transformers' matryoshka `shrink`)."""
    if dim > embedding.shape[-1]:
        raise BertkitError(f"--matryoshka-dims {dim} is more than the model's {embedding.shape[-1]} dimensions")
    return F.normalize(embedding[..., :dim].float(), p=2, dim=-1).to(embedding.dtype)


def matryoshka(inner: LossFn, dims: Sequence[int], weights: Sequence[float] | None = None) -> LossFn:
    """The weighted sum of `inner` at each truncated dimension (weights default 1); a teacher's
    embeddings as labels (mse) are cut to the same dimension."""
    weights = [1.0] * len(dims) if weights is None else list(weights)
    if not dims or len(weights) != len(dims) or any(d <= 0 for d in dims):
        raise BertkitError("matryoshka needs positive dimensions and one weight per dimension")

    def loss(embeddings: list, labels=None) -> torch.Tensor:
        total = 0.0
        for dim, weight in zip(dims, weights):
            cut = labels
            if labels is not None and labels.dim() >= 2 and labels.shape[-1] == embeddings[0].shape[-1]:
                cut = labels[..., :dim]
            total = total + weight * inner([shrink(e, dim) for e in embeddings], cut)
        return total

    return loss


@dataclasses.dataclass(frozen=True)
class LossSpec:
    """A loss by its command-line name and settings: what the trained model computes on a batch."""

    name: str = "mnrl"
    scale: float = 20.0  # mnrl / cached-mnrl / cosent
    symmetric: bool = False  # mnrl / cached-mnrl
    mini_batch_size: int = 32  # cached-mnrl
    matryoshka_dims: tuple[int, ...] = ()
    matryoshka_weights: tuple[float, ...] | None = None

    def __post_init__(self):
        if self.name not in LOSSES:
            raise BertkitError(f"unknown loss {self.name!r}; expected one of {', '.join(LOSSES)}")
        if self.scale <= 0 or self.mini_batch_size < 1:
            raise BertkitError("the loss scale and --mini-batch-size must be positive")

    @property
    def cached(self) -> bool:
        return self.name == "cached-mnrl"

    def function(self) -> LossFn:
        """(embeddings by column, labels) -> the loss."""
        if self.name in RANKING_LOSSES:
            def base(embeddings, labels=None):
                return mnrl(embeddings, scale=self.scale, symmetric=self.symmetric)
        elif self.name == "cosent":
            def base(embeddings, labels):
                return cosent(embeddings, labels, scale=self.scale)
        else:
            base = {"cosine": cosine, "mse": mse, "margin-mse": margin_mse}[self.name]
        if self.matryoshka_dims:
            return matryoshka(base, self.matryoshka_dims, self.matryoshka_weights)
        return base

    def describe(self) -> str:
        """The loss as sentence-transformers names it (the model card's wording)."""
        names = {"mnrl": "MultipleNegativesRankingLoss", "cached-mnrl": "CachedMultipleNegativesRankingLoss",
                 "cosent": "CoSENTLoss", "cosine": "CosineSimilarityLoss", "mse": "MSELoss",
                 "margin-mse": "MarginMSELoss"}
        text = names[self.name]
        if self.name in RANKING_LOSSES and self.symmetric:
            text = text.replace("Negatives", "NegativesSymmetric")
        settings = []
        if self.name in RANKING_LOSSES + ("cosent",):
            settings.append(f"scale {self.scale:g}")
        if self.cached:
            settings.append(f"mini-batch {self.mini_batch_size}")
        if settings:
            text += f" ({', '.join(settings)})"
        if self.matryoshka_dims:
            text = f"MatryoshkaLoss over {text}, dimensions {', '.join(map(str, self.matryoshka_dims))}"
        return text


# ---------------------------------------------------------------- GradCache


class _ReplayedRandomness:
    """The random state before a mini-batch's first pass, restored for its second (the same dropout)."""

    def __init__(self, device: torch.device):
        self.devices = [device.index if device.index is not None else torch.cuda.current_device()] \
            if device.type == "cuda" else []
        self.cpu = torch.get_rng_state()
        self.cuda = [torch.cuda.get_rng_state(d) for d in self.devices]

    @contextlib.contextmanager
    def replay(self):
        with torch.random.fork_rng(devices=self.devices):
            torch.set_rng_state(self.cpu)
            for d, state in zip(self.devices, self.cuda):
                torch.cuda.set_rng_state(state, d)
            yield


def cached_loss(embed: Callable[[dict], torch.Tensor], columns: list[dict], labels, loss: LossFn,
                mini_batch_size: int) -> torch.Tensor:
    """GradCache: the value of `loss` over the whole batch, with its gradients delivered in the
    memory of one mini-batch.

    `embed(inputs) -> (b, D)` embeds rows of one column (`columns[c]`: that column's input tensors).
    Pass 1 embeds every mini-batch, keeping no graph, and takes d loss / d embeddings; the returned
    loss carries a hook that, when the training loop calls backward on it (scaled by accumulation),
    embeds each mini-batch again with gradients, its dropout replayed, and back-propagates the
    cached gradients through it. The parameters' gradients are those of the uncached loss."""
    autocast_on = torch.is_autocast_enabled(_device_type(columns))
    autocast_dtype = torch.get_autocast_dtype(_device_type(columns)) if autocast_on else None
    device = columns[0]["input_ids"].device
    chunks, states, reps = [], [], []
    # Pass 1 runs with autograd on, each mini-batch's graph dropped as soon as it is embedded: the
    # kernels then take the same (training) paths, and draw the same dropout masks, as pass 2.
    with torch.enable_grad():
        for inputs in columns:
            rows = inputs["input_ids"].shape[0]
            column_chunks = [{k: v[s:s + mini_batch_size] for k, v in inputs.items()}
                             for s in range(0, rows, mini_batch_size)]
            column_states = []
            column_reps = []
            for chunk in column_chunks:
                column_states.append(_ReplayedRandomness(device))
                column_reps.append(embed(chunk).detach())
            chunks.append(column_chunks)
            states.append(column_states)
            reps.append(column_reps)
    leaves = [torch.cat(r).float().requires_grad_() for r in reps]
    with torch.enable_grad():
        value = loss(leaves, labels)
    gradients = torch.autograd.grad(value, leaves)
    value = value.detach().requires_grad_()

    def backward(grad_output: torch.Tensor) -> None:
        with torch.enable_grad(), _autocast(device, autocast_dtype):
            for column_chunks, column_states, gradient in zip(chunks, states, gradients):
                start = 0
                for chunk, state in zip(column_chunks, column_states):
                    rows = chunk["input_ids"].shape[0]
                    with state.replay():
                        again = embed(chunk)
                    surrogate = (again.float() * gradient[start:start + rows] * grad_output).sum()
                    surrogate.backward()
                    start += rows

    value.register_hook(backward)
    return value


def _device_type(columns: list[dict]) -> str:
    return columns[0]["input_ids"].device.type


def _autocast(device: torch.device, dtype):
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()
