"""Held-out text for pre-training evaluation: text that no pre-training corpus contains.

Held-out *documents* of the training files still share their books, authors and articles'
neighbours with the training text. A cleaner test of what pre-training learned is text from
elsewhere: the Wikipedia paragraphs of a SQuAD-format file (the questions are not used), minus
every article whose title also opens a document of the given corpora (BERT-format corpora
start each document with its title line). The result is written in BERT's corpus format, one
sentence per line and a blank line between articles, ready for `create-pretraining-data`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from ..errors import BertkitError
from .corpus import iter_documents, split_sentences


def corpus_titles(corpus_files: Iterable[str | Path]) -> set[str]:
    """Normalised first lines (titles) of every document in BERT-format corpus files."""
    return {_normalise_title(doc[0]) for doc in iter_documents(corpus_files) if doc}


def _normalise_title(text: str) -> str:
    return text.strip().strip("[]").replace("_", " ").strip().lower()


def squad_articles(path: str | Path) -> list[tuple[str, list[str]]]:
    """(title, paragraphs) for every article of a SQuAD-format JSON file."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BertkitError("file not found", path=str(path)) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BertkitError(f"not valid JSON ({e})", path=str(path)) from None
    articles = data.get("data") if isinstance(data, dict) else None
    if not isinstance(articles, list):
        raise BertkitError("expected a SQuAD-format object with a 'data' list", path=str(path))
    out = []
    for i, article in enumerate(articles):
        paragraphs = article.get("paragraphs") if isinstance(article, dict) else None
        if not isinstance(paragraphs, list):
            raise BertkitError(f"article {i} has no 'paragraphs' list", path=str(path))
        texts = [p["context"] for p in paragraphs if isinstance(p, dict) and isinstance(p.get("context"), str)]
        out.append((str(article.get("title", f"article {i}")), texts))
    return out


def write_heldout_corpus(squad_files: Iterable[str | Path], output: str | Path,
                         exclude_corpora: Iterable[str | Path] = ()) -> dict:
    """Write the articles of `squad_files` not titled like any document of `exclude_corpora`.

    Returns counts: articles kept / excluded, sentences, characters.
    """
    excluded_titles = corpus_titles(exclude_corpora)
    kept = excluded = sentences = chars = 0
    seen: set[str] = set()
    lines: list[str] = []
    for squad_file in squad_files:
        for title, paragraphs in squad_articles(squad_file):
            key = _normalise_title(title)
            if key in excluded_titles or key in seen:
                excluded += 1
                continue
            seen.add(key)
            kept += 1
            lines.append(f"[{title.replace('_', ' ')}]")
            for paragraph in paragraphs:
                for sentence in split_sentences(paragraph):
                    lines.append(sentence)
                    sentences += 1
                    chars += len(sentence)
            lines.append("")
    if not kept:
        raise BertkitError("no article left after excluding the corpora's titles", path=str(output))
    Path(output).write_text("\n".join(lines), encoding="utf-8")
    return {"articles": kept, "articles_excluded": excluded, "sentences": sentences, "characters": chars}


__all__ = ["write_heldout_corpus", "corpus_titles", "squad_articles"]
