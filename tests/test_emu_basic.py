"""End-to-end: compiled kernels of scalar/vector ALU and global memory."""

import numpy as np
import pytest

from emu_util import ARCHS, module, rng, run

SAXPY = module("""
define amdgpu_kernel void @saxpy(ptr addrspace(1) %x, ptr addrspace(1) %y, float %a, i32 %n) #0 {
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  %bid = call i32 @llvm.amdgcn.workgroup.id.x()
  %bd = mul i32 %bid, 256
  %i = add i32 %bd, %tid
  %c = icmp slt i32 %i, %n
  br i1 %c, label %do, label %done
do:
  %px = getelementptr float, ptr addrspace(1) %x, i32 %i
  %py = getelementptr float, ptr addrspace(1) %y, i32 %i
  %vx = load float, ptr addrspace(1) %px
  %vy = load float, ptr addrspace(1) %py
  %m = fmul float %vx, %a
  %s = fadd float %m, %vy
  store float %s, ptr addrspace(1) %py
  br label %done
done:
  ret void
}
declare i32 @llvm.amdgcn.workitem.id.x()
declare i32 @llvm.amdgcn.workgroup.id.x()
""")


@pytest.mark.parametrize("arch", ARCHS)
def test_saxpy_partial_grid(arch):
    g = rng(1)
    n = 1000
    x = g.standard_normal(1024).astype(np.float32)
    y = g.standard_normal(1024).astype(np.float32)
    want = y.copy()
    want[:n] = x[:n] * np.float32(1.5) + y[:n]
    stats = run(SAXPY, arch, "saxpy", {"x": x, "y": y, "a": 1.5, "n": n}, grid=(4,), block=(256,))
    np.testing.assert_array_equal(y, want)
    assert (stats.bytes_read["x"], stats.bytes_read["y"]) == (4 * n, 4 * n)
    assert (stats.bytes_written["x"], stats.bytes_written["y"]) == (0, 4 * n)
    assert stats.instructions["vmem_load"] == 2 * 4 * 4  # 2 loads x 16 waves, the last one partial
    assert stats.waves == 16 and stats.workgroups == 4
