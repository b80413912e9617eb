"""Tokens added to a trained vocabulary (transformers' `add_tokens` / `add_special_tokens`): each is
matched whole in the text before WordPiece runs, anywhere in it ("anewwordb" -> a, newword, b), as
the `tokenizers` library's added vocabulary does; a normalised (non-special) one is matched after
lower-casing when the tokenizer lower-cases. Ids follow the vocabulary (len(tokenizer) on), and
tokenizer.json keeps them, so a saved folder loads with them in bertkit and in transformers."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable

from tokenizers import AddedToken

from ..errors import BertkitError
from .vocabulary import SPECIAL_TOKENS, _read_json_object


def as_added_tokens(tokens, special: bool) -> list[AddedToken]:
    """A str, an AddedToken or a list of them, as transformers takes them: a plain str becomes a
    special token (matched as typed) or a normalised one."""
    listed = [tokens] if isinstance(tokens, (str, AddedToken)) else list(tokens)
    out = []
    for token in listed:
        if isinstance(token, str):
            token = AddedToken(token, special=special, normalized=not special)
        if not isinstance(token, AddedToken):
            raise TypeError(f"a token to add must be a str or a tokenizers.AddedToken, not {type(token).__name__}")
        if not token.content:
            raise ValueError("cannot add an empty token")
        out.append(token)
    return out


def split_pattern(tokens: Iterable[AddedToken], lowercase: bool) -> re.Pattern | None:
    """One regex finding every token (longest first); normalised ones case-blind when lower-casing."""
    alternatives = []
    for token in sorted(tokens, key=lambda t: len(t.content), reverse=True):
        escaped = re.escape(token.content)
        alternatives.append(f"(?i:{escaped})" if lowercase and token.normalized else escaped)
    return re.compile("|".join(alternatives)) if alternatives else None


def segments(text: str, pattern: re.Pattern | None, canonical: dict[str, str]) -> list[tuple[str, int, str | None]]:
    """(piece, start, token or None): the text cut at the tokens `pattern` finds; `canonical` maps
    what matched (as typed, or lower-cased) to the token's own spelling."""
    if pattern is None:
        return [(text, 0, None)] if text else []
    out, position = [], 0
    for match in pattern.finditer(text):
        if match.start() > position:
            out.append((text[position:match.start()], position, None))
        found = match.group()
        out.append((found, match.start(), canonical.get(found) or canonical[found.lower()]))
        position = match.end()
    if position < len(text):
        out.append((text[position:], position, None))
    return out


def saved_added_tokens(tokenizer_json: Path) -> list[tuple[int, AddedToken]]:
    """The added tokens a tokenizer.json holds besides BERT's own five, in id order."""
    if not tokenizer_json.is_file():
        return []
    entries = _read_json_object(tokenizer_json).get("added_tokens") or []
    out = []
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("content"), str) or not isinstance(entry.get("id"), int):
            raise BertkitError(f"added_tokens entries need a content string and an id, not {entry!r}",
                               path=str(tokenizer_json))
        if entry["content"] in SPECIAL_TOKENS:
            continue
        out.append((entry["id"], AddedToken(entry["content"], special=bool(entry.get("special", False)),
                                            normalized=bool(entry.get("normalized", True)),
                                            single_word=bool(entry.get("single_word", False)),
                                            lstrip=bool(entry.get("lstrip", False)),
                                            rstrip=bool(entry.get("rstrip", False)))))
    return sorted(out, key=lambda pair: pair[0])
