"""End-to-end: compiled kernels of scalar/vector ALU and global memory."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from k2back.emu.testing import ARCHS, handwritten, module, rng, run

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
    assert f"read {4 * n:>12,} B  written {4 * n:>12,} B" in stats.report()


# Uniform integer arithmetic: LLVM selects scalar ALU ops (carry chains, 32x32
# high products, shifts, bit counts, bit fields, selects) and the udiv/urem
# expansion; checked against Python integers.
SCALAR_OPS = module("""
define amdgpu_kernel void @scalar_ops(ptr addrspace(1) %out, i64 %a, i64 %b, i32 %c, i32 %d) #0 {
  %dm = and i32 %d, 31
  %d64 = zext i32 %dm to i64
  %r0 = add i64 %a, %b
  %r1 = sub i64 %a, %b
  %r2 = mul i64 %a, %b
  %s3 = ashr i32 %c, %dm
  %r3 = sext i32 %s3 to i64
  %r4 = lshr i64 %a, %d64
  %r5 = shl i64 %a, %d64
  %s6 = call i32 @llvm.smin.i32(i32 %c, i32 %d)
  %r6 = sext i32 %s6 to i64
  %s7 = call i32 @llvm.umax.i32(i32 %c, i32 %d)
  %r7 = zext i32 %s7 to i64
  %r8 = call i64 @llvm.ctpop.i64(i64 %a)
  %s9 = call i32 @llvm.cttz.i32(i32 %c, i1 false)
  %r9 = zext i32 %s9 to i64
  %s10 = call i32 @llvm.ctlz.i32(i32 %c, i1 false)
  %r10 = zext i32 %s10 to i64
  %s11 = call i32 @llvm.bitreverse.i32(i32 %c)
  %r11 = zext i32 %s11 to i64
  %f12 = lshr i32 %c, 5
  %s12 = and i32 %f12, 1023
  %r12 = zext i32 %s12 to i64
  %f13 = shl i32 %c, 7
  %s13 = ashr i32 %f13, 20
  %r13 = sext i32 %s13 to i64
  %lt = icmp slt i32 %c, %d
  %r14 = select i1 %lt, i64 %a, i64 %b
  %s15 = mul i32 %c, %d
  %r15 = zext i32 %s15 to i64
  %cx = sext i32 %c to i64
  %dx = sext i32 %d to i64
  %prod = mul i64 %cx, %dx
  %r16 = ashr i64 %prod, 32
  %dn = or i32 %d, 1
  %s17 = udiv i32 %c, %dn
  %r17 = zext i32 %s17 to i64
  %s18 = urem i32 %c, %dn
  %r18 = zext i32 %s18 to i64
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  %first = icmp eq i32 %tid, 0
  br i1 %first, label %write, label %done
write:
""" + "".join(f"""  %p{i} = getelementptr i64, ptr addrspace(1) %out, i32 {i}
  store i64 %r{i}, ptr addrspace(1) %p{i}
""" for i in range(19)) + """  br label %done
done:
  ret void
}
declare i32 @llvm.amdgcn.workitem.id.x()
declare i32 @llvm.smin.i32(i32, i32)
declare i32 @llvm.umax.i32(i32, i32)
declare i64 @llvm.ctpop.i64(i64)
declare i32 @llvm.cttz.i32(i32, i1)
declare i32 @llvm.ctlz.i32(i32, i1)
declare i32 @llvm.bitreverse.i32(i32)
""")


def scalar_ops_reference(a: int, b: int, c: int, d: int) -> list[int]:
    m64, m32 = 2**64 - 1, 2**32 - 1
    sc, sd = (c ^ 2**31) - 2**31, (d ^ 2**31) - 2**31
    dm = d & 31
    cu = c & m32
    return [
        (a + b) & m64, (a - b) & m64, (a * b) & m64, (sc >> dm) & m64, a >> dm, (a << dm) & m64,
        min(sc, sd) & m64, max(c, d), a.bit_count(), (cu & -cu).bit_length() - 1 if cu else 32,
        32 - cu.bit_length(), int(f"{cu:032b}"[::-1], 2), (c >> 5) & 1023,
        ((((c << 7) & m32) ^ 2**31) - 2**31 >> 20) & m64, a if sc < sd else b, (c * d) & m32,
        ((sc * sd) >> 32) & m64, c // (d | 1), c % (d | 1),
    ]


@pytest.mark.parametrize("arch", ARCHS)
def test_scalar_integer_ops(arch):
    g = rng(6)
    for trial in range(4):
        a, b = (int(v) for v in g.integers(0, 2**63, 2, dtype=np.uint64) * 2 + trial % 2)
        c, d = (int(v) for v in g.integers(0, 2**32, 2, dtype=np.uint64))
        if trial == 3:
            c, d = 0, 0x80000000  # zero bit counts, the most negative i32
        out = np.zeros(19, np.uint64)
        run(SCALAR_OPS, arch, "scalar_ops", {"out": out, "a": a, "b": b, "c": c, "d": d})
        assert out.tolist() == scalar_ops_reference(a, b, c, d), (trial, a, b, c, d)


# The same arithmetic on per-lane values: LLVM selects the vector ALU forms.
VECTOR_OPS = (SCALAR_OPS
              .replace("@scalar_ops(ptr addrspace(1) %out, i64 %a, i64 %b, i32 %c, i32 %d) #0 {",
                       """@vector_ops(ptr addrspace(1) %out, ptr addrspace(1) %ab, ptr addrspace(1) %cd) #0 {
  %lane = call i32 @llvm.amdgcn.workitem.id.x()
  %pab = getelementptr <2 x i64>, ptr addrspace(1) %ab, i32 %lane
  %vab = load <2 x i64>, ptr addrspace(1) %pab
  %a = extractelement <2 x i64> %vab, i32 0
  %b = extractelement <2 x i64> %vab, i32 1
  %pcd = getelementptr <2 x i32>, ptr addrspace(1) %cd, i32 %lane
  %vcd = load <2 x i32>, ptr addrspace(1) %pcd
  %c = extractelement <2 x i32> %vcd, i32 0
  %d = extractelement <2 x i32> %vcd, i32 1
  %row = mul i32 %lane, 19""")
              .replace("  %first = icmp eq i32 %tid, 0\n  br i1 %first, label %write, label %done",
                       "  br label %write")
              .replace("getelementptr i64, ptr addrspace(1) %out, i32", "getelementptr i64, ptr addrspace(1) %outrow, i32")
              .replace("write:\n", "write:\n  %outrow = getelementptr i64, ptr addrspace(1) %out, i32 %row\n"))


@pytest.mark.parametrize("arch", ARCHS)
def test_vector_integer_ops(arch):
    g = rng(7)
    ab = g.integers(0, 2**64, (64, 2), dtype=np.uint64)
    cd = g.integers(0, 2**32, (64, 2), dtype=np.uint64).astype(np.uint32)
    cd[:4] = [[0, 0x80000000], [1, 31], [0xFFFFFFFF, 0], [12345, 0xFFFFFFFF]]
    out = np.zeros((64, 19), np.uint64)
    run(VECTOR_OPS, arch, "vector_ops", {"out": out, "ab": ab, "cd": cd})
    for lane in range(64):
        want = scalar_ops_reference(*(int(v) for v in ab[lane]), *(int(v) for v in cd[lane]))
        assert out[lane].tolist() == want, lane


def test_the_emulator_imports_and_runs_without_llvm():
    """`k2back.emu` is a generic package: with llvmlite unimportable it still
    parses asm and runs a kernel (here hand-written: lane ids times 3)."""
    script = textwrap.dedent("""
        import sys
        sys.modules["llvmlite"] = None  # any import of it now fails
        import numpy as np
        from k2back.emu import Machine
        asm = sys.stdin.read()
        machine = Machine("gfx942")
        out = np.zeros(64, np.uint32)
        machine.launch(asm, "hand", kernargs=machine.map(out).to_bytes(8, "little"))
        assert "k2back.codegen" not in sys.modules and "llvmlite.binding" not in sys.modules
        print(out.tolist() == [3 * i for i in range(64)])
    """)
    body = """
\tv_mul_u32_u24_e32 v1, 3, v0
\ts_load_dwordx2 s[2:3], s[0:1], 0x0
\tv_lshlrev_b32_e32 v2, 2, v0
\ts_waitcnt lgkmcnt(0)
\tglobal_store_dword v2, v1, s[2:3]"""
    done = subprocess.run([sys.executable, "-c", script], input=handwritten("gfx942", body),
                          capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "True"
