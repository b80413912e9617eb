"""WordPiece tokenization (paper §3; Wu et al. 2016), id for id the original release's.

`wordpiece` holds the tokenizer (a `tokenizers` fast path and an exact port of the original),
`encoding` / `batch_encoding` what it returns to transformers-style callers, `cli` the
`train-tokenizer` and `tokenize` commands.
"""

from .batch_encoding import BatchEncoding
from .encoding import CharSpan, Encoding, TokenSpan
from .wordpiece import (
    CLS,
    CONFIG_NAME,
    LARGE_INTEGER,
    MASK,
    MODEL_MAX_LENGTH,
    PAD,
    SEP,
    SPECIAL_TOKENS,
    TOKENIZER_JSON_NAME,
    UNK,
    VERY_LARGE_INTEGER,
    VOCAB_NAME,
    BertTokenizer,
    load_vocab,
    tokenize_stream,
    train_tokenizer,
    truncated_pair_lengths,
)
# The exact path's parts, which the tests check against the original one by one.
from .wordpiece import _basic_tokenize, _needs_exact_path, _wordpiece  # noqa: F401

__all__ = [
    "BatchEncoding", "CharSpan", "Encoding", "TokenSpan", "CLS", "CONFIG_NAME", "LARGE_INTEGER", "MASK",
    "MODEL_MAX_LENGTH", "PAD", "SEP", "SPECIAL_TOKENS", "TOKENIZER_JSON_NAME", "UNK", "VERY_LARGE_INTEGER",
    "VOCAB_NAME", "BertTokenizer", "load_vocab", "tokenize_stream", "train_tokenizer", "truncated_pair_lengths",
]
