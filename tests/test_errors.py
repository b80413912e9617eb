"""BertkitError's one-line form, and `reading`: the ways a text file fails to open or decode, said
the same way by every reader that uses it (the CoNLL reader and conlleval's scorer)."""

import pytest

from bertkit.errors import BertkitError, reading
from bertkit.metrics.conll import evaluate_conll_file
from bertkit.tasks.conll_data import read_conll


def test_message_names_file_and_line():
    assert str(BertkitError("bad tag", path="a.txt", line=3)) == "a.txt:3: bad tag"
    assert str(BertkitError("bad tag", path="a.txt")) == "a.txt: bad tag"
    assert str(BertkitError("no data")) == "no data"


def test_reading_passes_other_errors_through(tmp_path):
    with pytest.raises(BertkitError, match="^x.txt:2: own$"):
        with reading("x.txt"):
            raise BertkitError("own", path="x.txt", line=2)
    with pytest.raises(ValueError):
        with reading("x.txt"):
            raise ValueError("not a file problem")


@pytest.mark.parametrize("reader", [read_conll, evaluate_conll_file])
def test_conll_readers_share_the_file_errors(tmp_path, reader):
    missing, folder, latin1 = tmp_path / "missing.txt", tmp_path / "folder", tmp_path / "latin1.txt"
    folder.mkdir()
    latin1.write_bytes("Zürich B-LOC B-LOC\n".encode("latin-1"))
    for path, message in ((missing, "CoNLL file not found"), (folder, "is a directory, expected a CoNLL file"),
                          (latin1, "not UTF-8 text (invalid start byte)")):
        with pytest.raises(BertkitError) as err:
            reader(path)
        assert str(err.value) == f"{path}: {message}"
