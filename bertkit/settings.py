"""Settings dataclasses that are their own command line: each field names its flag, type and help
(`setting(...)`), `add_arguments` makes the argparse flags from the fields, and `from_args` reads a
whole value back. One field, one flag, one default: no parser restates a default, so a setting is
written down once (fine-tuning's tasks/settings.py, pre-training's pretraining/options.py).

The parser holds no defaults (argparse.SUPPRESS): a flag left out is absent from the parsed
namespace and takes the dataclass's default (or the one a caller states, e.g. a task's learning
rates), so `given(args)` also tells a value typed on the command line from a default.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Callable, Iterable

MISSING = dataclasses.MISSING


def setting(default: Any = MISSING, *, help: str, type: Callable | None = None, flag: str | None = None,
            action: str | None = None, choices: Iterable | None = None, metavar: str | None = None,
            cli: bool = True, show_default: bool = True):
    """A dataclass field that is also a flag: `--field-name` unless `flag`; `type` an argparse type
    (bertkit.flags); `action` "store_true" for a switch. `cli` False: a field set by code only."""
    metadata = dict(help=help, type=type, flag=flag, action=action, choices=None if choices is None else tuple(choices),
                    metavar=metavar, cli=cli, show_default=show_default)
    return dataclasses.field(default=default, metadata=metadata)


def flag_of(field: dataclasses.Field) -> str:
    return field.metadata.get("flag") or "--" + field.name.replace("_", "-")


def cli_fields(cls) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if f.metadata.get("cli")]


def shown(value) -> str:
    """A default as --help prints it: 5e-05 as 5e-5, lists comma-joined."""
    if isinstance(value, (list, tuple)):
        return ",".join(shown(v) for v in value)
    if isinstance(value, float):
        return f"{value:g}".replace("e-0", "e-")
    return str(value)


def add_arguments(parser, cls, *, defaults: dict | None = None, helps: dict | None = None,
                  only: Iterable[str] | None = None, skip: Iterable[str] = ()) -> None:
    """One flag per CLI field of `cls` (those in `only`, less `skip`), with the field's help and its
    default said there: `defaults` (a caller's, e.g. the task's) in place of the field's own, `helps`
    the whole help text of some fields."""
    defaults, helps = defaults or {}, helps or {}
    chosen = None if only is None else set(only)
    for field in cli_fields(cls):
        if (chosen is not None and field.name not in chosen) or field.name in skip:
            continue
        meta = field.metadata
        default = defaults.get(field.name, field.default)
        text = helps.get(field.name, meta["help"])
        if field.name not in helps and meta["show_default"] and meta["action"] is None and default is not None:
            text += f" (default {shown(default)})"
        kwargs: dict = dict(dest=field.name, default=argparse.SUPPRESS, help=text)
        if meta["action"]:
            kwargs["action"] = meta["action"]
        else:
            kwargs.update({k: meta[k] for k in ("type", "choices", "metavar") if meta[k] is not None})
            if meta["choices"] is None:  # --learning-rate LEARNING_RATE, not the field's plural
                kwargs.setdefault("metavar", flag_of(field).lstrip("-").replace("-", "_").upper())
        parser.add_argument(flag_of(field), **kwargs)


def given(args: argparse.Namespace, cls) -> dict:
    """The CLI fields of `cls` that the command line set, by field name."""
    return {f.name: getattr(args, f.name) for f in cli_fields(cls) if hasattr(args, f.name)}


def from_args(cls, args: argparse.Namespace, **fixed):
    """`cls` with the fields the command line set; `fixed` (a caller's defaults) under them."""
    return cls(**{**fixed, **given(args, cls)})
