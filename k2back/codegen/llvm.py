"""Thin wrappers over llvmlite's binding layer for the amdgcn target.

Each call parses its own module: LLVM consumes a module when it emits code, so
asm and object are produced from separate parses of the same text.
"""

from __future__ import annotations

import functools
import re
from typing import NamedTuple

import llvmlite.binding as llvm

from k2back.codegen import targets

TRIPLE = "amdgcn-amd-amdhsa"
ARCHS = tuple(targets.ARCHS)
CODE_OBJECT_VERSION = 500  # code object v5, pinned by a module flag (SPEC §4)

# Target-ID features (AMDGPUUsage "Target ID"): absent means "any", the code runs
# in either mode (hipcc's default, what we build unless told); `name+` / `name-`
# pins a mode, which LLVM spells `+name` / `-name`.
TARGET_ID_FEATURES = ("sramecc", "xnack")
_CODE_OBJECT_FLAG = re.compile(r'!"amdhsa_code_object_version",\s*i32\s+(\d+)')


class Target(NamedTuple):
    arch: str  # e.g. gfx942
    features: str  # LLVM feature string, e.g. "+sramecc,-xnack"; "" = any

    @property
    def target_id(self) -> str:
        """The target ID as HIP reports it (gcnArchName), e.g. gfx942:sramecc+:xnack-."""
        pinned = (f[1:] + f[0] for f in self.features.split(",") if f)
        return ":".join((self.arch, *pinned))


def parse_arch(target_id: str) -> Target:
    """`gfx942:sramecc+:xnack-` (a device's gcnArchName) -> Target('gfx942', '+sramecc,-xnack')."""
    arch, *settings = target_id.split(":")
    if arch not in ARCHS:
        raise ValueError(f"arch: expected one of {ARCHS} with optional target-ID features, "
                         f"got {target_id!r}")
    pinned = {}
    for setting in settings:
        name, sign = setting[:-1], setting[-1:]
        if name not in TARGET_ID_FEATURES or not sign or sign not in "+-" or name in pinned:
            raise ValueError(f"arch {target_id!r}: expected features among "
                             f"{[f + s for f in TARGET_ID_FEATURES for s in '+-']}, "
                             f"each at most once, got {setting!r}")
        pinned[name] = sign
    # Target IDs list features alphabetically; so do we, for one spelling per target.
    return Target(arch, ",".join(pinned[name] + name for name in sorted(pinned)))


def check_code_object_version(ir: str) -> None:
    """Without the module flag LLVM picks its own default code object version,
    and the runtime, the metadata reader and the emulator all assume v5."""
    found = _CODE_OBJECT_FLAG.search(ir)
    if found is None or int(found[1]) != CODE_OBJECT_VERSION:
        given = "no such flag" if found is None else f"version {found[1]}"
        raise ValueError(
            f"IR: expected the module flag `!{{i32 1, !\"amdhsa_code_object_version\", "
            f"i32 {CODE_OBJECT_VERSION}}}` in !llvm.module.flags, got {given}")


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


def verify(ir: str, arch: str, features: str = "") -> str:
    """Parse and verify; the text passes on unchanged (comments and names kept)."""
    parse(ir)
    return ir


def optimize(ir: str, arch: str, features: str = "", level: int = 3) -> str:
    """The new pass manager's O<level> pipeline; returns the optimized IR text."""
    tm = target_machine(arch, features)
    module = parse(ir)
    builder = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level=level))
    builder.getModulePassManager().run(module, builder)
    return str(module)


def emit_assembly(ir: str, arch: str, features: str = "") -> str:
    """Verbose asm: the printer's comments include each kernel's `codeLenInByte`,
    which the build checks against the code object."""
    machine = target_machine(arch, features)
    machine.set_asm_verbosity(True)
    return machine.emit_assembly(parse(ir))


def emit_object(ir: str, arch: str, features: str = "") -> bytes:
    return target_machine(arch, features).emit_object(parse(ir))


def versions() -> dict[str, str]:
    import llvmlite

    return {"llvmlite": llvmlite.__version__, "llvm": ".".join(map(str, llvm.llvm_version_info))}



def serve(fd: int) -> None:
    """The LLVM worker process's loop (started by k2back.codegen.compiler).

    A request is (schedule, inputs, target): run each `(stage, input stage,
    function)` of the schedule in order, announcing each stage before it starts
    and sending its output when done, so that if LLVM aborts the process the
    parent knows where, and holds the IR that led there.
    """
    import multiprocessing.connection
    import time

    conn = multiprocessing.connection.Connection(fd)
    while True:
        try:
            schedule, outputs, target = conn.recv()
        except EOFError:  # the parent is gone
            return
        for stage, source, run in schedule:
            conn.send(("begin", stage))
            start = time.perf_counter()
            try:
                outputs[stage] = run(outputs[source], *target)
            except Exception as e:  # noqa: BLE001 -- reported to the parent, which raises
                conn.send(("error", f"{type(e).__name__}: {e}"))
                break
            conn.send(("output", stage, outputs[stage], time.perf_counter() - start))
        else:
            conn.send(("done",))
