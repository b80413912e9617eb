"""`bertkit train-tokenizer` and `bertkit tokenize`: thin wrappers over bertkit.tokenizer."""

from __future__ import annotations

import sys
from pathlib import Path

from .. import flags
from ..outputs import check_output_dir, check_output_file
from .bert_tokenizer import BertTokenizer
from .training import tokenize_stream, train_tokenizer
from .vocabulary import CONFIG_NAME, SPECIAL_TOKENS, VOCAB_NAME


class train:
    @staticmethod
    def add_arguments(p) -> None:
        p.add_argument("--input", nargs="+", required=True, help="corpus files (plain or .gz), one sentence per line")
        # The trainer counts in 32 bits; no BERT vocabulary comes near ten million pieces.
        p.add_argument("--vocab-size", type=flags.int_between(len(SPECIAL_TOKENS) + 1, 10_000_000), required=True)
        p.add_argument("--output", required=True, help="directory for vocab.txt + tokenizer_config.json")
        p.add_argument("--cased", action="store_true", help="keep case and accents (default: uncased)")
        p.add_argument("--min-frequency", type=flags.int_between(1, 2**31 - 1), default=2)
        p.add_argument("--overwrite", action="store_true",
                       help="replace vocab.txt / tokenizer_config.json already in --output")

    @staticmethod
    def run_from_args(args) -> int:
        # Before training: a model folder's vocabulary (or an input) is never silently replaced.
        output = check_output_dir(args.output, overwrite=True)
        for name in (VOCAB_NAME, CONFIG_NAME):
            check_output_file(output / name, inputs=args.input, overwrite=args.overwrite)
        tok = train_tokenizer(args.input, args.vocab_size, output, lowercase=not args.cased,
                              min_frequency=args.min_frequency)
        print(f"{tok.vocab_size} tokens ({'cased' if args.cased else 'uncased'}) -> {Path(args.output)}")
        return 0


class tokenize:
    @staticmethod
    def add_arguments(p) -> None:
        p.add_argument("--vocab", required=True, help="vocab.txt or a model directory")
        p.add_argument("--cased", action="store_true", help="do not lower-case (overrides tokenizer_config.json)")
        p.add_argument("--tokens", action="store_true", help="print WordPiece tokens instead of ids")

    @staticmethod
    def run_from_args(args) -> int:
        tok = BertTokenizer.from_pretrained(args.vocab, do_lower_case=False if args.cased else None)
        # Bytes in, so invalid UTF-8 is reported with its line number.
        tokenize_stream(tok, sys.stdin.buffer, sys.stdout, as_tokens=args.tokens)
        return 0
