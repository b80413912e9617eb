"""A CUDA device for the `fake_cuda` tests (the `cuda` fixture), faked on a machine without a GPU (or real with one).

BERTKIT_TEST_DEVICE=fake (default): torch's FakeTensorMode makes tensors that say device="cuda:0"
and carry shapes, dtypes and devices but no values; an operation that mixes a CPU tensor with a
CUDA one raises FakeTensorDeviceMismatchError, as it would on a GPU. So a hidden
`torch.arange(n)` without a device, a CPU-only kernel reached with a CUDA tensor or a CPU
generator in the model path turns a test red here. BERTKIT_TEST_DEVICE=cuda runs the same tests
on the real GPU (benchmarks/cuda_check.sh), where the marked exceptions below do not apply.

What a fake device cannot do, and what the fixture does instead (each said where it applies):
* there are no values: a host read (`float(loss)`, `bool(mask.all())`, `.item()`) raises
  DataDependentOutputException. The model is built on the CPU (its initialisation redraws
  values) and its tensors replaced by fake CUDA ones of the same shapes (ties kept); the padding
  check of `kernels.padding_mask` builds the mask always (the path of a batch with padding);
  tests that need a loss value read it only with the real device;
* torch.cuda's host calls (is_available, current_device, is_bf16_supported, the RNG state) reach
  the CUDA runtime, which a CPU build lacks: they answer as one GPU would (`FakeCuda.bf16`);
* a fake tensor cannot be swapped into a module in place, so `Module.to` of a model whose tensors
  are already fake, or real ones sent to CUDA (a model a command loads from a folder, built on the
  CPU: `FakeCuda.on_cpu` wraps the loader), moves them by replacement (same shapes, ties kept);
* Python indexing (`x[:, None]`, `x[:, 0]`) of a CUDA tensor enters the CUDA device guard in
  C++ before any kernel, which a CPU build lacks: `Tensor.__getitem__` of a fake CUDA tensor is
  the same composition of aten view ops (unsqueeze, select, slice, index), whose fake kernels
  check devices as the real ones do (`contiguous`, `masked_fill` and `~`, the same guard, are
  their aten ops);
* autograd records a CUDA stream for every CUDA tensor it differentiates, through the same
  absent device guard (torch fakes the guard only for CUDA builds without a GPU): faked, the
  tests run without gradients (`torch.no_grad`, every forward, dropout, the optimizer step on
  given gradients); backward passes are marked `needs_cuda_runtime` and run on the real device;
* boolean-mask indexing and `nonzero` have data-dependent output shapes: those paths (MLM at masked positions, unpadding) are marked
  `needs_real_values` and run with BERTKIT_TEST_DEVICE=cuda.
"""

from __future__ import annotations

import contextlib
import os

import pytest
import torch
from torch import nn

from bertkit import BertConfig
from bertkit.kernels import layout as layout_module

TEST_DEVICE = os.environ.get("BERTKIT_TEST_DEVICE", "fake").strip().lower()
if TEST_DEVICE not in ("fake", "cuda"):
    raise pytest.UsageError(f"BERTKIT_TEST_DEVICE must be fake or cuda, not {TEST_DEVICE!r}")
REAL = TEST_DEVICE == "cuda"

# Paths whose control flow reads tensor values (nonzero, boolean-mask indexing): faked tensors
# have none, so they run only on the real device (benchmarks/cuda_check.sh).
needs_real_values = pytest.mark.skipif(
    not REAL, reason="reads tensor values (nonzero / boolean-mask indexing): run with BERTKIT_TEST_DEVICE=cuda")


needs_cuda_runtime = pytest.mark.skipif(
    not REAL, reason="autograd on CUDA tensors needs the CUDA device guard (absent from a CPU build): "
                     "run with BERTKIT_TEST_DEVICE=cuda")


def is_fake(t) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor
    return isinstance(t, FakeTensor)


class FakeCuda:
    """The device the tests run on: `device` (cuda:0), `model(cls, ...)`, `tensor helpers`;
    `real` says whether it is a GPU. `bf16` (fake only) is what torch.cuda.is_bf16_supported says."""

    device = torch.device("cuda", 0)

    def __init__(self, mode=None):
        self.mode = mode
        self.real = mode is None
        self.bf16 = True
        self.rng_states: list[torch.Tensor] = [torch.zeros(16, dtype=torch.uint8)]
        self.current: int = 0

    @contextlib.contextmanager
    def cpu(self):
        """Real CPU tensors inside a test (building a model, reading a file)."""
        if self.real:
            yield
            return
        from torch._subclasses.fake_tensor import unset_fake_temporarily
        with unset_fake_temporarily():
            yield

    def move(self, module: nn.Module, device=None, dtype: torch.dtype | None = None) -> nn.Module:
        """`module.to(device, dtype)`: for real; faked, by fake tensors of the same shapes (ties kept)."""
        device = torch.device(device) if device is not None else self.device
        if device.type == "cuda" and device.index is None:
            device = self.device
        if self.real:
            return module.to(device=device, dtype=dtype)
        replaced: dict[int, torch.Tensor] = {}

        def fake_like(t: torch.Tensor) -> torch.Tensor:
            if id(t) not in replaced:
                kind = dtype if dtype is not None and t.is_floating_point() else t.dtype
                new = torch.empty(t.shape, dtype=kind, device=device)
                # Faked, parameters do not require gradients: autocast's cast cache would record
                # autograd metadata for them (the absent device guard again); `trainable` turns it on.
                replaced[id(t)] = nn.Parameter(new, requires_grad=self.real and t.requires_grad) \
                    if isinstance(t, nn.Parameter) else new
            return replaced[id(t)]

        for sub in module.modules():
            for store in (sub._parameters, sub._buffers):
                for name, t in list(store.items()):
                    if t is not None:
                        store[name] = fake_like(t)
        return module

    def on_cpu(self, function):
        """`function` (a model loader) run with real CPU tensors: models are built on the CPU."""
        def call(*args, **kwargs):
            with self.cpu():
                return function(*args, **kwargs)
        return call

    def trainable(self, module: nn.Module) -> nn.Module:
        """Every parameter requiring gradients again (faked: after the forward passes, before an
        optimizer is built on the parameters)."""
        for p in module.parameters():
            p.requires_grad_(True)
        return module

    def model(self, cls, preset: str = "tiny", kernels=None, **overrides) -> nn.Module:
        """A small model of class `cls` built on the CPU, then on this device."""
        with self.cpu():
            torch.manual_seed(0)
            config = BertConfig.preset(preset, **overrides)
            model = cls(config, kernels=kernels) if kernels is not None else cls(config)
        return self.move(model)

    def ids(self, batch: int = 2, length: int = 8, vocab: int = 100) -> torch.Tensor:
        return torch.randint(5, vocab, (batch, length), device=self.device)

    def padding(self, lengths, length: int) -> torch.Tensor:
        """A (B, T) 1/0 attention mask with these real lengths, on the device."""
        positions = torch.arange(length, device=self.device)
        return (positions[None] < torch.tensor(lengths, device=self.device)[:, None]).long()

    def loss_value(self, loss: torch.Tensor) -> float | None:
        """The loss as a float on a real device; None faked (no values)."""
        return float(loss) if self.real else None


def _fake_getitem(original):
    """`Tensor.__getitem__` for fake CUDA tensors as aten ops (see the module docstring)."""

    def getitem(self, index):
        if not (is_fake(self) and self.device.type == "cuda"):
            return original(self, index)
        index = index if isinstance(index, tuple) else (index,)
        used = sum(i.dim() if torch.is_tensor(i) and i.dtype == torch.bool else 1
                   for i in index if i is not None and i is not Ellipsis)
        out, dim, advanced = self, 0, []
        for i in index:
            if i is Ellipsis:
                skip = self.dim() - used
                advanced += [None] * skip
                dim += skip
            elif i is None:
                out = out.unsqueeze(dim)
                advanced.append(None)
                dim += 1
            elif isinstance(i, int) and not isinstance(i, bool):
                out = out.select(dim, i)
            elif isinstance(i, slice):
                step = 1 if i.step is None else i.step
                out = torch.ops.aten.slice.Tensor(out, dim, i.start, i.stop, step)
                advanced.append(None)
                dim += 1
            elif torch.is_tensor(i):
                advanced.append(i)
                dim += i.dim() if i.dtype == torch.bool else 1
            else:
                return original(self, index)
        if any(torch.is_tensor(a) for a in advanced):
            while advanced and advanced[-1] is None:
                advanced.pop()
            out = torch.ops.aten.index.Tensor(out, advanced)
        return out

    return getitem


def _as_aten(method, op):
    """A Tensor method whose Python binding enters the device guard, as its aten op for fake CUDA tensors."""

    def call(self, *args):
        if is_fake(self) and self.device.type == "cuda":
            return op(self, *args)
        return method(self, *args)

    return call


def _fake_mode_class():
    from torch._subclasses.fake_tensor import FakeTensorMode

    class FakeCudaMode(FakeTensorMode):
        """FakeTensorMode as on a machine without CUDA (a no-op CUDA device guard, no device
        initialisation) while torch.cuda.is_available() answers True for the code under test."""

        avoid_device_init = property(lambda self: True)

    return FakeCudaMode


_FakeCudaMode = _fake_mode_class()


@pytest.fixture
def cuda(monkeypatch):
    """The CUDA device, fake (default) or real (BERTKIT_TEST_DEVICE=cuda); the test body runs on it."""
    if REAL:
        if not torch.cuda.is_available():
            pytest.fail("BERTKIT_TEST_DEVICE=cuda but torch.cuda.is_available() is False")
        yield FakeCuda()
        return
    mode = _FakeCudaMode(allow_non_fake_inputs=False)
    fake = FakeCuda(mode)
    # torch.cuda's host calls, answered as one GPU would (the CUDA runtime is absent from this build).
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: fake.current)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: setattr(fake, "current", torch.device(
        "cuda", device).index if isinstance(device, int) else torch.device(device).index or 0))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: fake.bf16)
    def get_rng_state_all():
        with fake.cpu():
            return [s.clone() for s in fake.rng_states]

    def set_rng_state_all(states):
        with fake.cpu():
            fake.rng_states = [torch.as_tensor(s).clone() for s in states]

    monkeypatch.setattr(torch.cuda, "get_rng_state_all", get_rng_state_all)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", set_rng_state_all)
    monkeypatch.setattr(torch.cuda, "manual_seed_all", lambda seed: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "fake CUDA device")
    # The padding check reads values: build the mask always (the path of a batch with padding).
    padding_mask = layout_module.padding_mask
    monkeypatch.setattr(layout_module, "padding_mask",
                        lambda mask, causal, T, skip_if_full=True: padding_mask(mask, causal, T, skip_if_full=False))
    original_to = nn.Module.to

    def module_to(self, *args, **kwargs):
        tensors = list(self.parameters()) + list(self.buffers())
        device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        if device is not None and device.type == "cuda" and device.index is None:
            device = torch.device("cuda", fake.current)
        if tensors and device is not None and device.type == "cuda" and not any(is_fake(t) for t in tensors):
            return fake.move(self, device, dtype)  # real weights onto the fake GPU (their values stay behind)
        if not tensors or not all(is_fake(t) for t in tensors):
            return original_to(self, *args, **kwargs)
        if dtype is None and all(t.device == (device or t.device) for t in tensors):
            return self  # already there
        return fake.move(self, device or tensors[0].device, dtype)

    monkeypatch.setattr(nn.Module, "to", module_to)
    monkeypatch.setattr(torch.Tensor, "__getitem__", _fake_getitem(torch.Tensor.__getitem__))
    contiguous = torch.Tensor.contiguous

    def fake_contiguous(self, memory_format=torch.contiguous_format):  # the same device guard
        if not (is_fake(self) and self.device.type == "cuda"):
            return contiguous(self, memory_format=memory_format)
        if self.is_contiguous(memory_format=memory_format):
            return self
        return torch.ops.aten.clone.default(self, memory_format=memory_format)

    monkeypatch.setattr(torch.Tensor, "contiguous", fake_contiguous)
    for name, op in (("masked_fill", torch.ops.aten.masked_fill), ("__invert__", torch.ops.aten.bitwise_not)):
        monkeypatch.setattr(torch.Tensor, name, _as_aten(getattr(torch.Tensor, name), op))
    with mode, torch.no_grad():
        yield fake
