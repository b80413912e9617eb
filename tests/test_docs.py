"""The documentation site builds as `make docs` builds it: `mkdocs build --strict`, so a warning, a
broken link or anchor, or a docstring the API reference cannot render fails this test. The CLI
reference it carries is generated from the argparse parsers: every command and option is there.
(tests/test_readme.py runs the pages' code blocks.)"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))

import docs_hooks  # noqa: E402


def need_docs_packages():
    """The docs extra (installed by `make setup` through the dev extra); under CI missing is a failure."""
    missing = [name for name in ("mkdocs", "material", "mkdocstrings", "yaml") if importlib.util.find_spec(name) is None]
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"{', '.join(missing)} not installed: `make setup` installs the docs extra; CI requires it")
        pytest.skip(f"{', '.join(missing)} not installed (pip install -e '.[docs]')")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    need_docs_packages()
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                             str(REPO / "mkdocs.yml"), "--site-dir", str(out)], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=600)
    warnings = [line for line in result.stderr.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert result.returncode == 0, "\n".join(warnings) or result.stderr[-3000:]
    return out


def test_the_site_builds_strict(site):
    for page in ("index.html", "quickstart.html", "reference/cli.html", "reference/python-api.html",
                 "ARCHITECTURE.html", "speed.html", "assets/learning_curve.png",
                 "benchmarks/results/reproduce/cpu-hour-zen5/stages/pretrain-bert/loss.png"):
        assert (site / page).is_file(), page
    api = (site / "reference" / "python-api.html").read_text(encoding="utf-8")
    assert 'id="bertkit.config.BertConfig"' in api and 'id="bertkit.inference.pipelines.pipeline"' in api
    reproducing = (site / "reproducing.html").read_text(encoding="utf-8")
    assert 'src="benchmarks/results/reproduce/cpu-hour-zen5/stages/pretrain-bert/loss.png"' in reproducing


def test_every_page_is_in_the_navigation():
    need_docs_packages()
    import yaml

    def pages(entries):
        for entry in entries:
            value = next(iter(entry.values())) if isinstance(entry, dict) else entry
            yield from pages(value) if isinstance(value, list) else [value]

    config = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))
    in_nav = set(pages(config["nav"]))
    on_disk = {p.relative_to(REPO / "docs").as_posix() for p in (REPO / "docs").rglob("*.md")}
    assert not on_disk - in_nav, f"pages missing from mkdocs.yml's nav: {sorted(on_disk - in_nav)}"
    assert not in_nav - on_disk - {docs_hooks.CLI_PAGE}, f"nav entries without a page: {sorted(in_nav - on_disk)}"


def parsers(parser: argparse.ArgumentParser, words: list[str]):
    yield words, parser
    for name, child in docs_hooks._subcommands(parser).items():
        yield from parsers(child, [*words, name])


def test_the_cli_reference_lists_every_command_and_option():
    from bertkit.cli import build_parser

    reference = docs_hooks.cli_reference_markdown()
    count = 0
    for words, parser in parsers(build_parser(), ["bertkit"]):
        if len(words) > 1:
            assert f"# {' '.join(words)}\n" in reference, words
        section = reference.split(f"# {' '.join(words)}\n", 1)[-1] if len(words) > 1 else reference
        for action in parser._actions:
            if action.help != argparse.SUPPRESS and action.option_strings and not isinstance(action, argparse._HelpAction):
                assert f"`{action.option_strings[-1]}`" in section, (words, action.option_strings)
                count += 1
    assert count > 300


def test_links_into_the_repository_point_at_the_sites_copies():
    link = docs_hooks.repository_link_to_site
    assert link("../benchmarks/results/avx2/engines.md", "speed.md") == "benchmarks/results/avx2/engines.md"
    assert link("../../benchmarks/results/README.md#x", "reference/cli.md") == "../benchmarks/results/README.md#x"
    assert link("../../benchmarks/results/a.png", "pretraining/README.md") == "../benchmarks/results/a.png"
    assert link("../benchmarks/results/a.png", "pretraining/README.md") == "../benchmarks/results/a.png"  # docs/benchmarks
    for unchanged in ("speed.md#memory", "https://example.org/x", "#anchor", "../bertkit/cli.py"):
        assert link(unchanged, "index.md") == unchanged
    assert docs_hooks.literal_brackets("ids ([PAD] [UNK]) and [a link](x.md)") == r"ids (\[PAD\] \[UNK\]) and [a link](x.md)"
