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

from k2back.codegen.compiler import compile as compile_source
from k2back.codegen.llvm import parse_arch
from k2back.codegen.plan import plan
from k2back.codegen.render import KernelSource
from k2back.formats import resolve_key_fp8
from k2back.runtime.emu import EmuBackend
from k2back.runtime.hip import HipBackend, refuse_during_capture

# Where tensors live decides where the kernel runs.
BACKENDS = {"emu": EmuBackend, "hip": HipBackend}
DEVICE_BACKENDS = {"cpu": "emu", "cuda": "hip"}

# (geometry, tp, tokens, ratio, arch, swa_fp8, comp_fp8) -> (spec, kernel)
_KERNELS: dict[tuple, tuple] = {}


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


def plan_for(geometry: str, tp: int, tokens: int, ratio: int, arch: str,
             swa_fp8: str = "auto", comp_fp8: str = "auto"):
    """The spec of one configuration; `arch` may carry target-ID features
    (gfx942:sramecc+:xnack-), which change the build, not the plan; the key
    formats "auto" resolve to what vLLM writes on the arch."""
    return plan(geometry, tp, tokens, ratio, parse_arch(arch).arch, swa_fp8, comp_fp8)


def build(geometry: str, tp: int, tokens: int, ratio: int, arch: str, swa_fp8: str = "auto",
          comp_fp8: str = "auto"):
    """(spec, compiled kernel) of one configuration, from the disk cache when warm."""
    spec = plan_for(geometry, tp, tokens, ratio, arch, swa_fp8, comp_fp8)
    source = KernelSource(spec)
    source.arch = arch  # the target ID: its features change the build and its key, not the IR
    return spec, compile_source(source)


def kernel_for(geometry: str, tp: int, tokens: int, ratio: int, arch: str, swa_fp8: str = "auto",
               comp_fp8: str = "auto"):
    """`build`, once a process: what every launch goes through ("auto"
    formats resolved first: one kernel however they are named)."""
    swa_fp8, comp_fp8 = resolve_key_fp8(parse_arch(arch).arch, swa_fp8, comp_fp8)
    key = (geometry, tp, tokens, ratio, arch, swa_fp8, comp_fp8)
    if key not in _KERNELS:
        refuse_during_capture(f"building the kernel for geometry {geometry} tp {tp} "
                              f"tokens {tokens} ratio {ratio} arch {arch} swa_fp8 {swa_fp8} "
                              f"comp_fp8 {comp_fp8}")
        _KERNELS[key] = build(*key)
    return _KERNELS[key]


def launch(tensors: Mapping[str, object], out: torch.Tensor, scratch: torch.Tensor, *,
           geometry: str, tp: int, ratio: int, arch: str, swa_fp8: str, comp_fp8: str,
           qk_scale: float | None = None):
    """One launch on the backend of the tensors' device; the emulator's
    counters on the emu backend, None on HIP."""
    spec, kernel = kernel_for(geometry, tp, tensors["q"].shape[0], ratio, arch, swa_fp8, comp_fp8)
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
    tensors = {"q": q, "key_table": key_table, "key_len": key_len, "positions": positions,
               "swa_cache": swa_cache, "swa_block": swa_block, "comp_cache": comp_cache,
               "comp_block": comp_block, "cos_sin": cos_sin, "sink": sink, "wo_a": wo_a,
               "wo_a_scale": wo_a_scale, "wo_b": wo_b, "wo_b_scale": wo_b_scale}
    launch(tensors, out, scratch, geometry=geometry, tp=tp, ratio=ratio, arch=arch,
           swa_fp8=swa_fp8, comp_fp8=comp_fp8, qk_scale=qk_scale)


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
def _(q, key_table, key_len, positions, swa_cache, swa_block, comp_cache, comp_block, cos_sin,
      sink, wo_a, wo_a_scale, wo_b, wo_b_scale, out, scratch, geometry, tp, ratio, arch,
      swa_fp8, comp_fp8, qk_scale=None) -> None:
    # writes only its mutated arguments: nothing to allocate, nothing to return
    return None
