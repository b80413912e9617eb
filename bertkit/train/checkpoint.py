"""Checkpoints of a training run: weights in the Hugging Face layout plus `training_state.pt`.

A checkpoint directory is written under a temporary name and renamed into place, so it appears
complete or not at all; `latest_checkpoint` only picks directories whose training state exists.
A write that fails (a full disk) is raised as the OSError it was, naming the checkpoint's file,
and the checkpoints before it are kept: the CLI prints one line and exits 2.
The training state holds the optimizer, scheduler, data position, RNG states (one per rank), the
run's plan and its identity (what the run was started with), so `--resume` can refuse a
checkpoint that belongs to another run.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import numpy as np
import torch

from ..errors import BertkitError
from ..hub.checkpoints import WEIGHTS_NAME, read_safetensors
from ..outputs import atomic_folder

STATE_NAME = "training_state.pt"


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": _numpy_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _numpy_state():
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return [kind, keys.tolist(), pos, has_gauss, cached]  # plain types: loadable with weights_only


def set_rng_state(state: dict) -> None:
    random.setstate(_as_tuple(state["python"]))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _as_tuple(x):
    return tuple(_as_tuple(i) for i in x) if isinstance(x, (list, tuple)) else x


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The newest complete checkpoint-N directory (complete = its training state was renamed in)."""
    found = []
    for d in Path(output_dir).glob("checkpoint-*"):
        suffix = d.name.split("-", 1)[1]
        if suffix.isdigit() and (d / STATE_NAME).is_file():
            found.append((int(suffix), d))
    return max(found)[1] if found else None


def read_training_state(checkpoint: Path) -> dict:
    path = checkpoint / STATE_NAME
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a truncated or foreign file: say which, not a pickle traceback
        raise BertkitError(f"cannot read the training state ({type(e).__name__}: {e})".splitlines()[0],
                           path=str(path)) from None


class _RecordingWriter:
    """A file for torch.save that remembers the OSError its write raised: torch's zip writer turns it
    into `RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos ...`."""

    def __init__(self, handle):
        self.handle, self.error = handle, None

    def write(self, data) -> int:
        try:
            return self.handle.write(data)
        except OSError as e:
            self.error = e
            raise

    def flush(self) -> None:
        self.handle.flush()


def save_training_state(state: dict, path: Path) -> None:
    """torch.save(state, path); a failed write is the OSError (errno, reason, path) it was."""
    with open(path, "wb") as handle:
        writer = _RecordingWriter(handle)
        try:
            torch.save(state, writer)
        except (OSError, RuntimeError) as e:
            error = writer.error or (e if isinstance(e, OSError) else None)
            if error is None:
                raise
            raise OSError(error.errno, error.strerror, str(path)) from None


class Checkpointer:
    """Writes checkpoint-N directories atomically and keeps the newest `keep` of them."""

    def __init__(self, output_dir: Path, keep: int, tokenizer=None):
        self.output_dir = Path(output_dir)
        self.keep = keep
        self.tokenizer = tokenizer

    def save(self, model, step: int, state: dict) -> Path:
        final = self.output_dir / f"checkpoint-{step}"
        with atomic_folder(final) as tmp:  # a failed save (disk full) leaves no half checkpoint behind
            model.save_pretrained(tmp, tokenizer=self.tokenizer)
            save_training_state(state, tmp / STATE_NAME)
        self._prune()
        return final

    def _prune(self) -> None:
        steps = sorted((int(d.name.split("-")[1]), d) for d in self.output_dir.glob("checkpoint-*")
                       if d.name.split("-")[1].isdigit())
        for _, d in steps[: max(0, len(steps) - self.keep)]:
            shutil.rmtree(d, ignore_errors=True)

    @staticmethod
    def load_weights(model, checkpoint: Path) -> None:
        model.load_checkpoint_state(read_safetensors(checkpoint / WEIGHTS_NAME), source=str(checkpoint))


__all__ = ["Checkpointer", "STATE_NAME", "latest_checkpoint", "read_training_state", "rng_state",
           "save_training_state", "set_rng_state", "set_seed"]
