"""Sentence embeddings trained on your own files: `bertkit finetune sentence-embeddings`.

The columns are sentence-transformers' convention: the text columns in file order (anchor,
positive, then any negatives) and a column named `score` or `label` as the label. The model is an
encoder with pooling (mean or [CLS]) and L2 normalisation (`SentenceEmbeddingModel`), trained with
one of embedding_losses.py's losses; an MNRL batch never holds two copies of one text
(`NoDuplicatesSource`, sentence-transformers' NoDuplicatesBatchSampler, seeded per epoch so that
`--resume` sees the same batches). Dev scoring, which also picks the best run and drives early
stopping: scored pairs by the Spearman correlation of cosine with the score (sentence-transformers'
EmbeddingSimilarityEvaluator), other rows by retrieval (its InformationRetrievalEvaluator: every dev
anchor against all dev positives and negatives as the corpus; nDCG@10 selects). OUTPUT/model is a
sentence-transformers folder (modules.json, 1_Pooling, 2_Normalize, sentence_bert_config.json,
config_sentence_transformers.json) that sentence-transformers, `bertkit predict embeddings`,
`bertkit.pipeline("sentence-embeddings")` and `bertkit serve` load with the same embeddings.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Iterator, Sequence

import torch
from torch import nn

from .. import flags
from ..errors import BertkitError
from ..batching import collate
from ..inference.embed import embed, pool
from ..metrics.retrieval import retrieval_scores, sts_scores, top_k_similar
from ..model import BertModel
from . import runner
from .arguments import check_finetune_output
from .embedding_losses import LOSSES, RANKING_LOSSES, SCORED_LOSSES, LossSpec, cached_loss
from .examples import BadRows, Examples
from .results import TaskResult
from .settings import Defaults, RunSettings
from .splits import Splits
from .sweep import predict_precision
from .task import Task
from .user_files import read_table

log = logging.getLogger("bertkit")

LABEL_COLUMNS = ("score", "label")
# sentence-transformers' fit: lr 2e-5, warm-up 10% (of its steps), 1 epoch; batch 16 (its examples use 16-64)
DEFAULTS = Defaults(learning_rates=(2e-5,), learning_rate=2e-5, epochs=(1,), batch_sizes=(16,), max_seq_length=256,
                    eval_batch_size=64, anchor="sentence-transformers' fit defaults")
RETRIEVAL_K = (1, 3, 5, 10, 100)


@dataclasses.dataclass(frozen=True)
class TextRow:
    """One training row: its texts by column, its label (a score, or a list of scores), its line."""

    texts: tuple[str, ...]
    label: float | tuple[float, ...] | None
    index: int  # the row's line number


# ---------------------------------------------------------------- reading


def read_embedding_file(path, skip_bad_rows: bool = False, fmt: str | None = None) -> tuple[Examples, list[str]]:
    """(rows, text column names): every column but `score` / `label` is a text column, in file order
    (a JSON lines file's order is its first object's keys); the label is a number (or, in JSON
    lines, a list of numbers: margin-mse's scores)."""
    path = Path(path)
    bad = BadRows(path, skip_bad_rows)
    header, rows = read_table(path, bad, fmt)
    columns = None if header is None else list(header)
    examples = []
    for line, row in rows:
        if columns is None:
            columns = list(row)
        if set(row) != set(columns):
            missing, extra = sorted(set(columns) - set(row)), sorted(set(row) - set(columns))
            bad(line, "the row's fields differ from the first row's ("
                + "; ".join(x for x in (missing and f"missing {', '.join(missing)}",
                                        extra and f"extra {', '.join(extra)}") if x) + ")")
            continue
        text_columns = [c for c in columns if c not in LABEL_COLUMNS]
        texts = tuple(row[c] for c in text_columns)
        empty = next((c for c, t in zip(text_columns, texts) if not isinstance(t, str) or not t.strip()), None)
        if empty is not None:
            bad(line, f"empty text in {empty!r}" if isinstance(row[empty], str)
                else f"{empty!r} must be a string, not {type(row[empty]).__name__}")
            continue
        label_column = next((c for c in LABEL_COLUMNS if c in columns), None)
        label = None
        if label_column is not None:
            label = _label(row[label_column])
            if label is None:
                bad(line, f"{label_column!r} must be a number (or a list of numbers), not {row[label_column]!r}")
                continue
        examples.append(TextRow(texts, label, line))
    if columns is None or not examples:
        raise BertkitError("no rows", path=str(path))
    both = [c for c in LABEL_COLUMNS if c in columns]
    if len(both) > 1:
        raise BertkitError("both a 'score' and a 'label' column: the label is one column", path=str(path), line=1)
    return Examples(examples, path, bad.skipped), [c for c in columns if c not in LABEL_COLUMNS]


def _label(value):
    if isinstance(value, bool):
        return None
    if isinstance(value, list):
        numbers = [_label(v) for v in value]
        return tuple(numbers) if numbers and all(isinstance(n, float) for n in numbers) else None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number == number and abs(number) != float("inf") else None


def check_columns(loss: str, columns: list[str], labelled: bool, teacher: bool, path) -> None:
    """The columns each loss needs, said in one line."""
    n = len(columns)
    shown = ", ".join(columns) + (" + a score" if labelled else "")
    if loss in RANKING_LOSSES and n < 2:
        raise BertkitError(f"{loss} needs (anchor, positive[, negatives...]) text columns; the file has {shown}",
                           path=str(path), line=1)
    if loss in SCORED_LOSSES and (n != 2 or not labelled):
        raise BertkitError(f"{loss} needs two text columns and a 'score' (or 'label') column; the file has {shown}",
                           path=str(path), line=1)
    if loss == "mse" and not teacher:
        raise BertkitError("mse trains towards a teacher's embeddings: give --teacher MODEL")
    if loss == "margin-mse" and (n < 3 or not (teacher or labelled)):
        raise BertkitError("margin-mse needs (query, positive, negatives...) text columns and the teacher's "
                           f"margins: a 'score' column or --teacher MODEL; the file has {shown}",
                           path=str(path), line=1)


# ---------------------------------------------------------------- the model


class SentenceEmbeddingModel(nn.Module):
    """An encoder, its pooling and L2 normalisation, and the training loss: what the training loop
    trains. `forward` takes a batch of rows of C texts ((B, C, T) inputs, column c the file's c-th
    text column) and returns {"loss"}; `save_pretrained` writes a sentence-transformers folder."""

    def __init__(self, bert: BertModel, loss: LossSpec, pooling: str = "mean", max_seq_length: int = 256):
        super().__init__()
        self.bert, self.spec, self.pooling, self.max_seq_length = bert, loss, pooling, max_seq_length
        self.loss_fn = loss.function()
        self.config = bert.config

    @classmethod
    def builder(cls, loss: LossSpec, pooling: str, max_seq_length: int):
        """What the runner calls `HEAD.from_pretrained(model_dir, **config_overrides)` on."""

        class Build:
            @staticmethod
            def from_pretrained(model_dir, **overrides):
                return cls(BertModel.from_pretrained(model_dir, **overrides), loss, pooling, max_seq_length)

        return Build

    def embed_inputs(self, inputs: dict) -> torch.Tensor:
        """(b, T) inputs of one text each -> (b, D) normalised embeddings."""
        length = int(inputs["attention_mask"].sum(1).max())  # a column padded wider than its own longest
        inputs = {k: v[:, :length] for k, v in inputs.items()}
        hidden = self.bert(**inputs)["last_hidden_state"]
        return pool(hidden, inputs["attention_mask"], self.pooling, normalize=True)

    def forward(self, input_ids, attention_mask, token_type_ids=None, labels=None):
        B, C, T = input_ids.shape
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        columns = [{"input_ids": input_ids[:, c], "attention_mask": attention_mask[:, c],
                    "token_type_ids": token_type_ids[:, c]} for c in range(C)]
        if self.spec.cached and torch.is_grad_enabled():
            if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
                # its second pass runs outside DDP's forward, so DDP could not reduce the gradients
                raise BertkitError("cached-mnrl trains in one process: use mnrl under torchrun")
            return {"loss": cached_loss(self.embed_inputs, columns, labels, self.loss_fn, self.spec.mini_batch_size)}
        # One encoder pass over every column (column-major rows), as sentence-transformers merges columns.
        flat = {k: torch.cat([col[k] for col in columns]) for k in columns[0]}
        vectors = self.embed_inputs(flat)
        return {"loss": self.loss_fn(list(vectors.split(B)), labels)}

    # The training loop's and the runner's model surface, delegated to the encoder.
    def load_checkpoint_state(self, state, **kwargs):
        return self.bert.load_checkpoint_state(state, **kwargs)

    def save_pretrained(self, directory, tokenizer=None) -> Path:
        """A sentence-transformers folder: the encoder in the Hugging Face layout and its modules' files."""
        self.bert.sentence_transformers_files = sentence_transformers_files(
            self.pooling, self.config.hidden_size, self.max_seq_length,
            do_lower_case=bool(getattr(tokenizer, "do_lower_case", False)))
        directory = self.bert.save_pretrained(directory, tokenizer=tokenizer)
        (directory / "2_Normalize").mkdir(exist_ok=True)  # Normalize has no files; ST saves the folder
        return directory


def sentence_transformers_files(pooling: str, dimension: int, max_seq_length: int, do_lower_case: bool) -> dict:
    """modules.json (Transformer, Pooling, Normalize) and its modules' configs, as sentence-transformers writes them."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]
    pooling_config = {"word_embedding_dimension": dimension, "pooling_mode_cls_token": pooling == "cls",
                      "pooling_mode_mean_tokens": pooling == "mean", "pooling_mode_max_tokens": pooling == "max",
                      "pooling_mode_mean_sqrt_len_tokens": False, "pooling_mode_weightedmean_tokens": False,
                      "pooling_mode_lasttoken": False, "include_prompt": True}
    from ..version import __version__

    files = {"modules.json": modules, "1_Pooling/config.json": pooling_config,
             "sentence_bert_config.json": {"max_seq_length": max_seq_length, "do_lower_case": do_lower_case},
             "config_sentence_transformers.json": {"__version__": {"bertkit": __version__}, "prompts": {},
                                                   "default_prompt_name": None, "similarity_fn_name": "cosine"}}
    return {name: (json.dumps(value, indent=2) + "\n").encode() for name, value in files.items()}


# ---------------------------------------------------------------- batches without duplicate texts


class NoDuplicatesSource:
    """Training batches in which no text appears twice (sentence-transformers' NoDuplicatesBatchSampler:
    a duplicate would be a false in-batch negative): each epoch a seeded shuffle, then batches filled in
    that order with the rows whose texts the batch does not hold yet (a skipped row waits for a later
    batch). Deterministic given the seed and the epoch (train.loop's BatchSource)."""

    def __init__(self, features: Sequence[dict], batch_size: int, seed: int = 0, pad_token_id: int = 0):
        if not features:
            raise BertkitError("no training examples")
        self.features, self.batch_size, self.seed, self.pad_token_id = features, batch_size, seed, pad_token_id
        self._epoch, self._batches = None, None

    def plan(self, epoch: int) -> list[list[int]]:
        if self._epoch != epoch:
            g = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
            remaining = dict.fromkeys(torch.randperm(len(self.features), generator=g).tolist())
            batches = []
            while remaining:
                batch, seen = [], set()
                for index in remaining:
                    texts = set(self.features[index]["texts"])
                    if texts & seen:
                        continue
                    batch.append(index)
                    seen |= texts
                    if len(batch) == self.batch_size:
                        break
                for index in batch:
                    del remaining[index]
                batches.append(batch)
            self._epoch, self._batches = epoch, batches
        return self._batches

    def num_batches(self, epoch: int) -> int:
        return len(self.plan(epoch))

    def batches(self, epoch: int, start: int = 0) -> Iterator[dict]:
        for indices in self.plan(epoch)[start:]:
            yield collate_rows([self.features[i] for i in indices], self.pad_token_id)


def collate_rows(features: Sequence[dict], pad_token_id: int) -> dict:
    """Rows of C texts -> (B, C, T) inputs and their labels (scores, or teacher embeddings)."""
    batch = collate([{k: f[k] for k in ("input_ids", "token_type_ids", "attention_mask")} for f in features],
                    pad_token_id)
    if "labels" in features[0]:
        batch["labels"] = torch.tensor([f["labels"] for f in features], dtype=torch.float32)
    return batch


class SeededRows(NoDuplicatesSource):
    """Seeded shuffles without the duplicate rule (scored pairs and distillation: no in-batch negatives)."""

    def plan(self, epoch: int) -> list[list[int]]:
        if self._epoch != epoch:
            g = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
            order = torch.randperm(len(self.features), generator=g).tolist()
            self._epoch = epoch
            self._batches = [order[s:s + self.batch_size] for s in range(0, len(order), self.batch_size)]
        return self._batches


# ---------------------------------------------------------------- dev scoring

# How dev is scored: (the metric that selects, results.json's "selection").
EVALUATORS = {"sts": ("spearman", "best dev Spearman correlation of cosine with the score"),
              "retrieval": ("ndcg@10", "best dev nDCG@10 (retrieval: dev anchors against dev positives and negatives)"),
              "mse": ("negative_mse", "best dev negative mean squared error to the teacher's embeddings")}


def dev_evaluator(rows: Sequence[TextRow], teacher: bool) -> str:
    """By the dev rows' shape, whatever the loss (an MNRL model is often scored on STS pairs): two texts
    and a score -> "sts"; an anchor and candidates -> "retrieval"; one text (and a teacher) -> "mse"."""
    width, label = len(rows[0].texts), rows[0].label
    if width == 2 and isinstance(label, float):
        return "sts"
    if width >= 2:
        return "retrieval"
    if teacher:
        return "mse"
    raise BertkitError("one text column and no teacher: nothing to score dev on", path=getattr(rows, "path", None))


def sts_evaluation(vectors: list[torch.Tensor], rows: Sequence[TextRow]) -> dict:
    """Pearson and Spearman of cos(text, pair) with the gold scores (EmbeddingSimilarityEvaluator)."""
    cosines = (vectors[0] * vectors[1]).sum(-1).tolist()  # the vectors are normalised
    return sts_scores(cosines, [float(r.label) for r in rows])


def retrieval_evaluation(vectors: list[torch.Tensor], rows: Sequence[TextRow]) -> dict:
    """Each distinct anchor against every distinct dev positive and negative (the corpus); an anchor's
    relevant documents are its rows' positives (InformationRetrievalEvaluator, cosine)."""
    queries, corpus, qrels = {}, {}, {}
    query_vectors, corpus_vectors = [], []
    for i, row in enumerate(rows):
        if row.texts[0] not in queries:
            queries[row.texts[0]] = f"q{len(queries)}"
            query_vectors.append(vectors[0][i])
        for c, text in enumerate(row.texts[1:], start=1):
            if text not in corpus:
                corpus[text] = f"d{len(corpus)}"
                corpus_vectors.append(vectors[c][i])
        qrels.setdefault(queries[row.texts[0]], {})[corpus[row.texts[1]]] = 1
    scores, indices = top_k_similar(torch.stack(query_vectors), torch.stack(corpus_vectors), max(RETRIEVAL_K))
    ids = list(corpus.values())
    run = {f"q{q}": {ids[j]: float(s) for s, j in zip(scores[q].tolist(), indices[q].tolist())}
           for q in range(len(query_vectors))}
    metrics = retrieval_scores(run, qrels, RETRIEVAL_K)
    return {k: v for k, v in metrics.items()
            if k in ("mrr@10", "ndcg@10", "map@100", "map") or k.startswith(("recall@", "accuracy@"))}


# ---------------------------------------------------------------- the task


class SentenceEmbeddingTask(Task):
    """sentence embeddings (semantic search, similarity) on your own CSV / TSV / JSON lines files

    (tasks/task.py's interface; the command line is `bertkit finetune sentence-embeddings`)."""

    name = "sentence-embeddings"
    defaults = DEFAULTS
    phase = "train"
    own_data, skipped_settings = True, ()

    @classmethod
    def add_data_arguments(cls, parser) -> None:
        parser.add_argument("--train-file", required=True,
                            help="training rows (CSV / TSV with a header, or JSON lines): the text columns in file "
                                 "order (anchor, positive, then any negatives); a 'score' or 'label' column is "
                                 "the label")
        parser.add_argument("--dev-file", default=None,
                            help="dev rows, same columns: scored during training, selects the best run")
        parser.add_argument("--format", dest="file_format", choices=("csv", "tsv", "jsonl"), default=None,
                            help="file format (default: from the extension)")
        parser.add_argument("--loss", choices=LOSSES, default="mnrl",
                            help="mnrl: in-batch negatives (+ negative columns); cached-mnrl: the same in the memory "
                                 "of --mini-batch-size; cosent / cosine: scored pairs; mse / margin-mse: distillation "
                                 "from --teacher (default mnrl)")
        parser.add_argument("--pooling", choices=("mean", "cls"), default=None,
                            help="token vectors -> one (then L2-normalised) vector: default the model folder's own "
                                 "pooling when it is a sentence-transformers folder, else mean")
        parser.add_argument("--matryoshka-dims", type=flags.comma_list(flags.positive_int), default=(),
                            help="e.g. 384,192,96: the loss at each truncated dimension, summed (MatryoshkaLoss)")
        parser.add_argument("--matryoshka-weights", type=flags.comma_list(flags.positive_float), default=None,
                            help="one weight per --matryoshka-dims dimension (default 1 each)")
        parser.add_argument("--teacher", default=None,
                            help="mse: the model whose embeddings the student learns; margin-mse: a cross-encoder "
                                 "or embedding model scoring (query, positive) and (query, negative)")
        parser.add_argument("--mnrl-scale", dest="scale", type=flags.positive_float, default=20.0,
                            help="mnrl / cached-mnrl / cosent: the similarity scale (1 / temperature; default 20)")
        parser.add_argument("--symmetric", action="store_true",
                            help="mnrl: also rank the anchors for each positive "
                                 "(MultipleNegativesSymmetricRankingLoss)")
        parser.add_argument("--mini-batch-size", type=flags.positive_int, default=32,
                            help="cached-mnrl: rows embedded at once (memory), whatever --batch-size (default 32)")

    @classmethod
    def epilog(cls) -> str:
        return ("Defaults as sentence-transformers' fit: one run, learning rate 2e-5, batch 16, 1 epoch, warm-up 10%, "
                "max length 256. mnrl batches never hold one text twice; with --grad-accum the in-batch negatives "
                "are those of a micro-batch (cached-mnrl: the whole batch).")

    @classmethod
    def run_finetune(cls, args) -> int:
        check_finetune_output(args)
        loss = {f.name: getattr(args, f.name) for f in dataclasses.fields(LossSpec) if f.name != "name"}
        finetune_sentence_embeddings(args.model, args.train_file, args.dev_file, args.output, loss=args.loss,
                                     pooling=args.pooling, teacher=args.teacher, file_format=args.file_format,
                                     settings=cls.settings_from_args(args), **loss)
        return 0

    def __init__(self, train_file, dev_file=None, *, loss: LossSpec = LossSpec(), pooling: str = "mean",
                 teacher=None, file_format: str | None = None, max_seq_length: int = 256):
        self.files = {"train": train_file, "dev": dev_file}
        self.spec, self.pooling, self.teacher, self.file_format = loss, pooling, teacher, file_format
        self.max_seq_length = max_seq_length
        self.label = Path(train_file).stem
        self.HEAD = SentenceEmbeddingModel.builder(loss, pooling, max_seq_length)
        self.columns: list[str] = []
        self.evaluator = "retrieval"
        self.metric, self.selection = EVALUATORS[self.evaluator]
        self._teacher, self._dev_teacher = None, {}  # the loaded teacher; its dev embeddings by split

    def read(self, skip_bad_rows: bool) -> Splits:
        train, self.columns = read_embedding_file(self.files["train"], skip_bad_rows, self.file_format)
        labelled = train[0].label is not None
        check_columns(self.spec.name, self.columns, labelled, self.teacher is not None, train.path)
        if labelled and self.spec.name in RANKING_LOSSES:
            log.warning(f"{self.spec.name} does not use the score column; the texts are ranked by in-batch negatives")
        dev = None
        if self.files["dev"] is not None:
            dev, _ = read_embedding_file(self.files["dev"], skip_bad_rows, self.file_format)
        self.evaluator = dev_evaluator(dev or train, self.teacher is not None)
        self.metric, self.selection = EVALUATORS[self.evaluator]
        return Splits(train, dev, details={
            "train_file": str(self.files["train"]), "dev_file": None if dev is None else str(self.files["dev"]),
            "columns": self.columns, "loss": self.spec.describe(), "pooling": self.pooling,
            **({"teacher": str(self.teacher)} if self.teacher is not None else {})})

    def encode(self, examples, tokenizer, max_seq_length: int, labels: bool = True) -> list[dict]:
        C = len(examples[0].texts)
        flat = tokenizer.encode_batch([t for row in examples for t in row.texts], max_length=max_seq_length,
                                      truncation=True)
        features = []
        for i, row in enumerate(examples):
            encoded = flat[i * C:(i + 1) * C]
            feature = {k: [e[k] for e in encoded] for k in ("input_ids", "token_type_ids", "attention_mask")}
            feature["texts"] = row.texts
            features.append(feature)
        for feature, label in zip(features, self.labels(examples, max_seq_length) if labels else ()):
            if label is not None:
                feature["labels"] = label
        return features

    def eval_features(self, examples, tokenizer, max_seq_length: int):
        """Dev is scored from its texts (predict embeds them); no teacher labels to compute."""
        return self.encode(examples, tokenizer, max_seq_length, labels=False)

    def labels(self, examples, max_seq_length: int) -> list:
        """Each row's label: its score, or the teacher's embeddings (mse) or margins (margin-mse)."""
        if self.spec.name == "mse":
            return [v.tolist() for v in self.teacher_embeddings(examples, max_seq_length)]
        if self.spec.name == "margin-mse" and self.teacher is not None:
            return self.teacher_scores(examples, max_seq_length)
        if self.spec.name in SCORED_LOSSES + ("margin-mse",):
            return [r.label for r in examples]
        return [None] * len(examples)

    def teacher_embeddings(self, examples, max_seq_length: int) -> torch.Tensor:
        """(N, C, D): the teacher's embedding of every text of every row, with its own pooling."""
        if self._teacher is None:
            self._teacher = load_teacher(self.teacher)
        model, tokenizer, pooling, normalize = self._teacher
        texts = [t for row in examples for t in row.texts]
        vectors = embed(model, tokenizer, texts, pooling.mode, normalize=normalize, max_length=max_seq_length)
        return vectors.view(len(examples), len(examples[0].texts), -1)

    def teacher_scores(self, examples, max_seq_length: int) -> list[list[float]]:
        """Per row the teacher's score of (query, positive) then of each (query, negative): a cross-encoder
        teacher's logit, or an embedding teacher's dot product."""
        from ..inference.engine import InferenceEngine

        engine = InferenceEngine(self.teacher, device="cpu")
        if engine.task == "text-classification":
            queries = [row.texts[0] for row in examples for _ in row.texts[1:]]
            passages = [t for row in examples for t in row.texts[1:]]
            logits = [float(v.view(-1)[0]) for v in engine.logits(queries, passages)]
            per = len(examples[0].texts) - 1
            return [logits[i * per:(i + 1) * per] for i in range(len(examples))]
        vectors = self.teacher_embeddings(examples, max_seq_length)  # (N, C, D)
        return (vectors[:, :1] * vectors[:, 1:]).sum(-1).tolist()

    def predict(self, model, examples, features, runtime) -> list[torch.Tensor]:
        """Dev embeddings by column, (N, D) each."""
        texts = [t for row in examples for t in row.texts]
        vectors = embed(model.bert, runtime.tokenizer, texts, model.pooling, batch_size=runtime.eval_batch_size,
                        normalize=True, max_length=runtime.max_seq_length,
                        precision=predict_precision(model, runtime.precision))
        return list(vectors.view(len(examples), len(examples[0].texts), -1).unbind(1))

    def score(self, predictions, examples, split: str) -> dict:
        if self.evaluator == "sts":
            return sts_evaluation(predictions, examples)
        if self.evaluator == "mse":  # sentence-transformers' MSEEvaluator, as a fraction: higher is better
            if split not in self._dev_teacher:
                self._dev_teacher[split] = self.teacher_embeddings(examples, self.max_seq_length)
            teacher = self._dev_teacher[split]
            return {"negative_mse": -float(torch.stack([((p - teacher[:, c]) ** 2).mean()
                                                        for c, p in enumerate(predictions)]).mean())}
        return retrieval_evaluation(predictions, examples)

    def evaluate(self, model, examples, features, runtime, split: str):
        metrics = self.score(self.predict(model, examples, features, runtime), examples, split)
        return metrics, metrics

    def batch_source(self, features, batch_size: int, seed: int, pad_token_id: int):
        if self.spec.name in RANKING_LOSSES:
            return NoDuplicatesSource(features, batch_size, seed, pad_token_id)
        return SeededRows(features, batch_size, seed, pad_token_id)

    def describe(self, splits: Splits, train_features) -> str:
        return (f"{super().describe(splits, train_features)}, columns {', '.join(self.columns)}, "
                f"{self.spec.describe()}, {self.pooling} pooling")

    def identity(self, splits: Splits) -> dict:
        return {"dev_examples": 0 if splits.dev is None else len(splits.dev), "loss": self.spec.describe(),
                "pooling": self.pooling}

    def write_outputs(self, out: Path, model, outputs: dict, splits: Splits, runtime) -> dict:
        """No prediction files: the model is the output (its card reads the loss, data and dev scores
        from results.json)."""
        return {}


def load_teacher(reference):
    """A teacher folder: its encoder, tokenizer, pooling (the folder's, else mean) and normalisation."""
    from ..hub.checkpoints import model_tokenizer
    from ..hub.resolve import resolve_model
    from ..inference.engine import Pooling, read_pooling

    folder = resolve_model(reference)
    pooling = read_pooling(folder) or Pooling("mean", normalize=True)
    return BertModel.from_pretrained(folder).eval(), model_tokenizer(folder), pooling, pooling.normalize


def folder_pooling(model_dir) -> str:
    """The model folder's own pooling when it is a sentence-transformers folder, else mean."""
    from ..hub.resolve import resolve_model
    from ..inference.engine import read_pooling

    pooling = read_pooling(resolve_model(model_dir))
    if pooling is None:
        return "mean"
    if pooling.mode not in ("mean", "cls"):
        raise BertkitError(f"the model folder pools by {pooling.mode}: give --pooling mean or cls")
    return pooling.mode


def finetune_sentence_embeddings(model_dir, train_file, dev_file=None, output_dir=None, *, loss: str = "mnrl",
                                 pooling: str | None = None, teacher=None, file_format: str | None = None,
                                 settings: RunSettings | None = None, **options) -> TaskResult:
    """Fine-tune a sentence-embedding model on the user's file with `loss` (embedding_losses.LOSSES);
    `options`: the loss's settings (LossSpec's fields: scale, symmetric, mini_batch_size,
    matryoshka_dims, matryoshka_weights) and RunSettings fields, or `settings` a whole RunSettings
    (default: sentence-transformers' fit: lr 2e-5, batch 16, 1 epoch, warm-up 10%, max length 256).
    With output_dir: OUTPUT/model (a sentence-transformers folder), results.json and metrics.jsonl
    (every run's in runs/<run>/)."""
    loss_fields = {f.name for f in dataclasses.fields(LossSpec)}
    given = {k: options.pop(k) for k in list(options) if k in loss_fields}
    spec = LossSpec(loss, **{**given, **{k: tuple(given[k]) for k in ("matryoshka_dims", "matryoshka_weights")
                                         if given.get(k) is not None}})
    if settings is not None and options:
        raise BertkitError("give settings= or run options, not both")
    settings = settings or RunSettings.paper(DEFAULTS, **options)
    task = SentenceEmbeddingTask(train_file, dev_file, loss=spec, pooling=pooling or folder_pooling(model_dir),
                                 teacher=teacher, file_format=file_format, max_seq_length=settings.max_seq_length)
    return runner.finetune(task, model_dir, output_dir, settings)
