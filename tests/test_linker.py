"""ld.lld discovery order (K2BACK_LLD, ROCm, PATH newest, ziglang) with fake
linkers on disk, and a real link of an object LLVM made."""

from __future__ import annotations

import io

import pytest
from elftools.elf.elffile import ELFFile

from k2back.codegen import linker, llvm
from k2back.codegen.testing import fake_lld

KERNEL = """target triple = "amdgcn-amd-amdhsa"
define amdgpu_kernel void @store_tid(ptr addrspace(1) %out) {
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  %dst = getelementptr i32, ptr addrspace(1) %out, i32 %tid
  store i32 %tid, ptr addrspace(1) %dst
  ret void
}
declare i32 @llvm.amdgcn.workitem.id.x()
!llvm.module.flags = !{!0}
!0 = !{i32 1, !"amdhsa_code_object_version", i32 500}
"""


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No override, no ROCm, an empty PATH: only the ziglang rule can answer."""
    monkeypatch.delenv("K2BACK_LLD", raising=False)
    monkeypatch.delenv("ROCM_PATH", raising=False)
    monkeypatch.setattr(linker, "ROCM_ROOTS", ())
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    return monkeypatch


def test_ziglang_is_the_last_resort(clean_env):
    found = linker.find_linker()
    assert found.origin == "ziglang package"
    assert found.command[-1] == "ld.lld"
    assert found.version.startswith("LLD ")


def test_newest_versioned_lld_on_path_wins(clean_env, tmp_path):
    bin_a, bin_b = tmp_path / "a", tmp_path / "b"
    fake_lld(bin_a / "ld.lld-17")
    newest = fake_lld(bin_b / "ld.lld-19")
    fake_lld(bin_a / "ld.lld")
    (bin_b / "ld.lld-20.bak").write_text("not a linker")
    clean_env.setenv("PATH", f"{bin_a}:{bin_b}")
    assert linker.find_linker().command == (str(newest),)


def test_plain_lld_on_path(clean_env, tmp_path):
    plain = fake_lld(tmp_path / "bin" / "ld.lld")
    clean_env.setenv("PATH", str(plain.parent))
    assert linker.find_linker().command == (str(plain),)


def test_rocm_before_path(clean_env, tmp_path):
    rocm = fake_lld(tmp_path / "rocm" / "llvm" / "bin" / "ld.lld")
    fake_lld(tmp_path / "bin" / "ld.lld-19")
    clean_env.setenv("PATH", str(tmp_path / "bin"))
    clean_env.setenv("ROCM_PATH", str(tmp_path / "rocm"))
    found = linker.find_linker()
    assert found.command == (str(rocm),) and found.origin.startswith("ROCm")


def test_override_before_everything(clean_env, tmp_path):
    chosen = fake_lld(tmp_path / "mine" / "lld", version="LLD 42.0.0 (mine)")
    fake_lld(tmp_path / "rocm" / "llvm" / "bin" / "ld.lld")
    clean_env.setenv("ROCM_PATH", str(tmp_path / "rocm"))
    clean_env.setenv("K2BACK_LLD", str(chosen))
    found = linker.linker()
    assert (found.command, found.origin) == ((str(chosen),), "K2BACK_LLD")
    assert linker.linker_version() == f"{chosen} | LLD 42.0.0 (mine)"


@pytest.mark.parametrize("make", [
    lambda tmp: tmp / "missing" / "ld.lld",
    lambda tmp: tmp,  # a directory
    lambda tmp: (tmp / "ld.lld").write_text("not executable") and tmp / "ld.lld",
])
def test_bad_override_is_an_error_naming_the_variable(clean_env, tmp_path, make):
    clean_env.setenv("K2BACK_LLD", str(make(tmp_path)))
    with pytest.raises(linker.LinkerError, match="K2BACK_LLD"):
        linker.find_linker()


def test_nothing_found(clean_env, monkeypatch):
    monkeypatch.setattr(linker, "_ziglang", lambda: None)
    with pytest.raises(linker.LinkerError, match="no ld.lld found.*K2BACK_LLD"):
        linker.find_linker()


@pytest.mark.parametrize("arch", llvm.ARCHS)
def test_link_makes_a_shared_code_object(arch):
    hsaco = linker.link(llvm.emit_object(KERNEL, arch))
    elf = ELFFile(io.BytesIO(hsaco))
    assert (elf["e_machine"], elf["e_type"]) == ("EM_AMDGPU", "ET_DYN")
    names = {s.name for s in elf.get_section_by_name(".dynsym").iter_symbols()}
    assert {"store_tid", "store_tid.kd"} <= names


def test_link_failure_carries_the_linker_message():
    with pytest.raises(linker.LinkerError, match="(?s)-shared failed.*error"):
        linker.link(b"\x7fELF not really an object")
