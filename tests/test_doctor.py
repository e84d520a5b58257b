"""`k2back doctor` in a subprocess, as a user runs it: without ROCm it still
exits 0 and says what is missing; a broken toolchain is a failure."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from k2back import doctor
from k2back.doctor import hip_version_triple
from k2back.runtime import hip


def run_doctor(tmp_path, **env):
    return subprocess.run([sys.executable, "-m", "k2back", "doctor"], check=False,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "K2BACK_CACHE_DIR": str(tmp_path), **env})


def rows(stdout: str) -> dict[str, tuple[str, str]]:
    """check -> (status, detail) from the printed table (columns 2+ spaces apart)."""
    table = {}
    for line in stdout.splitlines()[2:]:
        parts = [p.strip() for p in line.split("  ") if p.strip()]
        name, status, detail = (parts + ["", ""])[:3]
        table[name] = (status, detail)
    return table


def test_doctor_without_rocm_reports_and_succeeds(tmp_path):
    done = run_doctor(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    found = rows(done.stdout)
    assert found["llvmlite / LLVM"][0] == "ok"
    assert found["amdgcn target gfx942"][0] == found["amdgcn target gfx950"][0] == "ok"
    assert found["ld.lld"][0] == "ok" and "LLD" in found["ld.lld"][1]
    assert "built for HIP" in found["hip-python"][1]
    status, detail = found.get("ROCm runtime", found.get("HIP runtime"))
    if status == "missing":
        assert "emu" in detail
    assert str(tmp_path) in found["cache"][1]


def test_doctor_fails_on_a_broken_linker(tmp_path):
    done = run_doctor(tmp_path, K2BACK_LLD=str(tmp_path / "no-such-ld.lld"))
    assert done.returncode == 1
    status, detail = rows(done.stdout)["linker"]
    assert status == "FAIL" and "K2BACK_LLD" in detail


def test_hip_version_encoding():
    # HIP_VERSION = major * 10^7 + minor * 10^5 + patch (ROCm 6.2's HIP is 6.2.41133)
    assert hip_version_triple(60241133) == (6, 2, 41133)
    assert hip_version_triple(71526333) == (7, 15, 26333)


@pytest.fixture
def rocm_machine(monkeypatch):
    """A ROCm 6.4 host with two MI300X, as hip-python and torch would report it."""
    fake = SimpleNamespace(HIP_VERSION_MAJOR=6, HIP_VERSION_MINOR=4, HIP_VERSION_PATCH=43482,
                           hipError_t=SimpleNamespace(hipSuccess=0),
                           hipRuntimeGetVersion=lambda: (0, 60443482))
    monkeypatch.setattr(hip, "bindings", lambda: fake)
    monkeypatch.setattr(hip, "runtime_status", lambda: None)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(
        name="AMD Instinct MI300X", gcnArchName="gfx942:sramecc+:xnack-"))
    monkeypatch.setattr(doctor, "loaded_hip_libraries",
                        lambda: {"/opt/rocm-6.4.0/lib/libamdhip64.so.6"})
    return fake


def checks_by_name() -> dict:
    return {c.name: c for c in doctor.checks()}


def test_doctor_reads_the_gpus_target_ids(rocm_machine):
    found = checks_by_name()
    assert found["HIP runtime"].status == "ok"
    assert found["libamdhip64.so"].status == "ok"
    for index in (0, 1):
        detail = found[f"GPU {index}"].detail
        assert "arch gfx942" in detail and "+sramecc" in detail and "-xnack" in detail


def test_doctor_flags_a_hip_python_runtime_mismatch(rocm_machine, monkeypatch):
    rocm_machine.hipRuntimeGetVersion = lambda: (0, 60342134)  # ROCm 6.3's HIP
    assert checks_by_name()["HIP runtime"].status == "FAIL"
    monkeypatch.setattr(doctor, "loaded_hip_libraries",
                        lambda: {"/opt/rocm/lib/libamdhip64.so", "/venv/torch/lib/libamdhip64.so"})
    assert checks_by_name()["libamdhip64.so"].status == "WARN"
