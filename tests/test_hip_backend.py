"""The hip backend without a GPU: the clear error when ROCm is absent, and the
launch call itself against a recording stand-in for hip-python (the `extra`
array, the kernarg bytes at the code object's offsets, grid, block, stream)."""

from __future__ import annotations

import contextlib
import ctypes
import struct
from types import SimpleNamespace

import pytest
import torch

from k2back.codegen import llvm
from k2back.codegen.testing import asm_metadata, echo_ir, small_tensors
from k2back.runtime import hip
from k2back.runtime.launch import TENSOR_ARGS


def test_without_rocm_the_error_names_the_emu_backend():
    if hip.runtime_status() is None:  # a ROCm machine: the backend comes up
        assert hip.HipBackend().name == "hip"
        return
    with pytest.raises(hip.BackendUnavailable) as e:
        hip.HipBackend()
    message = str(e.value)
    assert "ROCm" in message and "backend='emu'" in message


class RecordingHip:
    """The few hip-python calls the backend makes, recorded instead of run."""

    HIP_LAUNCH_PARAM_BUFFER_POINTER, HIP_LAUNCH_PARAM_BUFFER_SIZE, HIP_LAUNCH_PARAM_END = 1, 2, 3
    hipError_t = SimpleNamespace(hipSuccess=0, hipErrorInvalidImage=200)

    def __init__(self, fail_with=None):
        self.calls = []
        self.fail_with = fail_with

    def hipModuleLoadData(self, image):
        self.calls.append(("load", bytes(image)))
        return (self.fail_with or 0, "module")

    def hipModuleGetFunction(self, module, name):
        self.calls.append(("function", module, name))
        return (0, "function")

    def hipModuleLaunchKernel(self, f, gx, gy, gz, bx, by, bz, lds, stream, params, extra):
        config = (ctypes.c_void_p * 5).from_address(extra)
        size = ctypes.c_size_t.from_address(config[3]).value
        self.calls.append(("launch", f, (gx, gy, gz), (bx, by, bz), lds, stream, params,
                           [config[0], config[2], config[4]], ctypes.string_at(config[1], size)))
        return (0,)

    def hipGetErrorName(self, err):
        return (0, b"hipErrorInvalidImage")


@pytest.fixture
def recording(monkeypatch):
    fake = RecordingHip()
    monkeypatch.setattr(hip, "bindings", lambda: fake)
    monkeypatch.setattr(hip, "runtime_status", lambda: None)
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda d=None: SimpleNamespace(cuda_stream=77))
    monkeypatch.setattr(hip, "capturing", lambda: False)
    return fake


def echo_kernel(arch="gfx942"):
    asm = llvm.emit_assembly(echo_ir(), arch)
    return SimpleNamespace(name="k2_echo", arch=arch, asm=asm, hsaco=b"\x7fELF-image",
                           metadata=asm_metadata(asm), key=f"echo-{arch}")


SPEC = SimpleNamespace(name="k2_echo", geometry="tiny", blocks=304, threads=512, scratch_bytes=4096)


def test_launch_passes_the_kernarg_segment_through_extra(recording):
    backend = hip.HipBackend()
    kernel, tensors = echo_kernel(), small_tensors()
    scratch = torch.zeros(SPEC.scratch_bytes, dtype=torch.uint8)
    for _ in range(2):
        backend.run(kernel, SPEC, tensors, scratch, qk_scale=0.25)
    loads = [c for c in recording.calls if c[0] == "load"]
    assert loads == [("load", kernel.hsaco)]  # one module per device, loaded once
    assert ("function", "module", b"k2_echo") in recording.calls  # the name, not `.kd`
    launch = [c for c in recording.calls if c[0] == "launch"][-1]
    _, function, grid, block, lds, stream, params, markers, segment = launch
    assert (function, grid, block, lds, stream, params) == (
        "function", (304, 1, 1), (512, 1, 1), 0, 77, None)
    assert markers == [1, 2, 3]
    assert len(segment) == kernel.metadata.kernarg_size
    at = {a.name: a.offset for a in kernel.metadata.args}
    for name in TENSOR_ARGS:
        assert struct.unpack_from("<Q", segment, at[name])[0] == tensors[name].data_ptr(), name
    assert struct.unpack_from("<Q", segment, at["scratch"])[0] == scratch.data_ptr()
    comp = tensors["comp_cache"]
    assert struct.unpack_from("<qq", segment, at["comp_stride"]) == (
        2 * 64 * 576, 64 * 576 + 512 + 4 * 2 * 64 * 576)  # padded pages: real stride and extent
    assert struct.unpack_from("<f", segment, at["qk_scale"])[0] == 0.25
    assert comp.stride(0) == 2 * 64 * 576


def test_hip_errors_carry_the_hip_name(recording):
    recording.fail_with = 200
    backend = hip.HipBackend()
    with pytest.raises(hip.HipError, match="hipModuleLoadData failed: hipErrorInvalidImage"):
        backend.run(echo_kernel(), SPEC, small_tensors(), torch.zeros(16, dtype=torch.uint8))


def test_no_module_load_or_allocation_during_capture(recording, monkeypatch):
    backend = hip.HipBackend()
    monkeypatch.setattr(hip, "capturing", lambda: True)
    with pytest.raises(hip.CaptureError, match="capturing"):
        backend.run(echo_kernel(), SPEC, small_tensors(), torch.zeros(16, dtype=torch.uint8))
    with pytest.raises(hip.CaptureError, match="scratch"):
        backend.new_scratch(SPEC, torch.device("cpu"))
    assert not [c for c in recording.calls if c[0] == "load"]
