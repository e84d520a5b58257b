"""Barriers, LDS, and workgroups talking through device-scope flags."""

import numpy as np
import pytest

from k2back.emu import Deadlock, Machine
from k2back.emu.testing import ARCHS, module, rng, run

DECLS = """
declare i32 @llvm.amdgcn.workitem.id.x()
declare i32 @llvm.amdgcn.workgroup.id.x()
declare void @llvm.amdgcn.s.barrier()
declare void @llvm.amdgcn.s.sleep(i32)
"""

# 512 threads (8 waves): x -> LDS, then a tree sum with a barrier per level; the
# workgroup-scope fences make LLVM wait for the LDS stores (lgkmcnt) before each
# barrier, as the AMDGPU memory model requires across waves.
TREE_SUM = module("""
@partial = internal addrspace(3) global [512 x float] poison, align 16
define amdgpu_kernel void @tree_sum(ptr addrspace(1) %x, ptr addrspace(1) %out) #0 {
entry:
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  %px = getelementptr float, ptr addrspace(1) %x, i32 %tid
  %v = load float, ptr addrspace(1) %px
  %slot = getelementptr float, ptr addrspace(3) @partial, i32 %tid
  store float %v, ptr addrspace(3) %slot
  br label %level
level:
  %s = phi i32 [ 256, %entry ], [ %half, %next ]
  fence syncscope("workgroup") release
  call void @llvm.amdgcn.s.barrier()
  fence syncscope("workgroup") acquire
  %active = icmp ult i32 %tid, %s
  br i1 %active, label %add, label %next
add:
  %other = add i32 %tid, %s
  %po = getelementptr float, ptr addrspace(3) @partial, i32 %other
  %a = load float, ptr addrspace(3) %slot
  %b = load float, ptr addrspace(3) %po
  %sum = fadd float %a, %b
  store float %sum, ptr addrspace(3) %slot
  br label %next
next:
  %half = lshr i32 %s, 1
  %more = icmp ne i32 %half, 0
  br i1 %more, label %level, label %finish
finish:
  fence syncscope("workgroup") release
  call void @llvm.amdgcn.s.barrier()
  fence syncscope("workgroup") acquire
  %first = icmp eq i32 %tid, 0
  br i1 %first, label %write, label %done
write:
  %total = load float, ptr addrspace(3) @partial
  store float %total, ptr addrspace(1) %out
  br label %done
done:
  ret void
}
""" + DECLS)


def tree_sum_reference(x: np.ndarray) -> np.float32:
    values = x.astype(np.float32).copy()
    s = len(values) // 2
    while s:
        values[:s] = values[:s] + values[s:2 * s]
        s //= 2
    return values[0]


@pytest.mark.parametrize("arch", ARCHS)
def test_lds_tree_reduction_over_eight_waves(arch):
    x = rng(2).standard_normal(512).astype(np.float32)
    out = np.zeros(1, np.float32)
    stats = run(TREE_SUM, arch, "tree_sum", {"x": x, "out": out}, block=(512,))
    assert out[0] == tree_sum_reference(x)
    assert abs(out[0] - x.astype(np.float64).sum()) < 1e-4
    assert stats.barriers == 10  # 9 levels + the final one, each released once
    assert stats.instructions["barrier"] == 8 * 10
    assert stats.lds_written >= 4 * (512 + 511)


@pytest.mark.parametrize("arch", ARCHS)
def test_lds_stores_without_a_release_are_read_stale_across_waves(arch):
    # Without the fences nothing waits for the LDS stores before a barrier: the
    # LDS queues of different waves may reorder (AMDGPUUsage, GFX942 memory model).
    unfenced = TREE_SUM.replace('  fence syncscope("workgroup") release\n', "").replace(
        '  fence syncscope("workgroup") acquire\n', "")
    x = rng(2).standard_normal(512).astype(np.float32)
    sums = {}
    for memory in ("ideal", "strict"):
        out = np.zeros(1, np.float32)
        run(unfenced, arch, "tree_sum", {"x": x, "out": out}, block=(512,),
            machine=Machine(arch, memory=memory))
        sums[memory] = out[0]
    assert sums["ideal"] == tree_sum_reference(x)  # stores visible at once hide the race
    assert sums["strict"] != tree_sum_reference(x)


# Workgroup 0 produces data then raises a flag (release); workgroup 1 polls the
# flag at device scope, sleeping between polls, then reads (acquire).
HANDOFF = module("""
define amdgpu_kernel void @handoff(ptr addrspace(1) %x, ptr addrspace(1) %data,
                                   ptr addrspace(1) %flag, ptr addrspace(1) %out) #0 {
entry:
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  %wg = call i32 @llvm.amdgcn.workgroup.id.x()
  %pd = getelementptr float, ptr addrspace(1) %data, i32 %tid
  %producer = icmp eq i32 %wg, 0
  br i1 %producer, label %produce, label %poll
produce:
  %px = getelementptr float, ptr addrspace(1) %x, i32 %tid
  %v = load float, ptr addrspace(1) %px
  %v3 = fmul float %v, 3.0
  store float %v3, ptr addrspace(1) %pd
  fence syncscope("agent") release
  call void @llvm.amdgcn.s.barrier()
  %first = icmp eq i32 %tid, 0
  br i1 %first, label %raise, label %done
raise:
  store atomic i32 1, ptr addrspace(1) %flag syncscope("agent") monotonic, align 4
  br label %done
poll:
  %f = load atomic i32, ptr addrspace(1) %flag syncscope("agent") monotonic, align 4
  %ready = icmp ne i32 %f, 0
  br i1 %ready, label %consume, label %sleep
sleep:
  call void @llvm.amdgcn.s.sleep(i32 2)
  br label %poll
consume:
  fence syncscope("agent") acquire
  %d = load float, ptr addrspace(1) %pd
  %d1 = fadd float %d, 1.0
  %po = getelementptr float, ptr addrspace(1) %out, i32 %tid
  store float %d1, ptr addrspace(1) %po
  br label %done
done:
  ret void
}
""" + DECLS)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("order", ["forward", "reverse"])
def test_producer_consumer_through_device_scope_flag(arch, order):
    x = rng(3).standard_normal(256).astype(np.float32)
    data = np.zeros(256, np.float32)
    flag = np.zeros(1, np.int32)
    out = np.zeros(256, np.float32)
    stats = run(HANDOFF, arch, "handoff", {"x": x, "data": data, "flag": flag, "out": out},
                grid=(2,), block=(256,), order=order)
    np.testing.assert_array_equal(out, x * np.float32(3) + np.float32(1))
    assert flag[0] == 1
    if order == "reverse":  # the consumer started first, so it must have waited
        assert all(stats.polls.get((1, wave), 0) > 0 for wave in range(4))
    assert all(key[0] == 1 for key in stats.polls)  # only the consumer ever sleeps
    assert stats.cache_policy.get(("buffer_wbl2", "sc1")) == 4  # the release fence, per wave


@pytest.mark.parametrize("arch", ARCHS)
def test_consumer_waiting_on_a_flag_nobody_sets_is_a_deadlock(arch):
    x = np.ones(64, np.float32)
    flag = np.zeros(1, np.int32)
    arrays = {"x": x, "data": np.zeros(64, np.float32), "flag": flag,
              "out": np.zeros(64, np.float32)}
    # The producer stores 0 instead of raising the flag: the consumer waits forever.
    with pytest.raises(Deadlock) as caught:
        run(HANDOFF.replace("store atomic i32 1", "store atomic i32 0"), arch, "handoff", arrays,
            grid=(2,), block=(64,), machine=Machine(arch, stall_rounds=50))
    message = str(caught.value)
    assert "workgroup 1 wave 0" in message and "polling" in message
    assert "workgroup 0" not in message  # the producer finished
    assert "line" in message


# The same hand-off with the release fence forgotten: waves 1..3 store their data
# and pass the barrier without waiting for the stores; wave 0 raises the flag and
# ends while the others still spin. On the GPU the consumer may then read stale data.
UNFENCED = HANDOFF.replace("""  fence syncscope("agent") release
  call void @llvm.amdgcn.s.barrier()
  %first = icmp eq i32 %tid, 0
  br i1 %first, label %raise, label %done""", """  call void @llvm.amdgcn.s.barrier()
  %wave0 = icmp ult i32 %tid, 64
  br i1 %wave0, label %raise, label %spin
spin:
  %i = phi i32 [ 0, %produce ], [ %i1, %spin ]
  call void @llvm.amdgcn.s.sleep(i32 1)
  %i1 = add i32 %i, 1
  %more = icmp ult i32 %i1, 20
  br i1 %more, label %spin, label %done""")


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("order", ["forward", "reverse"])
def test_a_missing_release_is_read_stale_under_the_strict_model(arch, order):
    def launch(ir, memory):
        x = rng(3).standard_normal(256).astype(np.float32)
        arrays = {"x": x, "data": np.zeros(256, np.float32), "flag": np.zeros(1, np.int32),
                  "out": np.zeros(256, np.float32)}
        stats = run(ir, arch, "handoff", arrays, grid=(2,), block=(256,), order=order,
                    machine=Machine(arch, memory=memory))
        return arrays["out"], x * np.float32(3) + np.float32(1), stats

    out, want, stats = launch(HANDOFF, "strict")  # the correct release still works
    np.testing.assert_array_equal(out, want)
    assert stats.written_back > 0  # the release wrote the producer's XCD back
    out, want, _ = launch(UNFENCED, "ideal")  # one coherent memory hides the bug
    np.testing.assert_array_equal(out, want)
    # Strict: wave 0's flag store performs first (newest first) and reaches the
    # sleeping consumer on XCD 1 before any data store left XCD 0's L2: every
    # element is read as 0 (plus 1).
    out, want, stats = launch(UNFENCED, "strict")
    assert (out == np.float32(1)).all() and stats.stale_bytes == 0


@pytest.mark.parametrize("arch", ARCHS)
def test_spinning_without_sleep_hits_the_instruction_limit(arch):
    spin = HANDOFF.replace("store atomic i32 1", "store atomic i32 0").replace(
        "  call void @llvm.amdgcn.s.sleep(i32 2)\n", "")
    arrays = {"x": np.ones(64, np.float32), "data": np.zeros(64, np.float32),
              "flag": np.zeros(1, np.int32), "out": np.zeros(64, np.float32)}
    with pytest.raises(Deadlock, match=r"(?s)more than 20,000 wave-instructions.*workgroup 1 wave 0: running"):
        run(spin, arch, "handoff", arrays, grid=(2,), block=(64,),
            machine=Machine(arch, max_wave_instructions=20_000))
