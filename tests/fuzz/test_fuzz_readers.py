"""Fuzz every reader with generated hostile files: each returns a result or raises BertkitError
(which the CLI prints as one line) -- never another exception, never a hang."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from fuzz_strategies import FUZZ, hostile_file, json_text, json_values, rows_of, squad_json
from hypothesis import given
from hypothesis import strategies as st

from bertkit.config import BertConfig
from bertkit.errors import BertkitError
from bertkit.metrics.conll import evaluate_conll_file
from bertkit.metrics.squad import evaluate_squad
from bertkit.train.plot import read_metrics
from bertkit.pretraining.corpus import read_corpus_file
from bertkit.tasks.glue import read_glue_file
from bertkit.tasks.multiple_choice import read_swag_file
from bertkit.tasks.ner import read_conll
from bertkit.tasks.squad_windows import read_squad
from bertkit.tasks.user_files import read_choice_file, read_tagged_file, read_text_file
from bertkit.tokenizer import load_vocab


def read_or_refuse(read, content: bytes, name: str):
    """Write `content` to a fresh file `name`, call read(path); only BertkitError may escape."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / name
        path.write_bytes(content)
        try:
            return read(path)
        except BertkitError as error:
            assert "\n" not in str(error)
            return None


GLUE_HEADER = ["index", "sentence1", "sentence2", "label"]


@FUZZ
@given(content=hostile_file(rows_of("\t", GLUE_HEADER)), task=st.sampled_from(["rte", "stsb", "sst2", "cola"]),
       split=st.sampled_from(["train", "test"]), skip=st.booleans())
def test_glue_tsv(content, task, split, skip):
    read_or_refuse(lambda p: read_glue_file(p, task, split, skip_bad_rows=skip), content, "train.tsv")


SWAG_HEADER = ["", "video-id", "sent1", "sent2", "ending0", "ending1", "label"]


@FUZZ
@given(content=hostile_file(rows_of(",", SWAG_HEADER)), name=st.sampled_from(["swag.csv", "swag.jsonl"]),
       skip=st.booleans())
def test_swag_csv_and_jsonl(content, name, skip):
    read_or_refuse(lambda p: read_swag_file(p, skip_bad_rows=skip), content, name)


@FUZZ
@given(data=st.one_of(squad_json, json_values), version=st.sampled_from([None, "1.1", "2.0"]), skip=st.booleans())
def test_squad_json_for_training_and_prediction(data, version, skip):
    read_or_refuse(lambda p: read_squad(p, version, skip_bad_rows=skip), json_text(data).encode(), "squad.json")


@FUZZ
@given(data=st.one_of(squad_json, json_values), predictions=st.one_of(
    st.dictionaries(st.sampled_from(["q1", "q2", "q3"]), st.one_of(st.text(max_size=5), json_values)), json_values),
    na_probs=st.one_of(st.none(), st.dictionaries(st.sampled_from(["q1", "q2", "q3"]), json_values)))
def test_squad_official_evaluation(data, predictions, na_probs):
    with tempfile.TemporaryDirectory() as folder:
        paths = {name: Path(folder) / f"{name}.json" for name in ("data", "pred", "na")}
        paths["data"].write_text(json_text(data))
        paths["pred"].write_text(json_text(predictions))
        paths["na"].write_text(json_text(na_probs))
        try:
            evaluate_squad(paths["data"], paths["pred"], None if na_probs is None else paths["na"])
        except BertkitError:
            pass


@FUZZ
@given(content=hostile_file(rows_of(" ")), skip=st.booleans())
def test_conll_training_file_and_conlleval(content, skip):
    read_or_refuse(lambda p: read_conll(p, skip_bad_rows=skip), content, "train.txt")
    read_or_refuse(evaluate_conll_file, content, "predictions.txt")


USER_HEADER = ["id", "text", "pair", "label", "A", "B"]


@FUZZ
@given(content=hostile_file(rows_of(",", USER_HEADER)), name=st.sampled_from(["own.csv", "own.tsv", "own.jsonl"]),
       skip=st.booleans())
def test_own_tables_for_classification_and_multiple_choice(content, name, skip):
    read_or_refuse(lambda p: read_text_file(p, "text", "label", "pair", "id", skip_bad_rows=skip), content, name)
    read_or_refuse(lambda p: read_choice_file(p, "text", ["A", "B"], "label", skip_bad_rows=skip), content, name)
    read_or_refuse(lambda p: read_choice_file(p, "text", ["A"], "label", skip_bad_rows=skip), content, name)


@FUZZ
@given(content=hostile_file(rows_of(" ")), name=st.sampled_from(["own.conll", "own.jsonl"]),
       tag_column=st.sampled_from([None, 1, 2, 3]), skip=st.booleans())
def test_own_tagging_files(content, name, tag_column, skip):
    read_or_refuse(lambda p: read_tagged_file(p, tag_column, skip_bad_rows=skip), content, name)


@FUZZ
@given(content=hostile_file(rows_of(" ")), raw=st.booleans(), max_line_chars=st.integers(-2, 40),
       encoding_errors=st.sampled_from(["strict", "replace"]))
def test_corpus_reader_never_hangs(content, raw, max_line_chars, encoding_errors):
    read_or_refuse(lambda p: list(read_corpus_file(p, raw=raw, max_line_chars=max_line_chars,
                                                   encoding_errors=encoding_errors)), content, "corpus.txt")


CONFIG_FIELDS = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                 "hidden_dropout_prob", "layer_norm_eps", "max_position_embeddings", "id2label", "architectures",
                 "is_decoder", "hidden_act", "model_type", "num_labels", "pad_token_id", "classifier_dropout"]


@FUZZ
@given(fields=st.dictionaries(st.sampled_from(CONFIG_FIELDS), json_values, max_size=4), raw=st.one_of(st.none(),
       st.binary(max_size=40)))
def test_config_json(fields, raw):
    good = {"vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
            "intermediate_size": 32}
    content = raw if raw is not None else json_text({**good, **fields}).encode()
    config = read_or_refuse(BertConfig.from_json_file, content, "config.json")
    if config is not None:  # accepted: then it is a usable config
        assert config.hidden_size % config.num_attention_heads == 0


@FUZZ
@given(records=st.lists(st.one_of(json_values, st.fixed_dictionaries({"step": json_values, "loss": json_values})),
                        max_size=5), tail=st.binary(max_size=8))
def test_metrics_jsonl_for_plot(records, tail):
    content = ("\n".join(json_text(r) for r in records)).encode() + tail
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "metrics.jsonl").write_bytes(content)
        try:
            read_metrics(folder)
        except BertkitError:
            pass


@FUZZ
@given(content=hostile_file(st.lists(st.sampled_from(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "##a", "",
                                                      " ", "\r", "\u2028"]), max_size=12).map("\n".join)))
def test_vocabulary_file(content):
    read_or_refuse(load_vocab, content, "vocab.txt")
