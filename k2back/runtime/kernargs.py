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
import operator
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
    if isinstance(value, bool):
        raise KernargError(f"kernarg {name!r}: expected an integer, got bool {value!r}")
    try:
        # signed or unsigned both fit: i32 -1 and a 0xffffffff mask pack the same
        return operator.index(value).to_bytes(size, "little", signed=value < 0)
    except TypeError:
        raise KernargError(
            f"kernarg {name!r}: expected an integer, got {type(value).__name__} {value!r}"
        ) from None
    except OverflowError:
        raise KernargError(f"kernarg {name!r}: {value} does not fit in {8 * size} bits") from None


def _encode_float(name: str, value, size: int) -> bytes:
    try:
        return struct.pack(_FLOAT_FORMATS[size], float(value))
    except KeyError:
        raise KernargError(f"kernarg {name!r}: no float type of {size} bytes") from None
    except (TypeError, ValueError):
        raise KernargError(
            f"kernarg {name!r}: expected a number, got {type(value).__name__} {value!r}"
        ) from None


_ENCODERS = {int: _encode_int, float: _encode_float}


def _signature_kinds(explicit: list, signature: Iterable[KernelArg]) -> list[type]:
    """The number kind of each explicit argument. The code object's arguments
    must be the signature's, in order and size: a kernel built from another
    signature would read garbage."""
    signature = tuple(signature)
    got = [a.name for a in explicit]
    want = [a.name for a in signature]
    if got != want:
        raise KernargError(
            f"kernel arguments: the code object declares {got}, the signature {want}"
        )
    kinds = []
    for meta, arg in zip(explicit, signature):
        size, value_kind, number = _LLVM_TYPES[arg.llvm_type]
        if (meta.size, meta.value_kind) != (size, value_kind):
            raise KernargError(
                f"kernarg {arg.name!r}: the signature says {arg.llvm_type} "
                f"({size} B, {value_kind}), the code object {meta.size} B, {meta.value_kind}"
            )
        kinds.append(number)
    return kinds


class KernargLayout:
    """Where every argument of one code object goes, checked once; `pack` per launch.

    With `signature` (the K2 kernel's KERNEL_ARGS) the code object must
    declare exactly its arguments and each is encoded by its LLVM type;
    without one (hand-written test kernels) a float value packs as an IEEE
    float and an int as a little-endian integer of the argument's size.
    """

    def __init__(self, metadata, signature: Iterable[KernelArg] | None = None):
        self.kernel = metadata.name
        self.size = metadata.kernarg_size
        for arg in metadata.args:
            if arg.offset + arg.size > self.size or arg.offset % math.gcd(arg.size, 8):
                raise KernargError(
                    f"kernarg {arg.name or arg.value_kind!r}: offset {arg.offset}, size "
                    f"{arg.size} outside or misaligned in a {self.size}-byte segment")
            hidden = arg.value_kind.startswith("hidden_")
            if hidden and arg.value_kind not in (*HIDDEN_FROM_LAUNCH, *HIDDEN_RUNTIME_OWNED):
                raise KernargError(f"kernel {self.kernel!r}: unknown hidden argument "
                                   f"{arg.value_kind!r} (offset {arg.offset})")
        explicit = [a for a in metadata.args if not a.value_kind.startswith("hidden_")]
        kinds = (_signature_kinds(explicit, signature) if signature is not None
                 else [None] * len(explicit))  # None: the value's own type decides
        self.explicit = tuple((a.name, a.offset, a.size, kind) for a, kind in zip(explicit, kinds))
        self.names = frozenset(a.name for a in explicit)
        self.hidden = tuple((a.value_kind, a.offset, a.size) for a in metadata.args
                            if a.value_kind in HIDDEN_FROM_LAUNCH)

    def pack(self, values: Mapping[str, object], dims: LaunchDims) -> bytes:
        """The kernarg segment of one launch; `values` holds every explicit
        argument by name (pointers as device addresses)."""
        if values.keys() != self.names:
            missing = [name for name, *_ in self.explicit if name not in values]
            raise KernargError(
                f"kernel {self.kernel!r}: missing values for {missing}, unknown arguments "
                f"{sorted(set(values) - self.names)}; it declares {[e[0] for e in self.explicit]}")
        segment = bytearray(self.size)
        for name, offset, size, kind in self.explicit:
            value = values[name]
            encode = _ENCODERS[kind or (float if isinstance(value, float) else int)]
            segment[offset:offset + size] = encode(name, value, size)
        for kind, offset, size in self.hidden:
            segment[offset:offset + size] = _encode_int(kind, HIDDEN_FROM_LAUNCH[kind](dims), size)
        return bytes(segment)


def pack_kernargs(metadata, values: Mapping[str, object], dims: LaunchDims,
                  signature: Iterable[KernelArg] | None = None) -> bytes:
    """The kernarg segment of one launch: `metadata.kernarg_size` bytes (see KernargLayout)."""
    return KernargLayout(metadata, signature).pack(values, dims)
