"""`k2back selftest`: the no-GPU path end to end (a subprocess, as a user runs
it), and the GPU path against a recording stand-in for hip-python whose
"device" runs each launch it is given (the code object it was loaded with,
the kernarg bytes it was passed, pointers into the tensors selftest moved to
the device) in the emulator, as tests/test_hip_backend.py records launches."""

from __future__ import annotations

import contextlib
import ctypes
import os
import struct
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from k2back import selftest
from k2back.emu import Machine
from k2back.runtime import hip


@pytest.mark.kernel
@pytest.mark.slow
def test_without_a_gpu_it_says_so_and_runs_the_emulator_half(run_cache):
    flags = [] if hip.runtime_status() is not None else ["--emulator-only"]  # a ROCm machine
    done = subprocess.run([sys.executable, "-m", "k2back", "selftest", *flags],
                          check=False, capture_output=True, text=True, timeout=1800,
                          env={**os.environ, "K2BACK_CACHE_DIR": run_cache})
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("k2back selftest: ") and "running the emulator half only" in lines[0]
    rows = [line for line in lines if line.startswith(("gfx942", "gfx950"))]
    per_arch = len(selftest.UNITS) + len(selftest.K2_CONFIGS)
    assert len(rows) == 2 * per_arch
    assert all(("model ok" in row) or ("emulator ok" in row) for row in rows), done.stdout
    assert not any("GPU" in row for row in rows)
    assert lines[-1] == f"{2 * per_arch} of {2 * per_arch} checks passed"


class EmulatingHip:
    """hip-python's module API, recorded; a launch runs in the emulator on the
    host memory the kernarg pointers point into."""

    HIP_LAUNCH_PARAM_BUFFER_POINTER, HIP_LAUNCH_PARAM_BUFFER_SIZE, HIP_LAUNCH_PARAM_END = 1, 2, 3
    hipError_t = SimpleNamespace(hipSuccess=0)

    def __init__(self, kernels: dict, tensors: list, corrupt: str | None = None):
        self.kernels, self.tensors, self.corrupt = kernels, tensors, corrupt
        self.calls, self.modules = [], {}

    def hipModuleLoadData(self, image):
        self.calls.append(("load", bytes(image)))
        handle = f"module{len(self.modules)}"
        self.modules[handle] = self.kernels[bytes(image)]
        return (0, handle)

    def hipModuleGetFunction(self, module, name):
        self.calls.append(("function", module, name))
        assert self.modules[module].name.encode() == name
        return (0, module)

    def _owner(self, pointer: int) -> torch.Tensor:
        for tensor in self.tensors:
            start = tensor.untyped_storage().data_ptr()
            if start <= pointer < start + tensor.untyped_storage().nbytes():
                return tensor
        raise AssertionError(f"a kernarg pointer {pointer:#x} into no tensor moved to the device")

    def hipModuleLaunchKernel(self, f, gx, gy, gz, bx, by, bz, lds, stream, params, extra):
        config = (ctypes.c_void_p * 5).from_address(extra)
        assert [config[0], config[2], config[4]] == [1, 2, 3]
        segment = bytearray(ctypes.string_at(config[1], ctypes.c_size_t.from_address(config[3]).value))
        kernel = self.modules[f]
        self.calls.append(("launch", kernel.name, (gx, gy, gz), (bx, by, bz), len(segment)))
        machine, mapped = Machine(kernel.arch), {}
        for arg in kernel.metadata.args:
            if arg.value_kind != "global_buffer":
                continue
            (pointer,) = struct.unpack_from("<Q", segment, arg.offset)
            if pointer == 0:  # an absent tensor (no compressed cache at ratio 0)
                continue
            storage = self._owner(pointer).untyped_storage()
            if storage.data_ptr() not in mapped:
                whole = torch.empty(0, dtype=torch.uint8).set_(storage)
                mapped[storage.data_ptr()] = machine.map(whole)
            struct.pack_into("<Q", segment, arg.offset,
                             mapped[storage.data_ptr()] + pointer - storage.data_ptr())
        machine.launch(kernel.asm, kernel.name, grid=(gx, gy, gz), block=(bx, by, bz),
                       kernargs=bytes(segment), dynamic_lds=lds)
        if self.corrupt == kernel.name:  # a "GPU" that differs from the emulator
            (pointer,) = struct.unpack_from("<Q", ctypes.string_at(config[1], 16), 8)
            self._owner(pointer).view(torch.int32).view(-1)[5] ^= 1 << 20
        return (0,)

    def hipGetErrorName(self, err):
        return (0, b"hipErrorUnknown")


@pytest.fixture
def stand_in(monkeypatch):
    """selftest's GPU half on a stand-in: kernels registered by code object,
    device tensors are host clones the stand-in can find by address."""
    kernels, tensors = {}, []
    unit_kernel, k2_kernel = selftest.unit_kernel, selftest.k2_kernel

    def register_unit(name, arch):
        kernel = unit_kernel(name, arch)
        kernels[kernel.hsaco] = kernel
        return kernel

    def register_k2(config, arch):
        spec, kernel = k2_kernel(config, arch)
        kernels[kernel.hsaco] = kernel
        return spec, kernel

    def to_device(tensor, device):
        copy = tensor.clone()
        tensors.append(copy)
        return copy

    fake = EmulatingHip(kernels, tensors)
    monkeypatch.setattr(selftest, "unit_kernel", register_unit)
    monkeypatch.setattr(selftest, "k2_kernel", register_k2)
    monkeypatch.setattr(selftest, "to_device", to_device)
    monkeypatch.setattr(selftest, "K2_CONFIGS", selftest.K2_CONFIGS[:1])
    monkeypatch.setattr(hip, "bindings", lambda: fake)
    monkeypatch.setattr(hip, "runtime_status", lambda: None)
    monkeypatch.setattr(hip, "capturing", lambda: False)
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda d=None: SimpleNamespace(cuda_stream=77))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: None)
    return fake


def run_with_gpu(arch="gfx942"):
    lines = []
    status = selftest.selftest((arch,), selftest.Gpu(torch.device("cpu")), "stand-in GPU",
                               print=lines.append)
    return status, "\n".join(lines)


@pytest.mark.kernel
def test_with_a_gpu_every_kernel_runs_on_both_and_agrees(stand_in):
    status, report = run_with_gpu()
    assert status == 0, report
    launches = [c for c in stand_in.calls if c[0] == "launch"]
    assert [c[1] for c in launches] == ["unit"] * len(selftest.UNITS) + [launches[-1][1]]
    assert all(c[2:4] == ((1, 1, 1), (64, 1, 1)) for c in launches[:-1])
    assert launches[-1][1].startswith("k2_") and launches[-1][3][0] > 64
    assert len([c for c in stand_in.calls if c[0] == "load"]) == len(launches)
    for unit in selftest.UNITS:
        assert f"unit: {unit.name}" in report
    assert report.count("GPU ok") == len(selftest.UNITS) + 1  # and the K2 row
    assert "GPU vs emulator: xo 0.00, x8b 0.00, out 0.00" in report
    assert "gfx950" not in report  # one GPU, one arch


@pytest.mark.kernel
def test_a_gpu_that_differs_is_reported(stand_in):
    stand_in.corrupt = "unit"
    status, report = run_with_gpu()
    assert status == 1
    assert report.count("GPU DIFFERS") == len(selftest.UNITS)
    assert report.splitlines()[-1] == f"1 of {len(selftest.UNITS) + 1} checks passed"
