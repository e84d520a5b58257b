"""The one kernarg packer: every launcher (HIP and the emulator) builds the
kernarg segment here, from the layout the code object itself declares.

The layout (offset, size, value_kind of every argument) is read from the
code object's metadata, never restated: LLVM decides the offsets and the
hidden-argument block of code object v5. Explicit arguments are packed by name
from `values`; hidden arguments are filled from the launch geometry as the HIP
runtime fills them (AMDGPUUsage, "Code Object V5 Metadata"). HIP overwrites the
hidden block itself when the buffer goes through `extra`; the emulator has no
runtime, so it needs them from us, and packing them identically keeps one path.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from k2back.codegen.signature import KernelArg

AXES = "xyz"


@dataclass(frozen=True)
class LaunchDims:
    """Grid in workgroups, workgroup in work-items, dynamic LDS bytes."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dynamic_lds: int = 0

    @property
    def grid_dims(self) -> int:
        """Dimensions in use, as HIP reports them (trailing 1s dropped)."""
        used = [i for i, (g, b) in enumerate(zip(self.grid, self.block)) if g * b > 1]
        return max(used, default=0) + 1


def _per_axis(prefix: str, pick) -> dict:
    return {f"{prefix}_{axis}": (lambda d, i=i: pick(d, i)) for i, axis in enumerate(AXES)}


# hidden value_kind -> its value for a launch. Our grids are whole workgroups,
# so the partial-workgroup remainder is always 0.
HIDDEN_FROM_LAUNCH = {
    **_per_axis("hidden_block_count", lambda d, i: d.grid[i]),
    **_per_axis("hidden_group_size", lambda d, i: d.block[i]),
    **_per_axis("hidden_remainder", lambda d, i: 0),
    **_per_axis("hidden_global_offset", lambda d, i: 0),
    "hidden_grid_dims": lambda d: d.grid_dims,
    "hidden_dynamic_lds_size": lambda d: d.dynamic_lds,
}

# Runtime-owned pointers (printf/hostcall buffers, queues, apertures...): a
# kernel of ours never uses them, so null is what the emulator gets; HIP writes
# its own.
HIDDEN_RUNTIME_OWNED = frozenset({
    "hidden_none", "hidden_printf_buffer", "hidden_hostcall_buffer",
    "hidden_multigrid_sync_arg", "hidden_heap_v1", "hidden_default_queue",
    "hidden_completion_action", "hidden_queue_ptr", "hidden_private_base",
    "hidden_shared_base",
})

# LLVM parameter type -> (bytes, value_kind, number kind) of a K2 kernel argument.
_LLVM_TYPES = {
    "ptr addrspace(1)": (8, "global_buffer", int),
    "i32": (4, "by_value", int),
    "i64": (8, "by_value", int),
    "float": (4, "by_value", float),
}
_FLOAT_FORMATS = {2: "<e", 4: "<f", 8: "<d"}


class KernargError(ValueError):
    pass


def _encode_int(name: str, value, size: int) -> bytes:
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            value = int(value.__index__())
        except (AttributeError, TypeError):
            raise KernargError(
                f"kernarg {name!r}: expected an integer, got {type(value).__name__} {value!r}"
            ) from None
    bits = 8 * size
    # signed or unsigned both fit: i32 -1 and a 0xffffffff mask pack the same
    if not -(1 << (bits - 1)) <= value < (1 << bits):
        raise KernargError(f"kernarg {name!r}: {value} does not fit in {bits} bits")
    return (value & ((1 << bits) - 1)).to_bytes(size, "little")


def _encode_float(name: str, value, size: int) -> bytes:
    if size not in _FLOAT_FORMATS:
        raise KernargError(f"kernarg {name!r}: no float type of {size} bytes")
    try:
        return struct.pack(_FLOAT_FORMATS[size], float(value))
    except (TypeError, ValueError):
        raise KernargError(
            f"kernarg {name!r}: expected a number, got {type(value).__name__} {value!r}"
        ) from None


_ENCODERS = {int: _encode_int, float: _encode_float}


def _check_signature(explicit: list, signature: Iterable[KernelArg]) -> dict[str, type]:
    """The code object's explicit arguments must be the signature's, in order
    and size: a kernel built from another signature would read garbage."""
    signature = tuple(signature)
    got = [a.name for a in explicit]
    want = [a.name for a in signature]
    if got != want:
        raise KernargError(
            f"kernel arguments: the code object declares {got}, the signature {want}"
        )
    kinds = {}
    for meta, arg in zip(explicit, signature):
        size, value_kind, number = _LLVM_TYPES[arg.llvm_type]
        if (meta.size, meta.value_kind) != (size, value_kind):
            raise KernargError(
                f"kernarg {arg.name!r}: the signature says {arg.llvm_type} "
                f"({size} B, {value_kind}), the code object {meta.size} B, {meta.value_kind}"
            )
        kinds[arg.name] = number
    return kinds


def pack_kernargs(metadata, values: Mapping[str, object], dims: LaunchDims,
                  signature: Iterable[KernelArg] | None = None) -> bytes:
    """The kernarg segment of one launch: `metadata.kernarg_size` bytes.

    `values` holds every explicit argument by name (pointers as device
    addresses). With `signature` (the K2 kernel's KERNEL_ARGS) the code object
    must declare exactly its arguments and each is encoded by its LLVM type;
    without one (hand-written test kernels) a float value packs as an IEEE
    float and an int as a little-endian integer of the argument's size.
    """
    explicit = [a for a in metadata.args if not a.value_kind.startswith("hidden_")]
    names = {a.name for a in explicit}
    missing = [a.name for a in explicit if a.name not in values]
    unknown = sorted(set(values) - names)
    if missing or unknown:
        raise KernargError(
            f"kernel {metadata.name!r}: missing values for {missing}, "
            f"unknown arguments {unknown}; it declares {[a.name for a in explicit]}"
        )
    kinds = _check_signature(explicit, signature) if signature is not None else {
        a.name: float if isinstance(values[a.name], float) else int for a in explicit
    }

    segment = bytearray(metadata.kernarg_size)
    for arg in metadata.args:
        if arg.offset + arg.size > len(segment) or arg.offset % math.gcd(arg.size, 8):
            raise KernargError(
                f"kernarg {arg.name or arg.value_kind!r}: offset {arg.offset}, size {arg.size} "
                f"outside or misaligned in a {len(segment)}-byte segment"
            )
        if arg.value_kind in HIDDEN_FROM_LAUNCH:
            data = _encode_int(arg.value_kind, HIDDEN_FROM_LAUNCH[arg.value_kind](dims), arg.size)
        elif arg.value_kind in HIDDEN_RUNTIME_OWNED:
            continue
        elif arg.value_kind.startswith("hidden_"):
            raise KernargError(f"kernel {metadata.name!r}: unknown hidden argument "
                               f"{arg.value_kind!r} (offset {arg.offset})")
        else:
            data = _ENCODERS[kinds[arg.name]](arg.name, values[arg.name], arg.size)
        segment[arg.offset:arg.offset + arg.size] = data
    return bytes(segment)
