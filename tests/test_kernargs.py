"""pack_kernargs against the layout LLVM itself declares for hand-written
kernels of mixed i32/i64/ptr/f32 arguments (the asm's .amdgpu_metadata YAML)."""

from __future__ import annotations

import struct
from types import SimpleNamespace

import pytest
import torch

from k2back.codegen import llvm
from k2back.codegen.signature import KERNEL_ARGS, KernelArg
from k2back.codegen.testing import MIXED_IR, asm_metadata, echo_ir, small_tensors
from k2back.runtime.kernargs import KernargError, LaunchDims, pack_kernargs
from k2back.runtime.launch import TENSOR_ARGS

MIXED_SIGNATURE = (
    KernelArg("out", "ptr addrspace(1)"), KernelArg("a", "i32"), KernelArg("b", "i64"),
    KernelArg("c", "float"), KernelArg("p", "ptr addrspace(1)"), KernelArg("d", "i32"),
)
VALUES = {"out": 0x7F00_1234_5600, "a": -7, "b": 1 << 40, "c": 0.1, "p": 0, "d": 0xFFFF_FFFF}
DIMS = LaunchDims(grid=(304, 1, 1), block=(512, 1, 1))


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

def first_dword(t) -> int:
    """The 4 bytes at a tensor's first element, as the kernel's load sees them."""
    flat = t.reshape(-1)[: max(1, 4 // t.element_size())].contiguous()
    return int.from_bytes(flat.view(torch.uint8)[:4].numpy().tobytes(), "little")


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("K2BACK_CACHE_DIR", str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("arch", llvm.ARCHS)
def test_launch_arguments_reach_the_kernel_in_the_emulator(cache_dir, arch):
    """launch.kernel_arguments -> pack_kernargs -> EmuBackend: every pointer
    leads to its tensor's data, every scalar arrives as given."""
    from k2back.codegen.compiler import IRSource
    from k2back.codegen.compiler import compile as compile_source
    from k2back.runtime.emu import EmuBackend

    kernel = compile_source(IRSource(echo_ir(), "k2_echo", arch))
    # one wave: all its loads (out's included) come before its stores
    spec = SimpleNamespace(name="k2_echo", geometry="tiny", blocks=1, threads=64,
                           scratch_bytes=512)
    tensors = small_tensors(seed=3)
    tensors["out"] = torch.arange(1, 2 * 256 + 1).reshape(2, 256).to(torch.bfloat16)
    scratch = torch.arange(512, dtype=torch.int32).to(torch.uint8)
    want = {name: first_dword(tensors[name]) for name in TENSOR_ARGS}
    EmuBackend().run(kernel, spec, tensors, scratch, qk_scale=0.3)
    words = tensors["out"].view(torch.int64)[0, : len(KERNEL_ARGS)].tolist()
    got = dict(zip((a.name for a in KERNEL_ARGS), words))
    comp, swa = tensors["comp_cache"], tensors["swa_cache"]
    assert {name: got[name] for name in want} == want
    assert got["scratch"] == first_dword(scratch)
    assert (got["swa_block"], got["swa_stride"], got["swa_bytes"]) == (32, 64 * 576, swa.numel())
    assert (got["comp_block"], got["comp_stride"]) == (64, comp.stride(0))
    assert got["comp_bytes"] == (comp.shape[0] - 1) * comp.stride(0) + comp.shape[1]
    assert got["cos_sin_rows"] == tensors["cos_sin"].shape[0]
    assert got["qk_scale"] == int.from_bytes(struct.pack("<f", 0.3), "little")


HIDDEN_IR = """
target triple = "amdgcn-amd-amdhsa"
define amdgpu_kernel void @hidden(ptr addrspace(1) %out, i32 %pad) #0 {
  %imp = call ptr addrspace(4) @llvm.amdgcn.implicitarg.ptr()
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  %first = icmp eq i32 %tid, 0
  br i1 %first, label %store, label %done
store:
  %bcx = load i32, ptr addrspace(4) %imp, align 4
  %pbcy = getelementptr i8, ptr addrspace(4) %imp, i64 4
  %bcy = load i32, ptr addrspace(4) %pbcy, align 4
  %pgsx = getelementptr i8, ptr addrspace(4) %imp, i64 12
  %gsx = load i16, ptr addrspace(4) %pgsx, align 2
  %pdims = getelementptr i8, ptr addrspace(4) %imp, i64 64
  %dims = load i16, ptr addrspace(4) %pdims, align 2
  %gsx32 = zext i16 %gsx to i32
  %dims32 = zext i16 %dims to i32
  store i32 %bcx, ptr addrspace(1) %out, align 4
  %o1 = getelementptr i32, ptr addrspace(1) %out, i64 1
  store i32 %bcy, ptr addrspace(1) %o1, align 4
  %o2 = getelementptr i32, ptr addrspace(1) %out, i64 2
  store i32 %gsx32, ptr addrspace(1) %o2, align 4
  %o3 = getelementptr i32, ptr addrspace(1) %out, i64 3
  store i32 %dims32, ptr addrspace(1) %o3, align 4
  br label %done
done:
  ret void
}
declare ptr addrspace(4) @llvm.amdgcn.implicitarg.ptr()
declare i32 @llvm.amdgcn.workitem.id.x()
attributes #0 = { "amdgpu-flat-work-group-size"="1,512" }
!llvm.module.flags = !{!0}
!0 = !{i32 1, !"amdhsa_code_object_version", i32 500}
"""


@pytest.mark.parametrize("arch", llvm.ARCHS)
def test_hidden_args_where_the_kernel_reads_them(cache_dir, arch):
    """A kernel reading the v5 hidden block through llvm.amdgcn.implicitarg.ptr
    (LLVM's own offsets) sees the launch's geometry."""
    from k2back.codegen.compiler import IRSource
    from k2back.codegen.compiler import compile as compile_source
    from k2back.emu import Machine

    kernel = compile_source(IRSource(HIDDEN_IR, "hidden", arch))
    out = torch.zeros(4, dtype=torch.int32)
    machine = Machine(arch)
    dims = LaunchDims(grid=(3, 2, 1), block=(128, 1, 1))
    segment = pack_kernargs(kernel.metadata, {"out": machine.map(out), "pad": 0}, dims)
    machine.launch(kernel.asm, "hidden", grid=dims.grid, block=dims.block, kernargs=segment)
    assert out.tolist() == [3, 2, 128, 2]


@pytest.mark.parametrize("arch", llvm.ARCHS)
def test_mixed_args_in_the_emulator(cache_dir, arch):
    """No signature: each value's own type decides (float -> IEEE, int -> integer)."""
    from k2back.codegen.compiler import IRSource
    from k2back.codegen.compiler import compile as compile_source
    from k2back.emu import Machine

    kernel = compile_source(IRSource(MIXED_IR, "mixed", arch))
    machine = Machine(arch)
    out = torch.zeros(5, dtype=torch.int64)
    values = {**VALUES, "out": machine.map(out), "p": 0xDEAD_BEEF_00, "c": -2.5}
    segment = pack_kernargs(kernel.metadata, values, LaunchDims((1, 1, 1), (64, 1, 1)))
    machine.launch(kernel.asm, "mixed", grid=(1, 1, 1), block=(64, 1, 1), kernargs=segment)
    c_bits = int.from_bytes(struct.pack("<f", -2.5), "little")
    assert out.tolist() == [-7, 1 << 40, c_bits, 0xDEAD_BEEF_00, 0xFFFF_FFFF]
