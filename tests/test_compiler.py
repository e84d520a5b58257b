"""The stage table end to end on small hand-written kernels, for both archs:
worker results against the same pipeline run in-process, entry at `opt.ll`,
and every way a build fails (syntax, verifier, LLVM abort, missing module flag,
linker) as a CompileError naming the stage, with the parent alive."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys

import pytest
from elftools.elf.elffile import ELFFile

from k2back.codegen import linker, llvm
from k2back.codegen.compiler import STAGES, CompileError, IRSource, compile, schedule
from k2back.codegen.testing import AXPY, FLAGS, HEADER, SCALED_MFMA, module

pytestmark = pytest.mark.usefixtures("private_cache")

def cache_contents(root) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name != ".locks") if root.exists() else []


@pytest.mark.parametrize("arch", llvm.ARCHS)
def test_stages_in_worker_match_the_pipeline_in_process(arch, private_cache):
    kernel = compile(IRSource(AXPY, "axpy", arch))
    opt_ir = llvm.optimize(AXPY, arch)
    assert kernel.ir == AXPY
    assert kernel.opt_ir == opt_ir
    assert kernel.asm == llvm.emit_assembly(opt_ir, arch)
    assert kernel.hsaco == linker.link(llvm.emit_object(opt_ir, arch))
    elf = ELFFile(io.BytesIO(kernel.hsaco))
    assert (elf["e_machine"], elf["e_type"]) == ("EM_AMDGPU", "ET_DYN")
    assert {s.name for s in elf.get_section_by_name(".dynsym").iter_symbols()} >= {"axpy",
                                                                                   "axpy.kd"}
    assert (kernel.name, kernel.arch, kernel.features, kernel.cache_hit) == ("axpy", arch, "",
                                                                             False)
    assert kernel.metadata.name == "axpy" and kernel.metadata.target == arch
    assert "s_swappc_b64" not in kernel.asm  # the helper was inlined by O3
    assert kernel.path is not None and kernel.path.is_dir()


@pytest.mark.parametrize("arch", llvm.ARCHS)
def test_entry_at_opt_ll_skips_optimization(arch):
    kernel = compile(IRSource(AXPY, "axpy", arch, stage="opt.ll"))
    assert "s_swappc_b64" in kernel.asm  # the call survived: O3 never ran
    assert kernel.opt_ir == AXPY
    assert kernel.asm == llvm.emit_assembly(AXPY, arch)


def test_schedule_follows_the_table():
    assert [s for s, _, _ in schedule("ll")] == list(STAGES)
    assert [(s, src) for s, src, _ in schedule("opt.ll")] == [
        ("opt.ll", "source"), ("s", "opt.ll"), ("o", "opt.ll"), ("hsaco", "o")]
    with pytest.raises(ValueError, match="stage: expected one of .*got 's'"):
        schedule("s")


def test_target_features_reach_llvm_and_the_code_object():
    kernel = compile(IRSource(AXPY, "axpy", "gfx942:xnack-:sramecc+"))
    assert (kernel.arch, kernel.features) == ("gfx942", "+sramecc,-xnack")
    assert kernel.metadata.target == "gfx942:sramecc+:xnack-"
    elf = ELFFile(io.BytesIO(kernel.hsaco))
    # EF_AMDGPU_FEATURE_XNACK_OFF_V4 = 0x200, EF_AMDGPU_FEATURE_SRAMECC_ON_V4 = 0xc00
    assert elf["e_flags"] & 0xF00 == 0x200 | 0xC00
    default = compile(IRSource(AXPY, "axpy", "gfx942"))
    assert ELFFile(io.BytesIO(default.hsaco))["e_flags"] & 0xF00 == 0x100 | 0x400  # any, any


@pytest.mark.parametrize("target_id, expected", [
    ("gfx950", ("gfx950", "")),
    ("gfx942:sramecc+:xnack-", ("gfx942", "+sramecc,-xnack")),
    ("gfx942:xnack+", ("gfx942", "+xnack")),
])
def test_parse_arch(target_id, expected):
    target = llvm.parse_arch(target_id)
    assert tuple(target) == expected
    assert llvm.parse_arch(target.target_id) == target


@pytest.mark.parametrize("target_id", ["gfx90a", "gfx942:sramecc", "gfx942:ecc+",
                                       "gfx942:xnack+:xnack-", ""])
def test_parse_arch_rejects(target_id):
    with pytest.raises(ValueError, match=f"arch.*{re.escape(repr(target_id))}"):
        llvm.parse_arch(target_id)


@pytest.mark.parametrize("entry", ["ll", "opt.ll"])
def test_syntax_error_names_the_stage_and_keeps_the_ir(entry, private_cache):
    broken = AXPY.replace("%m = fmul float %v, %a", "%m = fmul float %v, %a, %a")
    with pytest.raises(CompileError, match=f"stage '{entry}' failed: .*parsing error") as error:
        compile(IRSource(broken, "axpy", "gfx942", stage=entry))
    assert error.value.stage == entry
    assert error.value.ir_path.read_text() == broken
    assert cache_contents(private_cache) == []


def test_verifier_error_names_the_ll_stage():
    # %m is used in a block its definition does not dominate
    broken = AXPY.replace("  %dst = getelementptr float, ptr addrspace(1) %out, i32 %tid\n", "") \
        .replace("store float %m, ptr addrspace(1) %dst", "store float %m, ptr addrspace(1) %out") \
        .replace("done:\n  ret void", "done:\n  store float %m, ptr addrspace(1) %out\n  ret void")
    with pytest.raises(CompileError, match="stage 'll' failed: .*dominate") as error:
        compile(IRSource(broken, "axpy", "gfx950"))
    assert error.value.stage == "ll"


def test_llvm_abort_is_a_compile_error_and_the_parent_lives_on(private_cache):
    pid = os.getpid()
    with pytest.raises(CompileError, match="(?s)stage 's' failed: .*SIGABRT.*Cannot select"
                       ) as error:
        compile(IRSource(SCALED_MFMA, "crash", "gfx942"))
    assert os.getpid() == pid
    assert error.value.stage == "s" and error.value.kernel == "crash"
    # the IR isel choked on is the optimized IR, kept for inspection
    assert error.value.ir_path.name == "crash.opt.ll"
    assert "mfma.scale" in error.value.ir_path.read_text()
    assert cache_contents(private_cache) == []
    # a fresh worker takes over; the same IR is fine for the arch that has the instruction
    assert "_16x16x128_f8f6f4 " in compile(
        IRSource(SCALED_MFMA, "crash", "gfx950")).asm


def test_a_stage_past_the_timeout_kills_the_worker_and_the_next_build_works(
        private_cache, monkeypatch):
    monkeypatch.setenv("K2BACK_COMPILE_TIMEOUT", "1e-6")  # no stage answers that fast
    with pytest.raises(CompileError, match="no progress for 1e-06 s .*K2BACK_COMPILE_TIMEOUT"):
        compile(IRSource(AXPY, "axpy", "gfx942"))
    assert cache_contents(private_cache) == []
    monkeypatch.delenv("K2BACK_COMPILE_TIMEOUT")
    assert "global_store_dword" in compile(IRSource(AXPY, "axpy", "gfx942")).asm


def test_failure_ir_goes_to_the_dump_dir_when_set(tmp_path, monkeypatch):
    monkeypatch.setenv("K2BACK_DUMP_DIR", str(tmp_path / "dump"))
    with pytest.raises(CompileError) as error:
        compile(IRSource(SCALED_MFMA, "crash", "gfx942"))
    assert error.value.ir_path.is_relative_to(tmp_path / "dump")
    assert (error.value.ir_path.parent / "crash.ll").read_text() == SCALED_MFMA


@pytest.mark.parametrize("flags, given", [
    ("", "no such flag"),
    (FLAGS.replace("i32 500", "i32 400"), "version 400"),
])
def test_code_object_version_flag_is_required(flags, given, private_cache):
    with pytest.raises(CompileError, match=f"amdhsa_code_object_version.*got {given}") as error:
        compile(IRSource(module(AXPY.split(HEADER)[1].split(FLAGS)[0], flags), "axpy", "gfx942"))
    assert error.value.stage == "ll"
    assert cache_contents(private_cache) == []


def test_linker_failure_is_the_hsaco_stage(tmp_path, monkeypatch, private_cache):
    fake = tmp_path / "ld.lld"
    fake.write_text('#!/bin/sh\n[ "$1" = --version ] && { echo "LLD 0.0 (fake)"; exit 0; }\n'
                    'echo "fake lld: cannot link" >&2; exit 3\n')
    fake.chmod(0o755)
    monkeypatch.setenv("K2BACK_LLD", str(fake))
    with pytest.raises(CompileError, match="(?s)stage 'hsaco' failed.*fake lld: cannot link"
                       ) as error:
        compile(IRSource(AXPY, "axpy", "gfx950"))
    assert error.value.ir_path.name == "axpy.opt.ll"  # what the object was made of
    assert cache_contents(private_cache) == []


FORK_AFTER_COMPILE = """
import os, sys
from k2back.codegen import compiler
from k2back.codegen.compiler import IRSource, compile
from k2back.codegen.testing import AXPY
compile(IRSource(AXPY, "axpy", "gfx942"))  # the parent's worker is up
parent_worker = compiler._worker._process.pid
pid = os.fork()
if pid == 0:  # the child builds something new, then leaves without cleanup handlers
    try:
        built = compile(IRSource(AXPY, "axpy", "gfx950:xnack-"))
        own = compiler._worker._process.pid != parent_worker
        os._exit(0 if own and built.metadata.target == "gfx950:xnack-" else 1)
    except BaseException:
        os._exit(2)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
# the parent's worker was not disturbed
assert compile(IRSource(AXPY, "axpy", "gfx950:sramecc-")).metadata.target == "gfx950:sramecc-"
"""


def test_a_forked_child_gets_its_own_worker():
    # in a fresh interpreter: forking a test process that may hold torch's threads is unsafe
    done = subprocess.run([sys.executable, "-c", FORK_AFTER_COMPILE],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr


def test_a_device_target_id_overrides_the_sources_features():
    source = IRSource(AXPY, "axpy", "gfx942")
    kernel = compile(source, arch="gfx942:sramecc+:xnack-")
    assert (kernel.arch, kernel.features) == ("gfx942", "+sramecc,-xnack")
    assert kernel.metadata.target == "gfx942:sramecc+:xnack-"
    assert kernel.key != compile(source).key
    with pytest.raises(ValueError, match="arch: expected a target ID of .* gfx942, got 'gfx950'"):
        compile(source, arch="gfx950")


@pytest.mark.parametrize("field, value", [("stage", "s"), ("arch", "gfx1100")])
def test_ir_source_checks_its_arguments(field, value):
    arguments = {"text": AXPY, "name": "axpy", "arch": "gfx942", field: value}
    with pytest.raises(ValueError, match=f"{field}: expected .*got '{value}'"):
        IRSource(**arguments)
