"""The import order docs/ARCHITECTURE.md states, checked over every import in the package (function-level
ones too, and the package __init__ each import runs): no arrow runs from a layer to one above it."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "bertkit"

# Bottom to top; a module's layer is that of the longest name here that it is, or lies under. A module
# may import its own layer and those below.
LAYERS = [
    ["bertkit.errors", "bertkit.version"],
    ["bertkit", "bertkit.outputs", "bertkit.tables", "bertkit.finite", "bertkit.flags", "bertkit.settings",
     "bertkit.config",
     "bertkit.embedding_resize", "bertkit.device", "bertkit.metrics", "bertkit.hub.resolve"],
    ["bertkit.hub.model_card", "bertkit.tokenizer"],
    ["bertkit.kernels", "bertkit.batching"],
    ["bertkit.hub"],
    ["bertkit.model"],
    ["bertkit.heads"],
    ["bertkit.train"],
    ["bertkit.pretraining"],
    ["bertkit.inference", "bertkit.features"],
    ["bertkit.tasks"],
    ["bertkit.serving"],
    ["bertkit.reproduce"],
    ["bertkit.convert", "bertkit.cli", "bertkit.__main__"],
]
# Package __init__ files that import nothing of their own at import time (names load on first use).
LAZY_PACKAGES = {"bertkit": {"bertkit.config", "bertkit.errors", "bertkit.version"}, "bertkit.hub": set()}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def layer_of(name: str) -> int:
    best, layer = -1, None
    for index, names in enumerate(LAYERS):
        for prefix in names:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best:
                best, layer = len(prefix), index
    assert layer is not None, f"{name} has no layer: add it to LAYERS (and docs/ARCHITECTURE.md)"
    return layer


def imports_of(name: str) -> set[str]:
    """Every bertkit module `name` imports, with the packages whose __init__ the import runs."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            submodules = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in MODULES]
            found.update(submodules or [target])
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    targets = set()
    for target in (t for t in found if t.startswith("bertkit")):
        parts = target.split(".")
        targets.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))  # each __init__ on the way runs
    return {t for t in targets if t in MODULES and t != name and not name.startswith(t + ".")}


def test_no_import_runs_back_up_the_layers():
    upward = []
    for name in sorted(MODULES):
        if name in LAZY_PACKAGES:
            assert imports_of(name) <= LAZY_PACKAGES[name], f"{name} imports more than {LAZY_PACKAGES[name]}"
            continue
        for target in sorted(imports_of(name) - set(LAZY_PACKAGES)):  # a lazy __init__ runs nothing above
            if layer_of(target) > layer_of(name):
                upward.append(f"{name} (layer {layer_of(name)}) -> {target} (layer {layer_of(target)})")
    assert not upward, "imports that run back up:\n" + "\n".join(upward)


def test_the_check_sees_an_arrow_that_runs_back_up(tmp_path, monkeypatch):
    """It can fail: the tokenizer importing the model is caught."""
    fake = tmp_path / "bertkit" / "tokenizer" / "leak.py"
    fake.parent.mkdir(parents=True)
    fake.write_text("from ..model import BertModel\n")
    monkeypatch.setitem(MODULES, "bertkit.tokenizer.leak", fake)
    assert "bertkit.model" in imports_of("bertkit.tokenizer.leak")
    assert layer_of("bertkit.model") > layer_of("bertkit.tokenizer.leak")
