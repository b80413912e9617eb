"""WordPiece tokenization (paper §3; Wu et al. 2016), id for id the original release's.

`bert_tokenizer` is BertTokenizer: a `tokenizers` (Rust) fast path and `original`, an exact port of the
original's basic tokenizer and WordPiece, for the texts where the two would differ; `vocabulary` the
files and special tokens; `encoding` / `batch_encoding` what a call returns to transformers-style
callers; `training` vocabulary training and corpus streaming; `cli` the `train-tokenizer` and
`tokenize` commands.
"""

from .batch_encoding import BatchEncoding
from .encoding import CharSpan, Encoding, TokenSpan
from .bert_tokenizer import BertTokenizer, truncated_pair_lengths
from .original import _basic_tokenize, _needs_exact_path, _wordpiece  # noqa: F401  (checked one by one by the tests)
from .training import tokenize_stream, train_tokenizer
from .vocabulary import (
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
    load_vocab,
)

__all__ = [
    "BatchEncoding", "CharSpan", "Encoding", "TokenSpan", "CLS", "CONFIG_NAME", "LARGE_INTEGER", "MASK",
    "MODEL_MAX_LENGTH", "PAD", "SEP", "SPECIAL_TOKENS", "TOKENIZER_JSON_NAME", "UNK", "VERY_LARGE_INTEGER",
    "VOCAB_NAME", "BertTokenizer", "load_vocab", "tokenize_stream", "train_tokenizer", "truncated_pair_lengths",
]
