"""The `cuda` fixture of the fake_cuda tests (fake_cuda_device.py says what is faked and how)."""

from fake_cuda_device import cuda  # noqa: F401  (the fixture)
