"""`k2back doctor` in a subprocess, as a user runs it: without ROCm it still
exits 0 and says what is missing; a broken toolchain is a failure."""

from __future__ import annotations

import os
import subprocess
import sys

from k2back.doctor import hip_version_triple


def doctor(tmp_path, **env):
    return subprocess.run([sys.executable, "-m", "k2back", "doctor"], check=False, capture_output=True,
                          text=True, timeout=120,
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
    done = doctor(tmp_path)
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
    done = doctor(tmp_path, K2BACK_LLD=str(tmp_path / "no-such-ld.lld"))
    assert done.returncode == 1
    status, detail = rows(done.stdout)["linker"]
    assert status == "FAIL" and "K2BACK_LLD" in detail


def test_hip_version_encoding():
    # HIP_VERSION = major * 10^7 + minor * 10^5 + patch (ROCm 6.2's HIP is 6.2.41133)
    assert hip_version_triple(60241133) == (6, 2, 41133)
    assert hip_version_triple(71526333) == (7, 15, 26333)
