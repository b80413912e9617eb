"""Models named by Hub id (`org/name`, `bert-base-uncased`), resolved with huggingface_hub against a
local stand-in Hub (tests/hub_server.py): download, cache reuse without the server, revision pinning,
the one-line errors, an interrupted download, a repository with only pytorch_model.bin; the CLI and
pipelines take the ids too. Nothing here reaches the real Hub."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import bertkit
from bertkit import BertForSequenceClassification, BertkitError, BertModel, BertTokenizer
from bertkit.cli import main
from bertkit.hub.resolve import hub_id_of, looks_like_hub_id


@pytest.fixture(scope="module")
def tiny_classifier(tiny_model, tmp_path_factory):
    return tiny_model(BertForSequenceClassification, tmp_path_factory.mktemp("tiny-cls"), max_positions=64,
                      id2label={0: "neg", 1: "pos"})


def _weights(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def _same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _snapshots(home: Path, repo_id: str) -> Path:
    return home / "hub" / ("models--" + repo_id.replace("/", "--")) / "snapshots"


def test_what_counts_as_a_hub_id():
    for text in ("bert-base-uncased", "sentence-transformers/all-MiniLM-L6-v2", "google-bert/bert-base-cased"):
        assert looks_like_hub_id(text)
    for text in ("runs/reviews/model", "./model", "/abs/model", "~/model", "vocab.txt", "a/b/c", "a--b", "x/../y"):
        assert not looks_like_hub_id(text)
    assert hub_id_of("/c/hub/models--org--name/snapshots/" + "a" * 40) == "org/name"
    assert hub_id_of("/c/runs/model") is None


def test_download_then_cache_reuse_after_the_server_is_gone(hub_server, tiny_classifier, tmp_path, monkeypatch):
    files = {**{p.name: p.read_bytes() for p in tiny_classifier.iterdir() if p.is_file()},
             "flax_model.msgpack": b"not read by bertkit", "pytorch_model.bin": b"never fetched beside safetensors"}
    hub_server.add("org/tiny", files)
    reference = _weights(BertForSequenceClassification.from_pretrained(tiny_classifier))
    model = BertForSequenceClassification.from_pretrained("org/tiny")
    assert _same(_weights(model), reference)
    tokenizer = BertTokenizer.from_pretrained("org/tiny")
    assert tokenizer("a film")["input_ids"] == BertTokenizer.from_pretrained(tiny_classifier)("a film")["input_ids"]
    snapshot = next(_snapshots(tmp_path / "hf-home", "org/tiny").iterdir())
    fetched = {p.name for p in snapshot.iterdir()}
    assert "model.safetensors" in fetched and "config.json" in fetched
    assert not fetched & {"flax_model.msgpack", "pytorch_model.bin"}  # only the files bertkit reads

    hub_server.stop()
    assert _same(_weights(bertkit.load_model("org/tiny")), reference)  # unreachable: the cached snapshot
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert _same(_weights(BertForSequenceClassification.from_pretrained("org/tiny")), reference)
    with pytest.raises(BertkitError, match=r"^org/other: no such local folder, and HF_HUB_OFFLINE is set while "
                                           r"org/other is not \(fully\) in the Hub cache .*hf-home"):
        BertModel.from_pretrained("org/other")


def test_server_gone_and_not_cached(hub_server):
    hub_server.stop()
    with pytest.raises(BertkitError, match=r"the Hub cannot be reached while org/tiny is not .*in the Hub cache "
                                           r".*HF_HUB_OFFLINE is not set"):
        BertModel.from_pretrained("org/tiny")


def test_revision_pinning(hub_server, tiny_model, tmp_path):
    first = hub_server.add("org/tiny", tiny_model(BertModel, tmp_path / "v1"), revision="main")
    hub_server.add("org/tiny", tiny_model(BertModel, tmp_path / "v1"), revision="v1")
    torch.manual_seed(1)
    newer = tmp_path / "v2"
    tiny_model(BertModel, newer)
    state = load_file(newer / "model.safetensors")
    state["embeddings.word_embeddings.weight"] += 1
    BertModel.from_pretrained(newer).load_checkpoint_state(state)
    from safetensors.torch import save_file
    save_file(state, newer / "model.safetensors", metadata={"format": "pt"})
    hub_server.add("org/tiny", newer, revision="main")

    latest = BertModel.from_pretrained("org/tiny").embeddings.word_embeddings.weight
    pinned = BertModel.from_pretrained("org/tiny", revision="v1").embeddings.word_embeddings.weight
    by_hash = bertkit.load_model("org/tiny", revision=first).embeddings.word_embeddings.weight
    assert torch.equal(latest, pinned + 1) and torch.equal(pinned, by_hash)
    with pytest.raises(BertkitError, match=r"org/tiny has no revision 'v9'"):
        BertModel.from_pretrained("org/tiny", revision="v9")
    with pytest.raises(BertkitError, match=r"--revision v1 applies to Hub ids, not to a local folder"):
        BertModel.from_pretrained(tmp_path / "v1", revision="v1")


def test_unknown_gated_and_not_bert(hub_server, tiny_classifier):
    with pytest.raises(BertkitError, match=r"^org/missing: no such local folder, and no Hub model of that name "
                                           r"\(or it is private and HF_TOKEN is not set\)$"):
        BertModel.from_pretrained("org/missing")
    hub_server.add("org/gated", tiny_classifier, gated=True)
    with pytest.raises(BertkitError, match=r"org/gated is a gated model: .*HF_TOKEN"):
        BertModel.from_pretrained("org/gated")
    config = json.loads((tiny_classifier / "config.json").read_text())
    hub_server.add("org/roberta", {"config.json": json.dumps({**config, "model_type": "roberta"}).encode()})
    with pytest.raises(BertkitError, match=r"org/roberta is not a BERT model: .*model_type 'roberta'"):
        bertkit.pipeline("text-classification", model="org/roberta")


def test_an_interrupted_download_is_never_used_and_resumes(hub_server, tiny_classifier, tmp_path, monkeypatch):
    import huggingface_hub.file_download

    monkeypatch.setattr(huggingface_hub.file_download.time, "sleep", lambda seconds: None)  # its retry pause
    # It writes (and so resumes from) whole 10 MB chunks; a tiny model needs smaller ones to show the resume.
    monkeypatch.setattr(huggingface_hub.constants, "DOWNLOAD_CHUNK_SIZE", 64 * 1024)
    hub_server.add("org/tiny", tiny_classifier)
    hub_server.cut["model.safetensors"] = 99  # every attempt drops half-way
    with pytest.raises(BertkitError, match=r"download of org/tiny failed .*nothing partial was kept"):
        BertForSequenceClassification.from_pretrained("org/tiny")
    assert len(hub_server.downloads("model.safetensors")) > 1  # huggingface_hub retried before giving up
    snapshots = _snapshots(tmp_path / "hf-home", "org/tiny")
    assert not list(snapshots.rglob("model.safetensors"))  # a half file is never in the snapshot
    assert not list((snapshots.parent / "blobs").glob("*.incomplete"))
    with pytest.raises(BertkitError, match=r"HF_HUB_OFFLINE is set while org/tiny is not \(fully\) in the Hub cache"):
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the partial snapshot is refused, not used
        BertForSequenceClassification.from_pretrained("org/tiny")
    monkeypatch.delenv("HF_HUB_OFFLINE")

    hub_server.requests.clear()
    hub_server.cut["model.safetensors"] = 1  # the connection drops once more, then holds
    reference = _weights(BertForSequenceClassification.from_pretrained(tiny_classifier))
    assert _same(_weights(BertForSequenceClassification.from_pretrained("org/tiny")), reference)
    assert any(r is not None and r.startswith("bytes=") and r != "bytes=0-"
               for r in hub_server.downloads("model.safetensors"))  # resumed, not restarted
    assert not list((snapshots.parent / "blobs").glob("*.incomplete"))


def test_a_repo_with_only_pytorch_model_bin(hub_server, tiny_classifier, tmp_path):
    state = load_file(tiny_classifier / "model.safetensors")
    folder = tmp_path / "pickled"
    folder.mkdir()
    torch.save(state, folder / "pytorch_model.bin")
    for name in ("config.json", "vocab.txt", "tokenizer_config.json"):
        (folder / name).write_bytes((tiny_classifier / name).read_bytes())
    hub_server.add("org/old", folder)
    reference = _weights(BertForSequenceClassification.from_pretrained(tiny_classifier))
    assert _same(_weights(BertForSequenceClassification.from_pretrained("org/old")), reference)


def test_cli_and_pipeline_take_hub_ids(hub_server, tiny_classifier, tmp_path, capsys):
    hub_server.add("org/tiny", tiny_classifier, revision="v1")
    source = tmp_path / "in.txt"
    source.write_text("a good film\nthe plot was bad\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    assert main(["predict", "text-classification", "--model", "org/tiny", "--revision", "v1", "--input", str(source),
                 "--output", str(out)]) == 0
    expected = bertkit.pipeline("text-classification", model=tiny_classifier)(["a good film", "the plot was bad"])
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert [g["label"] for g in got] == [e["label"] for e in expected]
    from_hub = bertkit.pipeline("text-classification", model="org/tiny", revision="v1")
    assert from_hub(["a good film", "the plot was bad"]) == expected

    capsys.readouterr()
    assert main(["predict", "text-classification", "--model", "org/tiny", "--input", str(source),
                 "--output", str(tmp_path / "other.jsonl")]) == 2  # main has no commit
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: org/tiny has no revision 'main'")
    assert main(["extract-features", "--help"]) == 0 and "--revision" in capsys.readouterr().out


def test_pretraining_data_and_init_from_by_hub_id(hub_server, tiny_model, tmp_path, monkeypatch):
    from bertkit.heads import BertForPreTraining

    hub_server.add("org/tiny-mlm", tiny_model(BertForPreTraining, tmp_path / "served", max_positions=64))
    monkeypatch.chdir(tmp_path)
    sentences = [f"the {w} sat on the mat near the {v} door ." for w in ("cat", "dog", "bird") for v in ("red", "old")]
    Path("corpus.txt").write_text("\n\n".join("\n".join(sentences[i:] + sentences[:i]) for i in range(6)) + "\n")
    assert main(["create-pretraining-data", "--input", "corpus.txt", "--vocab", "org/tiny-mlm", "--output", "data",
                 "--max-seq-length", "32", "--dupe-factor", "1", "--no-progress"]) == 0
    assert main(["pretrain", "--train-data", "data", "--output", "run", "--init-from", "org/tiny-mlm", "--revision",
                 "main", "--max-steps", "1", "--batch-size", "4", "--precision", "fp32", "--save-steps", "0",
                 "--no-progress"]) == 0
    meta = json.loads((tmp_path / "run" / "config.json").read_text())
    assert meta["hidden_size"] == 32
    assert "base_model: \"org/tiny-mlm\"" in (tmp_path / "run" / "README.md").read_text()


def test_every_command_that_takes_a_model_has_revision():
    import argparse

    from bertkit.cli import build_parser

    def parsers(parser):
        yield parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for child in action.choices.values():
                    yield from parsers(child)

    taking = [p for p in parsers(build_parser()) if {a.dest for a in p._actions} & {"model", "init_from"}]
    assert len(taking) >= 15  # finetune x8, predict x8, serve, export, extract-features, pretrain
    for parser in taking:
        dests = {a.dest: a for a in parser._actions}
        assert "revision" in dests, parser.prog
        assert "Hub id" in (dests.get("model") or dests.get("init_from")).help, parser.prog


def test_revision_travels_with_the_reference_not_the_process(hub_server, tiny_classifier, tmp_path, capsys):
    """Fine-tuning loads the tokenizer and the weights from the reference (both at --revision), and
    the revision stays with that command: a later load in the same process asks for main again."""
    hub_server.add("org/only-v1", tiny_classifier, revision="v1")
    train = tmp_path / "train.csv"
    train.write_text("text,label\n" + "a good film,pos\nthe plot was bad,neg\n" * 4, encoding="utf-8")
    assert main(["finetune", "text-classification", "--model", "org/only-v1", "--revision", "v1", "--train-file",
                 str(train), "--output", str(tmp_path / "out"), "--epochs", "1", "--max-seq-length", "16",
                 "--batch-size", "4"]) == 0
    assert (tmp_path / "out" / "model" / "model.safetensors").is_file()
    with pytest.raises(BertkitError, match=r"org/only-v1 has no revision 'main'"):
        BertModel.from_pretrained("org/only-v1")
