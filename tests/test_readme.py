"""Every Python block in README.md runs as written (in a scratch directory).

Blocks fenced as `py` instead of `python` continue a shell example (they load the model its
commands made) and are not run here."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def test_the_readme_has_python_blocks():
    assert BLOCKS


@pytest.mark.parametrize("number", range(len(BLOCKS)))
def test_python_block_runs(number, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    exec(compile(BLOCKS[number], f"README.md block {number}", "exec"), {"__name__": "__readme__"})
    if "print(" in BLOCKS[number]:
        assert capsys.readouterr().out.strip()
