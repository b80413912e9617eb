"""(e) create-pretraining-data throughput on the shared corpus: `create_pretraining_data` with 2
workers, dupe_factor 1, static masking, length 128, on all or the first part of every corpus file;
MB/s of uncompressed text, instances/s, and the projected time for the whole corpus."""

from __future__ import annotations

import gzip
import os
import shutil
import tempfile
import time
from pathlib import Path


def uncompressed_bytes(path: Path) -> int:
    total = 0
    with gzip.open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            total += len(chunk)
    return total


def corpus_prefix(path: Path, fraction: float, out: Path) -> int:
    """The first `fraction` of a corpus file's text, cut at a document break, gzipped to `out`."""
    limit = uncompressed_bytes(path) * fraction
    written = 0
    with gzip.open(path, "rt", encoding="utf-8") as src, gzip.open(out, "wt", encoding="utf-8", compresslevel=1) as dst:
        for line in src:
            if written >= limit and not line.strip():
                break
            dst.write(line)
            written += len(line.encode("utf-8"))
    return written


def create_data_case(data_dir: str | os.PathLike, fraction: float, workers: int = 2, log=print) -> dict:
    from bertkit.pretraining.create import create_pretraining_data

    data_dir = Path(data_dir)
    files = sorted((data_dir / "corpus").glob("*.txt.gz"))
    if not files:
        raise FileNotFoundError(f"no corpus files under {data_dir / 'corpus'}")
    vocab = data_dir / "vocab" / "bert-base-uncased-vocab.txt"
    whole = {f.name: uncompressed_bytes(f) for f in files}
    with tempfile.TemporaryDirectory(prefix="bertkit-bench-data-") as tmp:
        tmp = Path(tmp)
        if fraction >= 1.0:
            inputs, processed = files, sum(whole.values())
        else:
            inputs, processed = [], 0
            for f in files:
                part = tmp / f.name
                processed += corpus_prefix(f, fraction, part)
                inputs.append(part)
        start = time.perf_counter()
        summary = create_pretraining_data(inputs, vocab, tmp / "out", max_seq_length=128, dupe_factor=1,
                                          masking="static", workers=workers, progress=False)
        seconds = time.perf_counter() - start
        shutil.rmtree(tmp / "out", ignore_errors=True)
    mb = processed / 2**20
    whole_mb = sum(whole.values()) / 2**20
    row = {"case": "e: create-pretraining-data", "fraction": fraction, "workers": workers,
           "files": [f.name for f in files], "processed_mb": round(mb, 1), "whole_corpus_mb": round(whole_mb, 1),
           "seconds": round(seconds, 1), "mb_per_s": mb / seconds, "instances": summary["instances"],
           "instances_per_s": summary["instances"] / seconds, "corpus_tokens": summary["corpus_tokens"],
           "tokens_per_s": summary["corpus_tokens"] / seconds,
           "mean_instance_fill": summary["instance_tokens"] / (summary["instances"] * 128),
           "projected_whole_corpus_s": whole_mb / (mb / seconds)}
    log(f"{row['case']}: {mb:.0f} MB in {seconds:.1f} s = {row['mb_per_s']:.2f} MB/s, "
        f"{row['instances_per_s']:.0f} instances/s; whole corpus ({whole_mb:.0f} MB) projected "
        f"{row['projected_whole_corpus_s'] / 60:.1f} min")
    return row
