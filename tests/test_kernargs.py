"""pack_kernargs against the layout LLVM itself declares for hand-written
kernels of mixed i32/i64/ptr/f32 arguments (the asm's .amdgpu_metadata YAML)."""

from __future__ import annotations

import struct
from types import SimpleNamespace

import pytest
import yaml

from k2back.codegen import llvm
from k2back.codegen.signature import KERNEL_ARGS, KernelArg
from k2back.codegen.signature import params as signature_params
from k2back.runtime.kernargs import KernargError, LaunchDims, pack_kernargs

MIXED_IR = """
target triple = "amdgcn-amd-amdhsa"
define amdgpu_kernel void @mixed(ptr addrspace(1) %out, i32 %a, i64 %b, float %c,
                                 ptr addrspace(1) %p, i32 %d) #0 {
  %x = call i32 @llvm.amdgcn.workitem.id.x()
  store i32 %x, ptr addrspace(1) %out
  ret void
}
declare i32 @llvm.amdgcn.workitem.id.x()
attributes #0 = { "amdgpu-flat-work-group-size"="1,512" }
!llvm.module.flags = !{!0}
!0 = !{i32 1, !"amdhsa_code_object_version", i32 500}
"""
MIXED_SIGNATURE = (
    KernelArg("out", "ptr addrspace(1)"), KernelArg("a", "i32"), KernelArg("b", "i64"),
    KernelArg("c", "float"), KernelArg("p", "ptr addrspace(1)"), KernelArg("d", "i32"),
)
VALUES = {"out": 0x7F00_1234_5600, "a": -7, "b": 1 << 40, "c": 0.1, "p": 0, "d": 0xFFFF_FFFF}
DIMS = LaunchDims(grid=(304, 1, 1), block=(512, 1, 1))


def asm_metadata(asm: str) -> SimpleNamespace:
    """The kernel's metadata as LLVM printed it (YAML), independent of k2back's reader."""
    text = asm.split(".amdgpu_metadata")[1].split("...")[0]
    kernel = yaml.safe_load(text)["amdhsa.kernels"][0]
    args = [SimpleNamespace(name=a.get(".name", ""), offset=a[".offset"], size=a[".size"],
                            value_kind=a[".value_kind"]) for a in kernel[".args"]]
    return SimpleNamespace(name=kernel[".name"], kernarg_size=kernel[".kernarg_segment_size"],
                           args=args)


@pytest.fixture(scope="module", params=llvm.ARCHS)
def mixed(request):
    # unoptimized: LLVM keeps the v5 hidden block, which the packer must fill
    return asm_metadata(llvm.emit_assembly(MIXED_IR, request.param))


def field(segment: bytes, arg, fmt: str):
    return struct.unpack_from(fmt, segment, arg.offset)[0]


def test_explicit_args_land_at_llvm_offsets(mixed):
    segment = pack_kernargs(mixed, VALUES, DIMS)
    assert len(segment) == mixed.kernarg_size
    by_name = {a.name: a for a in mixed.args}
    assert field(segment, by_name["out"], "<Q") == VALUES["out"]
    assert field(segment, by_name["a"], "<i") == -7
    assert field(segment, by_name["b"], "<q") == 1 << 40
    assert field(segment, by_name["c"], "<f") == struct.unpack("<f", struct.pack("<f", 0.1))[0]
    assert field(segment, by_name["p"], "<Q") == 0
    assert field(segment, by_name["d"], "<I") == 0xFFFF_FFFF


def test_hidden_args_describe_the_launch(mixed):
    dims = LaunchDims(grid=(7, 3, 1), block=(256, 2, 1), dynamic_lds=0)
    segment = pack_kernargs(mixed, VALUES, dims)
    hidden = {a.value_kind: a for a in mixed.args if a.value_kind.startswith("hidden_")}
    fmt = {2: "<H", 4: "<I", 8: "<Q"}
    got = {k: field(segment, a, fmt[a.size]) for k, a in hidden.items()}
    assert (got["hidden_block_count_x"], got["hidden_block_count_y"],
            got["hidden_block_count_z"]) == (7, 3, 1)
    assert (got["hidden_group_size_x"], got["hidden_group_size_y"],
            got["hidden_group_size_z"]) == (256, 2, 1)
    assert got["hidden_grid_dims"] == 2
    assert got["hidden_remainder_x"] == got["hidden_global_offset_x"] == 0
    assert got["hidden_hostcall_buffer"] == 0


def test_signature_types_the_values(mixed):
    # with a signature, an int given for a float argument still packs as a float
    segment = pack_kernargs(mixed, {**VALUES, "c": 2}, DIMS, MIXED_SIGNATURE)
    c = next(a for a in mixed.args if a.name == "c")
    assert field(segment, c, "<f") == 2.0


@pytest.mark.parametrize("values, words", [
    ({k: v for k, v in VALUES.items() if k != "b"}, ["missing", "'b'"]),
    ({**VALUES, "bogus": 1}, ["unknown", "bogus"]),
    ({**VALUES, "a": 1 << 33}, ["'a'", "32 bits"]),
    ({**VALUES, "out": 1.5}, ["'out'", "integer"]),
])
def test_bad_values_are_named(mixed, values, words):
    with pytest.raises(KernargError) as e:
        pack_kernargs(mixed, values, DIMS, MIXED_SIGNATURE)
    for word in words:
        assert word in str(e.value)


def test_signature_mismatch_is_an_error(mixed):
    swapped = (MIXED_SIGNATURE[0], MIXED_SIGNATURE[2], MIXED_SIGNATURE[1], *MIXED_SIGNATURE[3:])
    with pytest.raises(KernargError, match="signature"):
        pack_kernargs(mixed, VALUES, DIMS, swapped)
    wrong_size = (*MIXED_SIGNATURE[:5], KernelArg("d", "i64"))
    with pytest.raises(KernargError, match="'d'.*i64"):
        pack_kernargs(mixed, VALUES, DIMS, wrong_size)
    with pytest.raises(KernargError, match="signature"):
        pack_kernargs(mixed, VALUES, DIMS, KERNEL_ARGS)


def test_unknown_hidden_kind_is_an_error(mixed):
    odd = SimpleNamespace(**{**vars(mixed), "args": [
        *mixed.args, SimpleNamespace(name="", offset=0, size=8, value_kind="hidden_future")]})
    with pytest.raises(KernargError, match="hidden_future"):
        pack_kernargs(odd, VALUES, DIMS)


# ---- the K2 signature end to end: launch.kernel_arguments -> pack -> a kernel ----------------

def echo_ir() -> str:
    """A kernel with the K2 signature writing, as i64 word i of `out`, argument
    i if it is a scalar, or the first dword it points to if it is a pointer
    (so each address is proven to reach its tensor's data)."""
    body = []
    for i, arg in enumerate(KERNEL_ARGS):
        v = f"%{arg.name}"
        if arg.is_pointer:
            body.append(f"%d{i} = load i32, {arg.llvm_type} {v}, align 4")
            body.append(f"%w{i} = zext i32 %d{i} to i64")
        elif arg.llvm_type == "float":
            body.append(f"%b{i} = bitcast float {v} to i32")
            body.append(f"%w{i} = zext i32 %b{i} to i64")
        elif arg.llvm_type == "i32":
            body.append(f"%w{i} = zext i32 {v} to i64")
        else:
            body.append(f"%w{i} = add i64 {v}, 0")
    for i, _ in enumerate(KERNEL_ARGS):  # every load before the first store into out
        body.append(f"%p{i} = getelementptr i64, ptr addrspace(1) %out, i64 {i}")
        body.append(f"store i64 %w{i}, ptr addrspace(1) %p{i}, align 8")
    return "\n".join([
        'target triple = "amdgcn-amd-amdhsa"',
        f"define amdgpu_kernel void @k2_echo({signature_params()}) #0 {{",
        *("  " + line for line in body), "  ret void", "}",
        'attributes #0 = { "amdgpu-flat-work-group-size"="1,512" }',
        "!llvm.module.flags = !{!0}",
        '!0 = !{i32 1, !"amdhsa_code_object_version", i32 500}',
    ])
