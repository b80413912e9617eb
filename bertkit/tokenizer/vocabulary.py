"""The vocabulary and tokenizer files: vocab.txt, tokenizer_config.json, tokenizer.json, the special
tokens, and the `tokenizers` (Rust) pipeline built from them."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

from ..errors import BertkitError


VOCAB_NAME = "vocab.txt"
CONFIG_NAME = "tokenizer_config.json"
TOKENIZER_JSON_NAME = "tokenizer.json"  # the `tokenizers` file transformers 5 saves alone
PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)
MAX_INPUT_CHARS_PER_WORD = 100
MODEL_MAX_LENGTH = 512  # what bertkit writes into the tokenizer_config.json it creates
# transformers' answers when tokenizer_config.json names no model_max_length: no limit.
VERY_LARGE_INTEGER = int(1e30)
LARGE_INTEGER = int(1e20)
# transformers' order of BERT's special tokens (all_special_tokens)
SPECIAL_TOKENS_ORDER = (UNK, SEP, PAD, CLS, MASK)
def load_vocab(path: str | os.PathLike) -> dict[str, int]:
    """Read vocab.txt (one token per line, id = line number - 1) and check it."""
    path = Path(path)
    if not path.is_file():
        raise BertkitError("vocabulary file not found", path=path)
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise BertkitError(f"vocabulary is not valid UTF-8 ({err.reason})", path, line) from None
    vocab: dict[str, int] = {}
    # Universal newlines, like transformers' load_vocab (str.splitlines would also split on
    # characters such as U+2028 that a token may contain).
    for line_number, line in enumerate(io.StringIO(text, newline=None), start=1):
        token = line.rstrip("\n")
        if not token:
            raise BertkitError("empty line in vocabulary (one token per line expected)", path, line_number)
        if token in vocab:
            raise BertkitError(f"duplicate token {token!r} (first on line {vocab[token] + 1})", path, line_number)
        vocab[token] = line_number - 1
    if not vocab:
        raise BertkitError("vocabulary file is empty", path=path)
    for special in SPECIAL_TOKENS:
        if special not in vocab:
            raise BertkitError(f"vocabulary lacks the special token {special}", path=path)
    return vocab


def _read_json_object(path: Path) -> dict:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise BertkitError(f"invalid JSON: {err.msg}", path, err.lineno) from None
    except UnicodeDecodeError:
        raise BertkitError("not valid UTF-8", path) from None
    if not isinstance(document, dict):
        raise BertkitError("expected a JSON object", path)
    return document


def _find_bert_normalizer(normalizer) -> dict | None:
    """The BertNormalizer inside a tokenizer.json normaliser (alone or in a Sequence)."""
    if not isinstance(normalizer, dict):
        return None
    if normalizer.get("type") == "BertNormalizer":
        return normalizer
    for inner in normalizer.get("normalizers") or []:
        found = _find_bert_normalizer(inner)
        if found is not None:
            return found
    return None


def _wordpiece_from_tokenizer_json(document: dict, path: Path) -> tuple[dict[str, int], bool]:
    """(vocabulary, lower-case) of a BERT tokenizer.json; anything else is refused with the reason."""
    model = document.get("model")
    if not isinstance(model, dict) or model.get("type") != "WordPiece":
        kind = model.get("type") if isinstance(model, dict) else None
        raise BertkitError(f"tokenizer.json holds a {kind} model; bertkit reads WordPiece (BERT) only", path)
    if model.get("continuing_subword_prefix", "##") != "##":
        raise BertkitError("WordPiece continuing_subword_prefix must be '##'", path)
    vocab = model.get("vocab")
    if not isinstance(vocab, dict) or not vocab:
        raise BertkitError("tokenizer.json has no WordPiece vocabulary", path)
    ordered = sorted(vocab, key=vocab.get)
    if [vocab[token] for token in ordered] != list(range(len(ordered))):
        raise BertkitError("tokenizer.json vocabulary ids are not 0..N-1 without gaps", path)
    for special in SPECIAL_TOKENS:
        if special not in vocab:
            raise BertkitError(f"vocabulary lacks the special token {special}", path)
    normalizer = _find_bert_normalizer(document.get("normalizer"))
    if normalizer is None:
        raise BertkitError("tokenizer.json has no BertNormalizer; bertkit reads BERT tokenizers only", path)
    lowercase = bool(normalizer.get("lowercase", True))
    strip_accents = normalizer.get("strip_accents")
    if strip_accents is not None and strip_accents != lowercase:
        raise BertkitError(f"strip_accents={strip_accents} with lowercase={lowercase} is not supported", path)
    if normalizer.get("handle_chinese_chars", True) is not True:
        raise BertkitError("handle_chinese_chars=false is not supported", path)
    return {token: vocab[token] for token in ordered}, lowercase


def _read_config(path: Path) -> dict:
    config = _read_json_object(path)
    lowercase = config.get("do_lower_case", True)
    if not isinstance(lowercase, bool):
        raise BertkitError(f"do_lower_case must be true or false, got {lowercase!r}", path)
    # Options of transformers' BertTokenizer this implementation does not offer: refuse rather
    # than tokenize differently from the model's training.
    strip_accents = config.get("strip_accents")
    if strip_accents is not None and strip_accents != lowercase:
        raise BertkitError(f"strip_accents={strip_accents} with do_lower_case={lowercase} is not supported", path)
    if config.get("tokenize_chinese_chars", True) is not True:
        raise BertkitError("tokenize_chinese_chars=false is not supported", path)
    return config


def _tokenizer_config(lowercase: bool) -> dict:
    return {
        "do_lower_case": lowercase,
        "strip_accents": None,
        "tokenize_chinese_chars": True,
        "tokenizer_class": "BertTokenizer",
        "model_max_length": MODEL_MAX_LENGTH,
        "unk_token": UNK,
        "sep_token": SEP,
        "pad_token": PAD,
        "cls_token": CLS,
        "mask_token": MASK,
    }


def _rust_normalizer(lowercase: bool):
    # transformers' port applies NFC before splitting; no need here, as text that NFC would
    # change never takes the Rust path (see _needs_exact_path).
    return normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=lowercase, lowercase=lowercase
    )


def _build_rust_tokenizer(vocab: dict[str, int] | None, lowercase: bool) -> Tokenizer:
    if vocab is None:
        model = models.WordPiece(unk_token=UNK, max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD)
    else:
        model = models.WordPiece(vocab, unk_token=UNK, max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD)
    tokenizer = Tokenizer(model)
    tokenizer.normalizer = _rust_normalizer(lowercase)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return tokenizer


