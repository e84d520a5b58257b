"""What a code object says about its kernel: the NT_AMDGPU_METADATA note, the
kernel descriptor, and the `.amdhsa_*` directives of the assembly.

Three views of one kernel, written by different parts of LLVM; `read()` takes the
note as the record, cross-checks the 64-byte kernel descriptor (`<name>.kd`, what
the hardware's command processor actually reads) against it and against the
directives, and fails loudly on any disagreement (AMDGPUUsage "Code Object V5
Metadata", "Kernel Descriptor"). The asm the emulator runs and the object we ship
come from two LLVM emissions: with the asm, `read()` also checks that the kernel's
code in the object is as long as the asm printer counted (`codeLenInByte`).
"""

from __future__ import annotations

import io
import math
import struct
from dataclasses import asdict, dataclass, field

import msgpack
from elftools.elf.elffile import ELFFile

from k2back.amdhsa import MetadataError, code_length, parse_directives
from k2back.codegen.llvm import TRIPLE, parse_arch

NOTE_NAME, NT_AMDGPU_METADATA = "AMDGPU", 32


@dataclass(frozen=True)
class KernelArgMeta:
    name: str  # "" for hidden arguments
    offset: int
    size: int
    value_kind: str  # by_value, global_buffer, hidden_block_count_x, ...
    address_space: str | None = None
    access: str | None = None  # actual_access when LLVM proved one


@dataclass(frozen=True)
class KernelMetadata:
    name: str
    target: str  # target ID, e.g. gfx942:sramecc+:xnack-
    kernarg_size: int
    kernarg_align: int
    args: tuple[KernelArgMeta, ...]
    vgpr_count: int  # gfx90a+: arch + acc VGPRs of the unified file
    agpr_count: int
    sgpr_count: int
    vgpr_spill_count: int
    sgpr_spill_count: int
    group_segment_size: int  # static LDS bytes
    private_segment_size: int  # scratch bytes per lane
    max_flat_workgroup_size: int
    wavefront_size: int
    uses_dynamic_stack: bool
    directives: dict[str, int] = field(default_factory=dict)  # `.amdhsa_<name>` -> value

    @property
    def arch(self) -> str:
        return parse_arch(self.target).arch

    @classmethod
    def from_note(cls, kernel: dict, target: str, directives: dict[str, int]) -> KernelMetadata:
        """From one `amdhsa.kernels` entry, as the note (msgpack) or the asm (YAML) spells it."""
        args = tuple(KernelArgMeta(a.get(".name", ""), a[".offset"], a[".size"], a[".value_kind"],
                                   a.get(".address_space"), a.get(".actual_access"))
                     for a in kernel.get(".args", ()))
        scalars = {f: kernel[key] for f, key in _NOTE_KEYS.items()}
        return cls(target=target, args=args, directives=dict(directives), **scalars)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> KernelMetadata:
        return cls(**{**data, "args": tuple(KernelArgMeta(**a) for a in data["args"])})


# KernelMetadata field -> its key in an `amdhsa.kernels` entry
_NOTE_KEYS = {
    "name": ".name",
    "kernarg_size": ".kernarg_segment_size",
    "kernarg_align": ".kernarg_segment_align",
    "vgpr_count": ".vgpr_count",
    "agpr_count": ".agpr_count",
    "sgpr_count": ".sgpr_count",
    "vgpr_spill_count": ".vgpr_spill_count",
    "sgpr_spill_count": ".sgpr_spill_count",
    "group_segment_size": ".group_segment_fixed_size",
    "private_segment_size": ".private_segment_fixed_size",
    "max_flat_workgroup_size": ".max_flat_workgroup_size",
    "wavefront_size": ".wavefront_size",
    "uses_dynamic_stack": ".uses_dynamic_stack",
}

# ---------------------------------------------------------------------------
# Kernel descriptor (llvm/Support/AMDHSAKernelDescriptor.h)

_DESCRIPTOR = struct.Struct("<III4xq20xIIIHH4x")
_DESCRIPTOR_WORDS = ("group_segment_fixed_size", "private_segment_fixed_size", "kernarg_size",
                     "kernel_code_entry_byte_offset", "rsrc3", "rsrc1", "rsrc2",
                     "kernel_code_properties", "kernarg_preload")


def _accum_offset(vgprs: int) -> int:
    return vgprs // 4 - 1  # encoded in granules of 4, minus one


# directive -> (descriptor word, bit shift, bit width, encoding of the directive's value)
DIRECTIVE_BITS = {
    "group_segment_fixed_size": ("group_segment_fixed_size", 0, 32, int),
    "private_segment_fixed_size": ("private_segment_fixed_size", 0, 32, int),
    "kernarg_size": ("kernarg_size", 0, 32, int),
    "float_round_mode_32": ("rsrc1", 12, 2, int),
    "float_round_mode_16_64": ("rsrc1", 14, 2, int),
    "float_denorm_mode_32": ("rsrc1", 16, 2, int),
    "float_denorm_mode_16_64": ("rsrc1", 18, 2, int),
    "dx10_clamp": ("rsrc1", 21, 1, int),
    "ieee_mode": ("rsrc1", 23, 1, int),
    "fp16_overflow": ("rsrc1", 26, 1, int),
    "enable_private_segment": ("rsrc2", 0, 1, int),
    "user_sgpr_count": ("rsrc2", 1, 5, int),
    "system_sgpr_workgroup_id_x": ("rsrc2", 7, 1, int),
    "system_sgpr_workgroup_id_y": ("rsrc2", 8, 1, int),
    "system_sgpr_workgroup_id_z": ("rsrc2", 9, 1, int),
    "system_sgpr_workgroup_info": ("rsrc2", 10, 1, int),
    "system_vgpr_workitem_id": ("rsrc2", 11, 2, int),
    "exception_fp_ieee_invalid_op": ("rsrc2", 24, 1, int),
    "exception_fp_denorm_src": ("rsrc2", 25, 1, int),
    "exception_fp_ieee_div_zero": ("rsrc2", 26, 1, int),
    "exception_fp_ieee_overflow": ("rsrc2", 27, 1, int),
    "exception_fp_ieee_underflow": ("rsrc2", 28, 1, int),
    "exception_fp_ieee_inexact": ("rsrc2", 29, 1, int),
    "exception_int_div_zero": ("rsrc2", 30, 1, int),
    "accum_offset": ("rsrc3", 0, 6, _accum_offset),
    "tg_split": ("rsrc3", 16, 1, int),
    "user_sgpr_private_segment_buffer": ("kernel_code_properties", 0, 1, int),
    "user_sgpr_dispatch_ptr": ("kernel_code_properties", 1, 1, int),
    "user_sgpr_queue_ptr": ("kernel_code_properties", 2, 1, int),
    "user_sgpr_kernarg_segment_ptr": ("kernel_code_properties", 3, 1, int),
    "user_sgpr_dispatch_id": ("kernel_code_properties", 4, 1, int),
    "user_sgpr_flat_scratch_init": ("kernel_code_properties", 5, 1, int),
    "user_sgpr_private_segment_size": ("kernel_code_properties", 6, 1, int),
    "uses_dynamic_stack": ("kernel_code_properties", 11, 1, int),
    "user_sgpr_kernarg_preload_length": ("kernarg_preload", 0, 7, int),
    "user_sgpr_kernarg_preload_offset": ("kernarg_preload", 7, 9, int),
}

# KernelMetadata field (from the note) -> the descriptor word that must agree with it
NOTE_IN_DESCRIPTOR = {
    "group_segment_size": "group_segment_fixed_size",
    "private_segment_size": "private_segment_fixed_size",
    "kernarg_size": "kernarg_size",
}


def _bits(word: int, shift: int, width: int) -> int:
    return (word >> shift) & ((1 << width) - 1)


def check_descriptor(descriptor: dict[str, int], meta: KernelMetadata) -> None:
    """The descriptor against the note and the directives; raises on the first mismatch."""
    wrong = [f"{word} = {descriptor[word]} but the note's {f} = {getattr(meta, f)}"
             for f, word in NOTE_IN_DESCRIPTOR.items() if descriptor[word] != getattr(meta, f)]
    for directive, value in meta.directives.items():
        if directive in DIRECTIVE_BITS:
            word, shift, width, encode = DIRECTIVE_BITS[directive]
            if _bits(descriptor[word], shift, width) != encode(value):
                wrong.append(f"{word}[{shift + width - 1}:{shift}] = "
                             f"{_bits(descriptor[word], shift, width)} but .amdhsa_{directive} "
                             f"{value} encodes as {encode(value)}")
    if wrong:
        raise MetadataError(f"kernel {meta.name!r}: its descriptor {meta.name}.kd disagrees: "
                            + "; ".join(wrong))


# ---------------------------------------------------------------------------
# The code object


def _note(elf: ELFFile) -> dict:
    for section in elf.iter_sections("SHT_NOTE"):
        for note in section.iter_notes():
            if note["n_name"] == NOTE_NAME and note["n_type"] == NT_AMDGPU_METADATA:
                return msgpack.unpackb(note["n_descdata"])
    raise MetadataError("code object: no NT_AMDGPU_METADATA note (code object v5 expected)")


def _symbol_bytes(elf: ELFFile, name: str) -> tuple[int, bytes]:
    """(address, contents) of a dynamic symbol: the runtime looks kernels up there."""
    symbols = elf.get_section_by_name(".dynsym").get_symbol_by_name(name)
    if not symbols:
        raise MetadataError(f"code object: no symbol {name!r}")
    symbol = symbols[0]
    section = elf.get_section(symbol["st_shndx"])
    start = symbol["st_value"] - section["sh_addr"]
    return symbol["st_value"], section.data()[start:start + symbol["st_size"]]


def descriptor(hsaco: bytes, kernel: str) -> dict[str, int]:
    """The kernel descriptor `<kernel>.kd`, word by word (rsrc1/2/3 raw)."""
    elf = ELFFile(io.BytesIO(hsaco))
    address, raw = _symbol_bytes(elf, f"{kernel}.kd")
    if len(raw) != _DESCRIPTOR.size:
        raise MetadataError(f"{kernel}.kd: expected {_DESCRIPTOR.size} bytes, got {len(raw)}")
    words = dict(zip(_DESCRIPTOR_WORDS, _DESCRIPTOR.unpack(raw)))
    entry, _ = _symbol_bytes(elf, kernel)
    if address + words["kernel_code_entry_byte_offset"] != entry:
        raise MetadataError(f"{kernel}.kd: its entry offset does not reach the symbol {kernel!r}")
    return words


def check_code_length(hsaco: bytes, kernel: str, asm: str) -> None:
    """The kernel's machine code in the object is as long as the asm's instructions."""
    _, code = _symbol_bytes(ELFFile(io.BytesIO(hsaco)), kernel)
    counted = code_length(asm, kernel)
    if len(code) != counted:
        raise MetadataError(f"kernel {kernel!r}: the code object holds {len(code)} bytes of code "
                            f"but its asm counts {counted} (codeLenInByte): the asm the emulator "
                            "runs is not the code we ship")


def read(hsaco: bytes, kernel: str, asm: str | None = None) -> KernelMetadata:
    """KernelMetadata of `kernel` in a code object, cross-checked (see module doc).
    With `asm`, its `.amdhsa_*` directives are attached and checked too, and its
    code length."""
    note = _note(ELFFile(io.BytesIO(hsaco)))
    entries = {k[".name"]: k for k in note.get("amdhsa.kernels", ())}
    if kernel not in entries:
        raise MetadataError(f"kernel: expected one of the code object's kernels "
                            f"{sorted(entries)}, got {kernel!r}")
    target = note["amdhsa.target"].removeprefix(f"{TRIPLE}--")
    directives = parse_directives(asm, kernel) if asm is not None else {}
    meta = KernelMetadata.from_note(entries[kernel], target, directives)
    check_descriptor(descriptor(hsaco, kernel), meta)
    if asm is not None:
        check_code_length(hsaco, kernel, asm)
    return meta


# ---------------------------------------------------------------------------
# Resource report


@dataclass(frozen=True)
class ComputeUnit:
    lds_bytes: int
    simds: int = 4
    waves_per_simd: int = 8
    vgprs_per_simd_lane: int = 512  # gfx90a+: one file for arch and acc VGPRs
    vgpr_granule: int = 8


COMPUTE_UNITS = {"gfx942": ComputeUnit(lds_bytes=64 * 1024),
                 "gfx950": ComputeUnit(lds_bytes=160 * 1024)}


def occupancy(meta: KernelMetadata) -> dict[str, int | None]:
    """Residency limits of one CU for this kernel (the K2 kernel needs 1 workgroup/CU)."""
    cu = COMPUTE_UNITS[meta.arch]
    vgprs = max(meta.vgpr_count, 1)
    waves_by_vgprs = min(cu.waves_per_simd,
                         cu.vgprs_per_simd_lane // (math.ceil(vgprs / cu.vgpr_granule)
                                                    * cu.vgpr_granule))
    waves_per_group = math.ceil(meta.max_flat_workgroup_size / meta.wavefront_size)
    return {
        "waves_per_simd_by_vgprs": waves_by_vgprs,
        "workgroups_per_cu_by_vgprs": waves_by_vgprs * cu.simds // waves_per_group,
        # None: the kernel uses no LDS, so LDS sets no limit
        "workgroups_per_cu_by_lds": (cu.lds_bytes // meta.group_segment_size
                                     if meta.group_segment_size else None),
        "lds_per_cu": cu.lds_bytes,
    }


def resource_report(meta: KernelMetadata) -> str:
    """A table for the CLI and the demo: what one workgroup of the kernel occupies."""
    limits = occupancy(meta)
    rows = [
        ("VGPRs (arch + acc)", meta.vgpr_count),
        ("accum_offset", meta.directives.get("accum_offset", "-")),
        ("AGPRs", meta.agpr_count),
        ("SGPRs", meta.sgpr_count),
        ("LDS", f"{meta.group_segment_size} B of {limits['lds_per_cu']} B per CU"),
        ("scratch", f"{meta.private_segment_size} B per lane"),
        ("spills", f"{meta.vgpr_spill_count} VGPR, {meta.sgpr_spill_count} SGPR"),
        ("kernarg", (f"{meta.kernarg_size} B (align {meta.kernarg_align}), "
                     f"{sum(not a.value_kind.startswith('hidden_') for a in meta.args)} "
                     "explicit args")),
        ("workgroup", f"up to {meta.max_flat_workgroup_size} threads, wave{meta.wavefront_size}"),
        ("waves/SIMD by VGPRs", limits["waves_per_simd_by_vgprs"]),
        ("workgroups/CU", (f"{limits['workgroups_per_cu_by_vgprs']} by VGPRs, "
                           f"{limits['workgroups_per_cu_by_lds'] or 'no limit'} by LDS")),
    ]
    width = max(len(label) for label, _ in rows)
    return "\n".join([f"{meta.name} ({meta.target})",
                      *(f"  {label:<{width}}  {value}" for label, value in rows)])
