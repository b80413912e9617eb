"""Feature-based use of a frozen BERT (paper §5.3): per-token activations of any layer, and the
paper's feature-based NER (frozen features -> 2-layer BiLSTM -> linear tagger, Table 7).

Layer indexes are those of `hidden_states` (as the original's `--layers`, negative from the end):
0 = the embedding output, 1..L = the Transformer layers, -1 = the last layer, -L-1 = embeddings.
`bertkit extract-features` writes the original `extract_features.py` JSONL layout, or for large
inputs a compact (total_tokens, dim) array with an offsets array and the tokens.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from . import flags
from .errors import BertkitError
from .model import ModelOutput
from .outputs import atomic_open, atomic_write, atomic_write_text, check_output_file, write_json

log = logging.getLogger("bertkit")

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
    """'A ||| B' -> ('A', 'B'); anything else -> (line, None). The last separator splits, as the
    original's greedy regex does."""
    if PAIR_SEPARATOR in line:
        a, _, b = line.rpartition(PAIR_SEPARATOR)
        return a, b
    return line, None


def _encoder(model):
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
    from .device import autocast, pick_device, resolve_precision
    from .tasks.common import collate

    encoder = _encoder(model)
    device = pick_device(device or "auto") if isinstance(device, str) or device is None else device
    precision = resolve_precision(precision, device)
    encoder.to(device).eval()
    num_layers = encoder.config.num_hidden_layers
    for i in layers:
        resolve_layer(i, num_layers)
    encoded = _encode(tokenizer, texts, max_seq_length)
    bar = None
    if progress:
        from tqdm.auto import tqdm

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
                   pool: str = "none", fmt: str = "jsonl", dtype: str = "float32", batch_size: int = 32,
                   max_seq_length: int = 128, device=None, precision: str = "fp32", progress: bool = False) -> dict:
    """Extract and write. jsonl: one JSON object per input line (streams). npy: OUTPUT.npy the
    (total_tokens, dim) matrix (dim = k, H for pool none), OUTPUT.offsets.npy (n_texts + 1 int64:
    text i is rows offsets[i]:offsets[i+1]) and OUTPUT.tokens.txt (one token per line).
    safetensors: tensors `features`, `offsets`, `token_ids` in one file (+ OUTPUT.tokens.txt)."""
    if fmt not in FORMATS:
        raise BertkitError(f"format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    if dtype not in ("float32", "float16"):
        raise BertkitError(f"dtype must be float32 or float16, not {dtype!r}")
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    stream = iter_features(model, tokenizer, texts, layers, pool, batch_size, max_seq_length, device, precision, progress)
    count = 0
    if fmt == "jsonl":
        with atomic_open(output) as handle:  # appears only complete; a failure leaves no partial file
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
        from safetensors.numpy import save_file

        token_ids = np.asarray(tokenizer.convert_tokens_to_ids(all_tokens), dtype=np.int64)
        tensors = {"features": matrix, "offsets": offsets_array, "token_ids": token_ids}
        atomic_write(output, lambda tmp: save_file(tensors, tmp, metadata={"layers": json.dumps(list(layers)),
                                                                            "pool": pool}))
    return {"texts": len(arrays), "tokens": int(matrix.shape[0]), "shape": list(matrix.shape), "output": str(output)}


def read_feature_inputs(path: str | Path) -> list:
    """One text per line ('A ||| B' for a pair); every line is an input, so linex_index = line - 1."""
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
    parser.add_argument("--input", required=True, help="one text per line; 'A ||| B' for a sentence pair")
    parser.add_argument("--model", required=True, help="model directory (Hugging Face layout); the encoder is frozen")
    parser.add_argument("--output", required=True, help="output file")
    parser.add_argument("--layers", default="-1,-2,-3,-4",
                        help="comma list: 0 = embeddings, 1..L layers, negative from the end (default -1,-2,-3,-4)")
    parser.add_argument("--pool", choices=POOLS, default="none",
                        help="combine layers: none (per layer, the original's JSONL), concat, sum, mean, "
                             "first ([CLS] only, layers concatenated)")
    parser.add_argument("--format", choices=FORMATS, default=None,
                        help="default from the output suffix (.npy, .safetensors), else jsonl")
    parser.add_argument("--dtype", choices=("float32", "float16"), default="float32", help="array formats only")
    parser.add_argument("--max-seq-length", type=flags.int_between(3), default=128)
    parser.add_argument("--batch-size", type=flags.positive_int, default=32)
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
    output = Path(output)
    sidecars = _array_paths(output)
    paths = [output] + ([] if fmt == "jsonl" else [sidecars["tokens"]]) + ([sidecars["offsets"]] if fmt == "npy" else [])
    for path in paths:
        check_output_file(path, inputs=inputs, overwrite=overwrite)


def run_from_args(args) -> int:

    from .model import BertModel
    from .tasks.ner import load_tokenizer

    fmt = args.format or {".npy": "npy", ".safetensors": "safetensors"}.get(Path(args.output).suffix, "jsonl")
    check_feature_outputs(args.output, fmt, inputs=[args.input, *Path(args.model).glob("*")],
                          overwrite=args.overwrite)
    texts = read_feature_inputs(args.input)
    model = BertModel.from_pretrained(args.model, allow_missing_weights=args.allow_missing_weights)
    tokenizer = load_tokenizer(args.model, args.cased)
    summary = write_features(model, tokenizer, texts, args.output, _parse_layers(args.layers), args.pool, fmt,
                             args.dtype, args.batch_size, args.max_seq_length, args.device, args.precision,
                             progress=sys.stderr.isatty())
    print(json.dumps(summary))
    return 0


# ---------------------------------------------------------------- feature-based NER (Table 7)

# variant -> (layer indexes, how the tagger combines them)
FEATURE_VARIANTS: dict[str, tuple[object, str]] = {
    "embeddings": ([0], "single"),
    "second-to-last": ([-2], "single"),
    "last": ([-1], "single"),
    "weighted-sum-all": ("all", "weighted"),
    "sum-last-four": ([-1, -2, -3, -4], "sum"),
    "concat-last-four": ([-1, -2, -3, -4], "concat"),
}


def variant_layers(variant: str, num_layers: int) -> tuple[list[int], str]:
    """hidden_states positions a variant reads, and its combination."""
    if variant not in FEATURE_VARIANTS:
        raise BertkitError(f"unknown feature variant {variant!r}; choose from {', '.join(FEATURE_VARIANTS)}")
    layers, combine = FEATURE_VARIANTS[variant]
    if layers == "all":
        return list(range(num_layers + 1)), combine
    return [resolve_layer(i, num_layers) for i in layers], combine


@torch.no_grad()
def word_feature_table(model, tokenizer, sentences, hidden_indexes: Sequence[int], max_seq_length: int = 128,
                       doc_context: bool = False, batch_size: int = 64, device=None, precision: str = "fp32",
                       dtype: torch.dtype = torch.float16, progress: bool = False):
    """Run the frozen encoder once over the NER windows and keep each word's first-piece vector
    of every layer in hidden_indexes. Returns (table (n_words, k, H), rows: per sentence, the
    table row of each word). Storage defaults to float16: the BiLSTM epochs then read a compact
    cache instead of re-running BERT."""
    from .device import autocast, pick_device, resolve_precision
    from .tasks.common import collate, length_sorted_batches
    from .tasks.ner import ner_features

    encoder = _encoder(model)
    device = pick_device(device or "auto") if isinstance(device, str) or device is None else device
    precision = resolve_precision(precision, device)
    encoder.to(device).eval()
    windows = ner_features(sentences, tokenizer, None, max_seq_length, doc_context)
    rows, start = [], 0
    for s in sentences:
        rows.append(list(range(start, start + len(s.words))))
        start += len(s.words)
    hidden = encoder.config.hidden_size
    table = torch.zeros(start, len(hidden_indexes), hidden, dtype=dtype)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(windows), unit="window", desc="features")
    for _, chunk in length_sorted_batches(windows, batch_size):
        batch = collate([{k: w[k] for k in ("input_ids", "token_type_ids", "attention_mask")} for w in chunk],
                        tokenizer.pad_token_id)
        batch = {k: v.to(device) for k, v in batch.items()}
        with autocast(device, precision):
            out = encoder(**batch, output_hidden_states=True)
        stacked = torch.stack([out.hidden_states[i] for i in hidden_indexes], dim=2)  # (B, T, k, H)
        for b, window in enumerate(chunk):
            positions = torch.tensor(window["first_pieces"], device=stacked.device)
            sentence_rows = rows[window["sentence"]]
            target = sentence_rows[window["word_start"]: window["word_start"] + len(window["first_pieces"])]
            table[target] = stacked[b, positions].to("cpu", dtype)
        if bar is not None:
            bar.update(len(chunk))
    if bar is not None:
        bar.close()
    return table, rows


class BiLSTMTagger(nn.Module):
    """Frozen per-word features -> (layer combination) -> 2-layer BiLSTM -> linear tagger.

    Its input_ids are rows of `feature_table` (n_rows, k, H), a frozen, non-persistent buffer
    holding the cached encoder features (row 0 = padding): like a frozen embedding lookup, which
    lets the shared training loop batch, count and pad it like any token model. combine: single
    (k = 1), sum, concat, or weighted (ELMo's gamma * sum_j softmax(s)_j h_j over all k layers).
    """

    def __init__(self, feature_table: torch.Tensor, combine: str, num_labels: int, lstm_size: int = 768,
                 dropout: float = 0.5, id2label: dict[int, str] | None = None):
        super().__init__()
        if combine not in ("single", "sum", "concat", "weighted"):
            raise BertkitError(f"unknown combination {combine!r}")
        _, k, hidden = feature_table.shape
        if combine == "single" and k != 1:
            raise BertkitError(f"combination 'single' needs one layer, the table has {k}")
        self.combine = combine
        self.register_buffer("feature_table", feature_table, persistent=False)
        if combine == "weighted":
            self.layer_weights = nn.Parameter(torch.zeros(k))  # softmax -> uniform at the start
            self.gamma = nn.Parameter(torch.ones(()))
        self.dropout = nn.Dropout(dropout)
        self.lstm = nn.LSTM(k * hidden if combine == "concat" else hidden, lstm_size, num_layers=2,
                            bidirectional=True, batch_first=True, dropout=dropout)
        self.classifier = nn.Linear(2 * lstm_size, num_labels)
        self.num_labels = num_labels
        self.id2label = id2label

    def combined(self, input_ids: torch.Tensor) -> torch.Tensor:
        features = self.feature_table[input_ids].float()  # (B, W) -> (B, W, k, H)
        if self.combine == "concat":
            return features.flatten(-2)  # (B, W, k*H)
        if self.combine == "sum":
            return features.sum(-2)
        if self.combine == "weighted":
            weights = torch.softmax(self.layer_weights, dim=0)
            return self.gamma * torch.einsum("bwkh,k->bwh", features, weights)
        return features[..., 0, :]

    def forward(self, input_ids, attention_mask=None, labels=None, **unused):
        x = self.dropout(self.combined(input_ids))  # (B, W, D)
        B, W = input_ids.shape
        lengths = attention_mask.sum(1) if attention_mask is not None else torch.full((B,), W)
        # Packed: the backward direction must start at each sentence's last word, not at padding.
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        states, _ = self.lstm(packed)
        states, _ = nn.utils.rnn.pad_packed_sequence(states, batch_first=True, total_length=W)  # (B, W, 2*lstm)
        logits = self.classifier(self.dropout(states))  # (B, W, K)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.float().reshape(-1, self.num_labels), labels.reshape(-1), ignore_index=-100)
        return ModelOutput(loss=loss, logits=logits)


def tagger_examples(rows: list[list[int]], tags: Sequence[Sequence[str]] | None, label2id: dict[str, int] | None,
                    row_offset: int = 1) -> list[dict]:
    """Batch-source examples: table rows as input_ids (shifted by row_offset past the padding row)."""
    examples = []
    for index, sentence_rows in enumerate(rows):
        example = {"input_ids": [r + row_offset for r in sentence_rows], "attention_mask": [1] * len(sentence_rows)}
        if tags is not None and label2id is not None:
            example["labels"] = [label2id.get(t, -100) for t in tags[index]]
        examples.append(example)
    return examples


@torch.no_grad()
def predict_tagger(tagger: BiLSTMTagger, examples: list[dict], id2label: dict[int, str], batch_size: int = 128,
                   precision: str = "fp32") -> list[list[str]]:
    from .tasks.common import predict

    logits = predict(tagger, examples, batch_size=batch_size, input_keys=("input_ids", "attention_mask"),
                     precision=precision)["logits"]
    return [[id2label[int(i)] for i in l.argmax(-1).tolist()] for l in logits]


def train_feature_based_ner(model_dir, data_dir=None, output_dir=None, variants: Sequence[str] = ("concat-last-four",),
                            lstm_size: int = 768, learning_rate: float = 1e-3, epochs: float = 4, batch_size: int = 32,
                            seed: int = 42, max_seq_length: int = 128, doc_context: bool = False,
                            precision: str = "auto", device: str = "auto", max_train_sentences: int | None = None,
                            max_eval_sentences: int | None = None, tag_scheme: str = "file", cased: bool | None = None,
                            dropout: float = 0.5, skip_bad_rows: bool = False, warmup_ratio: float = 0.1,
                            cache_dtype: torch.dtype = torch.float16, progress: bool | None = None) -> dict:
    """The paper's feature-based NER: for each variant, a BiLSTM tagger on frozen features, scored
    on dev and test with conlleval. The encoder runs once (all layers any variant needs are
    cached per word); each tagger is trained with the shared loop. Writes results.json and per
    variant <output>/feature-based/<variant>/{tagger.safetensors, tagger_config.json,
    dev_predictions.txt, test_predictions.txt, metrics.jsonl}. Returns the results dict."""
    from .device import pick_device, resolve_precision
    from .metrics.conll import evaluate_conll
    from .model import BertModel
    from .tasks.common import FeatureSource
    from .tasks.ner import (TAG_SCHEMES, find_conll_files, label_list, load_tokenizer, read_conll, to_iob2,
                            to_scheme, write_predictions)
    from .train import Phase, TrainArgs, fit

    if tag_scheme not in TAG_SCHEMES:
        raise BertkitError(f"tag_scheme must be one of {', '.join(TAG_SCHEMES)}, not {tag_scheme!r}")
    variants = list(variants)
    files = find_conll_files(data_dir)
    data = {split: read_conll(path, skip_bad_rows) for split, path in files.items()}
    limits = {"train": max_train_sentences, "valid": max_eval_sentences, "test": max_eval_sentences}
    sentences = {split: d.sentences if limits[split] is None else d.sentences[:limits[split]] for split, d in data.items()}
    tokenizer = load_tokenizer(model_dir, cased)
    encoder = BertModel.from_pretrained(model_dir)
    num_layers = encoder.config.num_hidden_layers
    plans = {v: variant_layers(v, num_layers) for v in variants}
    needed = sorted({i for layers, _ in plans.values() for i in layers})
    torch_device = pick_device(device)
    resolved_precision = resolve_precision(precision, torch_device)

    started = time.perf_counter()
    tables, rows, row_offsets, next_row = [torch.zeros(1, len(needed), encoder.config.hidden_size, dtype=cache_dtype)], {}, {}, 1
    for split, sents in sentences.items():
        table, split_rows = word_feature_table(encoder, tokenizer, sents, needed, max_seq_length, doc_context,
                                               device=torch_device, precision=resolved_precision, dtype=cache_dtype,
                                               progress=bool(progress))
        tables.append(table)
        rows[split], row_offsets[split] = split_rows, next_row
        next_row += table.shape[0]
    full_table = torch.cat(tables)  # row 0: padding
    encoder.to("cpu")
    del encoder
    feature_seconds = time.perf_counter() - started

    convert = tag_scheme == "iob2" and data["train"].scheme == "IOB1"
    train_tags = [to_iob2(s.tags) if convert else s.tags for s in sentences["train"]]
    labels = label_list(train_tags)
    label2id = {t: i for i, t in enumerate(labels)}
    id2label = dict(enumerate(labels))
    examples = {split: tagger_examples(rows[split], train_tags if split == "train" else None,
                                       label2id if split == "train" else None, row_offsets[split])
                for split in sentences}
    out = Path(output_dir) if output_dir is not None else None
    results = {"task": "ner-feature-based", "model": str(model_dir), "files": {k: str(v) for k, v in files.items()},
               "tag_scheme": {"file": data["train"].scheme, "training": "IOB2" if convert else data["train"].scheme},
               "labels": labels, "do_lower_case": tokenizer.do_lower_case, "doc_context": doc_context,
               "max_seq_length": max_seq_length, "precision": resolved_precision,
               "config": {"lstm_size": lstm_size, "learning_rate": learning_rate, "epochs": epochs,
                          "batch_size": batch_size, "seed": seed, "dropout": dropout},
               "sentences": {k: len(v) for k, v in sentences.items()},
               "bad_rows": {k: d.bad_rows for k, d in data.items()},
               "feature_seconds": feature_seconds, "variants": {}}
    for variant in variants:
        layers, combine = plans[variant]
        columns = [needed.index(i) for i in layers]
        torch.manual_seed(seed)
        tagger = BiLSTMTagger(full_table[:, columns], combine, len(labels), lstm_size, dropout, id2label)
        variant_dir = out / "feature-based" / variant if out else None
        source = FeatureSource(examples["train"], batch_size, seed=seed)
        args = TrainArgs(output_dir=str(variant_dir) if variant_dir else None, learning_rate=learning_rate,
                         warmup_ratio=warmup_ratio, weight_decay=0.0, precision=precision, device=device, seed=seed,
                         save_final_model=False, progress=progress)
        t0 = time.perf_counter()
        fit(tagger, Phase(source, epochs=epochs, name=variant), args)
        train_seconds = time.perf_counter() - t0
        entry = {"layers": layers, "combine": combine, "train_seconds": train_seconds}
        predictions = {}
        for split in ("valid", "test"):
            if split not in sentences:
                continue
            predicted = predict_tagger(tagger, examples[split], id2label, precision=resolved_precision)
            predicted = [to_scheme(p, data[split].scheme) for p in predicted]
            predictions[split] = predicted
            entry["dev" if split == "valid" else "test"] = evaluate_conll([s.tags for s in sentences[split]], predicted)
        if combine == "weighted":
            entry["layer_weights"] = torch.softmax(tagger.layer_weights.detach().float().cpu(), 0).tolist()
            entry["gamma"] = float(tagger.gamma.detach())
        print(f"feature-based {variant}: dev F1 {entry['dev']['f1']:.4f}", file=sys.stderr)
        results["variants"][variant] = entry
        if variant_dir is not None:
            save_tagger(tagger, variant_dir, {"variant": variant, "encoder": str(model_dir), "hidden_layers": layers,
                                              "combine": combine, "lstm_size": lstm_size, "dropout": dropout,
                                              "id2label": {str(k): v for k, v in id2label.items()},
                                              "max_seq_length": max_seq_length, "doc_context": doc_context,
                                              "do_lower_case": tokenizer.do_lower_case})
            for split, name in (("valid", "dev_predictions.txt"), ("test", "test_predictions.txt")):
                if split in predictions:
                    write_predictions(variant_dir / name, sentences[split], predictions[split])
        del tagger
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / "results.json", results)
    return results


def save_tagger(tagger: BiLSTMTagger, directory: str | Path, config: dict) -> None:
    """The trained tagger without its feature cache: tagger.safetensors + tagger_config.json."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in tagger.state_dict().items()}  # the cache is non-persistent
    save_file(state, str(directory / "tagger.safetensors"))
    write_json(directory / "tagger_config.json", config)


__all__ = ["select_layers", "resolve_layer", "extract_features", "iter_features", "write_features", "parse_text",
           "read_feature_inputs", "FEATURE_VARIANTS", "variant_layers", "word_feature_table", "BiLSTMTagger",
           "tagger_examples", "predict_tagger", "train_feature_based_ner", "save_tagger"]
