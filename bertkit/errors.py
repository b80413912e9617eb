"""The one exception type for bad user input: it names the file, the line and the problem."""

from __future__ import annotations

import contextlib
from pathlib import Path


class BertkitError(Exception):
    """Bad input or an impossible request, phrased for the user (no traceback needed)."""

    def __init__(self, message: str, path: str | None = None, line: int | None = None):
        self.message = message
        self.path = None if path is None else str(path)
        self.line = line
        super().__init__(str(self))

    def __str__(self) -> str:
        where = ""
        if self.path is not None:
            where = self.path + (f":{self.line}" if self.line is not None else "") + ": "
        return where + self.message


@contextlib.contextmanager
def reading(path: str | Path, what: str = "file"):
    """`with reading(path, "CoNLL file"), open(path, encoding="utf-8") as f:` turns the ways opening
    and decoding a text file fail (missing, a folder, not UTF-8) into one BertkitError naming it."""
    try:
        yield
    except FileNotFoundError:
        raise BertkitError(f"{what} not found", path=str(path)) from None
    except IsADirectoryError:
        raise BertkitError(f"is a directory, expected a {what}", path=str(path)) from None
    except UnicodeDecodeError as err:
        raise BertkitError(f"not UTF-8 text ({err.reason})", path=str(path)) from None


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """`1 input`, `2 inputs`, `1 query`, `3 queries` (plural given): a count in a message, in words a
    reader would write."""
    return f"{count:,} {noun if count == 1 else plural or noun + 's'}"
