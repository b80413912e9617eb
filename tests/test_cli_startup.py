"""`bertkit --help` and `--version` start without torch (issue: 3-5 s of torch import before any
output): the command modules load only for the command named on the line."""

import subprocess
import sys

import pytest

CHECK = """
import contextlib, io, sys
from bertkit import cli
out = io.StringIO()
with contextlib.redirect_stdout(out):
    rc = cli.main({argv!r})
assert rc == 0, rc
assert {expect!r} in out.getvalue(), out.getvalue()
heavy = sorted(name for name in ("torch", "tokenizers", "numpy") if name in sys.modules)
print(",".join(heavy))
"""


@pytest.mark.parametrize("argv, expect", [(["--help"], "finetune"), (["--version"], "bertkit "), ([], "")])
def test_top_level_help_and_version_import_no_torch(argv, expect):
    if not argv:  # `import bertkit.cli` and building the top-level parser alone
        code = ("import sys; from bertkit import cli; cli.build_parser(cli.chosen_command(['--help'])); "
                "print(','.join(n for n in ('torch', 'tokenizers', 'numpy') if n in sys.modules))")
    else:
        code = CHECK.format(argv=argv, expect=expect)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"imported at start-up: {done.stdout.strip()}"


def test_top_level_help_lists_every_command():
    from bertkit import cli

    parser = cli.build_parser(cli.chosen_command(["--help"]))
    text = parser.format_help()
    for name, (_, help_text) in cli.COMMANDS.items():
        assert name in text and help_text.split()[0] in text


def test_the_named_command_gets_its_flags():
    from bertkit import cli

    assert cli.chosen_command(["-v", "plot", "run"]) == {"plot"}
    args = cli.build_parser({"plot"}).parse_args(["plot", "some_run", "--output", "x.png"])
    assert args.run_dir == "some_run" and callable(args._run)
