"""`bertkit.pipeline(task, model=DIR)`: predictions in the result shapes of transformers' pipelines.

    classify = bertkit.pipeline("text-classification", model="runs/sst2/model")
    classify("a gripping film")                     # [{"label": "positive", "score": 0.98}]

Tasks and results (as transformers 4-5 give them; a single input gives one result, a list a list):
* text-classification: {"label", "score"} (top_k=None: every label, best first); the score is
  softmax over labels, sigmoid for one output or multi-label, the raw value for regression.
* token-classification: entities {"entity", "score", "index", "word", "start", "end"} per token
  (aggregation_strategy="none") or {"entity_group", "score", "word", "start", "end"} for
  B-/I- runs ("simple"); "O" is left out; start/end are character offsets into the text.
* question-answering: {"score", "start", "end", "answer"}; score = p(start) * p(end) over the
  context tokens of a window, the best span of at most max_answer_len tokens over all windows.
* fill-mask: {"score", "token", "token_str", "sequence"} for each "[MASK]" in the text.
* feature-extraction: per text the (1, T, H) nested list of last-layer vectors; and
  sentence-embeddings: one vector per text, pooled and normalised as the model folder says.
The functions below turn model outputs into these results; `predict` and `serve` share them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch

from .errors import BertkitError
from .inference import InferenceEngine
from .tasks.squad_windows import check_is_max_context, doc_spans
from .tokenizer import MASK

# ---------------------------------------------------------------- text classification


def score_function(config, function_to_apply: str | None = None) -> str:
    """transformers' rule: regression -> none; one output or multi-label -> sigmoid; else softmax."""
    if function_to_apply is not None:
        if function_to_apply not in ("softmax", "sigmoid", "none"):
            raise BertkitError(f"function_to_apply must be softmax, sigmoid or none, not {function_to_apply!r}")
        return function_to_apply
    if config.problem_type == "regression":
        return "none"
    if config.problem_type == "multi_label_classification" or config.num_labels == 1:
        return "sigmoid"
    return "softmax"


def label_scores(logits: torch.Tensor, id2label: dict[int, str], function: str, top_k: int | None = 1) -> list[dict]:
    """[{"label", "score"}] best first, top_k of them (None: all)."""
    if function == "softmax":
        scores = torch.softmax(logits.float(), -1)
    elif function == "sigmoid":
        scores = torch.sigmoid(logits.float())
    else:
        scores = logits.float()
    ranked = sorted(range(len(scores)), key=lambda i: -float(scores[i]))
    return [{"label": id2label[i], "score": float(scores[i])} for i in ranked[:top_k]]


# ---------------------------------------------------------------- token classification


def _tag(entity: str) -> tuple[str, str]:
    if entity.startswith("B-"):
        return "B", entity[2:]
    if entity.startswith("I-"):
        return "I", entity[2:]
    return "I", entity  # "O" and untyped labels continue like I-


def token_entities(text: str, logits: torch.Tensor, row: dict, tokenizer, id2label: dict[int, str],
                   aggregation_strategy: str = "none", ignore_labels: Sequence[str] = ("O",)) -> list[dict]:
    """Entities of one text from its (T, K) logits and its encoding (with offsets)."""
    if aggregation_strategy not in ("none", "simple"):
        raise BertkitError(f"aggregation_strategy must be 'none' or 'simple', not {aggregation_strategy!r}")
    probabilities = torch.softmax(logits.float(), -1)
    entities = []
    for index, (token_id, sequence_id) in enumerate(zip(row["input_ids"], row["sequence_ids"])):
        if sequence_id is None:  # [CLS], [SEP]
            continue
        start, end = row["offsets"][index]
        word = text[start:end] if token_id == tokenizer.unk_token_id else tokenizer.ids_to_tokens[token_id]
        best = int(probabilities[index].argmax())
        entities.append({"entity": id2label[best], "score": float(probabilities[index][best]), "index": index,
                         "word": word, "start": start, "end": end})
    if aggregation_strategy == "simple":
        entities = _group_entities(entities, tokenizer)
    return [e for e in entities if e.get("entity", e.get("entity_group")) not in ignore_labels]


def _group_entities(entities: list[dict], tokenizer) -> list[dict]:
    """transformers' group_entities: a token joins the open group when it has the same type and is not B-."""
    groups, current = [], []
    for entity in entities:
        if current:
            bi, tag = _tag(entity["entity"])
            if tag == _tag(current[-1]["entity"])[1] and bi != "B":
                current.append(entity)
                continue
            groups.append(_merge(current, tokenizer))
        current = [entity]
    if current:
        groups.append(_merge(current, tokenizer))
    return groups


def _merge(entities: list[dict], tokenizer) -> dict:
    words = tokenizer.convert_tokens_to_string([e["word"] for e in entities])
    return {"entity_group": entities[0]["entity"].split("-", 1)[-1],
            "score": sum(e["score"] for e in entities) / len(entities),
            "word": words, "start": entities[0]["start"], "end": entities[-1]["end"]}


# ---------------------------------------------------------------- question answering


def qa_windows(engine: InferenceEngine, question: str, context: str, max_question_len: int = 64,
               doc_stride: int = 128, truncate: bool = True) -> list[dict]:
    """[CLS] question [SEP] context-window [SEP] rows over the whole context (the original's windows),
    each with `offsets`, `sequence_ids` and `context_start` (index of its first context token)."""
    tokenizer = engine.tokenizer
    q_row, c_row = tokenizer.encode_batch([question, context], max_length=None, truncation=False, return_offsets=True)
    q_ids = q_row["input_ids"][1:-1][:max_question_len]
    c_ids, c_offsets = c_row["input_ids"][1:-1], c_row["offsets"][1:-1]
    room = engine.max_length - len(q_ids) - 3
    if room <= 0:
        raise BertkitError(f"the question leaves no room for context in {engine.max_length} positions")
    if not truncate and len(c_ids) > room:
        raise BertkitError(f"question and context take {len(q_ids) + len(c_ids) + 3} tokens, more than the "
                           f"model's {engine.max_length}: shorten them or ask for truncation")
    spans = doc_spans(len(c_ids), room, doc_stride) or [(0, 0)]
    rows = []
    for span_index, (start, length) in enumerate(spans):
        ids = [tokenizer.cls_token_id, *q_ids, tokenizer.sep_token_id, *c_ids[start:start + length], tokenizer.sep_token_id]
        first = len(q_ids) + 2
        rows.append({
            "input_ids": ids,
            "token_type_ids": [0] * first + [1] * (length + 1),
            "attention_mask": [1] * len(ids),
            "offsets": [(0, 0)] * first + list(c_offsets[start:start + length]) + [(0, 0)],
            "context_start": first,
            "max_context": [check_is_max_context(spans, span_index, start + i) for i in range(length)],
        })
    return rows


def qa_answers(windows: list[dict], outputs: list[dict], context: str, top_k: int = 1, max_answer_len: int = 15,
               handle_impossible_answer: bool = False) -> list[dict]:
    """Best spans over a question's windows: score = softmax(start)[s] * softmax(end)[e] over
    [CLS] + the window's context tokens, s <= e < s + max_answer_len (transformers' rule)."""
    candidates, null_score = [], 1.0
    for row, out in zip(windows, outputs):
        first, length = row["context_start"], len(row["input_ids"]) - row["context_start"] - 1
        if length == 0:
            continue
        allowed = torch.zeros(len(row["input_ids"]), dtype=torch.bool)
        allowed[0] = True
        allowed[first:first + length] = True
        start = torch.softmax(out["start_logits"].masked_fill(~allowed, -10000.0), -1)
        end = torch.softmax(out["end_logits"].masked_fill(~allowed, -10000.0), -1)
        null_score = min(null_score, float(start[0] * end[0]))
        start_c, end_c = start[first:first + length], end[first:first + length]
        scores = torch.triu(start_c[:, None] * end_c[None, :]).tril(max_answer_len - 1)  # (L, L)
        flat = scores.flatten()
        # Only spans with s <= e < s + max_answer_len: past them the zeros of the mask would come
        # back as "answers" ending before they start when top_k asks for more.
        spans = torch.ones(length, length, dtype=torch.bool).triu().tril(max_answer_len - 1).flatten().nonzero()[:, 0]
        for position in spans[torch.argsort(flat[spans], descending=True)[:top_k]].tolist():
            s, e = divmod(position, length)
            if not row["max_context"][s] and len(windows) > 1:
                continue
            char_start, char_end = row["offsets"][first + s][0], row["offsets"][first + e][1]
            candidates.append({"score": float(flat[position]), "start": char_start, "end": char_end,
                               "answer": context[char_start:char_end]})
    if handle_impossible_answer:
        candidates.append({"score": null_score, "start": 0, "end": 0, "answer": ""})
    candidates.sort(key=lambda c: -c["score"])
    seen, unique = set(), []
    for candidate in candidates:
        if (candidate["start"], candidate["end"]) not in seen:
            seen.add((candidate["start"], candidate["end"]))
            unique.append(candidate)
    return unique[:top_k]


# ---------------------------------------------------------------- fill-mask


def mask_row(tokenizer, text: str, max_length: int) -> dict:
    """[CLS] text [SEP] with every literal "[MASK]" as the mask token (the rest tokenized as usual)."""
    pieces = text.split(MASK)
    if len(pieces) < 2:
        raise BertkitError(f"no {MASK} in the text: {text[:60]!r}")
    ids = [tokenizer.cls_token_id]
    for number, piece_ids in enumerate(tokenizer.encode_ids_batch(pieces)):
        if number:
            ids.append(tokenizer.mask_token_id)
        ids.extend(piece_ids)
    ids.append(tokenizer.sep_token_id)
    if len(ids) > max_length:
        raise BertkitError(f"the text has {len(ids)} tokens, more than the model's {max_length}")
    return {"input_ids": ids, "token_type_ids": [0] * len(ids), "attention_mask": [1] * len(ids)}


def fill_mask_results(tokenizer, row: dict, logits: torch.Tensor, top_k: int = 5) -> list[list[dict]]:
    """Per mask position, the top_k tokens with their scores and the completed sequence."""
    results = []
    for position in [i for i, t in enumerate(row["input_ids"]) if t == tokenizer.mask_token_id]:
        probabilities = torch.softmax(logits[position].float(), -1)
        values, tokens = probabilities.topk(top_k)
        entries = []
        for score, token in zip(values.tolist(), tokens.tolist()):
            filled = list(row["input_ids"])
            filled[position] = token
            entries.append({"score": score, "token": token, "token_str": tokenizer.decode([token]),
                            "sequence": tokenizer.decode(filled, skip_special_tokens=True)})
        results.append(entries)
    return results


# ---------------------------------------------------------------- the pipeline objects


class Pipeline:
    """A loaded model answering one task; call it on a text or a list of texts."""

    task = ""

    def __init__(self, engine: InferenceEngine, **defaults):
        self.engine, self.defaults = engine, defaults
        self.tokenizer, self.model = engine.tokenizer, engine.model

    def __call__(self, inputs, **options):
        options = {**self.defaults, **options}
        single = isinstance(inputs, (str, dict))
        results = self.run([inputs] if single else list(inputs), **options)
        return results[0] if single else results

    def run(self, inputs: list, **options) -> list:
        raise NotImplementedError


class TextClassificationPipeline(Pipeline):
    task = "text-classification"

    def __call__(self, inputs, **options):
        # transformers: a single text gives a one-element list ([{"label", "score"}]) by default.
        options = {**self.defaults, **options}
        single = isinstance(inputs, (str, dict))
        results = self.run([inputs] if single else list(inputs), **options)
        if "top_k" in options:
            return results[0] if single else results
        if isinstance(inputs, dict):  # one {"text", "text_pair"}: the dict itself, as transformers
            return results[0][0]
        return [r[0] for r in results]

    def run(self, inputs, top_k=1, function_to_apply=None, truncation=True):
        texts = [x["text"] if isinstance(x, dict) else x for x in inputs]
        pairs = [x["text_pair"] for x in inputs] if inputs and isinstance(inputs[0], dict) else None
        function = score_function(self.engine.config, function_to_apply)
        return [label_scores(logits, self.engine.id2label, function, top_k)
                for logits in self.engine.logits(texts, pairs, truncate=truncation)]


class TokenClassificationPipeline(Pipeline):
    task = "token-classification"

    def run(self, inputs, aggregation_strategy="none", ignore_labels=("O",), truncation=True):
        rows = self.engine.encode(inputs, truncate=truncation, return_offsets=True)
        outputs = self.engine.forward(rows)
        return [token_entities(text, out["logits"], row, self.tokenizer, self.engine.id2label,
                               aggregation_strategy, ignore_labels)
                for text, row, out in zip(inputs, rows, outputs)]


class QuestionAnsweringPipeline(Pipeline):
    task = "question-answering"

    def __call__(self, inputs=None, question=None, context=None, **options):
        if inputs is None:
            if question is None or context is None:
                raise BertkitError("question-answering needs question= and context= (or dicts with both)")
            if isinstance(question, str) != isinstance(context, str):
                raise BertkitError("question and context must both be strings or both be lists")
            inputs = {"question": question, "context": context} if isinstance(question, str) else \
                [{"question": q, "context": c} for q, c in zip(question, context)]
        return super().__call__(inputs, **options)

    def run(self, inputs, top_k=1, max_answer_len=15, doc_stride=128, max_question_len=64,
            handle_impossible_answer=False, truncation=True):
        windows, owners = [], []
        for number, item in enumerate(inputs):
            for window in qa_windows(self.engine, item["question"], item["context"], max_question_len,
                                     doc_stride, truncation):
                windows.append(window)
                owners.append(number)
        outputs = self.engine.forward(windows, ("start_logits", "end_logits"))
        results = []
        for number, item in enumerate(inputs):
            mine = [i for i, owner in enumerate(owners) if owner == number]
            answers = qa_answers([windows[i] for i in mine], [outputs[i] for i in mine], item["context"], top_k,
                                 max_answer_len, handle_impossible_answer)
            results.append(answers[0] if top_k == 1 else answers)
        return results


class FillMaskPipeline(Pipeline):
    task = "fill-mask"

    def run(self, inputs, top_k=5):
        rows = [mask_row(self.tokenizer, text, self.engine.max_length) for text in inputs]
        results = []
        for row, out in zip(rows, self.engine.forward(rows)):
            per_mask = fill_mask_results(self.tokenizer, row, out["logits"], top_k)
            results.append(per_mask[0] if len(per_mask) == 1 else per_mask)
        return results


class FeatureExtractionPipeline(Pipeline):
    task = "feature-extraction"

    def run(self, inputs, truncation=True, return_tensors=False):
        vectors = self.engine.token_vectors(inputs, truncate=truncation)
        return [v[None] if return_tensors else v[None].tolist() for v in vectors]


class SentenceEmbeddingsPipeline(Pipeline):
    task = "sentence-embeddings"

    def run(self, inputs, truncation=True, normalize=None):
        return [v.tolist() for v in self.engine.embeddings(inputs, truncate=truncation, normalize=normalize)]


PIPELINES = {cls.task: cls for cls in (TextClassificationPipeline, TokenClassificationPipeline,
                                       QuestionAnsweringPipeline, FillMaskPipeline, FeatureExtractionPipeline,
                                       SentenceEmbeddingsPipeline)}
ALIASES = {"sentiment-analysis": "text-classification", "ner": "token-classification",
           "sentence-similarity": "sentence-embeddings"}
# Which model heads a task needs.
TASK_MODELS = {"text-classification": ("text-classification",), "token-classification": ("token-classification",),
               "question-answering": ("question-answering",), "fill-mask": ("fill-mask",),
               "feature-extraction": ("feature-extraction", "sentence-embeddings"),
               "sentence-embeddings": ("feature-extraction", "sentence-embeddings")}


def pipeline(task: str, model: str | Path, device: str = "auto", precision: str = "fp32",
             max_batch_tokens: int = 16384, quantize: str = "none", **defaults) -> Pipeline:
    """A ready pipeline for `task` on the model folder `model` (Hugging Face layout).

    precision "fp32" (default, matches transformers' numbers) or "auto" / "bf16" (faster where the
    CPU has bf16); quantize "int8" runs the encoder's Linear layers in dynamic int8. Extra keyword arguments become the call's defaults (e.g. top_k=None).
    """
    task = ALIASES.get(task, task)
    if task not in PIPELINES:
        raise BertkitError(f"unknown task {task!r}; choose from {', '.join(sorted([*PIPELINES, *ALIASES]))}")
    engine = model if isinstance(model, InferenceEngine) else InferenceEngine(
        model, device, precision, max_batch_tokens, quantize=quantize)
    if engine.task not in TASK_MODELS[task]:
        raise BertkitError(f"{task} needs a model for {' or '.join(TASK_MODELS[task])}, but this folder holds a "
                           f"{type(engine.model).__name__} ({engine.task})", path=str(engine.model_dir))
    return PIPELINES[task](engine, **defaults)


__all__ = ["pipeline", "Pipeline", "PIPELINES", "label_scores", "score_function", "token_entities", "qa_windows",
           "qa_answers", "mask_row", "fill_mask_results"]
