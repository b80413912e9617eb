"""`bertkit predict TASK --model DIR --input FILE --output FILE`: predictions for new text, every head.

Input: plain text (one input per line; for pairs and QA, tab-separated fields), CSV / TSV with a
header row, or JSONL (one object per line); `-` reads stdin. Field names: `text` (+ `text_pair`)
for classification, `text` for NER, fill-mask and embeddings, `question` + `context` for QA,
`context` (or `question`) + `choices` (a JSON list, or columns choice0, choice1, ...) for multiple
choice; --text-column etc. rename them. Any `id` field is copied to the output.

Output: JSONL (one object per input, in input order), TSV or CSV (fields holding a tab, comma,
quote or line break quoted), or for embeddings a .npy / .safetensors array (one row per input, in
input order): the format follows the extension (another is refused), `-` is standard output. The
output is written to a temporary file that replaces FILE only when every input has been predicted;
an existing FILE needs --overwrite, and an input (or a model file) is never replaced. Inputs are
read and predicted in chunks (streamed) through the shared inference engine (length-grouped
batches, unpadded fast path), with a progress bar on a terminal.

Results per task: text-classification {"label", "score", "scores"} (regression models: {"value"});
token-classification {"entities": [{"entity_group", "score", "word", "start", "end"}]} with
character offsets into the raw text; question-answering {"answer", "score", "start", "end"};
multiple-choice {"choice", "choice_text", "score", "scores"}; fill-mask {"predictions": [...]};
embeddings {"embedding": [...]} (the folder's pooling and normalisation).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Iterator

import numpy as np
import torch
from tqdm import tqdm

from .. import flags
from .answer_defaults import AGGREGATION_STRATEGIES, FILL_MASK, QUESTION_ANSWERING, TOKEN_CLASSIFICATION
from ..device import DEFAULT_PRECISION, add_precision_argument, precision_label
from ..errors import BertkitError, counted
from ..outputs import atomic_write, check_output, folder_files, is_stdout, output_stream
from ..tables import TableWriter, check_input_file, distinct_columns, open_text, require_columns, table_rows, text_lines
from .engine import InferenceEngine
from ..kernels.int8 import QUANTIZE_CHOICES
from .pipelines import fill_mask_results, label_scores, mask_row, qa_answers, qa_windows, score_function, token_entities

log = logging.getLogger("bertkit")

CHUNK = 1024  # inputs read, predicted and written together


# ---------------------------------------------------------------- reading inputs


def read_records(handle: IO[str], name: str, fmt: str, text_fields: list[str],
                 required: list[str] = ()) -> Iterator[tuple[int, dict]]:
    """(line, record) per input; plain text lines map onto `text_fields` (tab-separated). CSV / TSV go
    through the one table reader (tables.py: quoted line breaks, BOM, any line ending, duplicate or
    missing columns refused by name)."""
    if fmt in ("csv", "tsv"):
        header, rows = table_rows(handle, name, fmt)
        require_columns(header, list(required), name)
        yield from rows
        return
    for number, line in text_lines(handle, name):
        if not line.strip():
            continue
        if fmt == "jsonl":
            try:
                record = json.loads(line)
            except (json.JSONDecodeError, RecursionError) as e:
                raise BertkitError(f"invalid JSON ({getattr(e, 'msg', 'nested too deeply')})", name, number) from None
            if not isinstance(record, dict):
                raise BertkitError("expected a JSON object per line", name, number)
            yield number, record
        else:
            values = line.split("\t")
            if len(values) > len(text_fields):
                raise BertkitError(f"{len(values)} tab-separated fields; expected at most {len(text_fields)} "
                                   f"({', '.join(text_fields)})", name, number)
            yield number, dict(zip(text_fields, values))


def _format_of(path: str, given: str | None, choices: tuple[str, ...], default: str) -> str:
    if given:
        return given
    suffix = Path(path).suffix.lower().lstrip(".")
    return {"json": "jsonl", "txt": "text"}.get(suffix, suffix) if suffix in (*choices, "json", "txt") else default


# ---------------------------------------------------------------- the tasks


@dataclass
class PredictTask:
    name: str
    fields: list[str]  # plain-text column order
    rows: Callable  # (engine, record, options, where) -> list of model rows
    result: Callable  # (engine, record, rows, outputs, options) -> dict
    model_tasks: tuple[str, ...]


def _field(record: dict, name: str, where: tuple[str, int]) -> str:
    value = record.get(name)
    if not isinstance(value, str) or not value.strip():
        raise BertkitError(f"missing or empty field {name!r}", *where)
    return value


def _encode(engine, texts, pairs, options, where, offsets=False):
    try:
        return engine.encode(texts, pairs, truncate=options.truncate, return_offsets=offsets)
    except BertkitError as e:
        raise BertkitError(e.message, *where) from None


def _classification_rows(engine, record, options, where):
    pair = record.get(options.text_pair_column) if options.text_pair_column in record else None
    if pair is not None and not isinstance(pair, str):
        raise BertkitError(f"field {options.text_pair_column!r} must be a string", *where)
    text = _field(record, options.text_column, where)
    return _encode(engine, [text], None if pair is None else [pair], options, where)


def _classification_result(engine, record, rows, outputs, options):
    logits = outputs[0]["logits"]
    if engine.config.num_labels == 1 or engine.config.problem_type == "regression":
        return {"value": float(logits[0])} if logits.numel() == 1 else {"values": logits.tolist()}
    scores = label_scores(logits, engine.id2label, score_function(engine.config), None)
    return {"label": scores[0]["label"], "score": scores[0]["score"], "scores": {s["label"]: s["score"] for s in scores}}


def _ner_rows(engine, record, options, where):
    return _encode(engine, [_field(record, options.text_column, where)], None, options, where, offsets=True)


def _ner_result(engine, record, rows, outputs, options):
    text = record[options.text_column]
    return {"entities": token_entities(text, outputs[0]["logits"], rows[0], engine.tokenizer, engine.id2label,
                                       options.aggregation_strategy)}


def _qa_rows(engine, record, options, where):
    try:
        windows = qa_windows(engine, _field(record, "question", where), _field(record, "context", where),
                             doc_stride=options.doc_stride, truncate=True, max_seq_len=options.max_seq_length)
    except BertkitError as e:
        raise BertkitError(e.message, *where) from None
    if all(len(w["input_ids"]) - w["context_start"] - 1 == 0 for w in windows):
        raise BertkitError("the context has no text the tokenizer keeps (only spaces or control characters): "
                           "there is nothing to answer from", *where)
    return windows


def _qa_result(engine, record, rows, outputs, options):
    answers = qa_answers(rows, outputs, record["context"], options.top_k, options.max_answer_length)
    return answers[0] if options.top_k == 1 else {"answers": answers}


def _choices(record: dict, where) -> list[str]:
    choices = record.get("choices")
    if isinstance(choices, str):  # a CSV column holding a JSON list
        try:
            choices = json.loads(choices)
        except json.JSONDecodeError:
            raise BertkitError("'choices' must be a JSON list of strings", *where) from None
    if choices is None:
        choices = [record[k] for k in sorted((k for k in record if k.startswith("choice") and k[6:].isdigit()),
                                             key=lambda k: int(k[6:]))]
    if not isinstance(choices, list) or len(choices) < 2 or not all(isinstance(c, str) and c for c in choices):
        raise BertkitError("need 'choices' (a list of at least two strings) or columns choice0, choice1, ...", *where)
    return choices


def _choice_rows(engine, record, options, where):
    prompt = record.get("context", record.get("question"))
    if not isinstance(prompt, str) or not prompt.strip():
        raise BertkitError("missing or empty field 'context' (or 'question')", *where)
    choices = _choices(record, where)
    encoded = _encode(engine, [prompt] * len(choices), choices, options, where)
    return [{key: [row[key] for row in encoded] for key in ("input_ids", "token_type_ids", "attention_mask")}]


def _choice_result(engine, record, rows, outputs, options):
    probabilities = torch.softmax(outputs[0]["logits"].float(), -1)
    best = int(probabilities.argmax())
    return {"choice": best, "choice_text": _choices(record, ("", 0))[best], "score": float(probabilities[best]),
            "scores": probabilities.tolist()}


def _fill_mask_rows(engine, record, options, where):
    try:
        return [mask_row(engine.tokenizer, _field(record, options.text_column, where), engine.max_length)]
    except BertkitError as e:
        raise BertkitError(e.message, *where) from None


def _fill_mask_result(engine, record, rows, outputs, options):
    # --top-k beyond the vocabulary means every token: capped at the vocabulary size (a top-k can list no more).
    per_mask = fill_mask_results(engine.tokenizer, rows[0], outputs[0]["logits"],
                                 min(options.top_k, outputs[0]["logits"].shape[-1]))
    return {"predictions": per_mask[0] if len(per_mask) == 1 else per_mask}


def _embedding_rows(engine, record, options, where):
    return _encode(engine, [_field(record, options.text_column, where)], None, options, where)


def _embedding_result(engine, record, rows, outputs, options):
    return {"embedding": engine.pool(outputs[0]["last_hidden_state"], options.normalize).tolist()}


TASKS = {t.name: t for t in (
    PredictTask("text-classification", ["text", "text_pair"], _classification_rows, _classification_result,
                ("text-classification",)),
    PredictTask("token-classification", ["text"], _ner_rows, _ner_result, ("token-classification",)),
    PredictTask("question-answering", ["question", "context"], _qa_rows, _qa_result, ("question-answering",)),
    PredictTask("multiple-choice", ["context", "choice0", "choice1", "choice2", "choice3"], _choice_rows,
                _choice_result, ("multiple-choice",)),
    PredictTask("fill-mask", ["text"], _fill_mask_rows, _fill_mask_result, ("fill-mask",)),
    PredictTask("embeddings", ["text"], _embedding_rows, _embedding_result, ("feature-extraction", "sentence-embeddings")),
)}


# ---------------------------------------------------------------- the run


def _cell(value) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


# What each task's results can be written as: text tables, or (embeddings) an array file.
TEXT_OUTPUTS = ("jsonl", "tsv", "csv")
ARRAY_OUTPUTS = ("npy", "safetensors")


def output_formats(task: str) -> tuple[str, ...]:
    return TEXT_OUTPUTS + (ARRAY_OUTPUTS if task == "embeddings" else ())


def required_columns(task: str, options) -> list[str]:
    """The columns a CSV / TSV input must have for `task` (refused by name before any prediction)."""
    if task == "question-answering":
        return ["question", "context"]
    if task == "multiple-choice":
        return []
    return [options.text_column]


class _Results:
    """Writes results in input order as JSON lines, a CSV / TSV table (a header from the first
    result; every row the same columns) or, for embeddings, one array (rows in input order)."""

    def __init__(self, handle, fmt: str, name: str):
        self.handle, self.fmt, self.name = handle, fmt, name
        self.table = TableWriter(handle, fmt) if fmt in ("tsv", "csv") else None
        self.columns, self.arrays = None, []

    def add(self, line: int, result: dict) -> None:
        if self.fmt == "jsonl":
            self.handle.write(json.dumps(result, ensure_ascii=False) + "\n")
        elif self.table is not None:
            if self.columns is None:
                self.columns = list(result)
                self.table.writerow(self.columns)
            if set(result) - set(self.columns):
                extra = ", ".join(sorted(set(result) - set(self.columns)))
                raise BertkitError(f"this input has field(s) {extra} that the first input lacks: a {self.fmt.upper()} "
                                   "output needs the same columns on every row (write .jsonl instead)", self.name, line)
            self.table.writerow([_cell(result.get(c, "")) for c in self.columns])
        else:
            self.arrays.append(result["embedding"])

    def array(self) -> np.ndarray:
        return np.asarray(self.arrays, dtype=np.float32)


def predict_file(task: str, model_dir: str | Path, input_path: str, output_path: str, options,
                 input_format: str | None = None, output_format: str | None = None, device: str = "auto",
                 precision: str = DEFAULT_PRECISION, progress: bool | None = None, quantize: str = "none",
                 overwrite: bool = False) -> int:
    """Predict every input of `input_path` (or stdin for "-") into `output_path` (stdout for "-");
    returns the number of inputs. Before any work: the output must not be an input (the model
    folder's files included), nor exist unless `overwrite`, and its extension must name a format
    this task writes. The output appears only complete: an input that fails (or turns out empty)
    leaves an earlier output as it was. `options`: the command's flags (columns, max_batch_tokens,
    the task's own)."""
    spec = TASKS[task]
    in_format = _format_of(input_path, input_format, ("jsonl", "csv", "tsv", "text"), "text")
    out_format = check_output(output_path, inputs=[None if input_path == "-" else input_path,
                                                   *folder_files(model_dir)],
                              overwrite=overwrite, formats=output_formats(task), given_format=output_format,
                              default_format="jsonl")
    name = "<stdin>" if input_path == "-" else input_path
    if input_path != "-":
        check_input_file(input_path)  # a file, or a pipe (`--input <(cmd)`): read once
    renamed = {"text": options.text_column, "text_pair": options.text_pair_column}
    distinct_columns({"--text-column": options.text_column, "--text-pair-column": options.text_pair_column})
    fields = [renamed.get(f, f) for f in spec.fields]
    engine = InferenceEngine(model_dir, device, precision, options.max_batch_tokens, quantize=quantize)
    if engine.task not in spec.model_tasks:
        raise BertkitError(f"predict {task} needs a model for {' or '.join(spec.model_tasks)}; this folder holds a "
                           f"{type(engine.model).__name__} ({engine.task})", path=str(model_dir))
    log.info(f"predict {task}: {model_dir} on {precision_label(engine.device, engine.precision, engine.quantize)}")
    if not is_stdout(output_path):
        Path(output_path).parent.mkdir(parents=True, exist_ok=True)
    count = 0

    def predict_into(out) -> None:
        nonlocal count
        handle = open_text(input_path, newline="" if in_format in ("csv", "tsv") else None)
        try:
            records = read_records(handle, name, in_format, fields, required_columns(task, options))
            bar = tqdm(desc=f"predict {task}", unit=" inputs",
                       disable=(not sys.stderr.isatty()) if progress is None else not progress)
            results = _Results(out, out_format, name)
            for chunk in _chunks(records, CHUNK):
                for (line, record), result in zip(chunk, _predict_chunk(engine, spec, chunk, options, name)):
                    results.add(line, {"id": record["id"], **result} if "id" in record else result)
                count += len(chunk)
                bar.update(len(chunk))
            bar.close()
        finally:
            if input_path != "-":
                handle.close()
        if count == 0:  # raised before the rename: an existing output stays as it was
            raise BertkitError("no inputs found", path=name)
        return results

    if out_format in ARRAY_OUTPUTS:
        def write_array(tmp: str) -> None:
            matrix = predict_into(None).array()
            if out_format == "npy":
                with open(tmp, "wb") as f:
                    np.save(f, matrix)
            else:
                from safetensors.numpy import save_file
                save_file({"embeddings": matrix}, tmp)

        atomic_write(Path(output_path), write_array)
    else:
        with output_stream(output_path) as out:
            predict_into(out)
    return count


def _chunks(records: Iterator, size: int) -> Iterator[list]:
    chunk = []
    for item in records:
        chunk.append(item)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _predict_chunk(engine, spec: PredictTask, chunk: list[tuple[int, dict]], options, name: str) -> list[dict]:
    per_record = [spec.rows(engine, record, options, (name, line)) for line, record in chunk]
    outputs = engine.forward([row for rows in per_record for row in rows])
    results, start = [], 0
    for (line, record), rows in zip(chunk, per_record):
        results.append(spec.result(engine, record, rows, outputs[start:start + len(rows)], options))
        start += len(rows)
    return results


# ---------------------------------------------------------------- command line


def _command(task: str):
    class Command:
        @staticmethod
        def add_predict_arguments(parser) -> None:
            parser.add_argument("--model", required=True, help="fine-tuned model folder (Hugging Face layout)")
            parser.add_argument("--input", required=True, help="text, .csv, .tsv or .jsonl file; - for stdin")
            parser.add_argument("--output", required=True,
                                help=f"{', '.join('.' + f for f in output_formats(task))} file (the format follows the "
                                     "extension; written atomically), or - for standard output (JSON lines)")
            parser.add_argument("--overwrite", action="store_true",
                                help="replace an existing output file (never an input, with or without this flag)")
            parser.add_argument("--input-format", choices=("text", "csv", "tsv", "jsonl"), default=None,
                                help="default: from the input's extension (text otherwise)")
            parser.add_argument("--output-format", choices=TEXT_OUTPUTS, default=None,
                                help="for - (standard output) or a name without extension; an extension must agree")
            parser.add_argument("--text-column", default="text", help="field holding the text (default text)")
            parser.add_argument("--text-pair-column", default="text_pair", help="field holding the second text")
            parser.add_argument("--no-truncate", dest="truncate", action="store_false",
                                help="refuse over-long inputs instead of truncating them")
            parser.add_argument("--aggregation-strategy", default=TOKEN_CLASSIFICATION["aggregation_strategy"],
                                choices=AGGREGATION_STRATEGIES,
                                help="token-classification: one entity per token (none, the default, as "
                                     "transformers' pipeline), B-/I- runs (simple), or runs after a vote per "
                                     "word (first, average, max)")
            parser.add_argument("--top-k", type=flags.positive_int,
                                default=QUESTION_ANSWERING["top_k"] if task == "question-answering" else FILL_MASK["top_k"],
                                help="answers (QA) or tokens (fill-mask, capped at the vocabulary size) per input")
            parser.add_argument("--max-answer-length", type=flags.positive_int,
                                default=QUESTION_ANSWERING["max_answer_len"],
                                help="QA: longest answer in tokens (default %(default)s, transformers' pipeline; "
                                     "Google's run_squad.py and `bertkit squad`: 30)")
            parser.add_argument("--doc-stride", type=flags.positive_int, default=QUESTION_ANSWERING["doc_stride"],
                                help="QA: window step over long contexts")
            parser.add_argument("--max-seq-length", type=flags.int_between(4), default=QUESTION_ANSWERING["max_seq_len"],
                                help="QA: tokens per window (question + context)")
            parser.add_argument("--normalize", action=argparse.BooleanOptionalAction, default=None,
                                help="embeddings: --normalize / --no-normalize (default: as the model folder says)")
            parser.add_argument("--max-batch-tokens", type=flags.positive_int, default=16384,
                                help="padded tokens per forward pass")
            parser.add_argument("--device", type=flags.device, default="auto")
            add_precision_argument(parser)
            parser.add_argument("--quantize", default="none", choices=QUANTIZE_CHOICES,
                                help="int8: the encoder's Linear layers in dynamic int8 (CPU; faster, "
                                     "slightly different scores: docs/speed.md)")

        @staticmethod
        def run_predict(args) -> int:
            count = predict_file(task, args.model, args.input, args.output, args, args.input_format,
                                 args.output_format, args.device, args.precision, quantize=args.quantize,
                                 overwrite=args.overwrite)
            log.info(f"predict {task}: {counted(count, 'input')} -> {args.output}")
            return 0

    Command.__doc__ = f"predict {task} for new text (text / CSV / TSV / JSONL in, JSONL / TSV out)"
    return Command


COMMANDS = {task: _command(task) for task in TASKS}
