"""WordPiece tokenization, id for id the original BERT's (Google's tokenization.py).

Two paths produce the same tokens:

* the fast path: a `tokenizers` (Rust) pipeline, BertNormalizer + BertPreTokenizer + WordPiece;
* the exact path: a pure-Python port of the original basic tokenizer and greedy WordPiece.

The Rust library's Unicode tables are older than Python's (Unicode 14 here); it lower-cases
character by character where Python turns a word-final Σ into ς; it lacks the NFC step of
transformers' port (the reference), and its offsets for composed characters drop the combining
mark. A text goes to the Rust path only when every character in it is "settled" (assigned
already in Unicode 3.2 with the same general category as today, so every table in between
agrees on it) and NFC leaves it unchanged. Anything else (new scripts, emoji, unassigned code
points, lone surrogates, "Σ" when lower-casing, decomposed accents) takes the exact path: on
the shared corpora about one line in a thousand. Both paths report character offsets into the
ORIGINAL text.

Two surfaces share those paths. The original release's tokenization (`tokenize_batch`,
`encode_ids_batch`, `encode_batch`) is what pre-training data creation, `bertkit tokenize` and the
fine-tuning tasks use, for fidelity to the original: a literal "[MASK]" in the text is split like
any other text ("[", "mask", "]"), pairs are truncated as `_truncate_seq_pair` does. transformers'
call surface (`__call__`, `encode`, `tokenize`, `decode`, `pad`, ...) answers as `BertTokenizerFast`
does: special tokens typed in text are single tokens (unless `split_special_tokens=True`), and
truncation, stride windows and padding follow the `tokenizers` library (bertkit.tokenizer.encoding).
"""

from __future__ import annotations

import json
import operator
import os
from dataclasses import replace
from pathlib import Path
from typing import Iterable, Sequence

import torch
from tokenizers import AddedToken, decoders, processors

from .added_tokens import as_added_tokens, saved_added_tokens, segments, split_pattern
from .batch_encoding import BatchEncoding
from .encoding import LONGEST_FIRST, ONLY_FIRST, ONLY_SECOND, Encoding, padding_target, truncate_pair
from ..errors import BertkitError
from ..hub.resolve import resolve_model  # low in the import order; huggingface_hub only when an id is named
from ..outputs import atomic_write_text
from .vocabulary import (
    CLS,
    CONFIG_NAME,
    LARGE_INTEGER,
    MASK,
    PAD,
    SEP,
    SPECIAL_TOKENS,
    SPECIAL_TOKENS_ORDER,
    TOKENIZER_JSON_NAME,
    UNK,
    VERY_LARGE_INTEGER,
    VOCAB_NAME,
    _build_rust_tokenizer,
    _read_config,
    _read_json_object,
    _tokenizer_config,
    _wordpiece_from_tokenizer_json,
    load_vocab,
)
from .original import _basic_tokenize, _needs_exact_path, _wordpiece


def truncated_pair_lengths(length_a: int, length_b: int, budget: int) -> tuple[int, int]:
    """Lengths left by the original `_truncate_seq_pair` (pop from the longer; B on ties)."""
    excess = length_a + length_b - budget
    if excess <= 0:
        return length_a, length_b
    if length_a > length_b:
        cut = min(excess, length_a - length_b)
        length_a -= cut
        excess -= cut
    elif length_b > length_a:
        cut = min(excess, length_b - length_a)
        length_b -= cut
        excess -= cut
    # Equal lengths now: B loses first, then they alternate.
    length_b -= (excess + 1) // 2
    length_a -= excess // 2
    return length_a, length_b


def _clean_up_tokenization(text: str) -> str:
    # transformers' decode clean-up, so decode matches BertTokenizer.decode.
    for before, after in (
        (" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"),
        (" n't", "n't"), (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"),
    ):  # fmt: skip
        text = text.replace(before, after)
    return text


# --------------------------------------------------------------------------------------------
# The tokenizer
# --------------------------------------------------------------------------------------------


class BertTokenizer:
    """BERT's WordPiece tokenizer, called as transformers' `BertTokenizerFast` is called.

    Two ways in. `tokenize_batch` / `encode_ids_batch` / `encode_batch` are the original
    release's tokenization (special-token strings typed in text are split like any text; pairs
    truncated by `_truncate_seq_pair`): pre-training data creation, `bertkit tokenize` and the
    fine-tuning tasks use them. `__call__`, `encode`, `tokenize`, `decode`, `pad` and the rest of
    transformers' surface answer as `BertTokenizerFast` does: "[MASK]" typed in text is one
    token (unless `split_special_tokens=True`), truncation and overflow windows follow the
    `tokenizers` library.
    """

    def __init__(
        self,
        vocab_file: str | os.PathLike,
        do_lower_case: bool = True,
        vocab: dict[str, int] | None = None,
        model_max_length: int = VERY_LARGE_INTEGER,
        clean_up_tokenization_spaces: bool = False,
    ):
        """`vocab`, when given, is the vocabulary already read from `vocab_file` (a tokenizer.json).
        `model_max_length` and `clean_up_tokenization_spaces` take transformers' defaults."""
        self.vocab_file = Path(vocab_file)
        self.vocab: dict[str, int] = load_vocab(self.vocab_file) if vocab is None else vocab
        self.ids_to_tokens: list[str] = list(self.vocab)  # load_vocab assigns ids in file order
        self.do_lower_case = bool(do_lower_case)
        self.model_max_length = int(model_max_length)
        self.clean_up_tokenization_spaces = bool(clean_up_tokenization_spaces)
        self.padding_side = "right"
        self.truncation_side = "right"
        self.split_special_tokens = False
        self.name_or_path = str(self.vocab_file.parent)
        self.unk_token, self.sep_token, self.pad_token, self.cls_token, self.mask_token = UNK, SEP, PAD, CLS, MASK
        self.pad_token_id = self.vocab[PAD]
        self.unk_token_id = self.vocab[UNK]
        self.cls_token_id = self.vocab[CLS]
        self.sep_token_id = self.vocab[SEP]
        self.mask_token_id = self.vocab[MASK]
        self.pad_token_type_id = 0
        self.model_input_names = ["input_ids", "token_type_ids", "attention_mask"]
        self.all_special_tokens = list(SPECIAL_TOKENS_ORDER)
        self.all_special_ids = [self.vocab[token] for token in SPECIAL_TOKENS_ORDER]
        self.special_tokens_map = {"unk_token": UNK, "sep_token": SEP, "pad_token": PAD, "cls_token": CLS,
                                   "mask_token": MASK}
        self.additional_special_tokens: list[str] = []
        self._base_vocab_size = len(self.vocab)  # vocab.txt's; added tokens come after (len(self))
        self._added: dict[str, AddedToken] = {}  # add_tokens / add_special_tokens, in order
        self._refresh_patterns()
        # The original's pipeline (special-token strings are text) and transformers' (they are
        # tokens): the same vocabulary, the second with BERT's specials registered as added tokens.
        self._backend = _build_rust_tokenizer(self.vocab, self.do_lower_case)
        self._call_backend = _build_rust_tokenizer(self.vocab, self.do_lower_case)
        self._call_backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
        self._call_backend.decoder = decoders.WordPiece(prefix="##", cleanup=True)
        self._call_backend.post_processor = processors.TemplateProcessing(
            single=f"{CLS}:0 $A:0 {SEP}:0", pair=f"{CLS}:0 $A:0 {SEP}:0 $B:1 {SEP}:1",
            special_tokens=[(CLS, self.cls_token_id), (SEP, self.sep_token_id)],
        )

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, do_lower_case: bool | None = None,
                        revision: str | None = None) -> "BertTokenizer":
        """Load a directory holding vocab.txt (+ tokenizer_config.json), a vocab.txt path, or a Hub id
        (`bert-base-uncased`, `org/name`, at `revision`).

        `do_lower_case` given here overrides the config; without either it defaults to True.
        tokenizer_config.json's model_max_length and clean_up_tokenization_spaces are read as
        transformers reads them (no limit and False when absent).
        """
        path = resolve_model(path, revision, tokenizer_only=True)
        if path.is_dir():
            vocab_file = path / VOCAB_NAME
            if not vocab_file.is_file():
                if (path / TOKENIZER_JSON_NAME).is_file():
                    return cls.from_tokenizer_json(path / TOKENIZER_JSON_NAME, do_lower_case)
                raise BertkitError(f"no {VOCAB_NAME} or {TOKENIZER_JSON_NAME} in the tokenizer directory", path=path)
        elif path.is_file() and path.name == TOKENIZER_JSON_NAME:
            return cls.from_tokenizer_json(path, do_lower_case)
        elif path.is_file():
            vocab_file = path
        else:
            raise BertkitError("tokenizer path not found (expected a directory or a vocab.txt)", path=path)
        config_file = vocab_file.parent / CONFIG_NAME
        config = _read_config(config_file) if config_file.is_file() else {}
        if do_lower_case is None:
            do_lower_case = config.get("do_lower_case", True)
        tokenizer = cls(vocab_file, do_lower_case=do_lower_case, **_call_settings(config, config_file))
        return tokenizer._restore_added_tokens(vocab_file.parent / TOKENIZER_JSON_NAME)

    @classmethod
    def from_tokenizer_json(cls, path: str | os.PathLike, do_lower_case: bool | None = None) -> "BertTokenizer":
        """Load a `tokenizers` tokenizer.json holding a BERT WordPiece model: its vocabulary and its
        normaliser's lower-casing (the rest of a BERT pipeline is fixed, and checked)."""
        path = Path(path)
        document = _read_json_object(path)
        vocab, lowercase = _wordpiece_from_tokenizer_json(document, path)
        config_file = path.parent / CONFIG_NAME
        settings = _call_settings(_read_config(config_file), config_file) if config_file.is_file() else {}
        tokenizer = cls(path, do_lower_case=lowercase if do_lower_case is None else do_lower_case, vocab=vocab,
                        **settings)
        return tokenizer._restore_added_tokens(path)

    @property
    def vocab_size(self) -> int:
        """The trained vocabulary's size, without added tokens (transformers' meaning; len(self) counts them)."""
        return self._base_vocab_size

    def __len__(self) -> int:
        return len(self.vocab)

    def __repr__(self) -> str:
        return f"BertTokenizer({str(self.vocab_file)!r}, vocab_size={self.vocab_size}, do_lower_case={self.do_lower_case})"

    @property
    def is_fast(self) -> bool:
        return True

    def get_vocab(self) -> dict[str, int]:
        return dict(self.vocab)

    # ---- the original's WordPiece, without special tokens ----

    def _encode_texts(self, texts: Sequence[str]) -> list:
        """Per text: ids, tokens and offsets (tokenizers.Encoding or _Encoded), no specials."""
        if isinstance(texts, str):
            raise TypeError("expected a list of texts, got a single string")
        results: list = [None] * len(texts)
        fast_positions = []
        for position, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"text {position} is {type(text).__name__}, not str")
            if _needs_exact_path(text, self.do_lower_case):
                results[position] = _wordpiece(_basic_tokenize(text, self.do_lower_case), self.vocab) \
                    if not self._added else self._exact_encoding(text, split_special_tokens=True)
            else:
                fast_positions.append(position)
        if fast_positions:
            encodings = self._backend.encode_batch([texts[p] for p in fast_positions], add_special_tokens=False)
            for position, encoding in zip(fast_positions, encodings):
                results[position] = encoding
        return results

    def tokenize_batch(self, texts: Sequence[str]) -> list[list[str]]:
        """The original's FullTokenizer.tokenize per text ("[MASK]" in text is split)."""
        return [encoded.tokens for encoded in self._encode_texts(texts)]

    def encode_ids_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """WordPiece ids without special tokens, as the original: the fast path for corpora."""
        return [encoded.ids for encoded in self._encode_texts(texts)]

    # ---- vocabulary look-ups ----

    def convert_tokens_to_ids(self, tokens: str | Iterable[str]) -> int | list[int]:
        if isinstance(tokens, str):
            return self.vocab.get(tokens, self.unk_token_id)
        return [self.vocab.get(token, self.unk_token_id) for token in tokens]

    def convert_ids_to_tokens(self, ids: int | Iterable[int], skip_special_tokens: bool = False) -> str | list[str]:
        try:  # one id: int, numpy integer or 0-d tensor
            return self._id_to_token(operator.index(ids))
        except TypeError:
            ids = [int(i) for i in ids]
        if skip_special_tokens:
            ids = [i for i in ids if i not in self.all_special_ids]
        return [self._id_to_token(i) for i in ids]

    def _id_to_token(self, token_id: int) -> str:
        if not 0 <= token_id < len(self.ids_to_tokens):
            raise BertkitError(f"token id {token_id} is outside the vocabulary (size {self.vocab_size})")
        return self.ids_to_tokens[token_id]

    # ---- the original's model inputs (tasks, features, inference) ----

    def encode_batch(
        self,
        texts: Sequence[str],
        text_pairs: Sequence[str] | None = None,
        max_length: int | None = None,
        truncation: bool = True,
        padding: bool | str = False,
        return_offsets: bool = False,
    ) -> list[dict]:
        """`[CLS] text [SEP] (text_pair [SEP])` per text, as the original release builds them.

        Truncation (when max_length is given) follows the original: a single text loses tokens
        from its end; a pair loses them from the end of the longer side, B when equal.
        padding: False; "max_length" (needs max_length); "longest" (longest in the batch);
        True means "max_length" when max_length is given, else "longest". With return_offsets:
        `offsets`, the (start, end) character span of each token in its own original text
        ((0, 0) for specials and padding), and `sequence_ids` (None for specials and padding).
        """
        if text_pairs is not None and len(text_pairs) != len(texts):
            raise ValueError(f"{len(texts)} texts but {len(text_pairs)} text pairs")
        if padding is True:
            padding = "max_length" if max_length is not None else "longest"
        if padding not in (False, "max_length", "longest"):
            raise ValueError(f"padding must be False, True, 'max_length' or 'longest', not {padding!r}")
        if padding == "max_length" and max_length is None:
            raise ValueError("padding to max_length needs max_length")
        specials = 2 if text_pairs is None else 3
        if max_length is not None and truncation and max_length < specials:
            raise BertkitError(f"max_length={max_length} leaves no room for the {specials} special tokens")

        first = self._encode_texts(texts)
        second = self._encode_texts(text_pairs) if text_pairs is not None else [None] * len(texts)
        results = [
            self._assemble(a, b, max_length if truncation else None, return_offsets)
            for a, b in zip(first, second)
        ]
        if padding:
            target = max_length if padding == "max_length" else max((len(r["input_ids"]) for r in results), default=0)
            for result in results:
                self._pad(result, target)
        return results

    def _assemble(self, a, b, max_length: int | None, return_offsets: bool) -> dict:
        length_a, length_b = len(a.ids), 0 if b is None else len(b.ids)
        if max_length is not None:
            if b is None:
                length_a = min(length_a, max_length - 2)
            else:
                length_a, length_b = truncated_pair_lengths(length_a, length_b, max_length - 3)
        input_ids = [self.cls_token_id, *a.ids[:length_a], self.sep_token_id]
        token_type_ids = [0] * (length_a + 2)
        if b is not None:
            input_ids += [*b.ids[:length_b], self.sep_token_id]
            token_type_ids += [1] * (length_b + 1)
        result = {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": [1] * len(input_ids)}
        if return_offsets:
            offsets = [(0, 0), *a.offsets[:length_a], (0, 0)]
            sequence_ids = [None, *[0] * length_a, None]
            if b is not None:
                offsets += [*b.offsets[:length_b], (0, 0)]
                sequence_ids += [*[1] * length_b, None]
            result["offsets"] = [tuple(span) for span in offsets]
            result["sequence_ids"] = sequence_ids
        return result

    def _pad(self, result: dict, target: int) -> None:
        missing = target - len(result["input_ids"])
        if missing <= 0:
            return
        result["input_ids"] += [self.pad_token_id] * missing
        result["token_type_ids"] += [0] * missing
        result["attention_mask"] += [0] * missing
        if "offsets" in result:
            result["offsets"] += [(0, 0)] * missing
            result["sequence_ids"] += [None] * missing

    # ---- transformers' surface: BertTokenizerFast, answer for answer ----

    def _sequence_encodings(self, texts: Sequence[str], split_special_tokens: bool) -> list[Encoding]:
        """Each text's tokens without [CLS]/[SEP]; special tokens typed in text stay whole
        unless `split_special_tokens`. Rust where it agrees with the original, else the exact path."""
        backend = self._backend if split_special_tokens else self._call_backend
        results: list = [None] * len(texts)
        fast = []
        for position, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"text {position} is {type(text).__name__}, not str")
            if _needs_exact_path(text, self.do_lower_case):
                results[position] = self._exact_encoding(text, split_special_tokens)
            else:
                fast.append(position)
        if fast:
            for position, e in zip(fast, backend.encode_batch([texts[p] for p in fast], add_special_tokens=False)):
                results[position] = Encoding.sequence(e.ids, e.tokens, e.offsets, e.word_ids)
        return results

    def _exact_encoding(self, text: str, split_special_tokens: bool) -> Encoding:
        """The exact path, cutting the text at special tokens first as the `tokenizers`
        library's added vocabulary does; words are numbered across the pieces."""
        ids, tokens, offsets, word_ids = [], [], [], []
        # split_special_tokens splits BERT's own five; tokens a user added stay whole (as in the original path)
        pattern = self._user_pattern if split_special_tokens else self._call_pattern
        next_word = 0
        for piece, start, special in segments(text, pattern, self._canonical):
            if special is not None:
                ids.append(self.vocab[special])
                tokens.append(special)
                offsets.append((start, start + len(special)))
                word_ids.append(next_word)
                next_word += 1
                continue
            words = _basic_tokenize(piece, self.do_lower_case)
            encoded = _wordpiece(words, self.vocab)
            ids += encoded.ids
            tokens += encoded.tokens
            offsets += [(a + start, b + start) for a, b in encoded.offsets]
            word_ids += [w + next_word for w in encoded.word_ids]
            next_word += len(words)
        return Encoding.sequence(ids, tokens, offsets, word_ids)

    def _word_list_encodings(self, word_lists: Sequence[Sequence[str]], split_special_tokens: bool) -> list[Encoding]:
        """Pre-split input: every word tokenized on its own, its tokens' word id its position and
        their offsets within the word, as the `tokenizers` library answers is_pretokenized input."""
        flat = [word for words in word_lists for word in words]
        pieces = iter(self._sequence_encodings(flat, split_special_tokens))
        results = []
        for words in word_lists:
            ids, tokens, offsets, word_ids = [], [], [], []
            for index in range(len(words)):
                piece = next(pieces)
                ids += piece.ids
                tokens += piece.tokens
                offsets += piece.offsets
                word_ids += [index] * len(piece.ids)
            results.append(Encoding.sequence(ids, tokens, offsets, word_ids))
        return results

    def _strategies(self, padding, truncation, max_length, pad_to_multiple_of) -> tuple[str, str, int | None]:
        """transformers' `_get_padding_truncation_strategies`, defaults included."""
        if max_length is not None and padding is False and truncation is None:
            truncation = LONGEST_FIRST  # max_length alone turns truncation on, as in transformers
        if padding is True:
            padding = "longest"
        elif padding in (False, None):
            padding = "do_not_pad"
        if padding not in ("longest", "max_length", "do_not_pad"):
            raise ValueError(f"padding must be True, False, 'longest', 'max_length' or 'do_not_pad', not {padding!r}")
        if truncation is True:
            truncation = LONGEST_FIRST
        elif truncation in (False, None):
            truncation = "do_not_truncate"
        if truncation not in (LONGEST_FIRST, ONLY_FIRST, ONLY_SECOND, "do_not_truncate"):
            raise ValueError(
                "truncation must be True, False, 'longest_first', 'only_first', 'only_second' or "
                f"'do_not_truncate', not {truncation!r}"
            )
        if max_length is None:
            if padding == "max_length":
                if self.model_max_length > LARGE_INTEGER:
                    padding = "do_not_pad"
                else:
                    max_length = self.model_max_length
            if truncation != "do_not_truncate":
                if self.model_max_length > LARGE_INTEGER:
                    truncation = "do_not_truncate"
                else:
                    max_length = self.model_max_length
        if (truncation != "do_not_truncate" and padding != "do_not_pad" and pad_to_multiple_of is not None
                and max_length is not None and max_length % pad_to_multiple_of != 0):
            raise ValueError(
                "Truncation and padding are both activated but "
                f"truncation length ({max_length}) is not a multiple of pad_to_multiple_of ({pad_to_multiple_of})."
            )
        return padding, truncation, max_length

    def __call__(
        self,
        text: str | Sequence[str] | Sequence[Sequence[str]],
        text_pair: str | Sequence[str] | Sequence[Sequence[str]] | None = None,
        *,
        add_special_tokens: bool = True,
        padding: bool | str = False,
        truncation: bool | str | None = None,
        max_length: int | None = None,
        stride: int = 0,
        is_split_into_words: bool = False,
        pad_to_multiple_of: int | None = None,
        padding_side: str | None = None,
        return_tensors: str | None = None,
        return_token_type_ids: bool | None = None,
        return_attention_mask: bool | None = None,
        return_overflowing_tokens: bool = False,
        return_special_tokens_mask: bool = False,
        return_offsets_mapping: bool = False,
        return_length: bool = False,
        split_special_tokens: bool | None = None,
        verbose: bool = True,
    ) -> BatchEncoding:
        """`tokenizer(texts, text_pairs, padding=True, truncation=True, max_length=128,
        return_tensors="pt")`, with every argument and default of transformers' fast tokenizer.

        A string (or, with is_split_into_words, one list of words) gives flat lists; a list gives
        one row per text, plus one row per overflow window with return_overflowing_tokens (then
        `overflow_to_sample_mapping` names each row's text). The result also answers word_ids(),
        sequence_ids(), tokens(), char_to_token() and the other alignment questions.
        """
        padding, truncation, max_length = self._strategies(padding, truncation, max_length, pad_to_multiple_of)
        padding_side = padding_side or self.padding_side
        for name, side in (("padding_side", padding_side), ("truncation_side", self.truncation_side)):
            if side not in ("right", "left"):
                raise ValueError(f"{name} must be 'right' or 'left', not {side!r}")
        # The `tokenizers` library's own check, on the room left beside a single text's specials
        # (a max_length under 2 wraps round in its unsigned arithmetic: no check).
        if truncation != "do_not_truncate" and max_length >= 2 and max_length - 2 < stride:
            raise ValueError(
                f"tokenizer stride set to {stride}, which is greater than or equal to its effective max length "
                f"of {max_length - 2} (= {max_length} original max length - 2 added special tokens)"
            )
        if split_special_tokens is None:
            split_special_tokens = self.split_special_tokens
        batched, firsts, seconds = _batch_inputs(text, text_pair, is_split_into_words)
        encode = self._word_list_encodings if is_split_into_words else self._sequence_encodings
        first_encodings = encode(firsts, split_special_tokens)
        second_encodings = encode(seconds, split_special_tokens) if seconds is not None else [None] * len(firsts)
        rows, sample_mapping, main_lengths = [], [], []
        for sample, (a, b) in enumerate(zip(first_encodings, second_encodings)):
            if truncation != "do_not_truncate":
                added = self.num_special_tokens_to_add(pair=b is not None) if add_special_tokens else 0
                a, b = truncate_pair(a, b, max_length - added, truncation, stride, self.truncation_side)
            encoding = self._with_special_tokens(a, b, add_special_tokens)
            main_lengths.append(len(encoding))
            windows = [encoding, *encoding.overflowing] if return_overflowing_tokens else [encoding]
            rows += windows
            sample_mapping += [sample] * len(windows)
        if padding != "do_not_pad":
            # "longest" means the longest main window: the library pads a longer overflow window no further
            target = padding_target(main_lengths, max_length if padding == "max_length" else None,
                                    pad_to_multiple_of)
            rows = [r.padded(target, self.pad_token_id, PAD, padding_side) for r in rows]
        rows = [replace(r, overflowing=[]) for r in rows]
        data = {"input_ids": [r.ids for r in rows]}
        if return_token_type_ids is None or return_token_type_ids:
            data["token_type_ids"] = [r.type_ids for r in rows]
        if return_attention_mask is None or return_attention_mask:
            data["attention_mask"] = [r.attention_mask for r in rows]
        if return_special_tokens_mask:
            data["special_tokens_mask"] = [r.special_tokens_mask for r in rows]
        if return_offsets_mapping:
            data["offset_mapping"] = [list(r.offsets) for r in rows]
        if return_length:
            data["length"] = [len(r) for r in rows]
        if return_overflowing_tokens:
            data["overflow_to_sample_mapping"] = sample_mapping
        if not batched and return_tensors is None and not return_overflowing_tokens:
            data = {key: value[0] if value and isinstance(value[0], list) else value for key, value in data.items()}
        return BatchEncoding(data, rows, tensor_type=return_tensors)

    def _with_special_tokens(self, a: Encoding, b: Encoding | None, add_special_tokens: bool) -> Encoding:
        """`[CLS] A [SEP] (B [SEP])`, or A B without them: BERT's template, segment 1 for B."""
        a = a.placed(0, 0)
        b = None if b is None else b.placed(1, 1)
        if not add_special_tokens:
            encoding = a if b is None else a.merged(b)
        else:
            encoding = Encoding.special(self.cls_token_id, CLS, 0).merged(a).merged(
                Encoding.special(self.sep_token_id, SEP, 0))
            if b is not None:
                encoding = encoding.merged(b).merged(Encoding.special(self.sep_token_id, SEP, 1))
        count = 1 if b is None else 2
        return replace(encoding, placed_sequences=count,
                       overflowing=[replace(o, placed_sequences=count) for o in encoding.overflowing])

    def encode_plus(self, text, text_pair=None, **kwargs) -> BatchEncoding:
        """One text (or pair) as transformers 4's encode_plus: the call on a single input."""
        if isinstance(text, (list, tuple)) and not kwargs.get("is_split_into_words"):
            raise TypeError("encode_plus takes one text (or one pair); use batch_encode_plus or call the tokenizer")
        return self(text, text_pair, **kwargs)

    def batch_encode_plus(self, batch_text_or_text_pairs, **kwargs) -> BatchEncoding:
        """transformers 4's batch_encode_plus: a list of texts or of (text, text_pair) tuples."""
        if isinstance(batch_text_or_text_pairs, str):
            raise TypeError("batch_encode_plus takes a list of texts or of (text, text_pair) pairs")
        split_into_words = kwargs.get("is_split_into_words", False)
        firsts, seconds = [], []
        for item in batch_text_or_text_pairs:
            is_pair = isinstance(item, (list, tuple)) and (
                isinstance(item[0], (list, tuple)) if split_into_words else len(item) == 2)
            firsts.append(item[0] if is_pair else item)
            seconds.append(item[1] if is_pair else None)
        if any(s is None for s in seconds) and not all(s is None for s in seconds):
            raise ValueError("batch_encode_plus: mix of single texts and pairs in one batch")
        pairs = None if all(s is None for s in seconds) else seconds
        if not firsts:
            return self([], **kwargs)
        return self(firsts, pairs, **kwargs)

    def encode(self, text, text_pair=None, add_special_tokens: bool = True, **kwargs) -> list[int]:
        """The ids of one text (or pair): `[CLS] text [SEP]` by default, a list, as transformers."""
        return self(text, text_pair, add_special_tokens=add_special_tokens, **kwargs)["input_ids"]

    def tokenize(self, text: str, pair: str | None = None, add_special_tokens: bool = False, **kwargs) -> list[str]:
        """Word pieces of a text, as transformers' tokenize: "[MASK]" typed in text stays whole
        (split_special_tokens=True splits it, as `tokenize_batch` and the original do)."""
        return self(text, pair, add_special_tokens=add_special_tokens, **kwargs).tokens()

    def num_special_tokens_to_add(self, pair: bool = False) -> int:
        return 3 if pair else 2

    def build_inputs_with_special_tokens(self, token_ids_0: list[int],
                                         token_ids_1: list[int] | None = None) -> list[int]:
        ids = [self.cls_token_id, *token_ids_0, self.sep_token_id]
        return ids if token_ids_1 is None else ids + [*token_ids_1, self.sep_token_id]

    def create_token_type_ids_from_sequences(self, token_ids_0: list[int],
                                             token_ids_1: list[int] | None = None) -> list[int]:
        types = [0] * (len(token_ids_0) + 2)
        return types if token_ids_1 is None else types + [1] * (len(token_ids_1) + 1)

    def get_special_tokens_mask(self, token_ids_0: list[int], token_ids_1: list[int] | None = None,
                                already_has_special_tokens: bool = False) -> list[int]:
        """1 where build_inputs_with_special_tokens puts [CLS]/[SEP]; with
        already_has_special_tokens, 1 for every special id already in the list."""
        if already_has_special_tokens:
            if token_ids_1 is not None:
                raise ValueError("token_ids_1 must be None when already_has_special_tokens=True")
            return [1 if token in self.all_special_ids else 0 for token in token_ids_0]
        mask = [1, *[0] * len(token_ids_0), 1]
        return mask if token_ids_1 is None else mask + [*[0] * len(token_ids_1), 1]

    def pad(
        self,
        encoded_inputs,
        padding: bool | str = True,
        max_length: int | None = None,
        pad_to_multiple_of: int | None = None,
        padding_side: str | None = None,
        return_attention_mask: bool | None = None,
        return_tensors: str | None = None,
        verbose: bool = True,
    ) -> BatchEncoding:
        """Pad already-encoded inputs (one dict, a dict of rows, or a list of dicts, as a data
        collator passes them) as transformers' pad: input_ids with [PAD], attention_mask with 0,
        token_type_ids with 0, special_tokens_mask with 1; other columns are left as they are."""
        if isinstance(encoded_inputs, (list, tuple)) and encoded_inputs and isinstance(encoded_inputs[0], dict):
            encoded_inputs = {key: [row[key] for row in encoded_inputs] for key in encoded_inputs[0]}
        if not isinstance(encoded_inputs, dict) or "input_ids" not in encoded_inputs:
            keys = list(encoded_inputs) if isinstance(encoded_inputs, dict) else type(encoded_inputs).__name__
            raise ValueError(f"pad needs an encoding or a list of encodings that includes input_ids, got {keys}")
        columns = dict(encoded_inputs)
        first = columns["input_ids"]
        if return_tensors is None:  # tensors in, tensors of the same kind out
            probe = first[0] if isinstance(first, (list, tuple)) and len(first) else first
            if isinstance(probe, torch.Tensor):
                return_tensors = "pt"
            elif type(probe).__module__ == "numpy":
                return_tensors = "np"
        columns = {key: _as_python(value) for key, value in columns.items()}
        if not columns["input_ids"]:
            return BatchEncoding(columns, tensor_type=return_tensors)
        padding, _, max_length = self._strategies(padding, None if padding is not False else False, max_length,
                                                  pad_to_multiple_of)
        side = padding_side or self.padding_side
        if side not in ("right", "left"):
            raise ValueError(f"padding_side must be 'right' or 'left', not {side!r}")
        if return_attention_mask is None:
            return_attention_mask = True
        batched = isinstance(columns["input_ids"][0], (list, tuple))
        rows = len(columns["input_ids"]) if batched else 1
        get = (lambda key, i: columns[key][i]) if batched else (lambda key, i: columns[key])
        if padding == "longest":
            max_length = max(len(get("input_ids", i)) for i in range(rows))
        fill = {"input_ids": self.pad_token_id, "attention_mask": 0, "token_type_ids": self.pad_token_type_id,
                "special_tokens_mask": 1}
        if not return_attention_mask:  # transformers leaves a given mask as it is then
            del fill["attention_mask"]
        out = {key: [] for key in columns}
        if return_attention_mask:
            out.setdefault("attention_mask", [])
        for i in range(rows):
            ids = list(get("input_ids", i))
            row = {key: list(get(key, i)) if key in fill else get(key, i) for key in columns}
            if return_attention_mask and "attention_mask" not in columns:
                row["attention_mask"] = [1] * len(ids)
            target = max_length
            if padding != "do_not_pad" and target is not None and pad_to_multiple_of and target % pad_to_multiple_of:
                target += pad_to_multiple_of - target % pad_to_multiple_of
            missing = target - len(ids) if padding != "do_not_pad" and target is not None else 0
            if missing > 0:
                for key, value in fill.items():
                    if key in row:
                        pad = [value] * missing
                        row[key] = pad + row[key] if side == "left" else row[key] + pad
            for key, value in row.items():
                out[key].append(value)
        if not batched:
            out = {key: value[0] for key, value in out.items()}
        return BatchEncoding(out, tensor_type=return_tensors)

    def decode(self, token_ids, skip_special_tokens: bool = False,
               clean_up_tokenization_spaces: bool | None = None) -> str:
        """Ids back to text with the `tokenizers` WordPiece decoder, special tokens kept unless
        skip_special_tokens; clean_up_tokenization_spaces defaults to tokenizer_config.json's."""
        if isinstance(token_ids, dict):
            token_ids = token_ids["input_ids"]
        if hasattr(token_ids, "tolist"):
            token_ids = token_ids.tolist()
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        ids = [int(i) for i in token_ids]
        for i in ids:
            self._id_to_token(i)  # an id outside the vocabulary is an error, not a silent gap
        text = self._call_backend.decode(ids, skip_special_tokens=skip_special_tokens)
        if clean_up_tokenization_spaces is None:
            clean_up_tokenization_spaces = self.clean_up_tokenization_spaces
        return _clean_up_tokenization(text) if clean_up_tokenization_spaces else text

    def batch_decode(self, sequences, skip_special_tokens: bool = False,
                     clean_up_tokenization_spaces: bool | None = None) -> list[str]:
        if hasattr(sequences, "tolist"):
            sequences = sequences.tolist()
        return [self.decode(ids, skip_special_tokens, clean_up_tokenization_spaces) for ids in sequences]

    def convert_tokens_to_string(self, tokens: Sequence[str]) -> str:
        """Word pieces back to text: "##" continuations glued on (the WordPiece decoder)."""
        return self._call_backend.decoder.decode(list(tokens))

    # ---- tokens added to the vocabulary (transformers' add_tokens / add_special_tokens) ----

    def add_tokens(self, new_tokens, special_tokens: bool = False) -> int:
        """Tokens matched whole in the text before WordPiece (added_tokens.py), as
        BertTokenizerFast.add_tokens: a str, a tokenizers.AddedToken or a list; the ones not in the
        vocabulary get ids from len(tokenizer) on. Returns how many were added (transformers' count:
        one already in the vocabulary counts, one added before does not); grow the model to match
        with `model.resize_token_embeddings(len(tokenizer))`. Both surfaces use them: the
        fine-tuning tasks' tokenization keeps an added token whole too."""
        new = 0
        for token in as_added_tokens(new_tokens, special_tokens):
            if token.content in self._added or token.content in SPECIAL_TOKENS:
                continue
            if token.content not in self.vocab:
                self.vocab[token.content] = len(self.ids_to_tokens)
                self.ids_to_tokens.append(token.content)
            self._added[token.content] = token
            new += 1
            for backend in (self._backend, self._call_backend):
                (backend.add_special_tokens if token.special else backend.add_tokens)([token])
            if self._call_backend.token_to_id(token.content) != self.vocab[token.content]:  # one id on both sides
                raise BertkitError(f"added token {token.content!r}: the vocabulary and tokenizer.json disagree on its id")
            if token.special:
                self.all_special_tokens.append(token.content)
                self.all_special_ids.append(self.vocab[token.content])
                self.additional_special_tokens.append(token.content)
        self._refresh_patterns()
        return new

    def add_special_tokens(self, special_tokens_dict: dict, replace_additional_special_tokens: bool = True) -> int:
        """transformers' add_special_tokens: {"additional_special_tokens": [...]} adds special
        tokens (kept whole, skipped by decode(skip_special_tokens=True)); BERT's own keys
        (cls_token, sep_token, pad_token, unk_token, mask_token) may name the tokens they already
        are. Returns how many were added, as add_tokens."""
        new = 0
        for key, value in special_tokens_dict.items():
            if key == "additional_special_tokens":
                tokens = as_added_tokens(value, special=True)
                new += self.add_tokens(tokens, special_tokens=True)
                if replace_additional_special_tokens:
                    self.additional_special_tokens = [t.content for t in tokens]
            elif key in self.special_tokens_map:
                content = value.content if isinstance(value, AddedToken) else value
                if content != self.special_tokens_map[key]:
                    raise BertkitError(f"add_special_tokens: BERT's {key} is {self.special_tokens_map[key]!r}; another "
                                       f"one is not supported (add {content!r} under additional_special_tokens)")
            else:
                raise BertkitError(f"add_special_tokens: unknown key {key!r} (additional_special_tokens, "
                                   f"{', '.join(self.special_tokens_map)})")
        return new

    def _refresh_patterns(self) -> None:
        """The regexes the exact path cuts a text with: the user's added tokens, and those plus BERT's
        specials (the call surface keeps both whole)."""
        added = list(self._added.values())
        self._canonical = {t: t for t in SPECIAL_TOKENS} | {t.content: t.content for t in added} | {
            t.content.lower(): t.content for t in added if t.normalized and self.do_lower_case}
        self._user_pattern = split_pattern(added, self.do_lower_case)
        specials = [AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS]
        self._call_pattern = split_pattern(specials + added, self.do_lower_case)

    def _restore_added_tokens(self, tokenizer_json: Path) -> "BertTokenizer":
        """The added tokens a saved tokenizer.json holds, given their ids again (checked)."""
        for token_id, token in saved_added_tokens(tokenizer_json):
            self.add_tokens([token])
            if self.vocab[token.content] != token_id:
                raise BertkitError(f"added token {token.content!r} has id {token_id} in tokenizer.json, but "
                                   f"{self.vocab[token.content]} after the vocabulary", path=str(tokenizer_json))
        return self

    def save_pretrained(self, directory: str | os.PathLike) -> tuple[str, str, str]:
        """Write vocab.txt, tokenizer_config.json and tokenizer.json, so that transformers'
        AutoTokenizer loads the folder as a fast tokenizer answering as this one."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        vocab_path = directory / VOCAB_NAME
        config_path = directory / CONFIG_NAME
        json_path = directory / TOKENIZER_JSON_NAME
        config = _tokenizer_config(self.do_lower_case)
        config["model_max_length"] = self.model_max_length
        config["clean_up_tokenization_spaces"] = self.clean_up_tokenization_spaces
        # vocab.txt holds the trained vocabulary; added tokens live in tokenizer.json, as transformers keeps them
        atomic_write_text(vocab_path, "".join(token + "\n" for token in self.ids_to_tokens[:self._base_vocab_size]))
        atomic_write_text(config_path, json.dumps(config, indent=2) + "\n")
        atomic_write_text(json_path, self._call_backend.to_str(pretty=True) + "\n")
        return str(vocab_path), str(config_path), str(json_path)


def _as_python(value):
    """A column (tensor, array, list of either) as Python lists."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [v.tolist() if hasattr(v, "tolist") else v for v in value]
    return value


def _call_settings(config: dict, path: Path) -> dict:
    """model_max_length and clean_up_tokenization_spaces of a tokenizer_config.json, checked."""
    settings = {}
    if config.get("model_max_length") is not None:
        value = config["model_max_length"]
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise BertkitError(f"model_max_length must be a positive integer, got {value!r}", path)
        settings["model_max_length"] = value
    if "clean_up_tokenization_spaces" in config:
        value = config["clean_up_tokenization_spaces"]
        if not isinstance(value, bool):
            raise BertkitError(f"clean_up_tokenization_spaces must be true or false, got {value!r}", path)
        settings["clean_up_tokenization_spaces"] = value
    return settings


def _batch_inputs(text, text_pair, is_split_into_words: bool):
    """(batched, first inputs, second inputs or None), as transformers reads `text`/`text_pair`."""
    def valid(value) -> bool:
        if isinstance(value, str):
            return not is_split_into_words
        if not isinstance(value, (list, tuple)):
            return False
        if is_split_into_words:
            return all(isinstance(w, str) for w in value) or all(
                isinstance(ws, (list, tuple)) and all(isinstance(w, str) for w in ws) for ws in value)
        return all(isinstance(t, str) for t in value)

    expected = ("a list of words (or a list of such lists for a batch)" if is_split_into_words
                else "a str (one text) or a list of str (a batch)")
    for name, value in (("text", text), ("text_pair", text_pair)):
        if value is not None and not valid(value):
            raise ValueError(f"{name} must be {expected}, got {type(value).__name__}")
    if is_split_into_words:
        batched = isinstance(text, (list, tuple)) and bool(text) and isinstance(text[0], (list, tuple))
    else:
        batched = isinstance(text, (list, tuple))
    if batched:
        if isinstance(text_pair, str):
            raise TypeError("when tokenizing batches of text, `text_pair` must be a list or tuple with the same "
                            "length as `text`")
        if text_pair is not None and len(text) != len(text_pair):
            raise ValueError(f"batch length of `text`: {len(text)} does not match batch length of `text_pair`: "
                             f"{len(text_pair)}.")
        return True, list(text), None if text_pair is None else list(text_pair)
    # transformers reads an empty text_pair ("" or []) as no pair
    return False, [text], [text_pair] if text_pair else None


