"""Model cards: the README.md the Hugging Face Hub shows for a model folder (YAML front matter, then
Markdown), so a folder bertkit saved can be uploaded as it is (`hf upload org/name FOLDER`).

The front matter follows the Hub's model-card metadata (library_name, base_model, pipeline_tag, tags,
datasets); the body says what the model does and how it was made: task, labels, data files,
hyper-parameters, dev results and the bertkit version, read from the run's own records
(`results.json` beside the model folder, `train_summary.json` / `pretrain_args.json` in it).
A README.md that bertkit did not write (a copied model's own card) is kept as it is.
"""

from __future__ import annotations

import json
from pathlib import Path

from .resolve import hub_id_of, looks_like_hub_id
from ..outputs import atomic_write_text

CARD_NAME = "README.md"
MARK = "<!-- written by bertkit: rewritten whenever bertkit saves this folder -->"

PIPELINE_TAGS = {
    "BertForSequenceClassification": "text-classification",
    "BertForTokenClassification": "token-classification",
    "BertForQuestionAnswering": "question-answering",
    "BertForMaskedLM": "fill-mask",
    "BertForPreTraining": "fill-mask",
    "BertModel": "feature-extraction",
}
AUTO_CLASSES = {
    "BertForSequenceClassification": "AutoModelForSequenceClassification",
    "BertForTokenClassification": "AutoModelForTokenClassification",
    "BertForQuestionAnswering": "AutoModelForQuestionAnswering",
    "BertForMultipleChoice": "AutoModelForMultipleChoice",
    "BertForMaskedLM": "AutoModelForMaskedLM",
    "BertForPreTraining": "AutoModelForPreTraining",
}
TASK_TEXT = {
    "text-classification": "sentence (pair) classification",
    "token-classification": "token classification (tagging)",
    "question-answering": "extractive question answering (SQuAD-style spans)",
    "fill-mask": "masked language modelling (a pre-trained encoder to fine-tune)",
    "feature-extraction": "feature extraction (token vectors from the encoder)",
    "sentence-similarity": "sentence embeddings",
    "sentence-embeddings": "sentence embeddings (semantic search, similarity, clustering)",
    "multiple-choice": "multiple choice",
    "cross-encoder": "reranking (a cross-encoder: one relevance logit per query and passage)",
}
# Benchmarks whose data bertkit reads, as Hub dataset ids.
KNOWN_DATASETS = {"squad": "rajpurkar/squad", "ner": "eriktks/conll2003", "ner-feature-based": "eriktks/conll2003",
                  "swag": "allenai/swag"}
GLUE_TASKS = {"cola", "sst-2", "sst2", "mrpc", "sts-b", "stsb", "qqp", "mnli", "qnli", "rte", "wnli"}


def is_bertkit_card(path: Path) -> bool:
    try:
        return MARK in path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False


def _yaml_value(value) -> str:
    return json.dumps(value, ensure_ascii=False)  # JSON scalars are valid YAML


def _front_matter(fields: dict) -> str:
    lines = ["---"]
    for key, value in fields.items():
        if value in (None, [], ""):
            continue
        if isinstance(value, list):
            lines.append(f"{key}:")
            lines.extend(f"- {_yaml_value(v)}" for v in value)
        else:
            lines.append(f"{key}: {_yaml_value(value)}")
    return "\n".join(lines + ["---", ""])


def _read_json(path: Path) -> dict | None:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _base_model(reference) -> str | None:
    """The Hub id a model came from, when it came from the Hub (a cached snapshot or an id as given)."""
    if reference is None:
        return None
    return hub_id_of(reference) or (str(reference) if looks_like_hub_id(str(reference))
                                    and not Path(str(reference)).exists() else None)


def _table(rows: list[tuple[str, object]]) -> list[str]:
    return ["| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows]


def _number(value) -> str:
    if isinstance(value, float):
        return f"{value:.4f}" if value == 0 or abs(value) >= 1e-3 else f"{value:g}"  # learning rates: 2e-05
    return str(value)


def _run_record(directory: Path) -> dict:
    """What the run that made this folder recorded: fine-tuning's results.json (beside the folder),
    pre-training's train_summary.json / pretrain_args.json (inside it)."""
    results = _read_json(directory.parent / "results.json")
    if results is not None and (directory.name == "model"):
        return {"kind": "finetune", "results": results}
    summary, args = _read_json(directory / "train_summary.json"), _read_json(directory / "pretrain_args.json")
    if summary is not None or args is not None:
        return {"kind": "pretrain", "summary": summary or {}, "args": args or {}}
    return {}


def card_text(directory: Path, config, base_model=None) -> str:
    architecture = (config.architectures or ["BertModel"])[0]
    sentence_transformers = (directory / "modules.json").is_file()
    pipeline_tag = "sentence-similarity" if sentence_transformers else PIPELINE_TAGS.get(architecture)
    record = _run_record(directory)
    results = record.get("results", {})
    task = results.get("task") or ("multiple-choice" if architecture == "BertForMultipleChoice" else pipeline_tag)
    base = _base_model(base_model) or _base_model(results.get("model")) or _base_model(
        record.get("args", {}).get("init_from"))
    datasets = []
    if str(task).lower() in KNOWN_DATASETS:
        datasets.append(KNOWN_DATASETS[str(task).lower()])
    elif str(task).lower() in GLUE_TASKS:
        datasets.append("nyu-mll/glue")
    from ..version import __version__

    reranker = task == "cross-encoder"  # sentence-transformers' CrossEncoder; the Hub's text-ranking
    tags = ["bertkit", "bert"] + ([task] if task and task != pipeline_tag else []) + (
        ["sentence-transformers"] if sentence_transformers or reranker else []) + (["reranker"] if reranker else [])
    front = _front_matter({
        "library_name": "sentence-transformers" if sentence_transformers or reranker else "transformers",
        "base_model": base, "pipeline_tag": "text-ranking" if reranker else pipeline_tag, "tags": tags,
        "datasets": datasets,
        "license": None,
    })
    name = hub_id_of(directory) or directory.resolve().name
    if directory.name == "model" and directory.resolve().parent.name:
        name = directory.resolve().parent.name
    made = (f"fine-tuned from [{base}](https://huggingface.co/{base})" if base and record.get("kind") == "finetune"
            else f"pre-trained from [{base}](https://huggingface.co/{base})" if base
            else "fine-tuned with bertkit" if record.get("kind") == "finetune"
            else "pre-trained with bertkit" if record.get("kind") == "pretrain" else "saved with bertkit")
    body = [MARK, "", f"# {name}", "",
            f"A BERT model (Devlin et al., 2019) for {TASK_TEXT.get(task, task or 'feature extraction')}, {made} "
            f"(bertkit {__version__}). It is a standard `{architecture}` in the Hugging Face layout: bertkit, "
            "transformers and the Hub's widgets load it as it is.", ""]
    body += ["## Model", ""] + _table([
        ("architecture", f"`{architecture}`"), ("layers", config.num_hidden_layers),
        ("hidden size", config.hidden_size),
        ("attention heads", config.num_attention_heads), ("vocabulary", config.vocab_size),
        ("max positions", config.max_position_embeddings)]) + [""]
    labels = config.id2label or {}
    if labels and architecture in ("BertForSequenceClassification", "BertForTokenClassification"):
        body += ["## Labels", "", "| id | label |", "|---|---|"]
        body += [f"| {i} | {label} |" for i, label in sorted((int(k), v) for k, v in labels.items())] + [""]
    if record.get("kind") == "finetune":
        files = [(k.replace("_", " "), f"`{Path(str(v)).name}`") for k, v in results.items()
                 if k.endswith("_file") and v]
        rows = [(f"{split} rows", results[key]) for split, key in (("train", "num_train_examples"),
                                                                    ("dev", "num_dev_examples")) if results.get(key)]
        if files:
            body += ["## Data", ""] + _table(files + (rows if sentence_transformers else [])) + [""]
        training = [(k, results[k]) for k in ("loss", "pooling") if results.get(k)]
        if training and sentence_transformers:
            body += ["## Training", ""] + _table(training) + [""]
        best = results.get("best") or {}
        config_used = best.get("config") or results.get("config") or {}
        if config_used:
            body += ["## Hyper-parameters", ""] + _table([(k.replace("_", " "), _number(v))
                                                           for k, v in config_used.items()]) + [""]
        metrics = best.get("metrics") or best.get("dev") or results.get("metrics") or {}
        flat = [(k, _number(v)) for k, v in metrics.items() if isinstance(v, (int, float))]
        if flat:
            body += ["## Dev results", "", "Of the run selected on the dev set (fractions):", ""] + _table(flat) + [""]
    elif record.get("kind") == "pretrain":
        args, summary = record["args"], record["summary"]
        settings = {"objective": args.get("objective"), "next sentence prediction": args.get("nsp"),
                    "training data": f"`{Path(str(args['data'])).name}`" if args.get("data") else None,
                    **{k.replace("_", " "): v for k, v in (args.get("recipe") or {}).items() if v is not None},
                    "steps": summary.get("global_step", args.get("steps")), "sequences": summary.get("sequences"),
                    "precision": args.get("precision"), "seed": args.get("seed")}
        rows = [(k, _number(v)) for k, v in settings.items() if v is not None]
        if rows:
            body += ["## Pre-training", ""] + _table(rows) + [""]
        deviations = args.get("deviations_from_paper") or []
        if deviations:
            body += ["Deviations from the paper's setup: " + "; ".join(map(str, deviations)) + ".", ""]
    reference = hub_id_of(directory) or "PATH/TO/THIS/FOLDER"
    if reranker:
        if results.get("loss_class"):
            body += [f"Trained with sentence-transformers' `{results['loss_class']}` (`--loss {results.get('loss')}`).",
                     ""]
        body += ["## Usage", "", "```python", "from sentence_transformers import CrossEncoder", "",
                 f'model = CrossEncoder("{reference}")  # sigmoid of the logit, as config.json says',
                 'scores = model.predict([("a query", "a passage"), ("a query", "another passage")])', "```", "",
                 f"or `bertkit serve --model {reference}` (POST /rerank: the same scores), or `bertkit predict "
                 f"text-classification --model {reference} --input FILE --output OUT.jsonl` (text, text_pair; "
                 "the logit as `value`).", ""]
        return front + "\n".join(body)
    if sentence_transformers:
        body += ["## Usage", "", "```python", "from sentence_transformers import SentenceTransformer", "",
                 f'model = SentenceTransformer("{reference}")',
                 'embeddings = model.encode(["A sentence to embed.", "Another one."])', "```", "",
                 f"or `bertkit predict embeddings --model {reference} --input FILE --output OUT.jsonl`, "
                 f'`bertkit.pipeline("sentence-embeddings", model="{reference}")`, `bertkit serve --model {reference}`.',
                 ""]
        return front + "\n".join(body)
    auto = AUTO_CLASSES.get(architecture, "AutoModel")
    body += ["## Usage", "", "```python", f"from transformers import {auto}, AutoTokenizer",
             "", f'tokenizer = AutoTokenizer.from_pretrained("{reference}")',
             f'model = {auto}.from_pretrained("{reference}")', "```", "",
             f"or `bertkit predict {task if task in TASK_TEXT and task != 'fill-mask' else 'fill-mask'} --model "
             f"{reference} --input FILE --output OUT.jsonl`.", ""]
    return front + "\n".join(body)


def write_model_card(directory: str | Path, config, base_model=None) -> Path | None:
    """Write (or refresh) the folder's card; a README.md bertkit did not write is left alone."""
    directory = Path(directory)
    path = directory / CARD_NAME
    if path.exists() and not is_bertkit_card(path):
        return None
    atomic_write_text(path, card_text(directory, config, base_model))
    return path


def refresh_model_cards(output: str | Path) -> None:
    """After a command that saved models under `output`: rewrite their cards with what the run recorded
    once it finished (results.json is written after the model)."""
    from ..config import BertConfig

    output = Path(output)
    for config_file in [output / "config.json", *output.glob("model/config.json"), *output.glob("*/model/config.json")]:
        card = config_file.parent / CARD_NAME
        if config_file.is_file() and card.is_file() and is_bertkit_card(card):
            text = card.read_text(encoding="utf-8")
            base = next((line.split(":", 1)[1].strip().strip('"') for line in text.splitlines()
                         if line.startswith("base_model:")), None)
            write_model_card(config_file.parent, BertConfig.from_json_file(config_file), base)
