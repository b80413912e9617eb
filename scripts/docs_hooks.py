"""The documentation site's build hooks (mkdocs.yml `hooks:`), and the CLI reference as a script.

- `cli_reference_markdown()` walks `bertkit.cli.build_parser()` and writes one section per command
  and sub-command (usage, description, every option with its default and help), so the reference is
  the parsers themselves. The build adds it as the page `reference/cli.md`; it is never committed.
  `python scripts/docs_hooks.py` prints it.
- The repository's measured results (`benchmarks/results/`) join the site under the same path, so
  the pages cite the committed result files and show their pictures.
- A page links to a result file as it lies in the repository (`../benchmarks/results/...` from
  docs/), so the link works when reading docs/ on its own; the build rewrites it to the site's copy.
"""

from __future__ import annotations

import argparse
import html
import os
import posixpath
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Repository folders outside docs/ that the site carries, under the same path.
MIRRORED = ("benchmarks/results",)
CLI_PAGE = "reference/cli.md"
LEARNING_CURVE = ("benchmarks/results/reproduce/curves/report.json", "assets/learning_curve.png")
LINK = re.compile(r"(!?\[[^\]]*\]\()([^)\s]+)(\))")


# ---------------------------------------------------------------- the CLI reference


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell (no HTML, no emphasis, no column breaks)."""
    text = html.escape(" ".join(str(text).split()), quote=False)
    return re.sub(r"([|*_\[\]`])", r"\\\1", text)


def _option_row(parser: argparse.ArgumentParser, action: argparse.Action) -> str | None:
    if action.help == argparse.SUPPRESS or isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
        return None
    formatter = parser._get_formatter()
    names = ", ".join(f"`{name}`" for name in action.option_strings) or f"`{action.metavar or action.dest}`"
    if action.option_strings and action.nargs != 0:
        names += " " + _cell(formatter._format_args(action, formatter._get_default_metavar_for_optional(action)))
    help_text = formatter._expand_help(action) if action.help else ""
    required = "required" if action.required else ""
    default = action.default
    shown = ("" if default in (None, argparse.SUPPRESS, False) or action.nargs == 0 or required
             else f"`{default}`" if not isinstance(default, (list, tuple)) else f"`{','.join(map(str, default))}`")
    return f"| {names} | {required or shown} | {_cell(help_text)} |"


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _section(parser: argparse.ArgumentParser, words: list[str], level: int) -> list[str]:
    lines = [f"{'#' * level} {' '.join(words)}", ""]
    if parser.description:
        lines += [" ".join(parser.description.split()), ""]
    lines += ["```text", parser.format_usage().strip(), "```", ""]
    rows = [row for row in (_option_row(parser, action) for action in parser._actions) if row]
    if rows:
        lines += ["| option | default | meaning |", "|---|---|---|", *rows, ""]
    if parser.epilog:
        lines += [" ".join(parser.epilog.split()), ""]
    children = _subcommands(parser)
    if children and level > 1:
        lines += ["Sub-commands: " + ", ".join(f"`{name}`" for name in children), ""]
    for name, child in children.items():
        lines += _section(child, [*words, name], min(level + 1, 4))
    return lines


def cli_reference_markdown() -> str:
    """Markdown for every command and sub-command of `bertkit`, from the argparse parsers."""
    from bertkit.cli import build_parser

    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps usage lines at the terminal's width: one width for every build
    try:
        return _reference(build_parser())
    finally:
        if before is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = before


def _reference(parser: argparse.ArgumentParser) -> str:
    lines = ["# Command-line reference", "",
             "Generated from the argparse parsers (`bertkit.cli.build_parser()`) when the site is built: every",
             "command, sub-command and option as `bertkit COMMAND --help` prints it. How every command behaves",
             "(outputs, errors, progress): [Command line](command-line.md).", ""]
    lines += ["```text", parser.format_usage().strip(), "```", ""]
    rows = [row for row in (_option_row(parser, action) for action in parser._actions) if row]
    lines += ["| option | default | meaning |", "|---|---|---|", *rows, ""]
    for name, child in _subcommands(parser).items():
        lines += _section(child, ["bertkit", name], 2)
    return "\n".join(lines).rstrip() + "\n"


# ---------------------------------------------------------------- the learning curve's picture


def learning_curve_png(report: Path) -> bytes:
    """A learning-curve report.json (`bertkit reproduce --budget curves`) drawn: per task, the dev
    score of the pre-trained BERT and of random init against the fine-tuning set size (mean, one sd)."""
    import io
    import json

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = json.loads(report.read_text(encoding="utf-8"))["curves"]
    names = {"sst-2": "SST-2 accuracy", "mrpc": "MRPC", "ner": "CoNLL-2003 F1", "squad": "SQuAD v1.1 F1"}
    figure, axes = plt.subplots(1, len(curves), figsize=(3.2 * len(curves), 3.0))
    for axis, (task, points) in zip(axes, curves.items()):
        sizes = [point["used"] for point in points]
        for model, label in (("bert", "pre-trained BERT"), ("random_init", "random init")):
            means = [point[model]["mean"] for point in points]
            sds = [point[model]["sd"] for point in points]
            axis.errorbar(sizes, means, yerr=sds, marker="o", capsize=3, label=label)
        axis.set_xscale("log")
        axis.minorticks_off()
        axis.set_xticks(sizes, [f"{size:,}" for size in sizes], fontsize=7)
        axis.set_title(names.get(task, task))
        axis.set_xlabel("fine-tuning examples")
    axes[0].set_ylabel("dev score (%)")
    axes[0].legend(fontsize=8)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90, metadata={"Software": None})
    plt.close(figure)
    return buffer.getvalue()


# ---------------------------------------------------------------- docstrings in the API reference

BRACKETED = re.compile(r"\[([^\]\n]*)\](?![(\[])")


def literal_brackets(docstring: str) -> str:
    """`[CLS] [SEP]` in a docstring is text, not a Markdown reference link: escape the brackets
    (a link written `[text](url)` stays a link)."""
    return BRACKETED.sub(lambda match: "\\[" + match.group(1) + "\\]", docstring)


try:
    import griffe

    class LiteralBrackets(griffe.Extension):
        """griffe extension (mkdocs.yml: mkdocstrings' `extensions`): docstrings' brackets as text."""

        def on_instance(self, *, obj, **kwargs) -> None:
            if obj.docstring is not None:
                obj.docstring.value = literal_brackets(obj.docstring.value)
except ImportError:  # the script alone (the CLI reference) needs no docs packages
    pass


# ---------------------------------------------------------------- mkdocs hooks


def on_files(files, config):
    """Add the generated CLI reference, the learning curve's picture and the repository's result files
    to the site."""
    from mkdocs.structure.files import File

    files.append(File.generated(config, CLI_PAGE, content=cli_reference_markdown()))
    files.append(File.generated(config, LEARNING_CURVE[1], content=learning_curve_png(REPO / LEARNING_CURVE[0])))
    for root in MIRRORED:
        for path in sorted((REPO / root).rglob("*")):
            if path.is_file():
                uri = path.relative_to(REPO).as_posix()
                files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files


def repository_link_to_site(target: str, page_uri: str) -> str:
    """A link written from docs/PAGE to a mirrored repository file (`../benchmarks/results/x.md`),
    as the site's copy sees it from the built page; any other link is returned as it is."""
    if re.match(r"^[a-z][a-z0-9+.-]*:|^/|^#", target):
        return target
    path, _, fragment = target.partition("#")
    page_dir = posixpath.dirname(page_uri)
    in_repository = posixpath.normpath(posixpath.join("docs", page_dir, path))
    if not any(in_repository == root or in_repository.startswith(root + "/") for root in MIRRORED):
        return target
    site_target = posixpath.relpath(in_repository, page_dir or ".")
    return site_target + ("#" + fragment if fragment else "")


def on_page_markdown(markdown, page, config, files):
    """Links from a docs/ page into the mirrored repository folders point at the site's copies."""
    if page.file.src_uri.startswith(MIRRORED):
        return markdown

    def rewrite(match):
        return match.group(1) + repository_link_to_site(match.group(2), page.file.src_uri) + match.group(3)

    return LINK.sub(rewrite, markdown)


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.stdout.write(cli_reference_markdown())
