"""How a model computes is a value it holds from construction (kernels.KernelOptions): two models with
different options run side by side in one process, threads included; the attention a model asks
for is the attention that runs; nothing a model holds leaks into another."""

import threading

import torch

import bertkit
from bertkit import BertConfig, kernels
from bertkit.heads import load_model
from bertkit.kernels import KernelOptions

PACKED = kernels.PROCESS_DEFAULT.replace(unpad="always", unpad_multiple=1, attention="explicit")
PLAIN = KernelOptions.plain()


def tiny_config(**kw):
    return BertConfig.preset("mini", vocab_size=200, max_position_embeddings=64, **kw)


def batch_of(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    T = max(lengths)
    mask = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).long()
    return {"input_ids": torch.randint(1, 200, (len(lengths), T), generator=g) * mask, "attention_mask": mask}


def twins():
    torch.manual_seed(0)
    packed = bertkit.BertModel(tiny_config(), kernels=PACKED).eval()
    plain = bertkit.BertModel(tiny_config(), kernels=PLAIN).eval()
    plain.load_state_dict(packed.state_dict())
    return packed, plain


def test_each_model_runs_its_own_options_side_by_side_in_threads():
    """The packed model never computes padding rows (zeros there), the plain one does; on real
    tokens they agree. Interleaved in two threads, each keeps its own behaviour on every call."""
    packed, plain = twins()
    batch = batch_of([30, 4, 17, 1])
    real = batch["attention_mask"].bool()
    assert packed.kernels == PACKED and plain.kernels == PLAIN
    assert all(m.kernels == PACKED for m in packed.modules() if isinstance(m, kernels.HoldsKernelOptions))
    failures, outputs = [], {}

    def run(name, model, padding_is_zero):
        try:
            for _ in range(6):
                with torch.no_grad():
                    out = model(**batch).last_hidden_state
                if bool((out[~real] == 0).all()) != padding_is_zero:
                    failures.append(name)
                outputs[name] = out
        except Exception as err:  # surfaced below: a thread's exception would otherwise be lost
            failures.append(f"{name}: {err!r}")

    threads = [threading.Thread(target=run, args=("packed", packed, True)),
               threading.Thread(target=run, args=("plain", plain, False))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures
    torch.testing.assert_close(outputs["packed"][real], outputs["plain"][real], rtol=1e-4, atol=1e-5)
    assert kernels.default_options() == kernels.PROCESS_DEFAULT  # running them changed no default


def test_asking_for_sdpa_runs_sdpa():
    """One selector: a model built with attn_implementation="sdpa" runs torch's SDPA even in
    training with dropout, where "auto" takes the written-out formula; "eager" runs model.py's."""
    def sdpa_calls(implementation):
        torch.manual_seed(0)
        model = bertkit.BertModel(tiny_config(), attn_implementation=implementation).train()
        with torch.profiler.profile() as profile:
            model(**batch_of([12, 12]))
        return sum(event.name == "aten::scaled_dot_product_attention" for event in profile.events())

    layers = tiny_config().num_hidden_layers
    assert sdpa_calls("sdpa") == layers
    assert sdpa_calls("auto") == 0 and sdpa_calls("eager") == 0


def test_eager_padded_agrees_with_the_default_packed_model():
    """model.py's written-out formula on the padded batch (no unpadding) against the default kernels
    on the packed one (what test_model_parity's eager check means by "padded")."""
    torch.manual_seed(0)
    fast = bertkit.BertModel(tiny_config(), kernels=kernels.PROCESS_DEFAULT.replace(unpad="always")).eval()
    eager = bertkit.BertModel(tiny_config(), kernels=kernels.PROCESS_DEFAULT.replace(unpad="never", attention="eager")).eval()
    eager.load_state_dict(fast.state_dict())
    batch = batch_of([40, 3, 17, 29, 1, 40, 8])
    real = batch["attention_mask"].bool()
    assert kernels.unpadding_for(batch["attention_mask"], eager.kernels) is None
    with torch.no_grad():
        torch.testing.assert_close(eager(**batch).last_hidden_state[real], fast(**batch).last_hidden_state[real],
                                   rtol=1e-4, atol=2e-5)


def test_loaded_models_hold_the_options_asked_for(tmp_path):
    bertkit.BertForSequenceClassification(tiny_config(num_labels=3)).save_pretrained(tmp_path)
    plain = load_model(tmp_path, kernels=PLAIN)
    default = load_model(tmp_path)
    eager = bertkit.BertForSequenceClassification.from_pretrained(tmp_path, attn_implementation="eager")
    assert plain.kernels == PLAIN and plain.bert.encoder.layer[0].attention.self.kernels == PLAIN
    assert default.kernels == kernels.PROCESS_DEFAULT
    assert eager.kernels == kernels.PROCESS_DEFAULT.replace(attention="eager")
    default.set_attention_implementation("sdpa")
    assert default.kernels.attention == "sdpa" and plain.kernels == PLAIN  # one model changed, not the other
