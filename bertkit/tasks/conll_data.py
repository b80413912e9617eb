"""CoNLL-2003 data for NER (paper §5.3): read the files, tag schemes, and the model's windows.

Shared by the fine-tuned tagger (ner.py) and the feature-based one (ner_features.py). Tags stay as
the file gives them (IOB1 or IOB2, detected and recorded); predictions are written back in the
file's scheme (`write_predictions`, conlleval's input).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Sequence

from ..errors import BertkitError, reading
from ..outputs import atomic_open
from .examples import resolve_data_dir

log = logging.getLogger("bertkit")

DOCSTART = "-DOCSTART-"
SPLITS = ("train", "valid", "test")
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

    with reading(path, "CoNLL file"), open(path, encoding="utf-8") as handle:
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


def write_predictions(path: str | Path, sentences: Sequence[Sentence], predicted: Sequence[Sequence[str]]) -> None:
    """conlleval input: `token gold predicted` per line, a blank line between sentences."""
    with atomic_open(path) as handle:
        for sentence, tags in zip(sentences, predicted):
            for word, gold, guess in zip(sentence.words, sentence.tags, tags):
                handle.write(f"{word} {gold} {guess}\n")
            handle.write("\n")


# ---------------------------------------------------------------- data location

def find_conll_files(data_dir: str | Path | None) -> dict[str, Path]:
    """DATA/conll2003/{train,valid,test}.txt or DATA/{train,valid,test}.txt; DATA defaults to
    $BERTKIT_DATA. train and valid are required, test is used when present."""
    root = resolve_data_dir(data_dir)
    for folder in (root / "conll2003", root):
        if (folder / "train.txt").is_file():
            files = {split: folder / f"{split}.txt" for split in SPLITS if (folder / f"{split}.txt").is_file()}
            if "valid" not in files:
                raise BertkitError("valid.txt (the dev set) is missing", path=str(folder))
            return files
    raise BertkitError("expected conll2003/train.txt or train.txt (with valid.txt, test.txt)", path=str(root))
