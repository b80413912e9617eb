"""The per-CPU-class kernel rule: which class a CPU falls in (flags, vendor, ONEDNN_MAX_CPU_ISA caps),
the fp32 Linear each class gets by default, and the "inference" mode (oneDNN only without gradients)."""

import pytest
import torch
import torch.nn.functional as F

from bertkit import device, kernels
from bertkit.device import CpuFeatures
from bertkit.kernels import options as options_module, speed_options

INTEL_AVX512 = ({"avx2", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"}, "intel")
AMD_ZEN4 = ({"avx2", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16"}, "amd")
AMD_ZEN3 = ({"avx2", "fma"}, "amd")
SAPPHIRE_RAPIDS = ({"avx2", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "amx_bf16"}, "intel")


def features_of(monkeypatch, info, cap=None) -> CpuFeatures:
    monkeypatch.setattr(device, "_cpu_info", lambda: info)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    if cap is None:
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    else:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    # oneDNN's own bf16 answer is about this machine, not the mocked one: take the flags' word.
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True, raising=False)
    return device.cpu_features.__wrapped__()


@pytest.mark.parametrize("info, cap, cls, vendor, capped", [
    (INTEL_AVX512, None, "avx512", "intel", False),
    (AMD_ZEN4, None, "avx512-bf16", "amd", False),
    (AMD_ZEN3, None, "avx2", "amd", False),
    (SAPPHIRE_RAPIDS, None, "avx512-bf16", "intel", False),
    (INTEL_AVX512, "AVX2", "avx2", "intel", True),  # the emulation the AVX2 tables were measured under
    (AMD_ZEN4, "AVX512_CORE", "avx512", "amd", True),
])
def test_cpu_class_from_flags_vendor_and_cap(monkeypatch, info, cap, cls, vendor, capped):
    features = features_of(monkeypatch, info, cap)
    assert (features.cpu_class, features.vendor, features.capped) == (cls, vendor, capped)
    assert features.vnni == ("avx512_vnni" in info[0])  # fbgemm ignores the cap


@pytest.mark.parametrize("info, cap, linear", [
    (AMD_ZEN3, None, "never"),  # oneDNN cost the BERT-BASE training step on Zen 3
    (INTEL_AVX512, "AVX2", "never"),
    (INTEL_AVX512, None, "inference"),  # MKL trains faster on Intel AVX-512; oneDNN infers faster
    (AMD_ZEN4, None, "always"),
])
def test_default_fp32_linear_per_class(monkeypatch, info, cap, linear):
    features = features_of(monkeypatch, info, cap)
    assert options_module.default_onednn_linear(features) == linear
    monkeypatch.setattr(options_module, "cpu_features", lambda: features)
    assert options_module.KernelOptions().onednn_linear == linear  # what a fresh process would pick


def test_an_unmeasured_class_gets_the_stock_linear(monkeypatch):
    monkeypatch.setattr(options_module, "FP32_LINEAR_BY_CLASS", {"avx2": "never"})
    assert options_module.default_onednn_linear(CpuFeatures(avx512=True, bf16=False, amx=False)) == "never"


@pytest.mark.skipif(not kernels.onednn_available(), reason="torch built without oneDNN")
def test_inference_mode_runs_onednn_only_without_gradients():
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(9, 16, generator=g), torch.randn(12, 16, generator=g), torch.randn(12, generator=g)
    inference = kernels.PROCESS_DEFAULT.replace(onednn_linear="inference")
    with torch.no_grad(), torch.profiler.profile() as profile:
        y = kernels.linear(x, w, b, inference)
        fused = kernels.linear_gelu(x, w, b, inference)
    names = [event.name for event in profile.events()]
    assert sum("_linear_pointwise" in name for name in names) == 2 and "aten::gelu" not in names
    torch.testing.assert_close(y, F.linear(x, w, b), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fused, F.gelu(F.linear(x, w, b)), rtol=1e-5, atol=1e-5)
    trained = kernels.linear(x, w.requires_grad_(), b, inference)
    assert "OneDNN" not in type(trained.grad_fn).__name__  # torch's Linear where gradients flow
    assert torch.equal(trained.detach(), F.linear(x, w, b).detach())
    with pytest.raises(Exception, match="onednn_linear must be one of"):
        with speed_options(onednn_linear="sometimes"):
            pass
