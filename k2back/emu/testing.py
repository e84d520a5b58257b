"""Compile small LLVM IR kernels for both archs and run them in the emulator:
the helpers of the emulator's unit tests, its benchmark and `k2back selftest`.

Unlike the rest of `k2back.emu` this module needs LLVM (llvmlite) to compile IR;
`import k2back.emu` does not import it."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np
import yaml

from k2back.codegen import llvm
from k2back.emu import Machine
from k2back.runtime.kernargs import LaunchDims, pack_kernargs

ARCHS = llvm.ARCHS
MODULE_TAIL = """
attributes #0 = { "amdgpu-flat-work-group-size"="1,512" }
!llvm.module.flags = !{!0}
!0 = !{i32 1, !"amdhsa_code_object_version", i32 500}
"""


# The persistent grid's idle shape (benchmarks/emu_speed.py's `idle_grid`): lane 0 of each
# workgroup marks its word; every other wave compares, branches and ends. (Needs the
# workitem.id.x and workgroup.id.x declarations.)
IDLE_GRID = """
define amdgpu_kernel void @idle(ptr addrspace(1) %marks) #0 {
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  %wg = call i32 @llvm.amdgcn.workgroup.id.x()
  %first = icmp eq i32 %tid, 0
  br i1 %first, label %mark, label %done
mark:
  %p = getelementptr i32, ptr addrspace(1) %marks, i32 %wg
  store atomic i32 1, ptr addrspace(1) %p syncscope("agent") monotonic, align 4
  br label %done
done:
  ret void
}
"""


def module(body: str) -> str:
    """An amdhsa module around kernel definitions that use attribute group #0."""
    return f'target triple = "{llvm.TRIPLE}"\n{body}\n{MODULE_TAIL}'


@functools.cache
def assemble(ir: str, arch: str) -> str:
    return llvm.emit_assembly(llvm.optimize(ir, arch), arch)


@functools.lru_cache(maxsize=256)
def metadata(asm: str, name: str) -> SimpleNamespace:
    """Argument layout as LLVM printed it in the asm's .amdgpu_metadata YAML (parsed
    once per asm text: the YAML parse took 1.4 ms, a twentieth of an idle-grid run;
    callers only read it)."""
    text = asm.split(".amdgpu_metadata", 1)[1].split("\n...", 1)[0]
    kernels = yaml.safe_load(text)["amdhsa.kernels"]
    kernel = next(k for k in kernels if k[".name"] == name)
    args = [SimpleNamespace(name=a.get(".name", ""), offset=a[".offset"], size=a[".size"],
                            value_kind=a[".value_kind"]) for a in kernel[".args"]]
    return SimpleNamespace(name=name, kernarg_size=kernel[".kernarg_segment_size"], args=args)


def run(ir: str, arch: str, name: str, args: dict, grid=(1, 1, 1), block=(64, 1, 1),
        machine: Machine | None = None, **launch):
    """Launch `name`; array arguments are mapped in place (named like the argument,
    the key of the byte counters), others packed by value."""
    machine = machine or Machine(arch)
    asm = assemble(ir, arch)
    values = {k: machine.map(v, name=k) if hasattr(v, "shape") and v.shape != () else v
              for k, v in args.items()}
    dims = LaunchDims(tuple(grid) + (1,) * (3 - len(grid)), tuple(block) + (1,) * (3 - len(block)))
    kernargs = pack_kernargs(metadata(asm, name), values, dims)
    return machine.launch(asm, name, grid=grid, block=block, kernargs=kernargs, **launch)


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def handwritten(arch: str, body: str, lds_bytes: int = 0, agprs: int = 0) -> str:
    """Asm text of kernel `hand(ptr out)` whose instructions are `body` (then
    s_endpgm): s[0:1] is the kernarg pointer, v0 the work-item id."""
    return f"""
\t.amdgcn_target "amdgcn-amd-amdhsa--{arch}"
\t.text
\t.globl hand
hand:
{body}
\ts_endpgm
.Lfunc_end0:
\t.section .rodata,"a",@progbits
\t.amdhsa_kernel hand
\t\t.amdhsa_group_segment_fixed_size {lds_bytes}
\t\t.amdhsa_kernarg_size 8
\t\t.amdhsa_user_sgpr_count 2
\t\t.amdhsa_user_sgpr_kernarg_segment_ptr 1
\t\t.amdhsa_system_sgpr_workgroup_id_x 1
\t\t.amdhsa_system_vgpr_workitem_id 0
\t\t.amdhsa_next_free_vgpr {32 + agprs}
\t\t.amdhsa_next_free_sgpr 16
\t\t.amdhsa_accum_offset 32
\t\t.amdhsa_float_denorm_mode_32 3
\t.end_amdhsa_kernel
"""


def run_handwritten(arch: str, body: str, out: np.ndarray, lds_bytes: int = 0, agprs: int = 0,
                    memory: str = "strict", **launch):
    machine = Machine(arch, memory=memory)
    kernargs = machine.map(out).to_bytes(8, "little")
    return machine.launch(handwritten(arch, body, lds_bytes, agprs), "hand", kernargs=kernargs,
                          **launch)
