"""`bertkit.pipeline(task, model=...)`: predictions with the arguments and result shapes of transformers' pipelines.

    classify = bertkit.pipeline("text-classification", model="runs/sst2/model")
    classify("a gripping film")                     # [{"label": "positive", "score": 0.98}]

`model` is a model folder (or id) or a bertkit model object (then `tokenizer=` too: an object or a
folder); `device` an int (-1 the CPU, n cuda:n), a string or a torch.device; `batch_size` the
inputs per forward pass (default: batches bounded by `max_batch_tokens`). Every other keyword is
a default for the calls; one the task does not take is refused at construction, with the list of
those it takes. Defaults come from `answer_defaults` (shared with `bertkit predict` and `serve`).

Tasks and results (as transformers 4-5 give them; a single input gives one result, a list a list):
* text-classification: {"label", "score"} (top_k=None: every label, best first); the score is
  softmax over labels, sigmoid for one output or multi-label, the raw value for regression
  (function_to_apply="softmax" / "sigmoid" / "none" chooses).
* token-classification: entities {"entity", "score", "index", "word", "start", "end"} per token
  (aggregation_strategy="none") or {"entity_group", "score", "word", "start", "end"} for B-/I-
  runs ("simple"), after a vote per word ("first": its first token's label, "average": the label
  of its mean probabilities, "max": the label of its most confident token); "O" is left out;
  start/end are character offsets into the text.
* question-answering: {"score", "start", "end", "answer"}; score = p(start) * p(end) over the
  context tokens of a window, the best span of at most max_answer_len tokens over all windows,
  widened to whole words (align_to_words, transformers 4's default).
* fill-mask: {"score", "token", "token_str", "sequence"} for each "[MASK]" in the text; `targets`
  restricts the candidates (a word not in the vocabulary stands for its first word piece).
* zero-shot-classification: {"sequence", "labels", "scores"} from an NLI model (Yin et al. 2019):
  each candidate label becomes the hypothesis `hypothesis_template.format(label)`; scores are
  the softmax of the entailment logits over the labels, or with multi_label entailment against
  contradiction per label. The entailment label is found in config.id2label.
* feature-extraction: per text the (1, T, H) nested list of last-layer vectors;
  sentence-embeddings: one vector per text, pooled and normalised as the model folder says;
  sentence-similarity: {"source_sentence", "sentences"} -> one score per sentence,
  sentence-transformers' `similarity` (cosine unless the folder's config names another).
The functions below turn model outputs into these results; `predict` and `serve` share them.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Sequence

import torch

from .answer_defaults import (AGGREGATION_STRATEGIES, FILL_MASK, QUESTION_ANSWERING, TEXT_CLASSIFICATION,
                              TOKEN_CLASSIFICATION, ZERO_SHOT_CLASSIFICATION)
from ..device import DEFAULT_PRECISION, parse_dtype
from ..errors import BertkitError
from .engine import InferenceEngine
from ..batching.windows import check_is_max_context, doc_spans
from ..tokenizer import MASK

log = logging.getLogger("bertkit")

# ---------------------------------------------------------------- text classification

SCORE_FUNCTIONS = ("softmax", "sigmoid", "none")


def score_function(config, function_to_apply: str | None = None) -> str:
    """transformers' rule: regression -> none; one output or multi-label -> sigmoid; else softmax."""
    if function_to_apply is not None:
        name = getattr(function_to_apply, "value", function_to_apply)  # transformers' ClassificationFunction
        if not isinstance(name, str) or name.lower() not in SCORE_FUNCTIONS:
            raise BertkitError(f"function_to_apply must be softmax, sigmoid or none, not {function_to_apply!r}")
        return name.lower()
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
                   aggregation_strategy: str = TOKEN_CLASSIFICATION["aggregation_strategy"],
                   ignore_labels: Sequence[str] = TOKEN_CLASSIFICATION["ignore_labels"]) -> list[dict]:
    """Entities of one text from its (T, K) logits and its encoding (with offsets)."""
    if aggregation_strategy not in AGGREGATION_STRATEGIES:
        raise BertkitError(f"aggregation_strategy must be one of {', '.join(AGGREGATION_STRATEGIES)}, "
                           f"not {aggregation_strategy!r}")
    probabilities = torch.softmax(logits.float(), -1)
    tokens = []  # transformers' "pre-entities": every token but [CLS] / [SEP]
    for index, (token_id, sequence_id) in enumerate(zip(row["input_ids"], row["sequence_ids"])):
        if sequence_id is None:
            continue
        start, end = row["offsets"][index]
        word = tokenizer.ids_to_tokens[token_id]
        # A word piece shows as longer than its text ("##son" for "son"): it continues a word.
        is_subword = len(word) != end - start
        if token_id == tokenizer.unk_token_id:
            word, is_subword = text[start:end], False
        tokens.append({"word": word, "scores": probabilities[index], "start": start, "end": end, "index": index,
                       "is_subword": is_subword})
    if aggregation_strategy in ("none", "simple"):
        entities = [_token_entity(t, id2label) for t in tokens]
    else:
        entities = [_word_entity(word, aggregation_strategy, id2label, tokenizer) for word in _words(tokens)]
    if aggregation_strategy != "none":
        entities = _group_entities(entities, tokenizer)
    return [e for e in entities if e.get("entity", e.get("entity_group")) not in ignore_labels]


def _token_entity(token: dict, id2label) -> dict:
    best = int(token["scores"].argmax())
    return {"entity": id2label[best], "score": float(token["scores"][best]), "index": token["index"],
            "word": token["word"], "start": token["start"], "end": token["end"]}


def _words(tokens: list[dict]) -> list[list[dict]]:
    words: list[list[dict]] = []
    for token in tokens:
        if words and token["is_subword"]:
            words[-1].append(token)
        else:
            words.append([token])
    return words


def _word_entity(tokens: list[dict], strategy: str, id2label, tokenizer) -> dict:
    """One label per word (transformers' aggregate_word): its first token's, its most confident
    token's ("max"), or the best of its tokens' mean probabilities ("average")."""
    if strategy == "first":
        scores = tokens[0]["scores"]
    elif strategy == "max":
        scores = max(tokens, key=lambda t: float(t["scores"].max()))["scores"]
    else:
        scores = torch.stack([t["scores"] for t in tokens]).mean(0)
    best = int(scores.argmax())
    return {"entity": id2label[best], "score": float(scores[best]),
            "word": tokenizer.convert_tokens_to_string([t["word"] for t in tokens]),
            "start": tokens[0]["start"], "end": tokens[-1]["end"]}


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


def _word_offsets(tokens: Sequence[str], offsets: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Per word piece, the characters of the whole word it belongs to (a "##" piece continues the
    word before it: BERT's pre-tokenizer makes every other piece start a word)."""
    words: list[list[int]] = []
    for index, token in enumerate(tokens):
        if words and token.startswith("##"):
            words[-1].append(index)
        else:
            words.append([index])
    spans = [None] * len(tokens)
    for word in words:
        for index in word:
            spans[index] = (offsets[word[0]][0], offsets[word[-1]][1])
    return spans


def qa_windows(engine: InferenceEngine, question: str, context: str,
               max_question_len: int = QUESTION_ANSWERING["max_question_len"],
               doc_stride: int = QUESTION_ANSWERING["doc_stride"], truncate: bool = True,
               max_seq_len: int = QUESTION_ANSWERING["max_seq_len"]) -> list[dict]:
    """[CLS] question [SEP] context-window [SEP] rows of at most max_seq_len tokens (and the model's
    length) over the whole context, `doc_stride` tokens apart (the original's windows), each with
    `offsets`, `word_offsets`, `sequence_ids` and `context_start` (index of its first context token)."""
    tokenizer = engine.tokenizer
    if doc_stride < 1 or max_question_len < 1 or max_seq_len < 1:
        raise BertkitError("doc_stride, max_question_len and max_seq_len must be at least 1")
    length = min(max_seq_len, engine.max_length)
    q_row, c_row = tokenizer.encode_batch([question, context], max_length=None, truncation=False, return_offsets=True)
    q_ids = q_row["input_ids"][1:-1][:max_question_len]
    c_ids, c_offsets = c_row["input_ids"][1:-1], c_row["offsets"][1:-1]
    c_words = _word_offsets([tokenizer.ids_to_tokens[i] for i in c_ids], c_offsets)
    room = length - len(q_ids) - 3
    if room <= 0:
        raise BertkitError(f"the question leaves no room for context in {length} positions")
    if not truncate and len(c_ids) > room:
        raise BertkitError(f"question and context take {len(q_ids) + len(c_ids) + 3} tokens, more than the "
                           f"{length} of a window: shorten them or ask for truncation")
    spans = doc_spans(len(c_ids), room, doc_stride) or [(0, 0)]
    rows = []
    for span_index, (start, span_length) in enumerate(spans):
        ids = [tokenizer.cls_token_id, *q_ids, tokenizer.sep_token_id, *c_ids[start:start + span_length],
               tokenizer.sep_token_id]
        first = len(q_ids) + 2
        rows.append({
            "input_ids": ids,
            "token_type_ids": [0] * first + [1] * (span_length + 1),
            "attention_mask": [1] * len(ids),
            "offsets": [(0, 0)] * first + list(c_offsets[start:start + span_length]) + [(0, 0)],
            "word_offsets": [(0, 0)] * first + list(c_words[start:start + span_length]) + [(0, 0)],
            "context_start": first,
            "max_context": [check_is_max_context(spans, span_index, start + i) for i in range(span_length)],
        })
    return rows


def qa_answers(windows: list[dict], outputs: list[dict], context: str, top_k: int = QUESTION_ANSWERING["top_k"],
               max_answer_len: int = QUESTION_ANSWERING["max_answer_len"],
               handle_impossible_answer: bool = QUESTION_ANSWERING["handle_impossible_answer"],
               align_to_words: bool = True) -> list[dict]:
    """Best spans over a question's windows: score = softmax(start)[s] * softmax(end)[e] over
    [CLS] + the window's context tokens, s <= e < s + max_answer_len (transformers' rule); a span
    is kept in the window where its first token has its most context (the original's rule)."""
    if top_k < 1 or max_answer_len < 1:
        raise BertkitError("top_k and max_answer_len must be at least 1")
    candidates, null_score = [], 1.0
    for row, out in zip(windows, outputs):
        first, length = row["context_start"], len(row["input_ids"]) - row["context_start"] - 1
        if length == 0:
            continue
        allowed = torch.zeros(len(row["input_ids"]), dtype=torch.bool)
        allowed[0] = True
        allowed[first:first + length] = True
        start = torch.softmax(out["start_logits"].float().masked_fill(~allowed, -10000.0), -1)
        end = torch.softmax(out["end_logits"].float().masked_fill(~allowed, -10000.0), -1)
        null_score = min(null_score, float(start[0] * end[0]))
        start_c, end_c = start[first:first + length], end[first:first + length]
        scores = torch.triu(start_c[:, None] * end_c[None, :]).tril(max_answer_len - 1)  # (L, L)
        flat = scores.flatten()
        offsets = row["word_offsets"] if align_to_words else row["offsets"]
        spans = set()  # the window's best top_k distinct answers (word pieces of one word widen alike)
        for position in torch.argsort(flat, descending=True, stable=True).tolist():
            s, e = divmod(position, length)
            if len(spans) == top_k:
                break
            if not s <= e < s + max_answer_len or (not row["max_context"][s] and len(windows) > 1):
                continue
            char_start, char_end = offsets[first + s][0], offsets[first + e][1]
            if (char_start, char_end) not in spans:
                spans.add((char_start, char_end))
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


def target_ids(tokenizer, targets: str | Sequence[str]) -> list[int]:
    """The vocabulary ids `targets` name; a word not in the vocabulary stands for its first word
    piece (with a warning, as transformers)."""
    targets = [targets] if isinstance(targets, str) else list(targets)
    ids = []
    for target in targets:
        if not isinstance(target, str):
            raise BertkitError(f"targets must be strings, not {target!r}")
        if target in tokenizer.vocab:
            ids.append(tokenizer.vocab[target])
            continue
        pieces = tokenizer.encode_ids_batch([target])[0]
        if not pieces:
            raise BertkitError(f"target {target!r} has no token in the vocabulary")
        log.warning("target %r is not in the vocabulary: it stands for %r", target, tokenizer.ids_to_tokens[pieces[0]])
        ids.append(pieces[0])
    if not ids:
        raise BertkitError("targets is empty: give at least one token")
    return sorted(set(ids))


def fill_mask_results(tokenizer, row: dict, logits: torch.Tensor, top_k: int = FILL_MASK["top_k"],
                      targets: Sequence[int] | None = None) -> list[list[dict]]:
    """Per mask position, the top_k tokens (among `targets` ids when given) with their scores and
    the completed sequence (special tokens kept when there are several masks, as transformers)."""
    positions = [i for i, t in enumerate(row["input_ids"]) if t == tokenizer.mask_token_id]
    candidates = torch.tensor(targets) if targets is not None else None
    results = []
    for position in positions:
        probabilities = torch.softmax(logits[position].float(), -1)
        if candidates is not None:
            probabilities = probabilities[candidates]
        values, tokens = probabilities.topk(min(top_k, probabilities.numel()))
        if candidates is not None:
            tokens = candidates[tokens]
        entries = []
        for score, token in zip(values.tolist(), tokens.tolist()):
            filled = list(row["input_ids"])
            filled[position] = token
            entries.append({"score": score, "token": token, "token_str": tokenizer.decode([token]),
                            "sequence": tokenizer.decode(filled, skip_special_tokens=len(positions) == 1)})
        results.append(entries)
    return results


# ---------------------------------------------------------------- zero-shot classification


def entailment_id(id2label: dict[int, str]) -> int:
    """The NLI model's entailment label (the first whose name starts with "entail", as transformers)."""
    for index, label in id2label.items():
        if label.lower().startswith("entail"):
            return index
    raise BertkitError(f"zero-shot-classification needs an NLI model with an entailment label in config.json's "
                       f"id2label; this one has {', '.join(id2label.values())}")


def candidate_label_list(candidate_labels) -> list[str]:
    if isinstance(candidate_labels, str):  # "a, b, c", as transformers
        candidate_labels = [label.strip() for label in candidate_labels.split(",") if label.strip()]
    if not candidate_labels or not all(isinstance(label, str) for label in candidate_labels):
        raise BertkitError("zero-shot-classification needs candidate_labels: a list of strings (or 'a, b, c')")
    return list(candidate_labels)


def zero_shot_scores(logits: torch.Tensor, entailment: int, multi_label: bool) -> torch.Tensor:
    """(labels, classes) NLI logits of one sequence -> a score per label: softmax of the entailment
    logits over the labels, or (multi_label, or a single label) entailment vs. contradiction per label."""
    logits = logits.float()
    if multi_label or logits.shape[0] == 1:
        contradiction = -1 if entailment == 0 else 0  # transformers' choice of the contradiction column
        return torch.softmax(logits[:, [contradiction, entailment]], -1)[:, 1]
    return torch.softmax(logits[:, entailment], -1)


# ---------------------------------------------------------------- sentence similarity

SIMILARITY_FUNCTIONS = {
    "cosine": lambda a, b: torch.nn.functional.normalize(a, dim=-1) @ torch.nn.functional.normalize(b, dim=-1).T,
    "dot": lambda a, b: a @ b.T,
    "euclidean": lambda a, b: -torch.cdist(a, b, p=2.0),
    "manhattan": lambda a, b: -torch.cdist(a, b, p=1.0),
}


def similarity_function_name(model_dir: Path | None) -> str:
    """sentence-transformers' `similarity_fn_name` from the folder's config (cosine by default)."""
    path = model_dir / "config_sentence_transformers.json" if model_dir is not None else None
    if path is None or not path.is_file():
        return "cosine"
    try:
        name = json.loads(path.read_text(encoding="utf-8")).get("similarity_fn_name") or "cosine"
    except (ValueError, AttributeError):
        raise BertkitError("not a JSON object", path=str(path)) from None
    if name not in SIMILARITY_FUNCTIONS:
        raise BertkitError(f"similarity_fn_name {name!r} is unknown; choose from {', '.join(SIMILARITY_FUNCTIONS)}",
                           path=str(path))
    return name


# ---------------------------------------------------------------- the pipeline objects


class Pipeline:
    """A loaded model answering one task; call it on a text or a list of texts.

    `options`: the call options the task takes, with their defaults; those given at construction
    replace the defaults, those given to a call apply to that call."""

    task = ""
    options: dict = {}

    def __init__(self, engine: InferenceEngine, **defaults):
        self.engine = engine
        self.tokenizer, self.model = engine.tokenizer, engine.model
        self.defaults = self.checked(defaults)

    @classmethod
    def checked(cls, options: dict) -> dict:
        unknown = [name for name in options if name not in cls.options]
        if unknown:
            raise BertkitError(f"{cls.task} does not take {', '.join(unknown)}; its options are "
                               f"{', '.join(cls.options) or 'none'} (and at construction {', '.join(ENGINE_ARGUMENTS)})")
        return options

    def __call__(self, inputs, **options):
        options = {**self.options, **self.defaults, **self.checked(options)}
        single = isinstance(inputs, (str, dict))
        results = self.run([inputs] if single else list(inputs), **options)
        return results[0] if single else results

    def run(self, inputs: list, **options) -> list:
        raise NotImplementedError


class TextClassificationPipeline(Pipeline):
    task = "text-classification"
    options = {**TEXT_CLASSIFICATION, "truncation": True}

    def __call__(self, inputs, **options):
        # transformers: without an explicit top_k a single text gives a one-element list ([{"label", "score"}]).
        explicit_top_k = "top_k" in self.defaults or "top_k" in options
        options = {**self.options, **self.defaults, **self.checked(options)}
        single = isinstance(inputs, (str, dict))
        results = self.run([inputs] if single else list(inputs), **options)
        if explicit_top_k:
            return results[0] if single else results
        if isinstance(inputs, dict):  # one {"text", "text_pair"}: the dict itself, as transformers
            return results[0][0]
        return [r[0] for r in results]

    def run(self, inputs, top_k, function_to_apply, truncation):
        texts = [x["text"] if isinstance(x, dict) else x for x in inputs]
        pairs = [x["text_pair"] for x in inputs] if inputs and isinstance(inputs[0], dict) else None
        function = score_function(self.engine.config, function_to_apply)
        return [label_scores(logits, self.engine.id2label, function, top_k)
                for logits in self.engine.logits(texts, pairs, truncate=truncation)]


class TokenClassificationPipeline(Pipeline):
    task = "token-classification"
    options = {**TOKEN_CLASSIFICATION, "truncation": True}

    def run(self, inputs, aggregation_strategy, ignore_labels, truncation):
        if aggregation_strategy not in AGGREGATION_STRATEGIES:  # before the model runs
            raise BertkitError(f"aggregation_strategy must be one of {', '.join(AGGREGATION_STRATEGIES)}, "
                               f"not {aggregation_strategy!r}")
        rows = self.engine.encode(inputs, truncate=truncation, return_offsets=True)
        outputs = self.engine.forward(rows)
        return [token_entities(text, out["logits"], row, self.tokenizer, self.engine.id2label,
                               aggregation_strategy, ignore_labels)
                for text, row, out in zip(inputs, rows, outputs)]


class QuestionAnsweringPipeline(Pipeline):
    task = "question-answering"
    options = {**QUESTION_ANSWERING, "align_to_words": True, "truncation": True}

    def __call__(self, inputs=None, question=None, context=None, **options):
        if inputs is None:
            if question is None or context is None:
                raise BertkitError("question-answering needs question= and context= (or dicts with both)")
            if isinstance(question, str) != isinstance(context, str):
                raise BertkitError("question and context must both be strings or both be lists")
            inputs = {"question": question, "context": context} if isinstance(question, str) else \
                [{"question": q, "context": c} for q, c in zip(question, context)]
        return super().__call__(inputs, **options)

    def run(self, inputs, top_k, max_answer_len, max_seq_len, doc_stride, max_question_len,
            handle_impossible_answer, align_to_words, truncation):
        windows, owners = [], []
        for number, item in enumerate(inputs):
            if not isinstance(item, dict) or not isinstance(item.get("question"), str) \
                    or not isinstance(item.get("context"), str):
                raise BertkitError(f"input {number} must be a dict with string fields question and context")
            for window in qa_windows(self.engine, item["question"], item["context"], max_question_len,
                                     doc_stride, truncation, max_seq_len):
                windows.append(window)
                owners.append(number)
        outputs = self.engine.forward(windows, ("start_logits", "end_logits"))
        results = []
        for number, item in enumerate(inputs):
            mine = [i for i, owner in enumerate(owners) if owner == number]
            answers = qa_answers([windows[i] for i in mine], [outputs[i] for i in mine], item["context"], top_k,
                                 max_answer_len, handle_impossible_answer, align_to_words)
            results.append(answers[0] if top_k == 1 else answers)
        return results


class FillMaskPipeline(Pipeline):
    task = "fill-mask"
    options = dict(FILL_MASK)

    def run(self, inputs, top_k, targets):
        ids = target_ids(self.tokenizer, targets) if targets is not None else None
        rows = [mask_row(self.tokenizer, text, self.engine.max_length) for text in inputs]
        results = []
        for row, out in zip(rows, self.engine.forward(rows)):
            per_mask = fill_mask_results(self.tokenizer, row, out["logits"], top_k, ids)
            results.append(per_mask[0] if len(per_mask) == 1 else per_mask)
        return results


class ZeroShotClassificationPipeline(Pipeline):
    task = "zero-shot-classification"
    options = {**ZERO_SHOT_CLASSIFICATION, "candidate_labels": None, "truncation": True}

    def __call__(self, sequences, candidate_labels=None, **options):
        if candidate_labels is not None:
            options["candidate_labels"] = candidate_labels
        return super().__call__(sequences, **options)

    def run(self, inputs, candidate_labels, hypothesis_template, multi_label, truncation):
        labels = candidate_label_list(candidate_labels)
        if hypothesis_template.format(labels[0]) == hypothesis_template:
            raise BertkitError(f"hypothesis_template {hypothesis_template!r} has no {{}} for the label")
        entailment = entailment_id(self.engine.id2label)
        hypotheses = [hypothesis_template.format(label) for label in labels]
        texts = [text for text in inputs for _ in labels]
        logits = self.engine.logits(texts, hypotheses * len(inputs), truncate=truncation)  # only the text is cut
        results = []
        for number, sequence in enumerate(inputs):
            scores = zero_shot_scores(torch.stack(logits[number * len(labels):(number + 1) * len(labels)]),
                                      entailment, multi_label)
            order = torch.argsort(scores, descending=True, stable=True).tolist()
            results.append({"sequence": sequence, "labels": [labels[i] for i in order],
                            "scores": [float(scores[i]) for i in order]})
        return results


class FeatureExtractionPipeline(Pipeline):
    task = "feature-extraction"
    options = {"truncation": True, "return_tensors": False}

    def run(self, inputs, truncation, return_tensors):
        vectors = self.engine.token_vectors(inputs, truncate=truncation)
        return [v[None] if return_tensors else v[None].tolist() for v in vectors]


class SentenceEmbeddingsPipeline(Pipeline):
    task = "sentence-embeddings"
    options = {"truncation": True, "normalize": None}

    def run(self, inputs, truncation, normalize):
        return [v.tolist() for v in self.engine.embeddings(inputs, truncate=truncation, normalize=normalize)]


class SentenceSimilarityPipeline(Pipeline):
    """{"source_sentence": str, "sentences": [str]} -> a score per sentence (the Hub's task shape)."""

    task = "sentence-similarity"
    options = {"truncation": True}

    def __call__(self, inputs=None, sentences=None, **options):
        if sentences is not None:  # similarity(source_sentence, sentences)
            inputs = {"source_sentence": inputs, "sentences": sentences}
        return super().__call__(inputs, **options)

    def run(self, inputs, truncation):
        function = SIMILARITY_FUNCTIONS[similarity_function_name(self.engine.model_dir)]
        results = []
        for number, item in enumerate(inputs):
            source, sentences = (item.get("source_sentence"), item.get("sentences")) if isinstance(item, dict) else (None, None)
            if not isinstance(source, str) or not isinstance(sentences, list) or not sentences \
                    or not all(isinstance(s, str) for s in sentences):
                raise BertkitError(f"input {number} must be {{'source_sentence': str, 'sentences': [str, ...]}}")
            vectors = torch.stack(self.engine.embeddings([source, *sentences], truncate=truncation))
            results.append(function(vectors[:1], vectors[1:])[0].tolist())
        return results


PIPELINES = {cls.task: cls for cls in (TextClassificationPipeline, TokenClassificationPipeline,
                                       QuestionAnsweringPipeline, FillMaskPipeline, ZeroShotClassificationPipeline,
                                       FeatureExtractionPipeline, SentenceEmbeddingsPipeline,
                                       SentenceSimilarityPipeline)}
ALIASES = {"sentiment-analysis": "text-classification", "ner": "token-classification"}
# Which model heads a task needs.
TASK_MODELS = {"text-classification": ("text-classification",), "token-classification": ("token-classification",),
               "question-answering": ("question-answering",), "fill-mask": ("fill-mask",),
               "zero-shot-classification": ("text-classification",),
               "feature-extraction": ("feature-extraction", "sentence-embeddings"),
               "sentence-embeddings": ("feature-extraction", "sentence-embeddings"),
               "sentence-similarity": ("feature-extraction", "sentence-embeddings")}
# What pipeline() itself takes besides the task's call options.
ENGINE_ARGUMENTS = ("model", "revision", "tokenizer", "device", "batch_size", "dtype", "torch_dtype",
                    "precision", "max_batch_tokens", "quantize", "compile")


def device_name(device) -> str:
    """transformers' device argument: an int (-1 the CPU, n cuda:n), a string or a torch.device."""
    if device is None:
        return "auto"
    if isinstance(device, torch.device):
        return str(device)
    if isinstance(device, bool) or not isinstance(device, (int, str)):
        raise BertkitError(f"device must be an int, a string or a torch.device, not {device!r}")
    if isinstance(device, int):
        return "cpu" if device < 0 else f"cuda:{device}"
    return device


def pipeline(task: str, model=None, tokenizer=None, device=None, batch_size: int | None = None,
             dtype: torch.dtype | str | None = None, torch_dtype: torch.dtype | str | None = None,
             precision: str = DEFAULT_PRECISION, max_batch_tokens: int = 16384, quantize: str = "none",
             revision: str | None = None, compile: bool = False, **defaults) -> Pipeline:
    """A ready pipeline for `task` on `model`: a folder in the Hugging Face layout or a Hub id (at
    `revision`), a bertkit model object, or a ready InferenceEngine.

    `dtype` (alias `torch_dtype`): the weights' dtype (e.g. torch.bfloat16), as transformers;
    precision "fp32" (default, as predict and serve: transformers' numbers) or "bf16" / "auto" (bf16
    autocast; "auto" only where the CPU or GPU has native bf16); quantize "int8" runs the encoder's Linear layers in dynamic int8;
    `compile` runs lone inputs (at bf16 and int8 up to four) through a graph compiled ahead for this model and
    CPU (fp32, bf16 or, with quantize "int8" on a CPU with VNNI, AMX or AVX2, int8; inference/compiled.py). Extra
    keyword arguments become the calls' defaults (e.g. top_k=None); unknown ones are refused.
    """
    task = ALIASES.get(task, task)
    if task not in PIPELINES:
        raise BertkitError(f"unknown task {task!r}; choose from {', '.join(sorted([*PIPELINES, *ALIASES]))}")
    if model is None:
        raise BertkitError(f"pipeline({task!r}) needs model=: a model folder or id, or a bertkit model object")
    PIPELINES[task].checked(defaults)  # refuse unknown options before loading anything
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        raise BertkitError(f"batch_size must be a positive integer, not {batch_size!r}")
    if dtype is not None and torch_dtype is not None and dtype != torch_dtype:
        raise BertkitError("give dtype or torch_dtype (its old name), not both")
    dtype = parse_dtype(dtype if dtype is not None else torch_dtype)
    if quantize == "int8" and dtype not in (None, torch.float32):
        raise BertkitError("int8 quantisation runs with fp32 activations: drop dtype= or quantize=")
    if compile and dtype not in (None, torch.float32):
        raise BertkitError("compile needs the fp32 weights: drop dtype= (precision=\"bf16\" computes in bf16)")
    if isinstance(model, InferenceEngine):
        if tokenizer is not None or device is not None:
            raise BertkitError("a ready InferenceEngine has its tokenizer and device: pass neither")
        if compile:
            raise BertkitError("a ready InferenceEngine was made with or without compile: give it InferenceEngine(..., compile=True)")
        engine = model
    elif isinstance(model, (str, Path)):
        engine = InferenceEngine(model, device_name(device), precision, max_batch_tokens, quantize=quantize,
                                 tokenizer=tokenizer, revision=revision, compile=compile)
    else:
        engine = InferenceEngine(None, device_name(device), precision, max_batch_tokens, quantize=quantize,
                                 model=model, tokenizer=tokenizer, compile=compile)
    if dtype is not None:
        engine.model.to(dtype)
    if batch_size is not None:
        engine.max_batch_size = batch_size
    if engine.task not in TASK_MODELS[task]:
        raise BertkitError(f"{task} needs a model for {' or '.join(TASK_MODELS[task])}, but this model is a "
                           f"{type(engine.model).__name__} ({engine.task})",
                           path=str(engine.model_dir) if engine.model_dir is not None else None)
    return PIPELINES[task](engine, **defaults)


__all__ = ["pipeline", "Pipeline", "PIPELINES", "label_scores", "score_function", "token_entities", "qa_windows",
           "qa_answers", "mask_row", "fill_mask_results", "target_ids", "zero_shot_scores", "entailment_id",
           "device_name"]
