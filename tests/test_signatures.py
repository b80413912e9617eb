"""No function in the package takes more than 12 parameters: a wider one is a settings object waiting
to be named (tasks/settings.RunSettings, pretraining.run.PretrainOptions, squad's PredictOptions ...).
The tokenizer's call and `pipeline()` keep transformers' argument lists, which their users type."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "bertkit"
TRANSFORMERS_SURFACES = {("tokenizer/bert_tokenizer.py", "__call__"), ("inference/pipelines.py", "pipeline")}


def test_no_function_takes_more_than_twelve_parameters():
    wide = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                count = len([x for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg not in ("self", "cls")])
                where = (str(path.relative_to(PACKAGE)), node.name)
                if count > 12 and where not in TRANSFORMERS_SURFACES:
                    wide.append(f"{where[0]}:{node.lineno} {node.name} ({count})")
    assert not wide, wide
