"""Where the data is, and the examples read from it: the data-folder rule, the list of examples
that remembers its file and the malformed rows skipped, and the deterministic subsets of quick runs."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Sequence

from ..errors import BertkitError


def resolve_data_dir(data_dir: str | Path | None) -> Path:
    """--data-dir, else $BERTKIT_DATA; it must be a folder."""
    data_dir = data_dir or os.environ.get("BERTKIT_DATA")
    if not data_dir:
        raise BertkitError("no data directory: pass --data-dir or set BERTKIT_DATA")
    if not Path(data_dir).is_dir():
        raise BertkitError("data directory not found", path=str(data_dir))
    return Path(data_dir)


class Examples(list):
    """Examples read from one file, remembering the file and the malformed rows skipped."""

    def __init__(self, items=(), path: str | Path | None = None, skipped: Sequence[str] = ()):
        super().__init__(items)
        self.path = None if path is None else str(path)
        self.skipped = list(skipped)  # "path:line: problem" for each row left out


class BadRows:
    """Raise on the first malformed row, or (skip_bad_rows) record it and go on."""

    def __init__(self, path: Path, skip: bool):
        self.path, self.skip, self.skipped = path, skip, []

    def __call__(self, line: int, message: str) -> None:
        if not self.skip:
            raise BertkitError(f"{message} (or pass --skip-bad-rows to skip and count such rows)",
                               path=str(self.path), line=line)
        self.skipped.append(str(BertkitError(message, path=str(self.path), line=line)))


def subsample(examples: Sequence, n: int | None, seed: int = 0, contiguous: bool = False) -> Sequence:
    """A deterministic subset of n examples in file order (every run of a sweep sees the same): a
    seeded random sample, or with `contiguous` the first n (NER, whose windows take context from
    the neighbouring sentences of a document). All of them (the same object) when n is None or
    at least len(examples)."""
    if n is None or n >= len(examples):
        return examples
    if n <= 0:
        raise BertkitError(f"the example limit must be positive, not {n}")
    keep = range(n) if contiguous else sorted(random.Random(seed).sample(range(len(examples)), n))
    return Examples([examples[i] for i in keep], path=getattr(examples, "path", None),
                    skipped=getattr(examples, "skipped", ()))
