"""The HIP backend: load code objects with hip-python and launch them on
torch's current stream, with the kernarg bytes of `k2back.runtime.launch`.

vLLM's rules (SPEC §8): modules are per device and loaded once; nothing is
compiled, loaded or allocated while a stream is capturing a graph; no host
syncs on the launch path.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Mapping

import torch

from k2back.runtime import launch

EMU_HINT = ("without them, run the kernel in the emulator: backend='emu' with CPU tensors "
            "(CLI: `k2back verify`)")


class BackendUnavailable(RuntimeError):
    pass


class HipError(RuntimeError):
    pass


class CaptureError(RuntimeError):
    pass


def bindings():
    """hip-python's `hip` module (imports without ROCm; its first call needs libamdhip64.so)."""
    from hip import hip

    return hip


def error_name(err) -> str:
    _, name = bindings().hipGetErrorName(err)
    return name.decode() if isinstance(name, bytes) else str(name)


def hip_check(call: str, result):
    """hip-python returns (error, *results): raise on an error, by its HIP name."""
    result = result if isinstance(result, tuple) else (result,)
    err, rest = result[0], result[1:]
    if err != bindings().hipError_t.hipSuccess:
        raise HipError(f"{call} failed: {error_name(err)}")
    return rest[0] if len(rest) == 1 else rest


@functools.cache
def runtime_status() -> str | None:
    """None when the HIP runtime is loaded and sees a GPU, else why not."""
    if torch.version.hip is None:
        return f"torch {torch.__version__} is not a ROCm build (torch.version.hip is None)"
    try:
        count = hip_check("hipGetDeviceCount", bindings().hipGetDeviceCount())
    except (RuntimeError, ImportError) as e:
        return f"the HIP runtime could not be used: {e}"
    return None if count else "the HIP runtime sees no GPU"


def require_runtime() -> None:
    status = runtime_status()
    if status is not None:
        raise BackendUnavailable(
            f"backend 'hip' needs the ROCm runtime (libamdhip64.so) and an AMD GPU: {status}; "
            f"{EMU_HINT}"
        )


def capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def refuse_during_capture(what: str) -> None:
    if capturing():
        raise CaptureError(
            f"{what} while a stream is capturing a graph: run one call of every "
            "token count outside capture first (or `k2back warmup`), then capture"
        )


def device_arch(device: torch.device) -> str:
    """The device's gcnArchName with its feature suffixes, e.g. gfx942:sramecc+:xnack-."""
    return torch.cuda.get_device_properties(device).gcnArchName


class HipBackend:
    name = "hip"

    def __init__(self):
        require_runtime()
        self._functions: dict[tuple, object] = {}  # (device, kernel) -> hipFunction_t

    def new_scratch(self, spec, device: torch.device) -> torch.Tensor:
        refuse_during_capture(f"allocating the scratch of {spec.name}")
        return launch.new_scratch(spec, device)

    def _function(self, kernel, device: torch.device):
        key = (device.index, kernel.name, kernel.arch)
        if key not in self._functions:
            refuse_during_capture(f"loading {kernel.name} on {device}")
            hip = bindings()
            with torch.cuda.device(device):
                module = hip_check("hipModuleLoadData", hip.hipModuleLoadData(kernel.hsaco))
                self._functions[key] = hip_check(
                    "hipModuleGetFunction",
                    hip.hipModuleGetFunction(module, kernel.name.encode()),
                )
        return self._functions[key]

    def run(self, kernel, spec, tensors: Mapping[str, object], scratch: torch.Tensor,
            qk_scale: float | None = None) -> None:
        hip = bindings()
        device = scratch.device
        function = self._function(kernel, device)
        segment = launch.kernargs(kernel, spec, tensors, scratch.data_ptr(),
                                  lambda tensor, _: tensor.data_ptr(), qk_scale)
        buffer = ctypes.create_string_buffer(segment, len(segment))
        size = ctypes.c_size_t(len(segment))
        # the kernarg segment by value; the runtime copies it at launch
        extra = (ctypes.c_void_p * 5)(
            hip.HIP_LAUNCH_PARAM_BUFFER_POINTER, ctypes.addressof(buffer),
            hip.HIP_LAUNCH_PARAM_BUFFER_SIZE, ctypes.addressof(size),
            hip.HIP_LAUNCH_PARAM_END,
        )
        dims = launch.launch_dims(spec)
        stream = torch.cuda.current_stream(device).cuda_stream
        hip_check("hipModuleLaunchKernel", hip.hipModuleLaunchKernel(
            function, *dims.grid, *dims.block, dims.dynamic_lds, stream, None,
            ctypes.addressof(extra),
        ))
