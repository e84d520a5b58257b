"""Find ld.lld and link an amdgcn object into a shared code object (hsaco).

Discovery order (first that exists wins):
  1. `K2BACK_LLD` (cf. TRITON_HIP_LLD_PATH): the user's choice; if it does not
     run, that is an error naming the variable, never a silent fallback;
  2. ROCm's: `$ROCM_PATH/llvm/bin/ld.lld`, `/opt/rocm/llvm/bin/ld.lld`;
  3. a system `ld.lld-NN` on PATH, newest NN first, then a plain `ld.lld`;
  4. the `ziglang` package's bundled LLD (`zig ld.lld`), always installed with us.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from k2back import knobs

ROCM_ROOTS = ("/opt/rocm",)
VERSIONED_LLD = re.compile(r"^ld\.lld-(\d+)$")


class LinkerError(RuntimeError):
    pass


@dataclass(frozen=True)
class Linker:
    command: tuple[str, ...]  # argv prefix that behaves as `ld.lld`
    origin: str  # which discovery rule found it (for `k2back doctor`)

    @functools.cached_property
    def version(self) -> str:
        """First line of `ld.lld --version`, e.g. 'LLD 22.1.8 (compatible with GNU linkers)'."""
        try:
            done = subprocess.run([*self.command, "--version"], capture_output=True, text=True,
                                  timeout=60, check=False)
        except OSError as e:
            raise LinkerError(f"{self.origin}: cannot run {self.command[0]}: {e}") from None
        if done.returncode != 0 or not done.stdout.strip():
            raise LinkerError(f"{self.origin}: `{' '.join(self.command)} --version` failed "
                              f"(exit {done.returncode}): {done.stderr.strip()}")
        return done.stdout.strip().splitlines()[0]

    def link(self, obj: bytes) -> bytes:
        """`ld.lld -shared` of one relocatable object; returns the hsaco bytes."""
        with tempfile.TemporaryDirectory(prefix="k2back-link-") as tmp:
            src, dst = Path(tmp, "kernel.o"), Path(tmp, "kernel.hsaco")
            src.write_bytes(obj)
            done = subprocess.run([*self.command, "-shared", str(src), "-o", str(dst)],
                                  capture_output=True, text=True, timeout=300, check=False)
            if done.returncode != 0:
                raise LinkerError(f"{' '.join(self.command)} -shared failed "
                                  f"(exit {done.returncode}):\n{done.stderr.strip()}")
            return dst.read_bytes()


def _override(path: Path) -> Linker:
    if not path.is_file():
        raise LinkerError(f"K2BACK_LLD: expected the path of an ld.lld executable, "
                          f"got {str(path)!r}, which is not a file")
    chosen = Linker((str(path),), "K2BACK_LLD")
    chosen.version  # noqa: B018 -- an override that does not run is an error now, not at link time
    return chosen


def _rocm() -> Linker | None:
    roots = [os.environ["ROCM_PATH"]] if os.environ.get("ROCM_PATH") else []
    for root in (*roots, *ROCM_ROOTS):
        lld = Path(root, "llvm", "bin", "ld.lld")
        if lld.is_file():
            return Linker((str(lld),), f"ROCm ({root})")
    return None


def _system() -> Linker | None:
    """Newest `ld.lld-NN` on PATH (the name tells the version without running it), else `ld.lld`."""
    versioned = {}
    for directory in filter(os.path.isdir, os.environ.get("PATH", "").split(os.pathsep)):
        for entry in Path(directory).glob("ld.lld-*"):
            match = VERSIONED_LLD.match(entry.name)
            if match and os.access(entry, os.X_OK):
                versioned.setdefault(int(match[1]), entry)
    if versioned:
        return Linker((str(versioned[max(versioned)]),), "PATH")
    plain = shutil.which("ld.lld")
    return Linker((plain,), "PATH") if plain else None


def _ziglang() -> Linker | None:
    # The zig binary itself, not `python -m ziglang`: saves an interpreter start per link.
    spec = importlib.util.find_spec("ziglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    zig = Path(spec.submodule_search_locations[0], "zig")
    return Linker((str(zig), "ld.lld"), "ziglang package") if zig.is_file() else None


def find_linker() -> Linker:
    override = knobs.lld_override()
    if override is not None:
        return _override(override)
    for rule in (_rocm, _system, _ziglang):
        found = rule()
        if found is not None:
            return found
    raise LinkerError("no ld.lld found: set K2BACK_LLD, install ROCm or lld (e.g. apt install "
                      "lld-19), or `pip install ziglang`")


@functools.cache
def _found_for(*environment) -> Linker:
    # `environment` is only the memo key: discovery depends on nothing else.
    return find_linker()


def linker() -> Linker:
    """The linker for this environment, looked up once per (K2BACK_LLD, ROCM_PATH, PATH)."""
    return _found_for(knobs.lld_override(), os.environ.get("ROCM_PATH"), os.environ.get("PATH"))


def linker_version() -> str:
    """Path and version of the linker: a cache-key factor."""
    found = linker()
    return f"{' '.join(found.command)} | {found.version}"


def link(obj: bytes) -> bytes:
    return linker().link(obj)
