"""Everything about a launch that does not depend on where it runs.

Both backends (HIP, the emulator) take the kernel arguments, the launch
geometry, the scratch size and the kernarg bytes from here; only the final
call differs. The tensors are the vLLM-format launch arguments (the names of
`k2back.reference.attention_back`) plus `out`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from k2back.codegen.signature import KERNEL_ARGS
from k2back.model import geometry
from k2back.runtime.kernargs import KernargLayout, LaunchDims

# The paged KV caches: each one's pointer, records per page, page stride and
# real byte extent (the buffer resource's size: reads past it return 0).
CACHES = ("swa", "comp")
TENSOR_ARGS = tuple(a.name for a in KERNEL_ARGS if a.is_pointer and a.name != "scratch")


def byte_extent(tensor: torch.Tensor | None) -> int:
    """Bytes from a tensor's first element to one past its last, strides included."""
    if tensor is None or tensor.numel() == 0:
        return 0
    last = sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride()))
    return (last + 1) * tensor.element_size()


def qk_scale_value(spec, qk_scale: float | None) -> float:
    """The score scale the kernel multiplies q·K by (SPEC §2: 512^-0.5 unless given)."""
    return geometry(spec.geometry).qk_scale if qk_scale is None else float(qk_scale)


def kernel_arguments(spec, tensors: Mapping[str, object], scratch_address: int,
                     address_of: Callable[[torch.Tensor, str], int],
                     qk_scale: float | None = None) -> dict[str, object]:
    """Every explicit kernel argument by name: device addresses of the tensors
    (`address_of(tensor, argument name)` is the backend's), the caches'
    geometry, the score scale."""
    values: dict[str, object] = {
        name: 0 if tensors[name] is None else address_of(tensors[name], name)
        for name in TENSOR_ARGS
    }
    values["scratch"] = scratch_address
    for cache in CACHES:
        pages = tensors[f"{cache}_cache"]
        values[f"{cache}_block"] = 0 if pages is None else int(tensors[f"{cache}_block"])
        values[f"{cache}_stride"] = 0 if pages is None else pages.stride(0) * pages.element_size()
        values[f"{cache}_bytes"] = byte_extent(pages)
    values["cos_sin_rows"] = tensors["cos_sin"].shape[0]
    values["qk_scale"] = qk_scale_value(spec, qk_scale)
    return values


def launch_dims(spec, grid: tuple[int, int, int] | None = None) -> LaunchDims:
    """A persistent grid: one workgroup per CU, all resident (unless `grid` is
    given: a stage-level test kernel); LDS is static."""
    return LaunchDims(grid=(spec.blocks, 1, 1) if grid is None else grid,
                      block=(spec.threads, 1, 1))


def new_scratch(spec, device) -> torch.Tensor:
    """The hand-off buffer of one kernel, zeroed once: the epoch protocol
    never needs it cleared again (flags carry the epoch they belong to)."""
    return torch.zeros(spec.scratch_bytes, dtype=torch.uint8, device=device)


_LAYOUTS: dict[str, KernargLayout] = {}  # build key -> the checked layout of its code object


def kernargs(kernel, spec, tensors: Mapping[str, object], scratch_address: int,
             address_of: Callable[[torch.Tensor, str], int], qk_scale: float | None = None,
             dims: LaunchDims | None = None) -> bytes:
    """The kernarg segment of one launch of the K2 kernel (or of a kernel of
    its signature launched on `dims`), for either backend (the layout is
    checked against the signature once a build, not every call)."""
    if kernel.key not in _LAYOUTS:
        _LAYOUTS[kernel.key] = KernargLayout(kernel.metadata, KERNEL_ARGS)
    values = kernel_arguments(spec, tensors, scratch_address, address_of, qk_scale)
    return _LAYOUTS[kernel.key].pack(values, launch_dims(spec) if dims is None else dims)
