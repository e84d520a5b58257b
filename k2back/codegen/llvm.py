"""Thin wrappers over llvmlite's binding layer for the amdgcn target.

Each call parses its own module: LLVM consumes a module when it emits code, so
asm and object are produced from separate parses of the same text.
"""

from __future__ import annotations

import functools

import llvmlite.binding as llvm

TRIPLE = "amdgcn-amd-amdhsa"
ARCHS = ("gfx942", "gfx950")


@functools.cache
def _initialized() -> bool:
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    return True


def target_machine(arch: str, features: str = "", opt: int = 3):
    if arch not in ARCHS:
        raise ValueError(f"arch: expected one of {ARCHS}, got {arch!r}")
    _initialized()
    target = llvm.Target.from_triple(TRIPLE)
    return target.create_target_machine(cpu=arch, features=features, opt=opt, reloc="pic")


def parse(ir: str):
    module = llvm.parse_assembly(ir)
    module.verify()
    return module


def optimize(ir: str, arch: str, features: str = "", level: int = 3) -> str:
    """The new pass manager's O<level> pipeline; returns the optimized IR text."""
    tm = target_machine(arch, features)
    module = parse(ir)
    builder = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level=level))
    builder.getModulePassManager().run(module, builder)
    return str(module)


def emit_assembly(ir: str, arch: str, features: str = "") -> str:
    return target_machine(arch, features).emit_assembly(parse(ir))


def emit_object(ir: str, arch: str, features: str = "") -> bytes:
    return target_machine(arch, features).emit_object(parse(ir))


def versions() -> dict[str, str]:
    import llvmlite

    return {"llvmlite": llvmlite.__version__, "llvm": ".".join(map(str, llvm.llvm_version_info))}
