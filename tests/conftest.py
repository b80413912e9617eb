import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def find_data_dir() -> Path | None:
    env = os.environ.get("BERTKIT_DATA")
    if env:
        return Path(env).resolve()  # tests symlink and chdir: a relative path would break
    fallback = REPO.parent / "shared" / "data"
    return fallback if fallback.exists() else None


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """Real data; missing data fails under CI (never a silent skip there)."""
    d = find_data_dir()
    if d is None or not d.exists():
        if os.environ.get("CI"):
            pytest.fail(f"real data not found (BERTKIT_DATA={os.environ.get('BERTKIT_DATA')!r}); CI requires it")
        pytest.skip("real data not available; set BERTKIT_DATA")
    return d


@pytest.fixture(scope="session")
def uncased_vocab(data_dir) -> Path:
    return data_dir / "vocab" / "bert-base-uncased-vocab.txt"


def pytest_configure(config):
    # Tests run as parallel workers (pytest-xdist) and subprocesses on a small machine: one thread
    # each. torch's default of one thread per core oversubscribes the cores, and its spinning
    # threads then wait on each other (10x slower here).
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
