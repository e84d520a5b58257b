"""Emulator speed: wave-instructions per second on this machine.

Three kernels compiled from LLVM IR for gfx942 and gfx950:
  mfma      one 16x16 bf16 tile per wave, K loop of global loads + MFMAs
  scalar    a branchy SALU loop (uniform control flow, few vector ops)
  idle_grid the persistent-grid shape (304 / 256 workgroups x 8 waves) where
            each wave does a little bookkeeping and ends
  k2_tiny   the K2 kernel itself (tiny geometry, TP 1, 16 tokens) through the
            emulator backend, set-up and decode included
Best of three runs (one for k2_tiny); the machine is shared, so expect noise.
Absolute speeds compare between machines only through the yardstick printed
before and after the table: seconds Python takes for sum(range(10**7)) (278 ms
on the 2-core CI kind of machine the targets are set for).
Run: .venv/bin/python benchmarks/emu_speed.py
"""

from __future__ import annotations

import time

import numpy as np
import torch

from k2back.emu.testing import ARCHS, IDLE_GRID, module, run

MFMA = module("""
define amdgpu_kernel void @mfma(ptr addrspace(1) %a, ptr addrspace(1) %out, i32 %blocks) #0 {
entry:
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  %lane = and i32 %tid, 63
  br label %loop
loop:
  %kb = phi i32 [ 0, %entry ], [ %kb1, %loop ]
  %acc = phi <4 x float> [ zeroinitializer, %entry ], [ %acc2, %loop ]
  %base = mul i32 %kb, 64
  %idx = add i32 %base, %lane
  %pa = getelementptr <4 x i16>, ptr addrspace(1) %a, i32 %idx
  %av = load <4 x i16>, ptr addrspace(1) %pa
  %acc1 = call <4 x float> @llvm.amdgcn.mfma.f32.16x16x16bf16.1k(<4 x i16> %av, <4 x i16> %av, <4 x float> %acc, i32 0, i32 0, i32 0)
  %acc2 = call <4 x float> @llvm.amdgcn.mfma.f32.16x16x16bf16.1k(<4 x i16> %av, <4 x i16> %av, <4 x float> %acc1, i32 0, i32 0, i32 0)
  %kb1 = add i32 %kb, 1
  %more = icmp ult i32 %kb1, %blocks
  br i1 %more, label %loop, label %exit
exit:
  %po = getelementptr <4 x float>, ptr addrspace(1) %out, i32 %tid
  store <4 x float> %acc2, ptr addrspace(1) %po
  ret void
}
declare i32 @llvm.amdgcn.workitem.id.x()
declare <4 x float> @llvm.amdgcn.mfma.f32.16x16x16bf16.1k(<4 x i16>, <4 x i16>, <4 x float>, i32, i32, i32)
""")

SCALAR = module("""
define amdgpu_kernel void @scalar(ptr addrspace(1) %out, i32 %steps) #0 {
entry:
  %wg = call i32 @llvm.amdgcn.workgroup.id.x()
  br label %loop
loop:
  %i = phi i32 [ 0, %entry ], [ %i1, %next ]
  %x = phi i32 [ %wg, %entry ], [ %x2, %next ]
  %odd = and i32 %x, 1
  %isodd = icmp ne i32 %odd, 0
  br i1 %isodd, label %up, label %down
up:
  %t = mul i32 %x, 3
  %xu = add i32 %t, 1
  br label %next
down:
  %xd = lshr i32 %x, 1
  br label %next
next:
  %x1 = phi i32 [ %xu, %up ], [ %xd, %down ]
  %x2 = xor i32 %x1, %i
  %i1 = add i32 %i, 1
  %more = icmp ult i32 %i1, %steps
  br i1 %more, label %loop, label %exit
exit:
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  %v = add i32 %x2, %tid
  %po = getelementptr i32, ptr addrspace(1) %out, i32 %tid
  store i32 %v, ptr addrspace(1) %po
  ret void
}
declare i32 @llvm.amdgcn.workgroup.id.x()
declare i32 @llvm.amdgcn.workitem.id.x()
""")

IDLE = module(IDLE_GRID + """
declare i32 @llvm.amdgcn.workitem.id.x()
declare i32 @llvm.amdgcn.workgroup.id.x()
""")

CTAS = {"gfx942": 304, "gfx950": 256}


def cases(arch):
    yield "mfma", MFMA, "mfma", {"a": np.ones(64 * 4 * 64, np.uint16) * 0x3F80,
                                 "out": np.zeros(8 * 64 * 4, np.float32), "blocks": 64}, (8,), (256,)
    yield "scalar", SCALAR, "scalar", {"out": np.zeros(64, np.int32), "steps": 2000}, (8,), (64,)
    yield "idle_grid", IDLE, "idle", {"marks": np.zeros(CTAS[arch], np.int32)}, (CTAS[arch],), (512,)


def k2_tiny(arch):
    """One launch of the K2 kernel on the tiny geometry; returns (stats, seconds)."""
    from k2back import testing
    from k2back.codegen.compiler import compile as compile_source
    from k2back.codegen.plan import plan
    from k2back.codegen.render import KernelSource
    from k2back.runtime import launch
    from k2back.runtime.emu import EmuBackend

    spec = plan("tiny", 1, 16, 2, arch)
    kernel = compile_source(KernelSource(spec))
    inputs = testing.make_inputs("tiny", 1, 16, 2, seed=0, arch=arch)
    qk_scale = inputs.pop("qk_scale")
    out = torch.empty((spec.tokens, spec.hidden), dtype=torch.bfloat16)
    scratch = launch.new_scratch(spec, "cpu")
    start = time.perf_counter()
    stats = EmuBackend().run(kernel, spec, {**inputs, "out": out}, scratch, qk_scale=qk_scale)
    return stats, time.perf_counter() - start


def row(label, arch, stats, seconds):
    rate = stats.wave_instructions / seconds
    print(f"{label:<10} {arch:<7} {stats.wave_instructions:>11,} {seconds:>8.3f} {rate:>13,.0f}")


def yardstick() -> float:
    """Seconds for sum(range(10**7)), best of three."""
    timings = []
    for _ in range(3):
        start = time.perf_counter()
        sum(range(10**7))
        timings.append(time.perf_counter() - start)
    return min(timings)


def main():
    print(f"yardstick {yardstick():.3f} s")
    print(f"{'kernel':<10} {'arch':<7} {'wave-instr':>11} {'seconds':>8} {'wave-instr/s':>13}")
    for arch in ARCHS:
        for label, ir, name, args, grid, block in cases(arch):
            run(ir, arch, name, args, grid=grid, block=block)  # compile + warm caches
            timings = []
            for _ in range(3):
                start = time.perf_counter()
                stats = run(ir, arch, name, args, grid=grid, block=block)
                timings.append(time.perf_counter() - start)
            row(label, arch, stats, min(timings))
        row("k2_tiny", arch, *k2_tiny(arch))
    print(f"yardstick {yardstick():.3f} s")


if __name__ == "__main__":
    main()
