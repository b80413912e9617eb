"""The smoke set `make test-pythons` runs in a fresh venv per interpreter, bertkit installed from its wheel.

    python scripts/python_smoke.py            # torch installed: the full set
    python scripts/python_smoke.py --no-torch # torch absent: what runs without it

Full set: the Python quickstart of docs/quickstart.md, offline (a tiny model saved, loaded, called on the tokenizer's
batch, and the text-classification pipeline), then the command line a user runs on their own file:
`bertkit finetune text-classification` (a few steps), `bertkit predict` on new text, and `bertkit
serve` answering POST /predict with the same labels and scores as predict. Without torch: every
module of the installed package byte-compiles and either imports or stops only for want of torch,
and `bertkit --help` / `--version` run. Each check prints one line; any failure exits 1."""

from __future__ import annotations

import argparse
import compileall
import csv
import importlib
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "good", "bad", "film", "the", "plot", "was",
         "great", "dull", "story", "boring"]
REVIEWS = [("a good film", "positive"), ("the plot was bad", "negative"), ("a great story", "positive"),
           ("a dull film", "negative"), ("the film was good", "positive"), ("the story was boring", "negative")]


def check(name: str, ok: bool, detail: str = "") -> None:
    """One line per check; a failed check ends the run with status 1."""
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)
    if not ok:
        sys.exit(1)


def bertkit_command(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`bertkit ARGS` through the console script pip installed beside this interpreter."""
    script = Path(sys.executable).parent / "bertkit"
    return subprocess.run([str(script), *args], capture_output=True, text=True, timeout=timeout)


def installed_package() -> Path:
    """The bertkit this interpreter imports, refused when it is the source tree (the wheel is the subject)."""
    spec = importlib.util.find_spec("bertkit")
    check("bertkit importable", spec is not None and spec.origin is not None)
    folder = Path(spec.origin).parent
    check("bertkit installed from its wheel, not the source tree", "site-packages" in folder.parts, str(folder))
    return folder


def torch_free_checks(folder: Path) -> None:
    """What holds without torch: byte-compilation, imports that fail only for torch, the CLI's help."""
    check("byte-compiles", compileall.compile_dir(str(folder), quiet=1, force=True), str(folder))
    imported, need_torch = 0, 0
    for path in sorted(folder.rglob("*.py")):
        parts = path.relative_to(folder.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if name.endswith(".__main__"):  # runs the command line
            continue
        try:
            importlib.import_module(name)
            imported += 1
        except ModuleNotFoundError as e:
            if e.name != "torch" and not (e.name or "").startswith("torch."):
                check(f"import {name}", False, str(e))
            need_torch += 1
    check("modules import, or stop only for torch", imported > 0, f"{imported} imported, {need_torch} need torch")
    for flag in ("--help", "--version"):
        done = bertkit_command(flag, timeout=60)
        check(f"bertkit {flag} without torch", done.returncode == 0 and done.stdout.strip() != "",
              "" if done.returncode == 0 else done.stderr.strip()[-300:])


def quickstart(folder: Path) -> None:
    """docs/quickstart.md's Python use, offline: a tiny model saved and loaded, the tokenizer's batch, a pipeline."""
    import torch

    import bertkit
    from bertkit import BertConfig, BertForSequenceClassification, BertTokenizer

    (folder / "vocab.txt").write_text("\n".join(WORDS) + "\n")
    tokenizer = BertTokenizer.from_pretrained(folder)
    config = BertConfig(vocab_size=len(WORDS), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64,
                        id2label={0: "negative", 1: "positive"})
    torch.manual_seed(0)
    BertForSequenceClassification(config).save_pretrained(folder, tokenizer=tokenizer)
    model = bertkit.load_model(folder).eval()
    batch = tokenizer(["a good film", "the plot was bad"], padding=True, truncation=True, max_length=32,
                      return_tensors="pt")
    with torch.no_grad():
        logits = model(**batch).logits
    check("quickstart: logits of the tokenizer's batch", tuple(logits.shape) == (2, 2) and bool(torch.isfinite(logits).all()))
    classify = bertkit.pipeline("text-classification", model=folder)
    answer = classify("a good film")
    check("quickstart: pipeline", isinstance(answer, list) and answer[0]["label"] in ("negative", "positive"),
          json.dumps(answer))
    every = classify(["a good film", "the plot was bad"], top_k=None)
    check("quickstart: pipeline, every label", len(every) == 2 and all(len(r) == 2 for r in every))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, document: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(document).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def finetune_predict_serve(work: Path, base: Path) -> None:
    """The own-file round trip: fine-tune, predict new text, serve the model and ask it the same."""
    train = work / "train.csv"
    with open(train, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        writer.writerows(REVIEWS * 3)
    out = work / "run"
    done = bertkit_command("finetune", "text-classification", "--model", str(base), "--train-file", str(train),
                           "--output", str(out), "--epochs", "2", "--batch-size", "4", "--learning-rate", "1e-3",
                           "--precision", "fp32", "--device", "cpu")
    check("bertkit finetune text-classification", done.returncode == 0 and (out / "model" / "config.json").is_file(),
          "" if done.returncode == 0 else done.stderr.strip()[-500:])
    texts = ["a good story", "the film was dull"]
    (work / "new.txt").write_text("\n".join(texts) + "\n")
    done = bertkit_command("predict", "text-classification", "--model", str(out / "model"), "--input",
                           str(work / "new.txt"), "--output", str(work / "predictions.jsonl"), "--precision", "fp32")
    check("bertkit predict", done.returncode == 0, "" if done.returncode == 0 else done.stderr.strip()[-500:])
    predicted = [json.loads(line) for line in (work / "predictions.jsonl").read_text().splitlines() if line.strip()]
    check("predict: one answer per line", len(predicted) == 2 and all(r["label"] in ("negative", "positive") for r in predicted),
          json.dumps(predicted))

    port = free_port()
    server = subprocess.Popen([str(Path(sys.executable).parent / "bertkit"), "serve", "--model", str(out / "model"),
                               "--port", str(port), "--precision", "fp32", "--device", "cpu"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                check("bertkit serve starts", False, (server.stdout.read() if server.poll() is not None else "timeout")[-500:])
            time.sleep(0.5)
        check("bertkit serve starts", True)
        served = [post(f"http://127.0.0.1:{port}/predict", {"inputs": text}) for text in texts]
        best = [max(answer, key=lambda r: r["score"]) for answer in served]
        same = all(b["label"] == p["label"] and abs(b["score"] - p["score"]) < 1e-5 for b, p in zip(best, predicted))
        check("serve: POST /predict answers as predict", same, json.dumps(served))
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-torch", action="store_true", help="torch is not installed: the torch-free checks only")
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]} ({sys.executable})", flush=True)
    folder = installed_package()
    if args.no_torch:
        check("torch absent, as asked", importlib.util.find_spec("torch") is None)
        torch_free_checks(folder)
        return
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory(prefix="bertkit-smoke-") as tmp:
        work = Path(tmp)
        base = work / "base"
        base.mkdir()
        quickstart(base)
        finetune_predict_serve(work, base)


if __name__ == "__main__":
    main()
