"""The paper's feature-based NER (§5.3, Table 7): a frozen BERT's per-word features -> a 2-layer
BiLSTM -> a linear tagger, one tagger per layer combination (`FEATURE_VARIANTS`).

The encoder runs once over the CoNLL windows (conll_data.ner_features); each word's first-piece
vector of every layer any variant needs is cached (`word_feature_table`), and each BiLSTM is
trained on that cache with the shared loop. `bertkit finetune ner --feature-based` runs it.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn
from tqdm.auto import tqdm

from ..batching import FeatureSource, collate, length_sorted_batches
from ..inference.predict_batches import predict_batches
from ..device import autocast, pick_device, resolve_precision
from ..errors import BertkitError
from ..features import encoder_of, resolve_layer
from ..hub.checkpoints import load_tokenizer
from ..metrics.conll import evaluate_conll
from ..model import BertModel, ModelOutput
from ..outputs import write_json
from ..train import Phase, TrainArgs, fit
from .examples import subsample
from .results import TaskResult
from .conll_data import (TAG_SCHEMES, find_conll_files, label_list, ner_features, read_conll, to_iob2, to_scheme,
                         write_predictions)

log = logging.getLogger("bertkit")


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
    encoder = encoder_of(model)
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
    logits = predict_batches(tagger, examples, batch_size=batch_size, input_keys=("input_ids", "attention_mask"),
                     precision=precision)["logits"]
    return [[id2label[int(i)] for i in l.argmax(-1).tolist()] for l in logits]


@dataclasses.dataclass(frozen=True)
class FeatureBasedOptions:
    """The feature-based taggers' settings (the paper's §5.3: a 2-layer BiLSTM of 768 units per
    direction on frozen features): which layers, the tagger, its training, the windows."""

    variants: tuple[str, ...] = ("concat-last-four",)
    lstm_size: int = 768
    learning_rate: float = 1e-3
    epochs: float = 4
    batch_size: int = 32
    seed: int = 42
    max_seq_length: int = 128
    doc_context: bool = False
    precision: str = "auto"
    device: str = "auto"
    max_train_examples: int | None = None
    max_eval_examples: int | None = None
    tag_scheme: str = "file"
    cased: bool | None = None
    dropout: float = 0.5
    skip_bad_rows: bool = False
    warmup_ratio: float = 0.1
    cache_dtype: torch.dtype = torch.float16
    progress: bool | None = None


def train_feature_based_ner(model_dir, data_dir=None, output_dir=None, options: FeatureBasedOptions | None = None,
                            **given) -> TaskResult:
    """The paper's feature-based NER: for each variant, a BiLSTM tagger on frozen features, scored
    on dev and test with conlleval. The encoder runs once (all layers any variant needs are
    cached per word); each tagger is trained with the shared loop. Writes results.json and per
    variant <output>/feature-based/<variant>/{tagger.safetensors, tagger_config.json,
    dev_predictions.txt, test_predictions.txt, metrics.jsonl}. `max_train_examples` /
    `max_eval_examples` keep the first N sentences. The TaskResult's headline is the best
    variant's dev F1; its document is results.json. `options` (FeatureBasedOptions), or its fields
    as keywords."""
    o = options or FeatureBasedOptions(**{**given, **({"variants": tuple(given["variants"])} if "variants" in given
                                                       else {})})
    variants, lstm_size, learning_rate, epochs, batch_size, seed = (list(o.variants), o.lstm_size, o.learning_rate,
                                                                     o.epochs, o.batch_size, o.seed)
    max_seq_length, doc_context, precision, device, tag_scheme, cased = (o.max_seq_length, o.doc_context, o.precision,
                                                                         o.device, o.tag_scheme, o.cased)
    dropout, skip_bad_rows, warmup_ratio, cache_dtype, progress = (o.dropout, o.skip_bad_rows, o.warmup_ratio,
                                                                   o.cache_dtype, o.progress)
    max_train_examples, max_eval_examples = o.max_train_examples, o.max_eval_examples
    if tag_scheme not in TAG_SCHEMES:
        raise BertkitError(f"tag_scheme must be one of {', '.join(TAG_SCHEMES)}, not {tag_scheme!r}")
    files = find_conll_files(data_dir)
    data = {split: read_conll(path, skip_bad_rows) for split, path in files.items()}
    limits = {"train": max_train_examples, "valid": max_eval_examples, "test": max_eval_examples}
    sentences = {split: subsample(d.sentences, limits[split], contiguous=True) for split, d in data.items()}
    tokenizer = load_tokenizer(model_dir, cased)
    encoder = BertModel.from_pretrained(model_dir)
    plans = {v: variant_layers(v, encoder.config.num_hidden_layers) for v in variants}
    needed = sorted({i for layers, _ in plans.values() for i in layers})
    resolved_precision = resolve_precision(precision, pick_device(device))

    started = time.perf_counter()
    full_table, rows, row_offsets = _cached_word_features(encoder, tokenizer, sentences, needed, max_seq_length,
                                                          doc_context, device, resolved_precision, cache_dtype,
                                                          progress)
    del encoder
    feature_seconds = time.perf_counter() - started

    convert = tag_scheme == "iob2" and data["train"].scheme == "IOB1"
    train_tags = [to_iob2(s.tags) if convert else s.tags for s in sentences["train"]]
    labels = label_list(train_tags)
    label2id = {t: i for i, t in enumerate(labels)}
    examples = {split: tagger_examples(rows[split], train_tags if split == "train" else None,
                                       label2id if split == "train" else None, row_offsets[split])
                for split in sentences}
    out = Path(output_dir) if output_dir is not None else None
    recipe = _TaggerRecipe(learning_rate=learning_rate, epochs=epochs, batch_size=batch_size, seed=seed,
                           warmup_ratio=warmup_ratio, precision=precision, device=device, progress=progress)
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
        torch.manual_seed(seed)  # each variant's tagger starts from the same draw
        tagger = BiLSTMTagger(full_table[:, [needed.index(i) for i in layers]], combine, len(labels), lstm_size,
                              dropout, dict(enumerate(labels)))
        variant_dir = out / "feature-based" / variant if out else None
        entry, predictions = _train_and_score(tagger, variant, examples, sentences, data, recipe, variant_dir,
                                              resolved_precision)
        results["variants"][variant] = {"layers": layers, "combine": combine, **entry}
        if variant_dir is not None:
            save_tagger(tagger, variant_dir, {"variant": variant, "encoder": str(model_dir), "hidden_layers": layers,
                                              "combine": combine, "lstm_size": lstm_size, "dropout": dropout,
                                              "id2label": {str(k): v for k, v in tagger.id2label.items()},
                                              "max_seq_length": max_seq_length, "doc_context": doc_context,
                                              "do_lower_case": tokenizer.do_lower_case})
            for split, name in (("valid", "dev_predictions.txt"), ("test", "test_predictions.txt")):
                if split in predictions:
                    write_predictions(variant_dir / name, sentences[split], predictions[split])
        del tagger
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / "results.json", results)
    dev_scores = [entry["dev"] for entry in results["variants"].values()]
    return TaskResult(task="ner-feature-based", metric="f1", metrics=max(dev_scores, key=lambda m: m["f1"]),
                      run_metrics=dev_scores, document=results, output_dir=None if out is None else str(out))


@dataclasses.dataclass(frozen=True)
class _TaggerRecipe:
    """How each variant's tagger is trained (the shared loop's settings)."""

    learning_rate: float
    epochs: float
    batch_size: int
    seed: int
    warmup_ratio: float
    precision: str
    device: str
    progress: bool | None


def _cached_word_features(encoder, tokenizer, sentences: dict, needed: list[int], max_seq_length: int,
                          doc_context: bool, device: str, precision: str, dtype: torch.dtype, progress):
    """The encoder run once over every split: (one table of every word's vectors at the `needed`
    layers, row 0 the padding; each split's rows per sentence; each split's first row)."""
    torch_device = pick_device(device)
    tables = [torch.zeros(1, len(needed), encoder.config.hidden_size, dtype=dtype)]
    rows, row_offsets, next_row = {}, {}, 1
    for split, sents in sentences.items():
        table, split_rows = word_feature_table(encoder, tokenizer, sents, needed, max_seq_length, doc_context,
                                               device=torch_device, precision=precision, dtype=dtype,
                                               progress=bool(progress))
        tables.append(table)
        rows[split], row_offsets[split] = split_rows, next_row
        next_row += table.shape[0]
    encoder.to("cpu")
    return torch.cat(tables), rows, row_offsets


def _train_and_score(tagger: BiLSTMTagger, variant: str, examples: dict, sentences: dict, data: dict,
                     recipe: _TaggerRecipe, variant_dir: Path | None, precision: str) -> tuple[dict, dict]:
    """One variant's tagger trained with the shared loop, then scored on dev and test with conlleval:
    (its results.json entry, its predicted tags per split in the file's scheme)."""
    source = FeatureSource(examples["train"], recipe.batch_size, seed=recipe.seed)
    args = TrainArgs(output_dir=str(variant_dir) if variant_dir else None, learning_rate=recipe.learning_rate,
                     warmup_ratio=recipe.warmup_ratio, weight_decay=0.0, precision=recipe.precision,
                     device=recipe.device, seed=recipe.seed, save_final_model=False, progress=recipe.progress)
    t0 = time.perf_counter()
    fit(tagger, Phase(source, epochs=recipe.epochs, name=variant), args)
    entry, predictions = {"train_seconds": time.perf_counter() - t0}, {}
    for split in ("valid", "test"):
        if split not in sentences:
            continue
        predicted = predict_tagger(tagger, examples[split], tagger.id2label, precision=precision)
        predictions[split] = [to_scheme(p, data[split].scheme) for p in predicted]
        entry["dev" if split == "valid" else "test"] = evaluate_conll([s.tags for s in sentences[split]],
                                                                      predictions[split])
    if tagger.combine == "weighted":
        entry["layer_weights"] = torch.softmax(tagger.layer_weights.detach().float().cpu(), 0).tolist()
        entry["gamma"] = float(tagger.gamma.detach())
    log.info(f"feature-based {variant}: dev F1 {entry['dev']['f1']:.4f}")
    return entry, predictions


def save_tagger(tagger: BiLSTMTagger, directory: str | Path, config: dict) -> None:
    """The trained tagger without its feature cache: tagger.safetensors + tagger_config.json."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in tagger.state_dict().items()}  # the cache is non-persistent
    save_file(state, str(directory / "tagger.safetensors"))
    write_json(directory / "tagger_config.json", config)


__all__ = ["FEATURE_VARIANTS", "variant_layers", "word_feature_table", "BiLSTMTagger", "tagger_examples",
           "predict_tagger", "train_feature_based_ner", "save_tagger"]
