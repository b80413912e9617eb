"""Reading a user's own training files: CSV, TSV or JSON lines tables, and CoNLL-style or JSON lines
token tagging files, into the examples the task modules already train on (GlueExample,
MultipleChoiceExample, conll_data.ConllData).

Every problem is reported as `FILE:LINE: what is wrong` (BertkitError). Problems with one row (a
wrong number of fields, an invalid JSON line, an empty text, a missing label) go through BadRows,
so `--skip-bad-rows` can skip and count them; problems with the whole file (no such column, not
UTF-8, an unknown format) always stop.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Iterator, Sequence

from ..errors import BertkitError
from ..tables import check_input_file, distinct_columns, table_rows
from .examples import BadRows, Examples
from .glue import GlueExample
from .multiple_choice import MultipleChoiceExample, read_utf8
from .conll_data import DOCSTART, ConllData, Sentence, detect_scheme

TABLE_FORMATS = {".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl"}


# ---------------------------------------------------------------- tables: CSV, TSV, JSON lines


def table_format(path: Path, given: str | None = None) -> str:
    if given:
        return given
    fmt = TABLE_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise BertkitError(f"cannot tell the format from the extension {path.suffix!r}: name the file .csv, .tsv "
                           "or .jsonl, or pass --format", path=str(path))
    return fmt


def read_table(path: str | Path, bad: BadRows, fmt: str | None = None,
               quoting: str | None = None) -> tuple[list[str] | None, Iterator]:
    """(column names, or None for JSON lines; an iterator of (line number, {column: value})).
    CSV and TSV have a header row; `quoting` as tables.table_rows (default: CSV quoted, a quoted
    field may hold the delimiter or a line break; TSV as GLUE's reader, every tab a separator).
    JSON lines hold one object per line. A malformed row goes to `bad`. The file is read once, so
    it may be a pipe."""
    path = Path(path)
    check_input_file(path, "file")
    fmt = table_format(path, fmt)
    text = read_utf8(path)
    if fmt == "jsonl":
        return None, _json_rows(text, bad)
    return table_rows(io.StringIO(text, newline=""), str(path), fmt, bad, quoting)


def _json_rows(text: str, bad: BadRows) -> Iterator[tuple[int, dict]]:
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as e:
            bad(number, f"invalid JSON line ({getattr(e, 'msg', 'nested too deeply')})")
            continue
        if not isinstance(row, dict):
            bad(number, f"expected a JSON object per line, found {type(row).__name__}")
            continue
        yield number, row


def require_columns(header: list[str] | None, columns: Sequence[str | None], path: str | Path) -> None:
    """A CSV/TSV header must name every column used (JSON lines are checked row by row)."""
    if header is None:
        return
    missing = [c for c in columns if c is not None and c not in header]
    if missing:
        raise BertkitError(f"no column {', '.join(map(repr, missing))}; the columns are {', '.join(header)}",
                           path=str(path), line=1)


def text_value(row: dict, column: str) -> str | None:
    """The row's text in `column`; None when the field is missing, not a string, or blank."""
    value = row.get(column)
    return value if isinstance(value, str) and value.strip() else None


def text_problem(row: dict, column: str) -> str:
    """Why text_value(row, column) is None, in the user's words."""
    if column not in row:
        return f"no field {column!r}"
    if not isinstance(row[column], str):
        return f"{column!r} must be a string, not {type(row[column]).__name__}"
    return f"empty text in {column!r}"


def label_value(value) -> str | None:
    """A label cell as text: JSON numbers and booleans as written ('1', '0.5', 'true'); None when empty."""
    if value is None or isinstance(value, (list, dict)):
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    text = str(value).strip()
    return text or None


# ---------------------------------------------------------------- sentence (pair) classification


def read_text_file(path: str | Path, text_column: str, label_column: str | None, text_pair_column: str | None = None,
                   id_column: str | None = None, skip_bad_rows: bool = False, fmt: str | None = None,
                   labels_optional: bool = False, quoting: str | None = None) -> Examples:
    """GlueExample per row: text_a, text_b (the pair column), label as text (None when the file has no
    label column, or with labels_optional (a test file) when the row's label is empty), index = the
    id column or (rows without one) the row's line number."""
    path = Path(path)
    distinct_columns({"--text-column": text_column, "--text-pair-column": text_pair_column,
                      "--label-column": label_column})
    bad = BadRows(path, skip_bad_rows)
    header, rows = read_table(path, bad, fmt, quoting)
    has_labels = label_column is not None and (header is None or label_column in header)
    require_columns(header, [text_column, text_pair_column, id_column] + ([] if labels_optional else [label_column]),
                    path)
    examples = []
    for line, row in rows:
        problem = None
        if id_column and id_column not in row:  # JSON lines: a row without the id named by --id-column
            bad(line, f"no field {id_column!r} (--id-column)")
            continue
        text = text_value(row, text_column)
        pair = text_value(row, text_pair_column) if text_pair_column else None
        label = label_value(row.get(label_column)) if has_labels else None
        if text is None:
            problem = text_problem(row, text_column)
        elif text_pair_column and pair is None:
            problem = text_problem(row, text_pair_column)
        elif has_labels and label is None and not labels_optional:
            problem = f"no label in {label_column!r}"
        if problem is not None:
            bad(line, problem)
            continue
        index = str(row.get(id_column)) if id_column and row.get(id_column) is not None else str(line)
        examples.append(GlueExample(index=index, text_a=text, text_b=pair, label=label, line=line))
    if not examples and not bad.skipped:
        raise BertkitError("no examples", path=str(path))
    return Examples(examples, path=path, skipped=bad.skipped)


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def is_regression(train: Examples, regression: bool | None) -> bool:
    """Regression when asked, or (regression=None) when every training label is a number and some
    label has a fraction (0.5, 3.7): whole numbers alone (0/1, 1..5 stars) are read as classes,
    since that is what such columns usually are; --regression makes them scores."""
    if regression is False:
        return False
    _refuse_non_finite(train)
    numbers = [_number(e.label) for e in train]
    if regression:
        for example, value in zip(train, numbers):
            if value is None:
                raise BertkitError(f"label {example.label!r} is not a number (--regression)", path=train.path,
                                   line=example.line)
        return True
    return all(v is not None for v in numbers) and any(not v.is_integer() for v in numbers)


def _refuse_non_finite(train: Examples) -> None:
    """A score column holding nan or inf is broken data, not extra classes: refused at its line (a
    column of words where one class happens to be called "nan" is left alone)."""
    values = []
    for example in train:
        try:
            values.append(float(example.label))
        except (TypeError, ValueError):
            return
    for example, value in zip(train, values):
        if not math.isfinite(value):
            raise BertkitError(f"label {example.label!r} is not a finite number: a score column needs finite "
                               "values (fix or drop the row)", path=str(train.path), line=example.line)


def sorted_labels(labels) -> list[str]:
    """The label vocabulary in a stable order: numerically when every label is a whole number, else
    alphabetically ('10' after '9'; 'negative' before 'positive')."""
    found = set(labels)
    if all(_number(t) is not None and _number(t).is_integer() for t in found):
        return sorted(found, key=lambda t: (float(t), t))
    return sorted(found)


def check_labels(examples: Examples, labels: Sequence[str] | None, skip_bad_rows: bool) -> Examples:
    """Dev/test labels must be training labels (classes) or numbers (regression, labels=None)."""
    bad = BadRows(Path(examples.path), skip_bad_rows)
    kept = []
    for e in examples:
        if e.label is not None:
            if labels is None and _number(e.label) is None:
                bad(e.line, f"label {e.label!r} is not a number (the training labels are scores)")
                continue
            if labels is not None and e.label not in labels:
                shown = ", ".join(labels[:20]) + (", ..." if len(labels) > 20 else "")
                bad(e.line, f"label {e.label!r} does not occur in the training file (its labels: {shown})")
                continue
            if labels is None:
                e.label = float(e.label)
        kept.append(e)
    return Examples(kept, path=examples.path, skipped=list(examples.skipped) + bad.skipped)


# ---------------------------------------------------------------- multiple choice


def read_choice_file(path: str | Path, question_column: str, choice_columns: Sequence[str],
                     label_column: str | None = "label", context_column: str | None = None,
                     id_column: str | None = None, skip_bad_rows: bool = False,
                     fmt: str | None = None, quoting: str | None = None) -> Examples:
    """MultipleChoiceExample per row. The model reads `[CLS] first [SEP] second choice [SEP]` (SWAG's
    layout): with a context column, first = context and second = question + choice; without,
    first = question and second = the choice. `choice_columns` name one column per choice, or one
    column holding a list (JSON lines, or a JSON list in a CSV cell). The label is a choice's
    column name, its 0-based number, or its text; an empty label (or no label column) means none."""
    path = Path(path)
    bad = BadRows(path, skip_bad_rows)
    header, rows = read_table(path, bad, fmt, quoting)
    choice_columns = list(choice_columns)
    distinct_columns({"--question-column": question_column, "--context-column": context_column,
                      "--label-column": label_column,
                      **{f"--choice-columns ({c})": c for c in choice_columns}})
    require_columns(header, [question_column, context_column, *choice_columns], path)
    has_labels = label_column is not None and (header is None or label_column in header)
    examples, count = [], None
    for row_number, (line, row) in enumerate(rows):
        question = text_value(row, question_column)
        context = text_value(row, context_column) if context_column else None
        choices, problem = _choices(row, choice_columns)
        if question is None:
            problem = text_problem(row, question_column)
        elif context_column and context is None:
            problem = text_problem(row, context_column)
        elif problem is None and count is not None and len(choices) != count:
            problem = f"{len(choices)} choices, but the rows above have {count}"
        label = None
        if problem is None and has_labels and label_value(row.get(label_column)) is not None:
            label, problem = _choice_label(label_value(row.get(label_column)), choice_columns, choices)
        if problem is not None:
            bad(line, problem)
            continue
        count = len(choices)
        index = str(row.get(id_column)) if id_column and row.get(id_column) is not None else str(line)
        first, second = (context, question) if context_column else (question, "")
        examples.append(MultipleChoiceExample(index=index, context=first, start=second, endings=choices,
                                              label=label, line=line))
    if not examples and not bad.skipped:
        raise BertkitError("no examples", path=str(path))
    return Examples(examples, path=path, skipped=bad.skipped)


def _choices(row: dict, columns: list[str]) -> tuple[list[str], str | None]:
    if len(columns) == 1:  # one column holding the list
        value = row.get(columns[0])
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                return [], f"{columns[0]!r} must hold a list of choices (a JSON list in a CSV cell)"
        if not isinstance(value, list) or len(value) < 2:
            return [], f"{columns[0]!r} must hold a list of at least two choices"
        columns, row = [f"{columns[0]}[{i}]" for i in range(len(value))], {f"{columns[0]}[{i}]": v
                                                                           for i, v in enumerate(value)}
    choices = [text_value(row, c) for c in columns]
    empty = [c for c, v in zip(columns, choices) if v is None]
    if empty:
        return [], f"empty choice {', '.join(map(repr, empty))}"
    return choices, None


def _choice_label(label: str, columns: list[str], choices: list[str]) -> tuple[int | None, str | None]:
    if len(columns) > 1 and label in columns:
        return columns.index(label), None
    if label.isascii() and label.isdigit() and int(label) < len(choices):
        return int(label), None
    if label in choices:
        return choices.index(label), None
    named = f"a choice column ({', '.join(columns)}), " if len(columns) > 1 else ""
    return None, f"label {label!r} is not {named}a choice number 0..{len(choices) - 1} or one of the choices' texts"


# ---------------------------------------------------------------- token tagging: CoNLL-style or JSON lines


def read_tagged_file(path: str | Path, tag_column: int | None = None, skip_bad_rows: bool = False,
                     tokens_field: str = "tokens", tags_field: str = "tags") -> tuple[ConllData, list[list[int]]]:
    """A token tagging file with any tag set: CoNLL-style (`token ... tag` per line, whitespace-separated,
    the same number of columns on every line, the tag last or in column `tag_column` (1-based), a
    blank line between sentences, -DOCSTART- lines between documents) or, for .jsonl/.json, one
    `{"tokens": [...], "tags": [...]}` object per sentence. Returns the data (scheme as
    `tag_scheme` finds it) and each word's line number."""
    path = Path(path)
    check_input_file(path, "file")
    bad = BadRows(path, skip_bad_rows)
    text = read_utf8(path)
    if path.suffix.lower() in (".jsonl", ".json", ".ndjson"):
        sentences, lines = _json_sentences(text, bad, tokens_field, tags_field)
    else:
        sentences, lines = _conll_sentences(text, bad, tag_column)
    if not sentences:
        raise BertkitError("no sentences found" + (f" ({len(bad.skipped)} bad rows skipped)" if bad.skipped else ""),
                           path=str(path))
    documents = len({s.document for s in sentences})
    return ConllData(str(path), sentences, documents, tag_scheme([s.tags for s in sentences]), len(bad.skipped)), lines


def _json_sentences(text: str, bad: BadRows, tokens_field: str, tags_field: str):
    sentences, lines = [], []
    for line, row in _json_rows(text, bad):
        tokens, tags = row.get(tokens_field), row.get(tags_field)
        problem = None
        for name, value in ((tokens_field, tokens), (tags_field, tags)):
            if problem is None and (not isinstance(value, list) or not value):
                problem = f"{name!r} must be a non-empty list of strings"
            elif problem is None and not all(isinstance(v, str) and v.strip() and not any(c.isspace() for c in v.strip())
                                             for v in value):
                problem = f"{name!r} holds an empty, non-string or multi-word item"
        if problem is None and len(tokens) != len(tags):
            problem = f"{len(tokens)} tokens but {len(tags)} tags"
        if problem is not None:
            bad(line, problem)
            continue
        sentences.append(Sentence([t.strip() for t in tokens], [t.strip() for t in tags], 0, line))
        lines.append([line] * len(tokens))
    return sentences, lines


def _conll_sentences(text: str, bad: BadRows, tag_column: int | None):
    sentences, lines = [], []
    words, tags, word_lines = [], [], []
    document, columns, columns_line = 0, None, None

    def close():
        if words:
            sentences.append(Sentence(list(words), list(tags), document, word_lines[0]))
            lines.append(list(word_lines))
        words.clear(), tags.clear(), word_lines.clear()

    for number, raw in enumerate(text.split("\n"), start=1):
        fields = raw.split()
        if not fields:
            close()
            continue
        if fields[0] == DOCSTART:
            close()
            document += 1 if sentences else 0
            continue
        needed = max(2, tag_column or 2)
        if len(fields) < needed:
            bad(number, f"expected a token and its tag{f' in column {tag_column}' if tag_column else ''}, "
                        f"found {len(fields)} column(s): {raw.strip()!r}")
            continue
        if columns is not None and len(fields) != columns:
            bad(number, f"expected {columns} whitespace-separated columns like line {columns_line}, found {len(fields)}")
            continue
        if columns is None:
            columns, columns_line = len(fields), number
        words.append(fields[0])
        tags.append(fields[tag_column - 1] if tag_column else fields[-1])
        word_lines.append(number)
    close()
    return sentences, lines


CHUNK_PREFIXES = ("B-", "I-", "E-", "S-")


def tag_scheme(tag_sequences: Sequence[Sequence[str]]) -> str:
    """IOB1 / IOB2 (as conll_data.detect_scheme), IOBES (some E- or S- tags), or "tags": a tag set without
    chunks (a tag other than O without a B-/I-/E-/S- prefix, e.g. part of speech), scored by accuracy."""
    tags = {t for seq in tag_sequences for t in seq}
    if any(t != "O" and not (t[:2] in CHUNK_PREFIXES and len(t) > 2) for t in tags):
        return "tags"
    if any(t[:2] in ("E-", "S-") for t in tags):
        return "IOBES"
    return detect_scheme(tag_sequences)


def check_tags(data: ConllData, lines: list[list[int]], known: set[str], skip_bad_rows: bool) -> ConllData:
    """Dev/test tags must occur in the training file (the model has no output for any other)."""
    bad = BadRows(Path(data.path), skip_bad_rows)
    kept = []
    for sentence, word_lines in zip(data.sentences, lines):
        unknown = [(t, n) for t, n in zip(sentence.tags, word_lines) if t not in known]
        if unknown:
            shown = ", ".join(sorted(known)[:20]) + (", ..." if len(known) > 20 else "")
            bad(unknown[0][1], f"tag {unknown[0][0]!r} does not occur in the training file (its tags: {shown})")
            continue
        kept.append(sentence)
    return ConllData(data.path, kept, data.num_documents, data.scheme, data.bad_rows + len(bad.skipped))
