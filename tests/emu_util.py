"""Compile small LLVM IR kernels for both archs and run them in the emulator."""

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


def module(body: str) -> str:
    """An amdhsa module around kernel definitions that use attribute group #0."""
    return f'target triple = "{llvm.TRIPLE}"\n{body}\n{MODULE_TAIL}'


@functools.cache
def assemble(ir: str, arch: str) -> str:
    return llvm.emit_assembly(llvm.optimize(ir, arch), arch)


def metadata(asm: str, name: str) -> SimpleNamespace:
    """Argument layout as LLVM printed it in the asm's .amdgpu_metadata YAML."""
    text = asm.split(".amdgpu_metadata", 1)[1].split("\n...", 1)[0]
    kernels = yaml.safe_load(text)["amdhsa.kernels"]
    kernel = next(k for k in kernels if k[".name"] == name)
    args = [SimpleNamespace(name=a.get(".name", ""), offset=a[".offset"], size=a[".size"],
                            value_kind=a[".value_kind"]) for a in kernel[".args"]]
    return SimpleNamespace(name=name, kernarg_size=kernel[".kernarg_segment_size"], args=args)


def run(ir: str, arch: str, name: str, args: dict, grid=(1, 1, 1), block=(64, 1, 1),
        machine: Machine | None = None, **launch):
    """Launch `name`; array arguments are mapped in place, others packed by value."""
    machine = machine or Machine(arch)
    asm = assemble(ir, arch)
    values = {k: machine.map(v) if hasattr(v, "shape") and v.shape != () else v
              for k, v in args.items()}
    dims = LaunchDims(tuple(grid) + (1,) * (3 - len(grid)), tuple(block) + (1,) * (3 - len(block)))
    kernargs = pack_kernargs(metadata(asm, name), values, dims)
    return machine.launch(asm, name, grid=grid, block=block, kernargs=kernargs, **launch)


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)
