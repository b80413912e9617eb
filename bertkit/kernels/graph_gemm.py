"""MKL's packed sgemm inside a graph compiled ahead (inference/compiled.py), for the fp32 Linears of a
lone input where the eager engine takes MKL's pack (KernelOptions.mkl_rows: Intel CPUs with AMX /
AVX512_BF16).

Inductor cannot put MKL's pack in a package: its `mkl._mkl_linear` takes the row count as a plain
int, which torch.export fixes to the example's, and the pack is an opaque tensor with no storage to
save. So the graph records a small op of ours, `bertkit::bertkit_mkl_linear(x, weight, bias)`, which packs
each weight on its first call (cblas_sgemm_pack, kept by the weight's address, checked against a
sample of its values) and runs cblas_sgemm_compute for any row count. AOTInductor calls it
directly through a C function (`aot_inductor.custom_ops_to_c_shims`), not through its proxy
executor, which measured slower than the oneDNN GEMMs it would replace. The op is C++ (torch's
MKL symbols), built once per torch version with the compiler `--compile` needs anyway and kept
in the compile cache; eager models never use it. The packs stay for the process's life (a server's
one model; a process loading many compiled models keeps each one's).

Measured (2-vCPU Xeon, Emerald Rapids; benchmarks/compiled_gemm_ab.py), the compiled fp32 graph with
this op against oneDNN's packed GEMMs, one input of 8-64 tokens alternated, paired: all-MiniLM-L6-v2
1.13x after 0.1 s of rest and 1.11x back to back, BERT-base 1.09x; 0.98-0.99x at 128-512 tokens,
where the op has no oneDNN fallback (docs/speed.md).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

OP = "bertkit::bertkit_mkl_linear"
# inductor names an op's C function aoti_torch_cpu_<op name>: the op's name keeps it clear of torch's own
SHIM = "aoti_torch_cpu_bertkit_mkl_linear"
SHIM_DECLARATION = f"AOTITorchError {SHIM}(AtenTensorHandle, AtenTensorHandle, AtenTensorHandle*, AtenTensorHandle*)"

SOURCE = r"""
#include <torch/library.h>
#include <ATen/ATen.h>
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/inductor/aoti_torch/utils.h>
#include <algorithm>
#include <mutex>
#include <unordered_map>
#include <vector>

extern "C" {  // MKL's packed GEMM (LP64), as libtorch_cpu exports it
size_t cblas_sgemm_pack_get_size(int identifier, int m, int n, int k);
void cblas_sgemm_pack(int layout, int identifier, int trans, int m, int n, int k, float alpha,
                      const float* src, int ld, float* dest);
void cblas_sgemm_compute(int layout, int transa, int transb, int m, int n, int k, const float* a, int lda,
                         const float* b, int ldb, float beta, float* c, int ldc);
}

namespace {
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112, kPacked = 151, kBMatrix = 162;
constexpr int kPackRows = 64;  // sizes the pack only: any row count may use it
constexpr int64_t kSamples = 64;

struct Pack {
  int64_t n, k;
  std::vector<float> sample;  // a graph's constants may be freed and another's placed at the same address
  at::Tensor data;
};
std::mutex packs_lock;
std::unordered_map<const void*, Pack> packs;

// The values at these positions: a few dozen, read on every call without allocating.
template <typename Visit>
void for_each_sampled(const at::Tensor& w, Visit visit) {
  const float* v = w.data_ptr<float>();
  int64_t step = std::max<int64_t>(1, w.numel() / kSamples);
  for (int64_t i = 0; i < w.numel(); i += step) visit(v[i]);
  visit(v[w.numel() - 1]);
}

bool same_weight(const Pack& pack, const at::Tensor& w) {
  if (pack.n != w.size(0) || pack.k != w.size(1)) return false;
  size_t at = 0;
  bool same = true;
  for_each_sampled(w, [&](float value) { same = same && at < pack.sample.size() && pack.sample[at++] == value; });
  return same && at == pack.sample.size();
}

const float* pack_of(const at::Tensor& w) {
  std::lock_guard<std::mutex> guard(packs_lock);
  auto found = packs.find(w.data_ptr());
  if (found != packs.end() && same_weight(found->second, w)) return found->second.data.data_ptr<float>();
  std::vector<float> sample;
  for_each_sampled(w, [&](float value) { sample.push_back(value); });
  int n = w.size(0), k = w.size(1);
  size_t bytes = cblas_sgemm_pack_get_size(kBMatrix, kPackRows, n, k);
  auto data = at::empty({static_cast<int64_t>(bytes / sizeof(float) + 1)}, w.options());
  cblas_sgemm_pack(kRowMajor, kBMatrix, kTrans, kPackRows, n, k, 1.0f, w.data_ptr<float>(), k, data.data_ptr<float>());
  packs[w.data_ptr()] = Pack{n, k, std::move(sample), data};
  return data.data_ptr<float>();
}

at::Tensor mkl_linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat && x.device().is_cpu(),
              "bertkit_mkl_linear takes fp32 CPU tensors");
  TORCH_CHECK(weight.dim() == 2 && x.size(-1) == weight.size(1), "bertkit_mkl_linear: shapes do not match");
  // Packs are kept per weight address, which a graph's constants hold; anything else takes torch's GEMM.
  if (!weight.is_contiguous() || weight.numel() == 0) return at::linear(x, weight, bias);
  const auto& w = weight;
  auto input = x.contiguous();
  int64_t k = w.size(1), n = w.size(0), m = input.numel() / k;
  auto sizes = input.sizes().vec();
  sizes.back() = n;
  float beta = 0.0f;
  auto y = at::empty({m, n}, input.options());
  if (bias.has_value() && bias->defined()) {  // C = bias (copied: never the bias itself), then C += x W^T
    y.copy_(bias->expand({m, n}));
    beta = 1.0f;
  }
  if (m > 0)
    cblas_sgemm_compute(kRowMajor, kNoTrans, kPacked, m, n, k, input.data_ptr<float>(), k, pack_of(w), k, beta,
                        y.data_ptr<float>(), n);
  return y.view(sizes);
}
}  // namespace

TORCH_LIBRARY(bertkit, m) { m.def("bertkit_mkl_linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor"); }
TORCH_LIBRARY_IMPL(bertkit, CPU, m) { m.impl("bertkit_mkl_linear", &mkl_linear); }

extern "C" __attribute__((visibility("default"))) AOTITorchError SHIM_NAME(
    AtenTensorHandle x, AtenTensorHandle weight, AtenTensorHandle* bias, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
    using namespace torch::aot_inductor;
    std::optional<at::Tensor> b;
    if (bias != nullptr) b = *tensor_handle_to_tensor_pointer(*bias);
    *ret0 = new_tensor_handle(mkl_linear(*tensor_handle_to_tensor_pointer(x), *tensor_handle_to_tensor_pointer(weight), b));
  });
}
""".replace("SHIM_NAME", SHIM)

_lock = threading.Lock()
_loaded: list[Path] = []
_recording = threading.local()


def applies(model: torch.nn.Module) -> bool:
    """Whether a compiled fp32 graph of `model` records its Linears as this op: torch has MKL, and
    the model's options take MKL's pack for few rows (`mkl_rows`, per CPU class)."""
    from .options import mkl_available

    held = [getattr(m, "kernels", None) for m in model.modules()]
    return mkl_available() and any(options is not None and options.mkl_rows > 0 for options in held)


def load(folder: Path) -> Path:
    """Build the op's library into `folder` unless it is there, and load it (once per process).
    Raises RuntimeError (no compiler, a failed build)."""
    with _lock:
        if _loaded:
            return _loaded[0]
        facts = f"{SOURCE}{torch.__version__}{torch._C._GLIBCXX_USE_CXX11_ABI}"
        path = folder / f"bertkit_mkl_linear-{hashlib.sha256(facts.encode()).hexdigest()[:16]}.so"
        if not path.is_file():
            _build(path)
        # Global, so that a compiled package finds the C function when it is loaded.
        ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
        _register_fake()
        _loaded.append(path)
        return path


def _build(path: Path) -> None:
    from torch.utils import cpp_extension

    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        raise RuntimeError("no C++ compiler (c++ or g++, or $CXX)")
    path.parent.mkdir(parents=True, exist_ok=True)
    # ".compiling-": the compile cache deletes such folders left by a killed process (compiled.prune_cache)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".compiling-") as work:
        source, library = Path(work) / "mkl_linear.cpp", Path(work) / path.name
        source.write_text(SOURCE, encoding="utf-8")
        command = [compiler, "-O2", "-shared", "-fPIC", "-std=c++17", "-w",
                   f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"]
        command += [f"-I{folder}" for folder in cpp_extension.include_paths()]
        command += [str(source), "-o", str(library)]
        for folder in cpp_extension.library_paths():
            command += [f"-L{folder}", f"-Wl,-rpath,{folder}"]
        command += ["-lc10", "-ltorch_cpu", "-ltorch"]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise RuntimeError(f"building the MKL op failed: {last[:300]}")
        os.replace(library, path)  # whole or not at all


def _register_fake() -> None:
    @torch.library.register_fake(OP)
    def _(x, weight, bias):
        return x.new_empty(*x.shape[:-1], weight.shape[0])


@contextlib.contextmanager
def recording():
    """While a model is exported inside this block, its fp32 Linears (kernels.linear) record the op
    (load() first); inductor is told to call it through its C function."""
    import torch._inductor.config as inductor_config

    shims = {torch.ops.bertkit.bertkit_mkl_linear.default: [SHIM_DECLARATION]}
    _recording.on = True
    try:
        with inductor_config.patch({"aot_inductor.custom_ops_to_c_shims": shims}):
            yield
    finally:
        _recording.on = False


def is_recording() -> bool:
    return getattr(_recording, "on", False)


def graph_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The op, for an fp32 Linear recorded inside `recording()`."""
    return torch.ops.bertkit.bertkit_mkl_linear(x, weight, bias)
