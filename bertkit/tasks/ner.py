"""CoNLL-2003 named-entity recognition (paper §5.3): read, window, fine-tune, predict, score.

The paper's recipe: a linear layer on each token's final vector, the label of a word taken at its
first WordPiece (other pieces are ignored: label -100 in training, skipped at prediction), no CRF,
a case-preserving vocabulary and "maximal document context" (`doc_context`: each window is filled
with the neighbouring sentences of the same document, and only the centre sentence is predicted).
Scores are conlleval's chunk precision / recall / F1 (bertkit.metrics.conll).

Tags stay as the file gives them (IOB1 or IOB2, detected and recorded); `tag_scheme="iob2"`
converts IOB1 training tags to IOB2; predictions are always written back in the file's scheme.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Sequence

import torch

from .. import flags
from ..errors import BertkitError
from ..outputs import atomic_open, write_json
from ..hub import model_tokenizer
from ..metrics.conll import evaluate_conll, evaluate_conll_file
from .common import (MIN_SEQ_LENGTH, FeatureSource, RunResult, add_overwrite_argument, check_finetune_output, grid,
                     parse_list, predict, publish_best_metrics, run_name, run_sweep, summarize)

log = logging.getLogger("bertkit")

DOCSTART = "-DOCSTART-"
SPLITS = ("train", "valid", "test")
MODEL_KEYS = ("input_ids", "token_type_ids", "attention_mask", "labels")
TAG_SCHEMES = ("file", "iob2")  # --tag-scheme: keep the file's tags, or convert IOB1 -> IOB2


# ---------------------------------------------------------------- reading

@dataclasses.dataclass
class Sentence:
    words: list[str]
    tags: list[str]  # NER tags exactly as in the file
    document: int  # index of the document (-DOCSTART- block) in the file, from 0
    line: int  # line number of the first word


@dataclasses.dataclass
class ConllData:
    path: str
    sentences: list[Sentence]
    num_documents: int
    scheme: str  # "IOB1" or "IOB2": how the file marks chunk starts
    bad_rows: int = 0  # lines skipped with skip_bad_rows

    def documents(self) -> list[list[int]]:
        """Sentence indices of each non-empty document, in file order."""
        return _group_by_document(self.sentences)


def _group_by_document(sentences: Sequence[Sentence]) -> list[list[int]]:
    groups: list[list[int]] = []
    previous = None
    for index, sentence in enumerate(sentences):
        if sentence.document != previous:
            groups.append([])
            previous = sentence.document
        groups[-1].append(index)
    return groups


def _valid_tag(tag: str) -> bool:
    return tag == "O" or (len(tag) > 2 and tag[:2] in ("B-", "I-"))


def read_conll(path: str | Path, skip_bad_rows: bool = False) -> ConllData:
    """Read a CoNLL-2003 file: one `token POS chunk NER` line per word (any fixed number of columns
    >= 2; the first is the word, the last the NER tag), a blank line between sentences,
    `-DOCSTART-` lines between documents. A file without -DOCSTART- is one document."""
    path = str(path)
    sentences: list[Sentence] = []
    words: list[str] = []
    tags: list[str] = []
    first_line = 0
    document = -1
    columns = first_columns_line = None
    bad_rows = 0

    def close_sentence():
        nonlocal words, tags, document
        if words:
            document = max(document, 0)
            sentences.append(Sentence(words, tags, document, first_line))
        words, tags = [], []

    try:
        with open(path, encoding="utf-8") as handle:
            for line_number, line in enumerate(handle, start=1):
                fields = line.split()
                if not fields:
                    close_sentence()
                    continue
                if fields[0] == DOCSTART:
                    close_sentence()
                    document += 1
                    continue
                problem = None
                if len(fields) < 2:
                    problem = f"expected a word and its NER tag, found {line.strip()!r}"
                elif columns is not None and len(fields) != columns:
                    problem = (f"expected {columns} space-separated columns (token POS chunk NER) "
                               f"like line {first_columns_line}, found {len(fields)}")
                elif not _valid_tag(fields[-1]):
                    problem = f"NER tag {fields[-1]!r} is not IOB (expected O, B-TYPE or I-TYPE)"
                if problem is not None:
                    if skip_bad_rows:
                        bad_rows += 1
                        continue
                    raise BertkitError(problem, path=path, line=line_number)
                if columns is None:
                    columns, first_columns_line = len(fields), line_number
                if not words:
                    first_line = line_number
                words.append(fields[0])
                tags.append(fields[-1])
            close_sentence()
    except FileNotFoundError:
        raise BertkitError("CoNLL file not found", path=path) from None
    except IsADirectoryError:
        raise BertkitError("is a directory, expected a CoNLL file", path=path) from None
    except UnicodeDecodeError as err:
        raise BertkitError(f"not UTF-8 text ({err.reason})", path=path) from None
    if not sentences:
        raise BertkitError("no sentences found", path=path)
    if bad_rows:
        log.warning("%s: skipped %d malformed lines", path, bad_rows)
    scheme = detect_scheme([s.tags for s in sentences])
    return ConllData(path, sentences, max(document + 1, 1), scheme, bad_rows)


# ---------------------------------------------------------------- tag schemes

def _type(tag: str) -> str | None:
    return None if tag == "O" else tag[2:]


def detect_scheme(tag_sequences: Sequence[Sequence[str]]) -> str:
    """IOB1 when some chunk starts with I- (after O or after another type); else IOB2, where every
    chunk starts with B-."""
    for tags in tag_sequences:
        previous = None
        for tag in tags:
            if tag.startswith("I-") and _type(tag) != previous:
                return "IOB1"
            previous = _type(tag)
    return "IOB2"


def to_iob2(tags: Sequence[str]) -> list[str]:
    """Every chunk starts with B-. Also normalises any IOB tagging (e.g. a model's raw output)
    without changing the chunks conlleval reads: an I- that cannot continue becomes B-."""
    out, previous = [], None
    for tag in tags:
        if tag.startswith("I-") and _type(tag) != previous:
            tag = "B-" + tag[2:]
        out.append(tag)
        previous = _type(tag)
    return out


def to_iob1(tags: Sequence[str]) -> list[str]:
    """IOB1: chunks start with I-; B- only where a chunk directly follows one of the same type."""
    out, previous = [], None
    for tag in to_iob2(tags):
        if tag.startswith("B-") and _type(tag) != previous:
            tag = "I-" + tag[2:]
        out.append(tag)
        previous = _type(tag)
    return out


def to_scheme(tags: Sequence[str], scheme: str) -> list[str]:
    """Tags in IOB1 or IOB2; any other scheme (IOBES, a tag set without chunks) is left as it is."""
    if scheme == "IOB1":
        return to_iob1(tags)
    return to_iob2(tags) if scheme == "IOB2" else list(tags)


def label_list(tag_sequences: Sequence[Sequence[str]]) -> list[str]:
    """'O' first, then B-/I- (E-/S-) per type in alphabetical order of type; a tag without such a
    prefix (a tag set without chunks, e.g. part of speech) sorts as its own type."""
    found = {t for tags in tag_sequences for t in tags}
    found.add("O")

    def key(tag):
        prefixed = len(tag) > 2 and tag[1] == "-" and tag[0] in "BIES"
        return (tag != "O", tag[2:] if prefixed else tag, tag[0] if prefixed else "")

    return sorted(found, key=key)


# ---------------------------------------------------------------- windows

def word_pieces(tokenizer, sentences: Sequence[Sentence]) -> list[list[list[int]]]:
    """WordPiece ids of every word (per sentence, per word). Words are tokenized on their own,
    which equals tokenizing the sentence: BERT's basic step splits on whitespace anyway. A word
    with no pieces (only control characters) becomes [UNK], so every word has a first piece."""
    unique = sorted({w for s in sentences for w in s.words})
    pieces = tokenizer.tokenize_batch(unique)
    ids = {w: (tokenizer.convert_tokens_to_ids(p) if p else [tokenizer.unk_token_id]) for w, p in zip(unique, pieces)}
    return [[ids[w] for w in s.words] for s in sentences]


def _chunks(costs: Sequence[int], budget: int) -> list[tuple[int, int]]:
    """Split a sentence into consecutive word ranges of at most `budget` pieces (greedy). A single
    word longer than the budget gets a range of its own (its pieces are cut to the budget)."""
    ranges, start, used = [], 0, 0
    for index, cost in enumerate(costs):
        if index > start and used + cost > budget:
            ranges.append((start, index))
            start, used = index, 0
        used += cost
    ranges.append((start, len(costs)))
    return ranges


def ner_features(sentences: Sequence[Sentence], tokenizer, label2id: dict[str, int] | None = None,
                 max_seq_length: int = 128, doc_context: bool = False,
                 pieces: list[list[list[int]]] | None = None) -> list[dict]:
    """One model input per window: `[CLS] left-context centre right-context [SEP]`.

    The centre is a sentence, or a part of one too long for the window (its remaining words get
    their own continuation windows, so no word is dropped). Context fills the rest of the window
    alternately from the left and the right: first the other words of the same sentence, then
    (with doc_context) whole neighbouring sentences of the same document; the unit that no longer
    fits contributes its words nearest the centre and closes that side.

    Labels: the word's tag id at the first piece of each centre word, -100 everywhere else (context
    words and later pieces are not trained on). Metadata: `sentence` (index into sentences),
    `word_start` (first centre word) and `first_pieces` (token position of each centre word).
    """
    if max_seq_length < 3:
        raise BertkitError(f"max_seq_length must be at least 3 ([CLS] word [SEP]), not {max_seq_length}")
    budget = max_seq_length - 2
    pieces = pieces if pieces is not None else word_pieces(tokenizer, sentences)
    cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
    features = []
    for document in _group_by_document(sentences) if doc_context else [[i] for i in range(len(sentences))]:
        for position, s in enumerate(document):
            words = pieces[s]
            for start, end in _chunks([len(p) for p in words], budget):
                centre = [p[:budget] for p in words[start:end]]
                used = sum(len(p) for p in centre)
                # Context units, nearest first: the rest of this sentence, then neighbouring sentences.
                left_units = [words[:start]] + [pieces[t] for t in reversed(document[:position])]
                right_units = [words[end:]] + [pieces[t] for t in document[position + 1:]]
                left, right, used = _fill_context(left_units, right_units, budget - used)
                ids = [cls_id] + [i for p in left for i in p]
                first_pieces = []
                for p in centre:
                    first_pieces.append(len(ids))
                    ids.extend(p)
                ids += [i for p in right for i in p] + [sep_id]
                labels = [-100] * len(ids)
                if label2id is not None:
                    for position_in_window, tag in zip(first_pieces, sentences[s].tags[start:end]):
                        labels[position_in_window] = label2id.get(tag, -100)
                features.append({"input_ids": ids, "token_type_ids": [0] * len(ids), "attention_mask": [1] * len(ids),
                                 "labels": labels, "sentence": s, "word_start": start, "first_pieces": first_pieces})
    return features


def _fill_context(left_units, right_units, room: int):
    """Take whole units alternately from the left and the right while they fit; the first unit
    that does not fit on a side gives the words nearest the centre that do, and closes the side.
    Returns (left words in text order, right words in text order, room left)."""
    left: list[list[int]] = []
    right: list[list[int]] = []
    queues = {"left": list(left_units), "right": list(right_units)}
    open_sides = ["left", "right"]
    turn = 0
    while open_sides and room > 0:
        side = open_sides[turn % len(open_sides)]
        queue = queues[side]
        if not queue:
            open_sides.remove(side)
            continue
        unit = queue.pop(0)
        cost = sum(len(p) for p in unit)
        if cost <= room:
            taken = unit
        else:
            # Nearest words first: the end of a left unit, the start of a right one.
            taken, used = [], 0
            for p in (reversed(unit) if side == "left" else unit):
                if used + len(p) > room:
                    break
                taken.append(p)
                used += len(p)
            if side == "left":
                taken.reverse()
            open_sides.remove(side)
        if side == "left":
            left[:0] = taken
        else:
            right.extend(taken)
        room -= sum(len(p) for p in taken)
        if side in open_sides:
            turn += 1
    return left, right, room


# ---------------------------------------------------------------- prediction

def predict_ner(model, tokenizer, sentences: Sequence[Sentence], max_seq_length: int = 128,
                doc_context: bool = False, batch_size: int = 64, scheme: str = "IOB2",
                id2label: dict[int, str] | None = None, device=None, precision: str = "fp32",
                features: list[dict] | None = None) -> list[list[str]]:
    """Tags for every word of every sentence, argmax at each word's first piece, in `scheme`."""
    from ..device import pick_device, resolve_precision

    id2label = id2label or model.config.id2label
    if not id2label:
        raise BertkitError("the model has no id2label in its config: which tag is which output?")
    if device is None:
        device = next(model.parameters()).device
    else:
        device = pick_device(device) if isinstance(device, str) else device
        model.to(device)
    precision = resolve_precision(precision, device)
    if features is None:
        features = ner_features(sentences, tokenizer, None, max_seq_length, doc_context)
    logits = predict(model, features, batch_size=batch_size, device=device, precision=precision)["logits"]
    predicted: list[list[str | None]] = [[None] * len(s.words) for s in sentences]
    for feature, window_logits in zip(features, logits):
        best = window_logits[feature["first_pieces"]].argmax(-1).tolist()
        row = predicted[feature["sentence"]]
        for offset, label_id in enumerate(best):
            row[feature["word_start"] + offset] = id2label[int(label_id)]
    for index, row in enumerate(predicted):
        if any(tag is None for tag in row):  # a windowing bug, never user input
            raise AssertionError(f"sentence {index}: some words were in no window")
    return [to_scheme(row, scheme) for row in predicted]


def write_predictions(path: str | Path, sentences: Sequence[Sentence], predicted: Sequence[Sequence[str]]) -> None:
    """conlleval input: `token gold predicted` per line, a blank line between sentences."""
    with atomic_open(path) as handle:
        for sentence, tags in zip(sentences, predicted):
            for word, gold, guess in zip(sentence.words, sentence.tags, tags):
                handle.write(f"{word} {gold} {guess}\n")
            handle.write("\n")


# ---------------------------------------------------------------- data location and tokenizer

def find_conll_files(data_dir: str | Path | None) -> dict[str, Path]:
    """DATA/conll2003/{train,valid,test}.txt or DATA/{train,valid,test}.txt; DATA defaults to
    $BERTKIT_DATA. train and valid are required, test is used when present."""
    if data_dir is None:
        data_dir = os.environ.get("BERTKIT_DATA")
        if not data_dir:
            raise BertkitError("no data directory: pass --data-dir or set BERTKIT_DATA")
    root = Path(data_dir)
    for folder in (root / "conll2003", root):
        if (folder / "train.txt").is_file():
            files = {split: folder / f"{split}.txt" for split in SPLITS if (folder / f"{split}.txt").is_file()}
            if "valid" not in files:
                raise BertkitError("valid.txt (the dev set) is missing", path=str(folder))
            return files
    raise BertkitError("expected conll2003/train.txt or train.txt (with valid.txt, test.txt)", path=str(root))


def load_tokenizer(model_dir: str | Path, cased: bool | None = None):
    """The model directory's tokenizer; `cased` overrides its do_lower_case."""
    tokenizer = model_tokenizer(model_dir, do_lower_case=None if cased is None else not cased)
    if cased:
        upper_case_pieces = sum(any(c.isupper() for c in t) for t in tokenizer.ids_to_tokens if not t.startswith("["))
        if upper_case_pieces < 0.001 * tokenizer.vocab_size:  # cased English vocabularies have thousands
            log.warning("--cased with a vocabulary that has (almost) no upper-case pieces: capitalised words "
                        "will become [UNK] or be split badly")
    return tokenizer


def _limit(data: ConllData, n: int | None) -> list[Sentence]:
    return data.sentences if n is None else data.sentences[: max(0, n)]


# ---------------------------------------------------------------- fine-tuning

def finetune_ner(model_dir: str | Path, data_dir: str | Path | None = None, output_dir: str | Path | None = None,
                 learning_rates: Sequence[float] = (5e-5,), epochs: Sequence[float] = (3,),
                 batch_sizes: Sequence[int] = (32,), seeds: Sequence[int] = (42,), max_seq_length: int = 128,
                 doc_context: bool = False, precision: str = "auto", device: str = "auto",
                 max_train_sentences: int | None = None, max_eval_sentences: int | None = None,
                 tag_scheme: str = "file", cased: bool | None = None, warmup_ratio: float = 0.1,
                 eval_batch_size: int = 64, skip_bad_rows: bool = False, progress: bool | None = None,
                 data: dict[str, ConllData] | None = None, select_on: str = "f1", weight_decay: float = 0.01,
                 logging_steps: int = 50) -> dict:
    """Fine-tune BertForTokenClassification on CoNLL-2003 over the grid lr x epochs x batch x seed,
    keep the best run on dev F1, score it (and every run) on dev and test with conlleval.

    `data` ({"train", "valid"[, "test"]: ConllData}) replaces the files of data_dir (a user's own
    files, bertkit.tasks.custom); `select_on` is the dev score that picks the best run ("f1", or
    "accuracy" for a tag set without chunks). Writes to output_dir (when given): results.json,
    dev_predictions.txt, test_predictions.txt, the best model in the Hugging Face layout (id2label
    in config.json) with its tokenizer, runs/<name>/metrics.jsonl per run and the best run's
    metrics.jsonl beside the model. Returns the results dict."""
    from ..device import pick_device, resolve_precision
    from ..heads import BertForTokenClassification
    from ..train import Phase, TrainArgs, fit

    if tag_scheme not in TAG_SCHEMES:
        raise BertkitError(f"tag_scheme must be one of {', '.join(TAG_SCHEMES)}, not {tag_scheme!r}")
    if data is None:
        files = find_conll_files(data_dir)
        data = {split: read_conll(path, skip_bad_rows) for split, path in files.items()}
    else:
        files = {split: d.path for split, d in data.items()}
    tokenizer = load_tokenizer(model_dir, cased)
    train_sentences = _limit(data["train"], max_train_sentences)
    eval_sets = {split: _limit(data[split], max_eval_sentences) for split in ("valid", "test") if split in data}
    file_scheme = data["train"].scheme
    convert = tag_scheme == "iob2" and file_scheme == "IOB1"
    train_tags = [to_iob2(s.tags) if convert else s.tags for s in train_sentences]
    labels = label_list(train_tags)
    label2id = {t: i for i, t in enumerate(labels)}
    id2label = dict(enumerate(labels))
    training_sentences = [dataclasses.replace(s, tags=t) for s, t in zip(train_sentences, train_tags)]
    train_features = ner_features(training_sentences, tokenizer, label2id, max_seq_length, doc_context)
    eval_features = {split: ner_features(sents, tokenizer, None, max_seq_length, doc_context)
                     for split, sents in eval_sets.items()}
    resolved_precision = resolve_precision(precision, pick_device(device))
    out = Path(output_dir) if output_dir is not None else None

    def evaluate_split(model, split):
        sents = eval_sets[split]
        predicted = predict_ner(model, tokenizer, sents, max_seq_length, doc_context, eval_batch_size,
                                scheme=data[split].scheme, id2label=id2label, precision=resolved_precision,
                                features=eval_features[split])
        return evaluate_conll([s.tags for s in sents], predicted), predicted

    def run_one(config: dict) -> RunResult:
        name = run_name(config)
        started = time.perf_counter()
        torch.manual_seed(config["seed"])  # the new head's initialisation differs per restart
        model = BertForTokenClassification.from_pretrained(model_dir, num_labels=len(labels), id2label=id2label)
        source = FeatureSource(train_features, config["batch_size"], seed=config["seed"], model_keys=MODEL_KEYS,
                               pad_token_id=tokenizer.pad_token_id)
        args = TrainArgs(output_dir=str(out / "runs" / name) if out else None, learning_rate=config["learning_rate"],
                         warmup_ratio=warmup_ratio, weight_decay=weight_decay, precision=precision, device=device,
                         seed=config["seed"], logging_steps=logging_steps, save_final_model=False, progress=progress)
        train = fit(model, Phase(source, epochs=config["epochs"], name="ner"), args)
        scores, predictions = {}, {}
        for split in eval_sets:
            scores[split], predictions[split] = evaluate_split(model, split)
        metrics = {f"{'dev' if split == 'valid' else split}_{k}": v for split, r in scores.items()
                   for k, v in r.items() if k in ("precision", "recall", "f1", "accuracy")}
        metrics["train_seq_per_s"] = train.sequences_per_second
        if progress is not False:  # one line per finished run, like the other tasks
            print(f"ner {name}: dev F1 {scores['valid']['f1']:.4f}"
                  + (f", test F1 {scores['test']['f1']:.4f}" if "test" in scores else ""), file=sys.stderr)
        return RunResult(config, metrics, scores["valid"][select_on], time.perf_counter() - started,
                         artifacts={"model": model, "scores": scores, "predictions": predictions})

    configs = grid(learning_rates, epochs, batch_sizes, seeds)
    all_scores = []
    best, runs = run_sweep(configs, run_one, on_run=lambda r: all_scores.append(r.artifacts["scores"]))
    results = {
        "task": "ner",
        "model": str(model_dir),
        "selection": f"best dev {select_on}",
        "files": {split: str(path) for split, path in files.items()},
        "tag_scheme": {"file": file_scheme, "training": "IOB2" if convert else file_scheme},
        "labels": labels,
        "do_lower_case": tokenizer.do_lower_case,
        "max_seq_length": max_seq_length,
        "doc_context": doc_context,
        "precision": resolved_precision,
        "sentences": {"train": len(train_sentences), **{k: len(v) for k, v in eval_sets.items()}},
        "documents": {split: d.num_documents for split, d in data.items()},
        "windows": {"train": len(train_features), **{k: len(v) for k, v in eval_features.items()}},
        "bad_rows": {split: d.bad_rows for split, d in data.items()},
        "best": {"config": best.config, "dev": best.artifacts["scores"]["valid"],
                 "test": best.artifacts["scores"].get("test")},
        "runs": [{"config": r.config, "seconds": r.seconds, "dev": s["valid"], "test": s.get("test")}
                 for r, s in zip(runs, all_scores)],
        "summary": summarize(runs),
    }
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        best.artifacts["model"].save_pretrained(out, tokenizer=tokenizer)
        publish_best_metrics(out / "runs", best, out)
        for split, name in (("valid", "dev_predictions.txt"), ("test", "test_predictions.txt")):
            if split in eval_sets:
                write_predictions(out / name, eval_sets[split], best.artifacts["predictions"][split])
        write_json(out / "results.json", results)
    return results


# ---------------------------------------------------------------- CLI: bertkit finetune ner / evaluate conll

FEATURE_VARIANTS_HELP = ("embeddings, last, second-to-last, sum-last-four, concat-last-four, weighted-sum-all "
                         "(comma list: one tagger each, the paper's Table 7)")


def add_finetune_arguments(parser) -> None:
    parser.add_argument("--model", required=True, help="pre-trained model directory (Hugging Face layout)")
    parser.add_argument("--data-dir", default=None,
                        help="folder with conll2003/{train,valid,test}.txt or {train,valid,test}.txt (default $BERTKIT_DATA)")
    parser.add_argument("--output", required=True, help="output directory")
    add_overwrite_argument(parser)
    parser.add_argument("--learning-rate", default=None, type=flags.comma_list(flags.positive_float),
                        help="comma list allowed (a sweep, best on dev F1); default 5e-5, or 1e-3 with --feature-based")
    parser.add_argument("--epochs", default=None, type=flags.comma_list(flags.positive_number), help="comma list allowed; default 3, or 4 with --feature-based")
    parser.add_argument("--batch-size", default="32", type=flags.comma_list(flags.positive_int), help="comma list allowed")
    parser.add_argument("--seed", default="42", type=flags.comma_list(flags.seed), help="comma list = restarts")
    parser.add_argument("--max-seq-length", type=flags.int_between(MIN_SEQ_LENGTH), default=128)
    parser.add_argument("--doc-context", action="store_true",
                        help="fill each window with neighbouring sentences of the same document; predict the centre one")
    parser.add_argument("--tag-scheme", choices=TAG_SCHEMES, default="file",
                        help="file: train on the file's tags; iob2: convert IOB1 training tags to IOB2 "
                             "(predictions are written in the file's scheme either way)")
    case = parser.add_mutually_exclusive_group()
    case.add_argument("--cased", dest="cased", action="store_true", default=None,
                      help="keep case (default: do_lower_case from the model's tokenizer_config.json)")
    case.add_argument("--uncased", dest="cased", action="store_false", help="lower-case and strip accents")
    parser.add_argument("--max-train-sentences", type=flags.positive_int, default=None, help="use only the first N training sentences")
    parser.add_argument("--max-eval-sentences", type=flags.positive_int, default=None,
                        help="score only the first N dev and test sentences (quick runs)")
    parser.add_argument("--warmup-ratio", type=flags.probability, default=0.1)
    parser.add_argument("--eval-batch-size", type=flags.positive_int, default=64)
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto")
    parser.add_argument("--device", default="auto", type=flags.device)
    parser.add_argument("--skip-bad-rows", action="store_true", help="skip (and count) malformed lines instead of failing")
    feature = parser.add_argument_group("feature-based (frozen encoder + 2-layer BiLSTM tagger, the paper's §5.3)")
    feature.add_argument("--feature-based", action="store_true", help="train BiLSTM taggers on frozen features instead")
    feature.add_argument("--layers", default="concat-last-four", help=FEATURE_VARIANTS_HELP)
    feature.add_argument("--lstm-size", type=flags.positive_int, default=768, help="BiLSTM units per direction (768 in the paper)")
    feature.add_argument("--lstm-dropout", type=flags.probability, default=0.5)


def run_finetune(args) -> int:
    check_finetune_output(args)
    seeds = parse_list(args.seed, int)
    batch_sizes = parse_list(args.batch_size, int)
    if args.feature_based:
        from ..features import train_feature_based_ner

        if len(seeds) > 1 or len(batch_sizes) > 1:
            raise BertkitError("--feature-based takes one --seed and one --batch-size")
        learning_rates = parse_list(args.learning_rate or "1e-3")
        epochs = parse_list(args.epochs or "4")
        if len(learning_rates) > 1 or len(epochs) > 1:
            raise BertkitError("--feature-based takes one --learning-rate and one --epochs")
        results = train_feature_based_ner(
            args.model, args.data_dir, args.output, variants=parse_list(args.layers, str), lstm_size=args.lstm_size,
            learning_rate=learning_rates[0], epochs=epochs[0], batch_size=batch_sizes[0], seed=seeds[0],
            max_seq_length=args.max_seq_length, doc_context=args.doc_context, precision=args.precision,
            device=args.device, max_train_sentences=args.max_train_sentences,
            max_eval_sentences=args.max_eval_sentences, tag_scheme=args.tag_scheme, cased=args.cased,
            dropout=args.lstm_dropout, skip_bad_rows=args.skip_bad_rows)
        summary = {v: {"dev_f1": r["dev"]["f1"], "test_f1": (r.get("test") or {}).get("f1")}
                   for v, r in results["variants"].items()}
    else:
        results = finetune_ner(
            args.model, args.data_dir, args.output, learning_rates=parse_list(args.learning_rate or "5e-5"),
            epochs=parse_list(args.epochs or "3"), batch_sizes=batch_sizes, seeds=seeds,
            max_seq_length=args.max_seq_length, doc_context=args.doc_context, precision=args.precision,
            device=args.device, max_train_sentences=args.max_train_sentences,
            max_eval_sentences=args.max_eval_sentences, tag_scheme=args.tag_scheme, cased=args.cased,
            warmup_ratio=args.warmup_ratio, eval_batch_size=args.eval_batch_size, skip_bad_rows=args.skip_bad_rows)
        summary = {"best_config": results["best"]["config"], "dev_f1": results["best"]["dev"]["f1"],
                   "test_f1": (results["best"]["test"] or {}).get("f1")}
    bad = {k: v for k, v in results["bad_rows"].items() if v}
    if bad:
        summary["skipped_bad_rows"] = bad
    print(json.dumps(summary))
    return 0


def add_evaluate_arguments(parser) -> None:
    parser.add_argument("file", metavar="FILE",
                        help="conlleval input: token ... gold predicted per line, blank line between sentences")


def run_evaluate(args) -> int:
    print(json.dumps(evaluate_conll_file(args.file)))
    return 0


__all__ = ["Sentence", "ConllData", "read_conll", "detect_scheme", "to_iob1", "to_iob2", "label_list",
           "word_pieces", "ner_features", "predict_ner", "write_predictions", "find_conll_files", "load_tokenizer", "finetune_ner"]
