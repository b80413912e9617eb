"""One reader for the CSV / TSV tables users bring (predict inputs, own-data fine-tuning files).

Quoting (`--quoting`): CSV is read with csv quoting (a quoted field may hold the delimiter, quotes
or line breaks); TSV as GLUE's own reader reads it (the original's `_read_tsv`, `csv.reader(f,
delimiter="\t", quotechar=None)`): every tab separates fields and a quote is text, so
`"Oh, you're such a good person!<TAB>You're...` stays two fields. `quoting="csv"` reads a TSV
written with csv quoting (a quoted field holding tabs or line breaks), `"none"` a CSV without it.
Any line ending (LF, CRLF, CR alone) ends a record; a UTF-8 byte-order mark (Excel's "CSV UTF-8")
is not part of the first column's name. The header must name each column once: two columns
named "text" would leave it to chance which one the model reads. Every problem is one
BertkitError naming the file and the record's first line. Inputs may be pipes (`<(cmd)`, a FIFO):
the readers here read a file once, start to end.
"""

from __future__ import annotations

import csv
import io
import os
import stat
import sys
from pathlib import Path
from typing import IO, Callable, Iterator, Sequence

from .errors import BertkitError

DELIMITERS = {"csv": ",", "tsv": "\t"}
QUOTING = ("none", "csv")  # the --quoting choices; the default follows the format (default_quoting)


def default_quoting(fmt: str) -> str:
    """csv quoting for CSV; none for TSV, as GLUE's files are written and read."""
    return "none" if fmt == "tsv" else "csv"


def is_readable_file(path: str | Path) -> bool:
    """A regular file, or a stream read once from start to end: a pipe (`--input <(cmd)`, a named
    FIFO) or a character device (/dev/stdin on a terminal). Folders, sockets and missing paths are not."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return False
    return stat.S_ISREG(mode) or stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)


def check_input_file(path: str | Path, what: str = "input file") -> None:
    """Refuse, by name, an input that is missing or that cannot be read as a file (a folder)."""
    if not is_readable_file(path):
        raise BertkitError(f"{what} not found" if not os.path.lexists(path) else "not a file", path=str(path))


def open_text(path: str | Path, newline: str | None = None) -> IO[str]:
    """The file (or stdin for `-`) as UTF-8 text, a leading byte-order mark dropped. newline="" for
    csv (it finds the line ends itself, quoted ones included); None splits on LF, CRLF and CR alike."""
    if str(path) == "-":
        return io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8-sig", newline=newline)
    check_input_file(path)
    return open(path, encoding="utf-8-sig", newline=newline)


def text_lines(handle: IO[str], name: str) -> Iterator[tuple[int, str]]:
    """(line number, line without its ending) for a text or JSON lines file; not UTF-8 is one error."""
    number = 0
    try:
        for number, line in enumerate(handle, start=1):
            yield number, line.rstrip("\r\n")
    except UnicodeDecodeError as e:
        raise BertkitError(f"not valid UTF-8 ({e.reason})", name, number + 1) from None


def check_header(header: Sequence[str], name: str) -> list[str]:
    """Column names, stripped; an empty header or a name given twice is refused by name."""
    names = [h.strip() for h in header]
    if not any(names):
        raise BertkitError("empty file: expected a header row naming the columns", name, 1)
    seen = set()
    for column in names:
        if column in seen:
            raise BertkitError(f"the header names column {column!r} twice; rename one", name, 1)
        seen.add(column)
    return names


def require_columns(header: Sequence[str] | None, columns: dict[str, str | None] | Sequence[str | None],
                    name: str) -> None:
    """Every column a flag names must be in the header (JSON lines, header None, are checked per row).
    `columns`: {flag: column} (the message names the flag) or a plain list of columns."""
    if header is None:
        return
    named = columns.items() if isinstance(columns, dict) else ((None, c) for c in columns)
    missing = [(flag, c) for flag, c in named if c is not None and c not in header]
    if missing:
        shown = ", ".join(f"{c!r}" + (f" ({flag})" if flag else "") for flag, c in missing)
        raise BertkitError(f"no column {shown}; the columns are {', '.join(header)}", name, 1)


def distinct_columns(columns: dict[str, str | None]) -> None:
    """Two roles may not share a column: `--text-column label --label-column label` would let the
    model read its own answer."""
    seen: dict[str, str] = {}
    for flag, column in columns.items():
        if column is None:
            continue
        if column in seen:
            raise BertkitError(f"{seen[column]} and {flag} both name column {column!r}; each needs its own column")
        seen[column] = flag


def table_rows(handle: IO[str], name: str, fmt: str, bad: Callable[[int, str], None] | None = None,
               quoting: str | None = None) -> tuple[list[str], Iterator[tuple[int, dict]]]:
    """(header, iterator of (first line of the record, {column: value})) for a CSV or TSV table opened
    with open_text(..., newline=""). `quoting`: "csv" or "none" (default: default_quoting(fmt)).
    Blank records are skipped; a record with the wrong number of fields goes to `bad(line, problem)`
    (which may skip it or raise), or stops the read."""
    quoting = quoting or default_quoting(fmt)
    if quoting not in QUOTING:
        raise BertkitError(f"quoting must be one of {', '.join(QUOTING)}, not {quoting!r}")
    options = {"quoting": csv.QUOTE_NONE} if quoting == "none" else {}
    reader = csv.reader(handle, delimiter=DELIMITERS[fmt], **options)
    # How the record was split, in the message: the other quoting may be what the file needs.
    separator = "comma" if fmt == "csv" else "tab"
    hint = (f" (read without quoting: every {separator} separates fields)" if quoting == "none"
            else " (read with csv quoting: a field that opens with a quote runs to the closing quote)")
    try:
        header = next(reader, None)
    except (csv.Error, UnicodeDecodeError) as e:
        raise BertkitError(f"unreadable {fmt.upper()} header ({getattr(e, 'reason', e)})", name, 1) from None
    if header is None:
        raise BertkitError("empty file: expected a header row naming the columns", name, 1)
    header = check_header(header, name)

    def rows() -> Iterator[tuple[int, dict]]:
        start = reader.line_num + 1
        while True:
            try:
                fields = next(reader)
            except StopIteration:
                return
            except csv.Error as e:  # a NUL byte, a field over the size limit, an unclosed quote at the end
                raise BertkitError(f"unreadable {fmt.upper()} record ({e})", name, start) from None
            except UnicodeDecodeError as e:
                raise BertkitError(f"not valid UTF-8 ({e.reason})", name, start) from None
            if any(f.strip() for f in fields):
                if len(fields) != len(header):
                    problem = (f"expected {len(header)} {separator}-separated fields "
                               f"({', '.join(header)}), found {len(fields)}{hint}")
                    if bad is None:
                        raise BertkitError(problem, name, start)
                    bad(start, problem)
                else:
                    yield start, dict(zip(header, fields))
            start = reader.line_num + 1

    return header, rows()


class TableWriter:
    """CSV or TSV rows: a field holding the delimiter, CR or LF is quoted (RFC 4180, as csv readers
    and spreadsheets expect), never written raw where it would split a record. CSV also quotes a
    field holding a quote; TSV only one that starts with a quote (which csv-quoting readers would
    take as an opening), so that quotes inside TSV text read back as written without quoting, as
    GLUE's files hold them. (Python 3.11's csv.writer leaves a lone CR unquoted when the line ends
    in LF.)"""

    def __init__(self, handle: IO[str], fmt: str):
        self.handle, self.delimiter = handle, DELIMITERS[fmt]

    def field(self, value: str) -> str:
        if (any(c in value for c in (self.delimiter, "\r", "\n"))
                or ('"' in value if self.delimiter == "," else value.startswith('"'))):
            return '"' + value.replace('"', '""') + '"'
        return value

    def writerow(self, values: Sequence[str]) -> None:
        self.handle.write(self.delimiter.join(self.field(v) for v in values) + "\n")
