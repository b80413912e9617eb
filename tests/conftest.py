import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def find_data_dir() -> Path | None:
    env = os.environ.get("BERTKIT_DATA")
    if env:
        return Path(env)
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
