"""Modules that moved into packages keep importing under their old names (docs/ARCHITECTURE.md)."""

import importlib
import subprocess
import sys

import pytest

import bertkit


@pytest.mark.parametrize("old, new", sorted(bertkit.MOVED_MODULES.items()))
def test_an_old_module_name_imports_the_moved_module_itself(old, new):
    module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert module.__name__ == new and module.__spec__.name == new  # not re-run, not renamed


def test_old_names_work_in_every_import_form():
    # a fresh interpreter, so the old name is imported first, before its new one
    code = ("from bertkit.hub_resolve import resolve_model\n"
            "import bertkit.pipelines as p\n"
            "from bertkit import tokenizer_cli\n"
            "import bertkit.hub.resolve, bertkit.inference.pipelines\n"
            "assert resolve_model is bertkit.hub.resolve.resolve_model\n"
            "assert p is bertkit.inference.pipelines and tokenizer_cli.__name__ == 'bertkit.tokenizer.cli'\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_an_unknown_module_is_still_an_import_error():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("bertkit.no_such_module")
