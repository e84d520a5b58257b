"""`k2back doctor`: what this machine can do, and what is missing.

The toolchain (llvmlite, the amdgcn target, ld.lld) is required: a FAIL there
means nothing can be built. ROCm and GPUs are optional: without them the
emulator still runs every kernel, and doctor says so rather than failing.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from k2back import knobs
from k2back.codegen import llvm

OK, MISSING, WARN, FAIL = "ok", "missing", "WARN", "FAIL"
HIP_LIBRARY = "libamdhip64.so"


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    detail: str


def _toolchain() -> Iterable[Check]:
    versions = llvm.versions()
    yield Check("llvmlite / LLVM", OK, f"llvmlite {versions['llvmlite']}, LLVM {versions['llvm']}")
    for arch in llvm.ARCHS:
        llvm.target_machine(arch)
        yield Check(f"amdgcn target {arch}", OK, "target machine created")


def _linker() -> Iterable[Check]:
    from k2back.codegen.linker import linker

    found = linker()
    yield Check("ld.lld", OK, f"{' '.join(found.command)} ({found.origin}): {found.version}")


def hip_version_triple(encoded: int) -> tuple[int, int, int]:
    """HIP_VERSION = major * 10^7 + minor * 10^5 + patch."""
    return encoded // 10_000_000, encoded // 100_000 % 100, encoded % 100_000


def loaded_hip_libraries() -> set[str]:
    """Paths of every libamdhip64.so mapped into this process."""
    maps = Path("/proc/self/maps")
    if not maps.exists():
        return set()
    return {line.split()[-1] for line in maps.read_text().splitlines() if HIP_LIBRARY in line}


def _hip() -> Iterable[Check]:
    from k2back.runtime import hip as runtime

    hip = runtime.bindings()
    bound = (hip.HIP_VERSION_MAJOR, hip.HIP_VERSION_MINOR, hip.HIP_VERSION_PATCH)
    yield Check("hip-python", OK, f"{importlib.metadata.version('hip-python')}, built for HIP "
                f"{'.'.join(map(str, bound))}")
    status = runtime.runtime_status()
    if status is not None:
        yield Check("ROCm runtime", MISSING, f"{status}; the emu backend still runs every kernel")
        return
    version = runtime.hip_check("hipRuntimeGetVersion", hip.hipRuntimeGetVersion())
    found = hip_version_triple(version)
    yield Check("HIP runtime", OK if bound == found else FAIL,
                f"{'.'.join(map(str, found))} (hip-python's must match: "
                f"{'.'.join(map(str, bound))})")
    libraries = loaded_hip_libraries()
    yield Check(HIP_LIBRARY, OK if len(libraries) == 1 else WARN,
                ", ".join(sorted(libraries)) + ("" if len(libraries) == 1 else
                                                " (torch and hip-python loaded different copies)"))
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        target = llvm.parse_arch(props.gcnArchName)
        yield Check(f"GPU {index}", OK, f"{props.name}: {props.gcnArchName} -> arch "
                    f"{target.arch}, features {target.features or '(any)'}")


def _cache() -> Iterable[Check]:
    from k2back.runtime import cache

    yield Check("cache", OK, f"{knobs.cache_dir()}: {cache.size_bytes()} bytes")


# a section that raises FAILs as a whole, with the reason; ROCm's absence is not a failure
SECTIONS: tuple[Callable[[], Iterable[Check]], ...] = (_toolchain, _linker, _hip, _cache)


def checks() -> list[Check]:
    rows = []
    for section in SECTIONS:
        try:
            rows += section()
        except Exception as e:  # noqa: BLE001 -- doctor reports every failure, not just the first
            rows.append(Check(section.__name__.strip("_"), FAIL, f"{type(e).__name__}: {e}"))
    return rows
