"""NotNext partners on the real corpus: where `create-pretraining-data` draws them from, per scheme.

For each scheme (`--not-next-partners block`, bertkit's earlier draw from the same block of one
input file, and `corpus`, the original script's draw from any document of all the inputs) this
makes the pre-training data of the whole shared corpus (the three files, length 128, dupe factor 1,
dynamic masking, one worker; cached in --work) and reads its manifest's counts: the NotNext
partners per input file against the corpus's documents per file (a chi-square goodness-of-fit
test: the original's draw is uniform over documents), partners from A's own document, and the
NotNext fraction. Statistics only: no timing.

    python benchmarks/not_next_partners.py --data-dir $BERTKIT_DATA --work /tmp/partners
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from scipy import stats

CORPUS = ["corpus/nltk2008.txt.gz", "corpus/enwiki2015.txt.gz", "corpus/gutenberg_digiuga.txt.gz"]
SCHEMES = ("block", "corpus")


def make_data(data_dir: Path, vocab: Path, output: Path, scheme: str) -> dict:
    if not (output / "manifest.json").is_file():
        subprocess.run([sys.executable, "-m", "bertkit", "create-pretraining-data", "--input",
                        *[str(data_dir / c) for c in CORPUS], "--vocab", str(vocab), "--output", str(output),
                        "--max-seq-length", "128", "--dupe-factor", "1", "--masking", "dynamic", "--seed", "1",
                        "--workers", "1", "--no-progress", "--not-next-partners", scheme, "--overwrite"], check=True)
    return json.loads((output / "manifest.json").read_text())


def partner_row(manifest: dict) -> dict:
    counts = manifest["counts"]
    documents, partners = counts["documents_used_per_file"], counts["not_next_partners_per_file"]
    total_documents, total_partners = sum(documents), sum(partners)
    # The original's draw: a partner's file in proportion to its documents (A's own document is left
    # out, which moves each share by under 1/6,000 here: below what 270k draws can show).
    expected = [total_partners * d / total_documents for d in documents]
    chi2, p = stats.chisquare(partners, expected)
    return {"scheme": manifest["config"]["not_next_partners"], "documents": documents, "partners": partners,
            "partner_share": [x / total_partners for x in partners],
            "document_share": [d / total_documents for d in documents], "chi2": float(chi2), "p": float(p),
            "same_document": counts["random_next_from_same_document"], "not_next": counts["not_next"],
            "instances": counts["instances"], "not_next_fraction": counts["not_next_fraction"]}


def markdown(rows: list[dict], files: list[str]) -> str:
    names = [Path(f).name.split(".")[0] for f in files]
    shares = lambda xs: " / ".join(f"{100 * x:.1f}%" for x in xs)  # noqa: E731
    lines = [f"| scheme | NotNext partners by input file ({' / '.join(names)}) | the corpus's documents | "
             "chi-square (2 df), p | partner from A's own document | NotNext fraction |",
             "|---|---|---|---|---:|---:|"]
    for r in rows:
        partners, documents = " / ".join(f"{x:,}" for x in r["partners"]), " / ".join(f"{x:,}" for x in r["documents"])
        lines.append(f"| `{r['scheme']}` | {shares(r['partner_share'])} ({partners}) | "
                     f"{shares(r['document_share'])} ({documents}) | "
                     f"{r['chi2']:,.1f}, p {'< 1e-300' if r['p'] == 0 else format(r['p'], '.2g')} | "
                     f"{r['same_document']} | "
                     f"{100 * r['not_next_fraction']:.1f}% ({r['not_next']:,} of {r['instances']:,}) |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=Path(os.environ.get("BERTKIT_DATA", "../shared/data")))
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--vocab", type=Path, help="default: the data folder's bert-base-uncased vocabulary")
    args = parser.parse_args()
    vocab = args.vocab or args.data_dir / "vocab" / "bert-base-uncased-vocab.txt"
    manifests = [make_data(args.data_dir, vocab, args.work / scheme, scheme) for scheme in SCHEMES]
    rows = [partner_row(m) for m in manifests]
    (args.work / "partners.json").write_text(json.dumps(rows, indent=2) + "\n")
    print(markdown(rows, manifests[0]["config"]["inputs"]))


if __name__ == "__main__":
    main()
