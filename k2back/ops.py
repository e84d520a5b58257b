"""The launch path under the public API, and the torch custom op on top of it.

`torch.ops.k2back.attention_back` is what a torch.compile'd / CUDA-graph
captured model sees: it writes `out` and the layer's `scratch` (epoch state),
nothing else.
`k2back.AttentionBack` validates the arguments and owns the scratch; it calls
the op.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import torch

from k2back.codegen.build import build
from k2back.config import LAUNCH_ARGS, Config
from k2back.runtime.emu import EmuBackend
from k2back.runtime.hip import HipBackend, refuse_during_capture

# Where tensors live decides where the kernel runs.
BACKENDS = {"emu": EmuBackend, "hip": HipBackend}
DEVICE_BACKENDS = {"cpu": "emu", "cuda": "hip"}

# Config (as given and with its key formats resolved) -> (spec, kernel)
_KERNELS: dict[Config, tuple] = {}


@functools.cache
def backend(name: str):
    """One backend object a process (the HIP one keeps the per-device modules)."""
    return BACKENDS[name]()


def backend_for(device: torch.device):
    try:
        return backend(DEVICE_BACKENDS[device.type])
    except KeyError:
        raise ValueError(
            f"tensors on {device}: expected CPU tensors (emu backend) or ROCm GPU tensors "
            f"(hip backend)"
        ) from None


def kernel_for(config: Config):
    """`build`, once a process: what every launch goes through ("auto"
    formats resolved first: one kernel however they are named)."""
    if config not in _KERNELS:
        resolved = config.resolved()
        if resolved not in _KERNELS:
            refuse_during_capture(f"building the kernel for {resolved}")
            _KERNELS[resolved] = build(resolved)
        _KERNELS[config] = _KERNELS[resolved]
    return _KERNELS[config]


@functools.cache
def _config(*fields) -> Config:
    """The op's configuration from its arguments, checked once a process."""
    return Config(*fields)


def launch(tensors: Mapping[str, object], out: torch.Tensor, scratch: torch.Tensor,
           config: Config, qk_scale: float | None = None):
    """One launch on the backend of the tensors' device; the emulator's
    counters on the emu backend, None on HIP."""
    spec, kernel = kernel_for(config)
    return backend_for(out.device).run(kernel, spec, {**tensors, "out": out}, scratch, qk_scale)


def attention_back(
    q: torch.Tensor, key_table: torch.Tensor, key_len: torch.Tensor, positions: torch.Tensor,
    swa_cache: torch.Tensor, swa_block: int, comp_cache: torch.Tensor | None,
    comp_block: int, cos_sin: torch.Tensor, sink: torch.Tensor,
    wo_a: torch.Tensor, wo_a_scale: torch.Tensor, wo_b: torch.Tensor, wo_b_scale: torch.Tensor,
    out: torch.Tensor, scratch: torch.Tensor,
    geometry: str, tp: int, ratio: int, arch: str, swa_fp8: str, comp_fp8: str,
    qk_scale: float | None = None,
) -> None:
    """The launch as torch sees it: writes `out` and the layer's `scratch`."""
    given = locals()
    config = _config(geometry, tp, q.shape[0], ratio, arch, swa_fp8, comp_fp8)
    launch({name: given[name] for name in LAUNCH_ARGS}, out, scratch, config, qk_scale)


# Registered as vLLM's direct_register_custom_op does: the schema inferred from
# the annotations above, plain kernels per dispatch key. torch.library.custom_op
# would add ~50-300 µs of Python dispatch a call (measured here), on a kernel
# of a few µs.
MUTATED = ("out", "scratch")
_LIBRARY = torch.library.Library("k2back", "FRAGMENT")
_LIBRARY.define("attention_back" + torch.library.infer_schema(attention_back, mutates_args=MUTATED))
for _key in ("CPU", "CUDA"):  # emu on CPU tensors; hip on ROCm tensors (torch's CUDA key)
    _LIBRARY.impl("attention_back", attention_back, _key)


@torch.library.register_fake("k2back::attention_back")
def _(*args, **kwargs) -> None:
    # writes only its mutated arguments: nothing to allocate, nothing to return
    return None
