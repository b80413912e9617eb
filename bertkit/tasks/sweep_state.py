"""The records that let an interrupted sweep resume, as plain files: each finished run's
runs/<run>/result.json, and the best run's artifacts so far in runs/best/ — its models in the
Hugging Face layout (config.json + model.safetensors, rebuilt by heads.load_model from the
architecture config.json names) and everything else in artifacts.json. Nothing is unpickled:
plain data (numbers, text, lists, tuples, dicts) is JSON, and a dataclass comes back only if its
class was declared `@restorable` (a fixed table of names, never an import path read from a file)."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
from pathlib import Path

from ..errors import BertkitError
from ..heads import load_model
from ..outputs import atomic_write_text
from .runs import RunResult, run_name

log = logging.getLogger("bertkit")

ARTIFACTS = "artifacts.json"
RESTORABLE: dict[str, type] = {}  # dataclass name -> class: what artifacts.json may name


def restorable(cls: type) -> type:
    """Declare a dataclass whose instances may be in a sweep's artifacts (saved as its fields)."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls.__name__} is not a dataclass")
    RESTORABLE[cls.__qualname__] = cls
    return cls


def _is_model(value) -> bool:
    return hasattr(value, "save_pretrained") and hasattr(value, "state_dict")


def encode_artifacts(value, folder: Path, models: list):
    """Artifacts -> JSON-able data; models are saved under folder/model<N> as they are met."""
    def encode(value):
        if _is_model(value):
            name = f"model{len(models)}"
            value.save_pretrained(folder / name)
            models.append(name)
            return {"$model": name}
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            name = type(value).__qualname__
            if RESTORABLE.get(name) is not type(value):
                raise TypeError(f"{name} is not declared @restorable: a sweep cannot save it")
            return {"$dataclass": name, "fields": encode({f.name: getattr(value, f.name)
                                                          for f in dataclasses.fields(value)})}
        if isinstance(value, tuple):
            return {"$tuple": [encode(v) for v in value]}
        if isinstance(value, list):
            return [encode(v) for v in value]
        if isinstance(value, dict):  # as pairs: keys keep their type (ints stay ints)
            return {"$dict": [[encode(k), encode(v)] for k, v in value.items()]}
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        raise TypeError(f"a sweep cannot save a {type(value).__name__} among its best run's artifacts")
    return encode(value)


def decode_artifacts(data, folder: Path):
    def decode(data):
        if isinstance(data, list):
            return [decode(v) for v in data]
        if not isinstance(data, dict):
            return data
        if "$model" in data:
            return load_model(folder / data["$model"])
        if "$dataclass" in data:
            cls = RESTORABLE.get(data["$dataclass"])
            if cls is None:
                raise BertkitError(f"unknown saved type {data['$dataclass']!r}", path=str(folder / ARTIFACTS))
            return cls(**decode(data["fields"]))
        if "$tuple" in data:
            return tuple(decode(v) for v in data["$tuple"])
        if "$dict" in data:
            return {_hashable(decode(k)): decode(v) for k, v in data["$dict"]}
        raise BertkitError(f"unreadable artifacts entry with keys {sorted(data)}", path=str(folder / ARTIFACTS))
    return decode(data)


def _hashable(key):
    return tuple(key) if isinstance(key, list) else key


class SweepState:
    """The records that let an interrupted sweep resume (see sweep.run_sweep)."""

    def __init__(self, directory: Path, identity: dict | None):
        self.directory, self.identity = directory, identity

    def _result_files(self):
        return sorted(self.directory.glob("*/result.json")) if self.directory.is_dir() else []

    def clear(self) -> dict:
        for path in self._result_files():
            path.unlink()
        (self.directory / "sweep.json").unlink(missing_ok=True)
        self.finish()
        self.directory.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.directory / "sweep.json", json.dumps({"identity": self.identity}, default=str) + "\n")
        return {}

    def restore(self) -> dict:
        """Finished runs by name, the best one with its artifacts; a best run whose artifacts were not
        saved (interrupted in between) is left out, so that it runs again."""
        recorded = self.directory / "sweep.json"
        if not recorded.is_file():  # e.g. the GLUE tasks after the one that was interrupted
            log.info(f"no earlier sweep in {self.directory}: starting one")
            return self.clear()
        identity = json.loads(recorded.read_text(encoding="utf-8")).get("identity")
        expected = json.loads(json.dumps(self.identity, default=str))
        if identity != expected:
            differ = sorted(k for k in set(identity or {}) | set(expected or {})
                            if (identity or {}).get(k) != (expected or {}).get(k))
            raise BertkitError(f"the sweep here was run with other settings ({', '.join(differ)}): resume it with "
                               "the same ones, or --overwrite to start again", path=str(recorded))
        done = {}
        for path in self._result_files():
            record = json.loads(path.read_text(encoding="utf-8"))
            done[path.parent.name] = RunResult(config=record["config"], metrics=record["metrics"],
                                               score=record["score"], seconds=record["seconds"],
                                               training=record.get("training") or {})
        if done:
            best_name = max(done, key=lambda n: done[n].score)  # ties: any, the artifacts decide below
            payload = self.load_best()
            if payload is not None and payload["run"] in done and done[payload["run"]].score == done[best_name].score:
                done[payload["run"]].artifacts = payload["artifacts"]
            else:
                del done[best_name]
            log.info(f"resuming the sweep in {self.directory}: {len(done)} finished run(s) kept")
        return done

    def finish(self) -> None:
        shutil.rmtree(self.directory / "best", ignore_errors=True)

    def save_best(self, result: RunResult) -> None:
        """The artifacts in state_dir/best/: models in the Hugging Face layout, the rest in artifacts.json."""
        tmp, best = self.directory / "best.tmp", self.directory / "best"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            artifacts = encode_artifacts(result.artifacts, tmp, [])
            atomic_write_text(tmp / ARTIFACTS, json.dumps({"run": run_name(result.config), "artifacts": artifacts})
                              + "\n")
        except BaseException:  # a full disk or an interrupt: no half-written best.tmp left behind
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        shutil.rmtree(best, ignore_errors=True)  # an interruption here: restore() reruns the best run
        os.replace(tmp, best)

    def load_best(self) -> dict | None:
        saved = self.directory / "best" / ARTIFACTS
        if not saved.is_file():
            return None
        payload = json.loads(saved.read_text(encoding="utf-8"))
        return {"run": payload["run"], "artifacts": decode_artifacts(payload["artifacts"], saved.parent)}

    def record(self, result: RunResult) -> None:
        folder = self.directory / run_name(result.config)
        folder.mkdir(parents=True, exist_ok=True)
        record = {"config": result.config, "metrics": result.metrics, "score": result.score,
                  "seconds": result.seconds, "training": result.training}
        atomic_write_text(folder / "result.json", json.dumps(record, indent=1, default=float) + "\n")
