"""Output safety: never write over a run, an input or a non-file, and never leave half a file.

Every command checks its output paths with these functions *before* it starts work, so a bad output
path is reported at once, not after an hour of training. Files are written through `atomic_write` /
`atomic_open`: the content goes to a temporary file in the same folder, which is renamed over the
real name only when complete; on any failure (disk full included) the temporary file is removed,
and a write that failed inside a library (safetensors' Rust writer says "os error 28") is raised
as the OSError it was, naming the file's real name, which the CLI prints in one line.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import re
import stat
import tempfile
from pathlib import Path
from typing import Callable, Iterable, Iterator

from .errors import BertkitError

OVERWRITE_HINT = "pass --overwrite to replace it"
STDOUT = "-"  # `--output -`: the result goes to standard output (text formats only)


def is_stdout(path) -> bool:
    return str(path) == STDOUT


def _nearest_existing(path: Path) -> Path:
    """The path itself or its closest ancestor that exists (a relative path ends at '.')."""
    for candidate in (path, *path.parents):
        if os.path.lexists(candidate):
            return candidate
    return Path(".")


def _check_parent_writable(path: Path) -> None:
    """The folder that will hold `path` (or its closest existing ancestor) is a writable folder."""
    anchor = _nearest_existing(path.parent if path.parent != path else path)
    if not anchor.is_dir():
        raise BertkitError("is not a folder, so nothing can be written under it", path=str(anchor))
    if not os.access(anchor, os.W_OK | os.X_OK):
        raise BertkitError("folder is not writable", path=str(anchor))


def check_output_dir(path: str | Path, overwrite: bool = False, kind: str = "results") -> Path:
    """Refuse an output folder that is not a folder, cannot be created, or already holds something
    (a previous run's `kind`) unless `overwrite`. Creates nothing."""
    path = Path(path)
    if os.path.lexists(path):
        if not path.is_dir():
            raise BertkitError("output is an existing file, not a folder", path=str(path))
        entries = sorted(p.name for p in path.iterdir())
        if entries and not overwrite:
            shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
            raise BertkitError(f"output folder already holds {kind} ({shown}); {OVERWRITE_HINT} "
                               "or choose another folder", path=str(path))
        if not os.access(path, os.W_OK | os.X_OK):
            raise BertkitError("output folder is not writable", path=str(path))
    else:
        _check_parent_writable(path)
    return path


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return os.path.abspath(os.path.realpath(a)) == os.path.abspath(os.path.realpath(b))


def check_not_an_input(path: str | Path, inputs: Iterable[str | Path | None]) -> None:
    """Refuse an output that is one of the inputs (symbolic and hard links resolved); stdout never is."""
    if is_stdout(path):
        return
    for source in inputs:
        if source is not None and str(source) != STDOUT and _same_file(Path(path), Path(source)):
            raise BertkitError(f"output is also an input ({source}); refusing to destroy it", path=str(path))


def check_output_file(path: str | Path, inputs: Iterable[str | Path] = (), overwrite: bool = False) -> Path:
    """Refuse an output file that is one of the inputs (symbolic links and hard links resolved), that
    exists but is not a regular file (a folder, a link, a device, a pipe), or that exists at all
    unless `overwrite`. Creates nothing."""
    path = Path(path)
    for source in inputs:
        if source is not None and _same_file(path, Path(source)):
            raise BertkitError(f"output is also an input ({source}); refusing to destroy it", path=str(path))
    if os.path.lexists(path):
        mode = os.lstat(path).st_mode
        if not stat.S_ISREG(mode):
            what = ("a folder" if stat.S_ISDIR(mode) else "a symbolic link" if stat.S_ISLNK(mode)
                    else "not a regular file")
            raise BertkitError(f"output exists and is {what}; refusing to replace it", path=str(path))
        if not overwrite:
            raise BertkitError(f"output file already exists; {OVERWRITE_HINT}", path=str(path))
    _check_parent_writable(path)
    return path


def _file_mode() -> int:
    """0666 minus the process umask: what open() would give a new file (mkstemp gives 0600)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def _refuse_non_regular(path: Path) -> None:
    if os.path.lexists(path) and not stat.S_ISREG(os.lstat(path).st_mode):
        raise BertkitError("exists and is not a regular file; refusing to replace it", path=str(path))


FULL_DISK = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # what a write fails with for want of room


def write_error(error: BaseException, written: str | Path, shown: str | Path) -> OSError | None:
    """The OSError behind a failed write of `written` (a temporary file or folder), naming `shown`
    (its real name) instead: an OSError that names the temporary path, or safetensors'
    SafetensorError, which carries the operating system's error only in its text ("... No space
    left on device (os error 28)"). None when `error` needs no translation."""
    if isinstance(error, OSError):
        name, written = error.filename, str(written)
        if name is None and error.errno in FULL_DISK:  # write() names no file: the one being written
            return OSError(error.errno, error.strerror, str(shown))
        if error.errno is None or not isinstance(name, str):
            return None
        if not (name == written or name.startswith(written + os.sep)):
            return None
        return OSError(error.errno, error.strerror, str(shown) + name[len(written):])  # the errno's subclass
    if type(error).__name__ == "SafetensorError":
        found = re.search(r"\(os error (\d+)\)", str(error))
        if found:
            number = int(found.group(1))
            return OSError(number, os.strerror(number), str(shown))
    return None


@contextlib.contextmanager
def _temporary_beside(path: Path) -> Iterator[str]:
    """A temporary file next to `path`, renamed to `path` (readable by others, as a plain open() would
    make it) on a clean exit and removed on any error, a full disk included."""
    _refuse_non_regular(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, _file_mode())
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        translated = write_error(e, tmp, path)
        if translated is not None:
            raise translated from None
        raise


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "w", encoding: str | None = "utf-8") -> Iterator:
    """open() for writing, atomically: the file appears under `path` complete or not at all."""
    with _temporary_beside(Path(path)) as tmp, open(tmp, mode, encoding=None if "b" in mode else encoding) as handle:
        yield handle


def atomic_write(path: str | Path, write: Callable[[str], object]) -> None:
    """write(tmp_path) then rename to `path`; the temporary file never outlives a failure."""
    with _temporary_beside(Path(path)) as tmp:
        write(tmp)


def atomic_write_text(path: str | Path, text: str) -> None:
    """The text under `path` complete, on disk (fsync before the rename: a crash right after leaves the
    new file or the old one, never an empty one), or not at all."""
    with atomic_open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())


def _finite_or_none(value):
    """JSON has no NaN or Infinity: such a float (e.g. a correlation of constant predictions) becomes null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_none(v) for v in value]
    return value


def write_json(path: str | Path, data, indent: int | None = 2) -> None:
    """Strict JSON (non-finite numbers written as null), atomically."""
    atomic_write_text(path, json.dumps(_finite_or_none(data), indent=indent, allow_nan=False) + "\n")


# ---------------------------------------------------------------- one check for every command's output file


# The extensions each format is recognised by; an output's format follows its extension.
EXTENSIONS = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".tsv": "tsv", ".tab": "tsv", ".csv": "csv",
              ".txt": "text", ".npy": "npy", ".safetensors": "safetensors", ".onnx": "onnx", ".png": "png"}
BINARY_FORMATS = ("npy", "safetensors", "onnx", "png")


def output_format(path: str | Path, formats: tuple[str, ...], given: str | None = None,
                  default: str | None = None) -> str:
    """The format an output is written in: `given` (a --format flag), else the one its extension names.
    An extension that names none of `formats` is refused in one line (an `emb.npy` that holds JSON lines
    would mislead every reader); so is a binary format on standard output. `default` applies to a
    path without an extension and to standard output."""
    suffix = "" if is_stdout(path) else Path(path).suffix.lower()
    named = EXTENSIONS.get(suffix)
    if given is not None:
        fmt = given
        if named is not None and named != fmt and suffix != ".txt":
            raise BertkitError(f"the extension {suffix} names {named}, but the format asked is {fmt}; rename the "
                               "output or drop the format flag", path=str(path))
    elif named is not None:
        fmt = named
    elif (not suffix or is_stdout(path)) and default is not None:
        fmt = default
    else:
        raise BertkitError(f"cannot tell the output format from {'no extension' if not suffix else repr(suffix)}: "
                           f"name the file {' or '.join('.' + f for f in formats)}", path=str(path))
    if fmt not in formats:
        raise BertkitError(f"this command writes {', '.join(formats)}, not {fmt}; name the file "
                           f"{' or '.join('.' + f for f in formats)}", path=str(path))
    if is_stdout(path) and fmt in BINARY_FORMATS:
        raise BertkitError(f"{fmt} is a binary format: give a file name, not - (standard output)")
    return fmt


def folder_files(folder: str | Path | None) -> list[Path]:
    """Every file of a model (or data) folder: each is an input that no output may replace."""
    if folder is None or not Path(folder).is_dir():
        return [Path(folder)] if folder is not None and Path(folder).exists() else []
    return [p for p in Path(folder).iterdir() if p.is_file()]


def check_output(path: str | Path, inputs: Iterable[str | Path | None] = (), overwrite: bool = False,
                 formats: tuple[str, ...] | None = None, given_format: str | None = None,
                 default_format: str | None = None) -> str | None:
    """The single pre-flight check of a command's output file, before any work: standard output is
    fine (text formats); an input (through symbolic or hard links) is never replaced, --overwrite
    or not; an existing file only with --overwrite; the format must follow the extension. Returns the
    format (None when `formats` is not given). Creates nothing."""
    check_not_an_input(path, inputs)  # the gravest mistake is named first
    fmt = output_format(path, formats, given_format, default_format) if formats else None
    if not is_stdout(path):
        check_output_file(path, inputs=[p for p in inputs if p is not None], overwrite=overwrite)
    return fmt


@contextlib.contextmanager
def output_stream(path: str | Path, mode: str = "w") -> Iterator:
    """Where a text result goes: standard output for `-`, else an atomic file (complete or absent)."""
    if is_stdout(path):
        import sys
        yield sys.stdout.buffer if "b" in mode else sys.stdout
        (sys.stdout.buffer if "b" in mode else sys.stdout).flush()
        return
    with atomic_open(path, mode) as handle:
        yield handle


@contextlib.contextmanager
def atomic_folder(path: str | Path) -> Iterator[Path]:
    """A folder written in full under a temporary name beside `path`, then put in its place (an
    earlier one replaced only then); on any failure (a full disk, an interrupt) the temporary
    folder is removed and an earlier `path` is left as it was."""
    import shutil

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        os.chmod(tmp, _folder_mode())
        if path.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent))
            os.replace(path, old / "previous")
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        translated = write_error(e, tmp, path)
        if translated is not None:
            raise translated from None
        raise


def _folder_mode() -> int:
    """0777 minus the process umask: what mkdir() would give (mkdtemp gives 0700)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o777 & ~mask


def check_not_an_input_folder(output_dir: str | Path, inputs: dict[str, str | Path | None]) -> None:
    """An output folder that is one of the input folders ({flag: folder}) would have its files (a model's
    weights, a data set's vocab.txt) replaced by the run's: refused, --overwrite or not."""
    for flag, folder in inputs.items():
        if folder is not None and Path(folder).is_dir() and _same_file(Path(output_dir), Path(folder)):
            raise BertkitError(f"the output folder is also the {flag} folder; its files would be replaced: "
                               "choose another --output", path=str(output_dir))
