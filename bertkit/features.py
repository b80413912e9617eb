"""Feature-based use of a frozen BERT (paper §5.3): per-token activations of any layer (the
feature-based NER tagger built on them is tasks/ner_features.py).

Layer indexes are those of `hidden_states` (as the original's `--layers`, negative from the end):
0 = the embedding output, 1..L = the Transformer layers, -1 = the last layer, -L-1 = embeddings.
`bertkit extract-features` writes the original `extract_features.py` JSONL layout, or for large
inputs a compact (total_tokens, dim) array with an offsets array and the tokens.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import torch
from safetensors.numpy import save_file
from tqdm.auto import tqdm

from . import flags
from .batching import collate
from .device import autocast, pick_device, resolve_precision
from .errors import BertkitError
from .hub.checkpoints import load_tokenizer
from .model import BertModel
from .outputs import (atomic_open, atomic_write, atomic_write_text, check_not_an_input, check_output_file, is_stdout,
                      output_format, output_stream)

POOLS = ("concat", "sum", "mean", "first", "none")
FORMATS = ("jsonl", "npy", "safetensors")
PAIR_SEPARATOR = " ||| "  # "A ||| B" is a sentence pair, as in the original


# ---------------------------------------------------------------- layer selection

def resolve_layer(index: int, num_layers: int) -> int:
    """A user's layer index -> position in hidden_states (L + 1 entries: embeddings, layers 1..L)."""
    if not -(num_layers + 1) <= index <= num_layers:
        raise BertkitError(f"layer {index} does not exist: the model has {num_layers} layers "
                           f"(valid: 0 = embeddings, 1..{num_layers}, or -1..-{num_layers + 1} from the end)")
    return index % (num_layers + 1)


def select_layers(hidden_states: Sequence[torch.Tensor], layers: Sequence[int], pool: str = "concat") -> torch.Tensor:
    """Combine the chosen layers of `hidden_states` (each (B, T, H)).

    concat -> (B, T, k*H); sum / mean -> (B, T, H); none -> (B, T, k, H) (each layer kept apart);
    first -> (B, 1, k*H): the first token ([CLS]) only, layers concatenated (a sentence vector)."""
    if pool not in POOLS:
        raise BertkitError(f"pool must be one of {', '.join(POOLS)}, not {pool!r}")
    if not layers:
        raise BertkitError("no layers chosen")
    num_layers = len(hidden_states) - 1
    chosen = [hidden_states[resolve_layer(i, num_layers)] for i in layers]
    if pool == "concat":
        return torch.cat(chosen, dim=-1)
    if pool == "sum":
        return torch.stack(chosen).sum(0)
    if pool == "mean":
        return torch.stack(chosen).mean(0)
    if pool == "none":
        return torch.stack(chosen, dim=-2)
    return torch.cat(chosen, dim=-1)[:, :1]


# ---------------------------------------------------------------- extraction

def parse_text(line: str):
    """'A<TAB>B' (the pair separator of every bertkit text input, as `bertkit predict`'s) or the
    original extract_features.py's 'A ||| B' -> ('A', 'B'); anything else -> (line, None). The last
    separator splits, as the original's greedy regex does."""
    if "\t" in line:
        a, _, b = line.rpartition("\t")
        return a, b
    if PAIR_SEPARATOR in line:
        a, _, b = line.rpartition(PAIR_SEPARATOR)
        return a, b
    return line, None


def encoder_of(model):
    """The bare encoder of a model with a head (or the model itself)."""
    return model.bert if hasattr(model, "bert") else model


def _encode(tokenizer, texts, max_seq_length: int) -> list[dict]:
    """Single texts and pairs through the tokenizer's batch path (pairs truncate longest-first)."""
    singles = [i for i, t in enumerate(texts) if not isinstance(t, tuple)]
    pairs = [i for i, t in enumerate(texts) if isinstance(t, tuple)]
    encoded: list = [None] * len(texts)
    if singles:
        for i, e in zip(singles, tokenizer.encode_batch([texts[i] for i in singles], max_length=max_seq_length)):
            encoded[i] = e
    if pairs:
        for i, e in zip(pairs, tokenizer.encode_batch([texts[i][0] for i in pairs], [texts[i][1] for i in pairs],
                                                      max_length=max_seq_length)):
            encoded[i] = e
    return encoded


@torch.no_grad()
def iter_features(model, tokenizer, texts: Sequence, layers: Sequence[int] = (-1, -2, -3, -4), pool: str = "concat",
                  batch_size: int = 32, max_seq_length: int = 128, device=None, precision: str = "fp32",
                  progress: bool = False) -> Iterator[tuple[int, list[str], np.ndarray]]:
    """Yield (index, tokens, features) per text in input order; features as select_layers gives them
    for one text (float32 numpy). Texts are str or (a, b) pairs. Batches are length-sorted within
    blocks of 32 batches, so output can stream in order with little padding."""
    encoder = encoder_of(model)
    device = pick_device(device or "auto") if isinstance(device, str) or device is None else device
    precision = resolve_precision(precision, device)
    encoder.to(device).eval()
    num_layers = encoder.config.num_hidden_layers
    for i in layers:
        resolve_layer(i, num_layers)
    encoded = _encode(tokenizer, texts, max_seq_length)
    bar = None
    if progress:
        bar = tqdm(total=len(encoded), unit="text", desc="features")
    block = batch_size * 32
    for block_start in range(0, len(encoded), block):
        indexes = sorted(range(block_start, min(block_start + block, len(encoded))),
                         key=lambda i: len(encoded[i]["input_ids"]))
        results = {}
        for s in range(0, len(indexes), batch_size):
            chunk = indexes[s:s + batch_size]
            batch = collate([{k: encoded[i][k] for k in ("input_ids", "token_type_ids", "attention_mask")}
                             for i in chunk], tokenizer.pad_token_id)
            batch = {k: v.to(device) for k, v in batch.items()}
            with autocast(device, precision):
                out = encoder(**batch, output_hidden_states=True)
            selected = select_layers(out.hidden_states, layers, pool).float().cpu().numpy()
            for row, i in enumerate(chunk):
                n = 1 if pool == "first" else len(encoded[i]["input_ids"])
                results[i] = selected[row, :n]
            if bar is not None:
                bar.update(len(chunk))
        for i in sorted(results):
            tokens = tokenizer.convert_ids_to_tokens(encoded[i]["input_ids"])
            yield i, (tokens[:1] if pool == "first" else tokens), results[i]
    if bar is not None:
        bar.close()


def extract_features(model, tokenizer, texts: Sequence, layers: Sequence[int] = (-1, -2, -3, -4),
                     pool: str = "concat", batch_size: int = 32, max_seq_length: int = 128, device=None,
                     precision: str = "fp32") -> list[np.ndarray]:
    """Frozen-encoder activations per text: (T, k*H) for concat, (T, H) for sum/mean, (T, k, H) for
    none, (1, k*H) for first. T counts [CLS] and [SEP]."""
    return [f for _, _, f in iter_features(model, tokenizer, texts, layers, pool, batch_size, max_seq_length,
                                           device, precision)]


def _jsonl_record(index: int, tokens: list[str], features: np.ndarray, layers: Sequence[int], pool: str) -> dict:
    if pool == "none":  # the original extract_features.py layout
        feats = [{"token": token, "layers": [{"index": layer, "values": [round(float(x), 6) for x in features[t, j]]}
                                             for j, layer in enumerate(layers)]}
                 for t, token in enumerate(tokens)]
    else:
        feats = [{"token": token, "values": [round(float(x), 6) for x in features[t]]} for t, token in enumerate(tokens)]
        return {"linex_index": index, "layers": list(layers), "pool": pool, "features": feats}
    return {"linex_index": index, "features": feats}


def _array_paths(output: Path) -> dict[str, Path]:
    base = output.with_suffix("") if output.suffix in (".npy", ".safetensors") else output
    return {"offsets": base.parent / (base.name + ".offsets.npy"), "tokens": base.parent / (base.name + ".tokens.txt")}


def write_features(model, tokenizer, texts: Sequence, output: str | Path, layers: Sequence[int] = (-1, -2, -3, -4),
                   pool: str = "none", fmt: str = "jsonl", dtype: str = "float32", **run) -> dict:
    """Extract and write (`run`: iter_features' batch_size, max_seq_length, device, precision,
    progress). jsonl: one JSON object per input line (streams). npy: OUTPUT.npy the
    (total_tokens, dim) matrix (dim = k, H for pool none), OUTPUT.offsets.npy (n_texts + 1 int64:
    text i is rows offsets[i]:offsets[i+1]) and OUTPUT.tokens.txt (one token per line).
    safetensors: tensors `features`, `offsets`, `token_ids` in one file (+ OUTPUT.tokens.txt)."""
    if fmt not in FORMATS:
        raise BertkitError(f"format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    if dtype not in ("float32", "float16"):
        raise BertkitError(f"dtype must be float32 or float16, not {dtype!r}")
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    stream = iter_features(model, tokenizer, texts, layers, pool, **run)
    count = 0
    if fmt == "jsonl":
        with output_stream(output) as handle:  # `-`: stdout; a file appears only complete, or not at all
            for index, tokens, features in stream:
                handle.write(json.dumps(_jsonl_record(index, tokens, features, layers, pool)) + "\n")
                count += 1
        return {"texts": count, "output": str(output)}
    arrays, all_tokens, offsets = [], [], [0]
    for _, tokens, features in stream:
        arrays.append(features.astype(dtype))
        all_tokens.extend(tokens)
        offsets.append(offsets[-1] + len(tokens))
    if not arrays:
        raise BertkitError("no input texts")
    matrix = np.concatenate(arrays)
    offsets_array = np.asarray(offsets, dtype=np.int64)
    sidecars = _array_paths(output)
    atomic_write_text(sidecars["tokens"], "".join(t + "\n" for t in all_tokens))
    if fmt == "npy":
        for path, array in ((output, matrix), (sidecars["offsets"], offsets_array)):
            with atomic_open(path, "wb") as handle:  # a handle: np.save would add ".npy" to a temp name
                np.save(handle, array)
    else:
        token_ids = np.asarray(tokenizer.convert_tokens_to_ids(all_tokens), dtype=np.int64)
        tensors = {"features": matrix, "offsets": offsets_array, "token_ids": token_ids}
        atomic_write(output, lambda tmp: save_file(tensors, tmp, metadata={"layers": json.dumps(list(layers)),
                                                                            "pool": pool}))
    return {"texts": len(arrays), "tokens": int(matrix.shape[0]), "shape": list(matrix.shape), "output": str(output)}


def read_feature_inputs(path: str | Path) -> list:
    """One text per line ('A<TAB>B', or the original's 'A ||| B', for a pair); every line is an input,
    so linex_index = line - 1."""
    path = str(path)
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except FileNotFoundError:
        raise BertkitError("input file not found", path=path) from None
    except UnicodeDecodeError as err:
        raise BertkitError(f"not UTF-8 text ({err.reason})", path=path) from None
    texts = []
    for line in lines:
        a, b = parse_text(line.strip())
        texts.append((a, b) if b is not None else a)
    if not texts:
        raise BertkitError("no input lines", path=path)
    return texts


# ---------------------------------------------------------------- CLI: bertkit extract-features

def _parse_layers(text: str) -> list[int]:
    try:
        return [int(t) for t in str(text).split(",") if t.strip()]
    except ValueError:
        raise BertkitError(f"--layers expects comma-separated integers like -1,-2,-3,-4, not {text!r}") from None


def add_arguments(parser) -> None:
    # argparse would read "-1,-2" as an unknown option; let this parser's values start with "-<digit>".
    parser._negative_number_matcher = re.compile(r"^-\d+(,-?\d+)*$|^-\d*\.\d+$")
    parser.add_argument("--input", required=True, help="one text per line; a tab between the two texts of a pair, as "
                                                       "`bertkit predict` reads them ('A ||| B', the original's, also read)")
    parser.add_argument("--model", required=True, help="model directory (Hugging Face layout); the encoder is frozen")
    parser.add_argument("--output", required=True,
                        help="output file: .jsonl, .npy or .safetensors (the format follows the extension), "
                             "or - for JSON lines on standard output")
    parser.add_argument("--layers", default="-1,-2,-3,-4",
                        help="comma list: 0 = embeddings, 1..L layers, negative from the end (default -1,-2,-3,-4)")
    parser.add_argument("--pool", choices=POOLS, default="none",
                        help="combine layers: none (per layer, the original's JSONL), concat, sum, mean, "
                             "first ([CLS] only, layers concatenated)")
    parser.add_argument("--format", choices=FORMATS, default=None,
                        help="default from the output suffix (.npy, .safetensors), else jsonl")
    parser.add_argument("--dtype", choices=("float32", "float16"), default="float32", help="array formats only")
    parser.add_argument("--max-seq-length", type=flags.int_between(3), default=128)
    parser.add_argument("--eval-batch-size", type=flags.positive_int, default=32,
                        help="sequences per forward pass (default 32)")
    parser.add_argument("--device", default="auto", type=flags.device)
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="fp32")
    parser.add_argument("--overwrite", action="store_true", help="replace existing output files")
    parser.add_argument("--allow-missing-weights", action="store_true",
                        help="use a checkpoint whose encoder does not match its config.json (random weights there)")
    case = parser.add_mutually_exclusive_group()
    case.add_argument("--cased", dest="cased", action="store_true", default=None,
                      help="keep case (default: do_lower_case from the model's tokenizer_config.json)")
    case.add_argument("--uncased", dest="cased", action="store_false")


def check_feature_outputs(output: str | Path, fmt: str, inputs, overwrite: bool) -> None:
    """Before extracting: no output file (or sidecar) may be an input, a non-file, or exist unless overwrite."""
    if is_stdout(output):
        return
    output = Path(output)
    sidecars = _array_paths(output)
    paths = [output] + ([] if fmt == "jsonl" else [sidecars["tokens"]]) + ([sidecars["offsets"]] if fmt == "npy" else [])
    for path in paths:
        check_output_file(path, inputs=inputs, overwrite=overwrite)


def run_from_args(args) -> int:
    check_not_an_input(args.output, [args.input, *Path(args.model).glob("*")])
    fmt = output_format(args.output, FORMATS, args.format, default="jsonl")  # an extension that names none: refused
    check_feature_outputs(args.output, fmt, inputs=[args.input, *Path(args.model).glob("*")],
                          overwrite=args.overwrite)
    texts = read_feature_inputs(args.input)
    model = BertModel.from_pretrained(args.model, allow_missing_weights=args.allow_missing_weights)
    tokenizer = load_tokenizer(args.model, args.cased)
    summary = write_features(model, tokenizer, texts, args.output, _parse_layers(args.layers), args.pool, fmt,
                             args.dtype, batch_size=args.eval_batch_size, max_seq_length=args.max_seq_length,
                             device=args.device, precision=args.precision, progress=sys.stderr.isatty())
    # With `--output -` stdout holds the features: the summary goes to stderr.
    print(json.dumps(summary), file=sys.stderr if is_stdout(args.output) else sys.stdout)
    return 0


__all__ = ["select_layers", "resolve_layer", "extract_features", "iter_features", "write_features", "parse_text",
           "read_feature_inputs"]
