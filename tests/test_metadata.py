"""KernelMetadata read from code objects of hand-written kernels, against what
the IR declares (the kernarg ABI, LDS and scratch sizes, launch registers) and
against the asm's own `.amdgpu_metadata` YAML; the kernel-descriptor
cross-check catches tampered descriptors and directives."""

from __future__ import annotations

import dataclasses
import io
import json
import struct

import pytest
import yaml
from elftools.elf.elffile import ELFFile

from k2back.codegen import llvm, metadata
from k2back.codegen.compiler import IRSource, compile
from k2back.codegen.metadata import KernelMetadata, MetadataError
from k2back.codegen.testing import module

pytestmark = pytest.mark.usefixtures("private_cache")

# (name, LLVM type, bytes) of the mixed kernel's parameters
MIXED_PARAMS = [("out", "ptr addrspace(1)", 8), ("a", "i32", 4), ("b", "i64", 8),
                ("c", "float", 4), ("p", "ptr addrspace(1)", 8), ("d", "i32", 4),
                ("e", "i64", 8)]
LDS_WORDS = 1024

# Uses every argument, a 4 KiB LDS tile, workgroup id x and workitem ids x and y.
MIXED = module(f"""
@tile = internal addrspace(3) global [{LDS_WORDS} x i32] poison, align 16

define amdgpu_kernel void @mixed({", ".join(f"{t} %{n}" for n, t, _ in MIXED_PARAMS)}) #0 {{
  %tx = call i32 @llvm.amdgcn.workitem.id.x()
  %ty = call i32 @llvm.amdgcn.workitem.id.y()
  %wg = call i32 @llvm.amdgcn.workgroup.id.x()
  %t = add i32 %tx, %ty
  %slot = getelementptr i32, ptr addrspace(3) @tile, i32 %t
  store i32 %a, ptr addrspace(3) %slot
  call void @llvm.amdgcn.s.barrier()
  %back = getelementptr i32, ptr addrspace(3) @tile, i32 %wg
  %v = load i32, ptr addrspace(3) %back
  %vb = zext i32 %v to i64
  %s1 = add i64 %vb, %b
  %s2 = add i64 %s1, %e
  %ci = fptosi float %c to i64
  %s3 = add i64 %s2, %ci
  %dd = zext i32 %d to i64
  %s4 = add i64 %s3, %dd
  %src = load i64, ptr addrspace(1) %p
  %s5 = add i64 %s4, %src
  %dst = getelementptr i64, ptr addrspace(1) %out, i32 %t
  store i64 %s5, ptr addrspace(1) %dst
  ret void
}}

declare i32 @llvm.amdgcn.workitem.id.x()
declare i32 @llvm.amdgcn.workitem.id.y()
declare i32 @llvm.amdgcn.workgroup.id.x()
declare void @llvm.amdgcn.s.barrier()
attributes #0 = {{ "amdgpu-flat-work-group-size"="1,512" }}
""")

# A dynamically indexed private array: it lives in scratch.
SCRATCH = module("""
define amdgpu_kernel void @scratch(ptr addrspace(1) %out, i32 %i, i32 %j) {
  %buf = alloca [64 x i32], align 4, addrspace(5)
  %w = getelementptr i32, ptr addrspace(5) %buf, i32 %i
  store volatile i32 %j, ptr addrspace(5) %w
  %r = getelementptr i32, ptr addrspace(5) %buf, i32 %j
  %v = load volatile i32, ptr addrspace(5) %r
  store i32 %v, ptr addrspace(1) %out
  ret void
}
""")


@pytest.fixture(scope="module", params=llvm.ARCHS)
def arch(request):
    return request.param


def build(ir: str, name: str, arch: str):
    return compile(IRSource(ir, name, arch))


def asm_yaml(asm: str) -> dict:
    """The one kernel entry of the asm's `.amdgpu_metadata` block, as LLVM printed it."""
    block = asm.split(".amdgpu_metadata\n", 1)[1].split("\n...\n")[0]  # YAML's document end
    (kernel,) = yaml.safe_load(block)["amdhsa.kernels"]
    return kernel


def test_args_follow_the_kernarg_abi(arch):
    """Each explicit argument at the next multiple of its natural alignment."""
    meta = build(MIXED, "mixed", arch).metadata
    expected, offset = [], 0
    for name, _, size in MIXED_PARAMS:
        offset = -(-offset // size) * size
        expected.append((name, offset, size))
        offset += size
    explicit = [a for a in meta.args if not a.value_kind.startswith("hidden_")]
    assert [(a.name, a.offset, a.size) for a in explicit] == expected
    kinds = {a.name: (a.value_kind, a.address_space) for a in explicit}
    assert kinds["out"] == kinds["p"] == ("global_buffer", "global")
    assert kinds["a"] == kinds["b"] == kinds["c"] == ("by_value", None)
    assert meta.kernarg_size >= offset and meta.kernarg_align == 8


@pytest.mark.parametrize("ir, name", [(MIXED, "mixed"), (SCRATCH, "scratch")])
def test_note_matches_the_asm_yaml(arch, ir, name):
    kernel = build(ir, name, arch)
    from_yaml = KernelMetadata.from_note(asm_yaml(kernel.asm), arch,
                                         metadata.parse_directives(kernel.asm))
    assert kernel.metadata == from_yaml


def test_sizes_and_launch_registers_follow_the_ir(arch):
    meta = build(MIXED, "mixed", arch).metadata
    assert meta.group_segment_size == 4 * LDS_WORDS
    assert meta.private_segment_size == 0
    assert meta.max_flat_workgroup_size == 512 and meta.wavefront_size == 64
    d = meta.directives
    assert d["group_segment_fixed_size"] == 4 * LDS_WORDS
    assert d["kernarg_size"] == meta.kernarg_size
    assert d["system_sgpr_workgroup_id_x"] == 1
    assert d["system_sgpr_workgroup_id_y"] == d["system_sgpr_workgroup_id_z"] == 0
    assert d["system_vgpr_workitem_id"] == 1  # x and y
    assert d["user_sgpr_kernarg_segment_ptr"] == 1


def test_scratch_kernel(arch):
    meta = build(SCRATCH, "scratch", arch).metadata
    assert meta.private_segment_size >= 64 * 4
    assert meta.directives["enable_private_segment"] == 1
    assert "scratch" in metadata.resource_report(meta)
    assert f"{meta.private_segment_size} B per lane" in metadata.resource_report(meta)


def test_json_round_trip(arch):
    meta = build(MIXED, "mixed", arch).metadata
    assert KernelMetadata.from_json(json.loads(json.dumps(meta.to_json()))) == meta


def test_parse_directives_needs_a_name_when_several_kernels():
    mixed = build(MIXED, "mixed", "gfx942").asm
    both = mixed + build(SCRATCH, "scratch", "gfx942").asm
    with pytest.raises(MetadataError, match=r"\['mixed', 'scratch'\], got None"):
        metadata.parse_directives(both)
    assert metadata.parse_directives(both, "mixed") == metadata.parse_directives(mixed)


def test_unknown_kernel_is_named():
    kernel = build(MIXED, "mixed", "gfx950")
    with pytest.raises(MetadataError, match=r"\['mixed'\], got 'other'"):
        metadata.read(kernel.hsaco, "other")


def kd_file_offset(hsaco: bytes, kernel: str) -> int:
    elf = ELFFile(io.BytesIO(hsaco))
    (symbol,) = elf.get_section_by_name(".dynsym").get_symbol_by_name(f"{kernel}.kd")
    section = elf.get_section(symbol["st_shndx"])
    return symbol["st_value"] - section["sh_addr"] + section["sh_offset"]


# (descriptor byte offset, struct format, change, what the error names)
TAMPERINGS = [
    (8, "<I", lambda v: v + 8, "kernarg_size"),
    (0, "<I", lambda v: v + 256, "group_segment_fixed_size"),
    (52, "<I", lambda v: v ^ (1 << 7), "system_sgpr_workgroup_id_x"),
    (52, "<I", lambda v: v + (1 << 1), "user_sgpr_count"),
    (48, "<I", lambda v: v ^ (1 << 23), "ieee_mode"),
    (56, "<H", lambda v: v ^ (1 << 3), "user_sgpr_kernarg_segment_ptr"),
    (16, "<q", lambda v: v + 256, "entry offset"),
]


@pytest.mark.parametrize("offset, fmt, change, named", TAMPERINGS)
def test_descriptor_cross_check_catches_tampering(arch, offset, fmt, change, named):
    kernel = build(MIXED, "mixed", arch)
    metadata.read(kernel.hsaco, "mixed", kernel.asm)  # untouched: consistent
    tampered = bytearray(kernel.hsaco)
    at = kd_file_offset(kernel.hsaco, "mixed") + offset
    struct.pack_into(fmt, tampered, at, change(struct.unpack_from(fmt, tampered, at)[0]))
    with pytest.raises(MetadataError, match=named):
        metadata.read(bytes(tampered), "mixed", kernel.asm)


def test_code_length_cross_check(arch):
    """The asm the emulator runs and the object we ship are two emissions: their
    code must be as long as each other (an asm of another build fails by name)."""
    kernel = build(MIXED, "mixed", arch)
    counted = metadata.code_length(kernel.asm, "mixed")
    assert counted > 0 and counted % 4 == 0
    edited = kernel.asm.replace(f"codeLenInByte = {counted}", f"codeLenInByte = {counted + 8}")
    with pytest.raises(MetadataError, match=f"{counted} bytes of code but its asm counts {counted + 8}"):
        metadata.read(kernel.hsaco, "mixed", edited)
    with pytest.raises(MetadataError, match="no `; codeLenInByte`"):
        metadata.read(kernel.hsaco, "mixed", edited.replace("codeLenInByte", "codeLength"))


def test_directives_cross_check(arch):
    kernel = build(MIXED, "mixed", arch)
    edited = kernel.asm.replace(".amdhsa_system_vgpr_workitem_id 1",
                                ".amdhsa_system_vgpr_workitem_id 2")
    assert edited != kernel.asm
    with pytest.raises(MetadataError, match="system_vgpr_workitem_id 2"):
        metadata.read(kernel.hsaco, "mixed", edited)


@pytest.mark.parametrize("vgprs, waves, groups", [
    (24, 8, 4),  # at most 8 waves per SIMD
    (96, 5, 2),  # 512 / 96
    (128, 4, 2),
    (256, 2, 1),
    (512, 1, 0),  # 8 waves of 512 threads do not fit 4 SIMDs x 1 wave
])
def test_occupancy_by_vgprs(vgprs, waves, groups):
    """CDNA3/4: 512 unified VGPRs a lane per SIMD, allocated in granules of 8;
    a 512-thread workgroup is 8 waves over 4 SIMDs."""
    meta = dataclasses.replace(build(MIXED, "mixed", "gfx942").metadata, vgpr_count=vgprs)
    limits = metadata.occupancy(meta)
    assert (limits["waves_per_simd_by_vgprs"], limits["workgroups_per_cu_by_vgprs"]) == (waves,
                                                                                         groups)


@pytest.mark.parametrize("arch_, lds_per_cu", [("gfx942", 64 * 1024), ("gfx950", 160 * 1024)])
def test_resource_report_lds(arch_, lds_per_cu):
    meta = build(MIXED, "mixed", arch_).metadata
    report = metadata.resource_report(meta)
    assert f"{4 * LDS_WORDS} B of {lds_per_cu} B per CU" in report
    assert f"{lds_per_cu // (4 * LDS_WORDS)} by LDS" in report
    assert f"{len(MIXED_PARAMS)} explicit args" in report
    assert report.startswith(f"mixed ({arch_})")
