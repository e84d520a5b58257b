"""The scheduler (machine.Machine._run_turn): the waves of a workgroup run in
lock-step, VALU/MFMA and LDS reads once per batch of waves; a launch must leave
the same bytes and the same counters as wave by wave (a trace turns batching
off), with waves that part on scalar loops and branches and meet again."""

import dataclasses
import itertools

import numpy as np
import pytest

from k2back.emu import Machine, MemoryFault
from k2back.emu.machine import CODE_ADDRESS
from k2back.emu.testing import ARCHS, handwritten, module, rng, run, run_handwritten

# 8 waves a workgroup. x -> LDS (and 3x into the upper half), a barrier; a scalar
# loop whose trip count is the wave's index (the waves part and meet again);
# LDS reads (a neighbour, a pair, a halfword), cross-lane ops (bpermute,
# permute, swizzle), a branch waves 0-3 and 4-7 take differently, and an LDS
# read under a partial exec mask.
MIX = module("""
@buf = internal addrspace(3) global [1024 x i32] poison, align 16
define amdgpu_kernel void @mix(ptr addrspace(1) %x, ptr addrspace(1) %out) #0 {
entry:
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  %wg = call i32 @llvm.amdgcn.workgroup.id.x()
  %base = mul i32 %wg, 512
  %gid = add i32 %base, %tid
  %px = getelementptr i32, ptr addrspace(1) %x, i32 %gid
  %v = load i32, ptr addrspace(1) %px
  %slot = getelementptr i32, ptr addrspace(3) @buf, i32 %tid
  store i32 %v, ptr addrspace(3) %slot
  %v3 = mul i32 %v, 3
  %tid2 = add i32 %tid, 512
  %slot2 = getelementptr i32, ptr addrspace(3) @buf, i32 %tid2
  store i32 %v3, ptr addrspace(3) %slot2
  fence syncscope("workgroup") release
  call void @llvm.amdgcn.s.barrier()
  fence syncscope("workgroup") acquire
  %wave = lshr i32 %tid, 6
  %wv = call i32 @llvm.amdgcn.readfirstlane(i32 %wave)
  br label %loop
loop:
  %i = phi i32 [ 0, %entry ], [ %i1, %loop ]
  %acc = phi i32 [ %wg, %entry ], [ %acc1, %loop ]
  %m = mul i32 %acc, 5
  %acc1 = xor i32 %m, %i
  %i1 = add i32 %i, 1
  %more = icmp ule i32 %i1, %wv
  br i1 %more, label %loop, label %after
after:
  %n = mul i32 %tid, 7
  %n1 = add i32 %n, %acc1
  %nidx = and i32 %n1, 1023
  %pn = getelementptr i32, ptr addrspace(3) @buf, i32 %nidx
  %a = load i32, ptr addrspace(3) %pn
  %b0 = load i32, ptr addrspace(3) %slot
  %b1 = load i32, ptr addrspace(3) %slot2
  %hidx = and i32 %n, 2047
  %ph = getelementptr i16, ptr addrspace(3) @buf, i32 %hidx
  %h = load i16, ptr addrspace(3) %ph
  %hz = zext i16 %h to i32
  %l13 = mul i32 %tid, 13
  %lane = and i32 %l13, 63
  %addr = shl i32 %lane, 2
  %bp = call i32 @llvm.amdgcn.ds.bpermute(i32 %addr, i32 %a)
  %fp = call i32 @llvm.amdgcn.ds.permute(i32 %addr, i32 %b0)
  %sw = call i32 @llvm.amdgcn.ds.swizzle(i32 %b1, i32 1055)
  %low = icmp ult i32 %wv, 4
  br i1 %low, label %three, label %five
three:
  %t3 = mul i32 %tid, 3
  %i3 = and i32 %t3, 1023
  %p3 = getelementptr i32, ptr addrspace(3) @buf, i32 %i3
  %c3 = load i32, ptr addrspace(3) %p3
  br label %joined
five:
  %t5 = mul i32 %tid, 5
  %i5 = and i32 %t5, 1023
  %p5 = getelementptr i32, ptr addrspace(3) @buf, i32 %i5
  %l5 = load i32, ptr addrspace(3) %p5
  %c5 = add i32 %l5, 1
  br label %joined
joined:
  %c = phi i32 [ %c3, %three ], [ %c5, %five ]
  %q = and i32 %tid, 3
  %some = icmp eq i32 %q, 0
  br i1 %some, label %masked, label %rest
masked:
  %ri = sub i32 1023, %tid
  %pr = getelementptr i32, ptr addrspace(3) @buf, i32 %ri
  %dl = load i32, ptr addrspace(3) %pr
  br label %rest
rest:
  %d = phi i32 [ %dl, %masked ], [ 0, %joined ]
  %r0 = mul i32 %b0, 3
  %r1 = mul i32 %b1, 5
  %r2 = mul i32 %hz, 7
  %r3 = mul i32 %bp, 11
  %r4 = mul i32 %fp, 13
  %r5 = mul i32 %sw, 17
  %r6 = mul i32 %c, 19
  %r7 = mul i32 %d, 23
  %s0 = add i32 %a, %r0
  %s1 = add i32 %s0, %r1
  %s2 = add i32 %s1, %r2
  %s3 = add i32 %s2, %r3
  %s4 = add i32 %s3, %r4
  %s5 = add i32 %s4, %r5
  %s6 = add i32 %s5, %r6
  %s7 = add i32 %s6, %r7
  %s8 = add i32 %s7, %acc1
  %po = getelementptr i32, ptr addrspace(1) %out, i32 %gid
  store i32 %s8, ptr addrspace(1) %po
  ret void
}
declare i32 @llvm.amdgcn.workitem.id.x()
declare i32 @llvm.amdgcn.workgroup.id.x()
declare i32 @llvm.amdgcn.readfirstlane(i32)
declare i32 @llvm.amdgcn.ds.bpermute(i32, i32)
declare i32 @llvm.amdgcn.ds.permute(i32, i32)
declare i32 @llvm.amdgcn.ds.swizzle(i32, i32)
declare void @llvm.amdgcn.s.barrier()
""")
GROUPS = 3


def mix_reference(x: np.ndarray) -> np.ndarray:
    out = np.zeros_like(x)
    t = np.arange(512, dtype=np.uint32)
    for wg in range(GROUPS):
        buf = np.concatenate([x[512 * wg:512 * (wg + 1)], x[512 * wg:512 * (wg + 1)] * np.uint32(3)])
        acc = np.zeros(512, np.uint32)
        for w in range(8):
            value = np.uint32(wg)
            for i in range(w + 1):
                value = (value * np.uint32(5)) ^ np.uint32(i)
            acc[64 * w:64 * (w + 1)] = value
        a = buf[(t * 7 + acc) & 1023]
        b0, b1 = buf[t], buf[t + 512]
        hz = buf.view(np.uint16)[(t * 7) & 2047].astype(np.uint32)
        lane = (t * 13) & 63
        wave_base = t & ~np.uint32(63)
        bp = a[wave_base + lane]
        fp = np.empty_like(b0)
        fp[wave_base + lane] = b0
        sw = b1[t ^ 1]
        c = np.where(t < 256, buf[(t * 3) & 1023], buf[(t * 5) & 1023] + np.uint32(1))
        d = np.where(t % 4 == 0, buf[1023 - t], 0).astype(np.uint32)
        out[512 * wg:512 * (wg + 1)] = (a + b0 * 3 + b1 * 5 + hz * 7 + bp * 11 + fp * 13 + sw * 17
                                        + c * 19 + d * 23 + acc)
    return out


def launch_mix(arch: str, x: np.ndarray, batched: bool):
    out = np.zeros_like(x)
    machine = Machine(arch, trace=None if batched else (lambda w, ins: None))
    stats = run(MIX, arch, "mix", {"x": x, "out": out}, grid=(GROUPS,), block=(512,), machine=machine)
    return out, stats


# what must not depend on batching (rounds and the batched count may)
SAME_COUNTERS = ("instructions", "wave_instructions", "bytes_read", "bytes_written", "lds_read",
                 "lds_written", "barriers", "polls", "cache_policy", "workgroups", "waves",
                 "stale_bytes", "written_back")


@pytest.mark.parametrize("arch", ARCHS)
def test_batched_launch_matches_wave_by_wave(arch):
    x = rng(12).integers(0, 2**32, 512 * GROUPS, dtype=np.uint64).astype(np.uint32)
    want = mix_reference(x)
    batched, stats = launch_mix(arch, x, batched=True)
    alone, alone_stats = launch_mix(arch, x, batched=False)
    np.testing.assert_array_equal(alone, want)
    np.testing.assert_array_equal(batched, want)
    assert stats.instructions["lds"] > 0 and stats.batched > stats.instructions["lds"]
    assert alone_stats.batched == 0
    mine, theirs = dataclasses.asdict(stats), dataclasses.asdict(alone_stats)
    assert {k: mine[k] for k in SAME_COUNTERS} == {k: theirs[k] for k in SAME_COUNTERS}


OUT_OF_RANGE = module("""
@buf = internal addrspace(3) global [512 x i32] poison, align 16
define amdgpu_kernel void @stray(ptr addrspace(1) %out) #0 {
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  %slot = getelementptr i32, ptr addrspace(3) @buf, i32 %tid
  store i32 %tid, ptr addrspace(3) %slot
  fence syncscope("workgroup") release
  call void @llvm.amdgcn.s.barrier()
  fence syncscope("workgroup") acquire
  %wave = lshr i32 %tid, 6
  %stray = icmp eq i32 %wave, 3
  %far = add i32 %tid, 100000
  %index = select i1 %stray, i32 %far, i32 %tid
  %p = getelementptr i32, ptr addrspace(3) @buf, i32 %index
  %v = load i32, ptr addrspace(3) %p
  %po = getelementptr i32, ptr addrspace(1) %out, i32 %tid
  store i32 %v, ptr addrspace(1) %po
  ret void
}
declare i32 @llvm.amdgcn.workitem.id.x()
declare void @llvm.amdgcn.s.barrier()
""")


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("batched", [True, False])
def test_an_lds_read_out_of_range_names_its_wave_in_a_batch(arch, batched):
    machine = Machine(arch, trace=None if batched else (lambda w, ins: None))
    with pytest.raises(MemoryFault, match=r"outside the workgroup's 2048 bytes, workgroup 0 wave 3,"):
        run(OUT_OF_RANGE, arch, "stray", {"out": np.zeros(512, np.uint32)}, block=(512,), machine=machine)


# Wave 0 runs a scalar loop the other waves skip (longer than a quantum), so it
# reaches the barrier last, alone; after it the waves run the same vector code.
# Released together, they must run it as one batch: the waves a lone wave
# releases run on with it (before, they ran a quantum ahead of it, apart).
LATE_WAVE = """
\tv_readfirstlane_b32 s2, v0
\ts_mov_b32 s3, 0
\ts_cmp_gt_u32 s2, 63
\ts_cbranch_scc1 .LBB0_2
\ts_movk_i32 s4, 0x12c
.LBB0_1:
\ts_add_u32 s3, s3, 1
\ts_cmp_lt_u32 s3, s4
\ts_cbranch_scc1 .LBB0_1
.LBB0_2:
\ts_barrier
\tv_cvt_f32_u32_e32 v1, v0
\tv_mul_f32_e32 v2, 0x3fc00000, v1
\tv_add_f32_e32 v3, 2.0, v2
\tv_mul_f32_e32 v3, v3, v3
\tv_sub_f32_e32 v1, v3, v1
\tv_mul_f32_e32 v1, 0x3e800000, v1
\tv_add_f32_e32 v1, v2, v1
\tv_cvt_u32_f32_e32 v1, v1
\tv_add_u32_e32 v1, s3, v1
\ts_load_dwordx2 s[0:1], s[0:1], 0x0
\tv_lshlrev_b32_e32 v0, 2, v0
\ts_waitcnt lgkmcnt(0)
\tglobal_store_dword v0, v1, s[0:1]"""


@pytest.mark.parametrize("arch", ARCHS)
def test_waves_a_lone_wave_releases_run_on_with_it_as_one_batch(arch):
    out = np.zeros(512, np.uint32)
    stats = run_handwritten(arch, LATE_WAVE, out, block=(512,))
    x = np.arange(512, dtype=np.float32)
    a = x * np.float32(1.5)
    f = ((a + np.float32(2)) ** 2 - x) * np.float32(0.25) + a
    np.testing.assert_array_equal(out, f.astype(np.uint32) + np.where(np.arange(512) < 64, 300, 0))
    assert stats.instructions["salu"] > 2 * 256  # wave 0's loop outlasts two quanta
    # every VALU ran once for the eight waves: the v_readfirstlane at the start, and
    # every one after the barrier; so did the store after them (memops.vmem_store)
    assert stats.batched == stats.instructions["valu"] + stats.instructions["vmem_store"]


# Waves 0-3 of each workgroup wait at s_barrier while waves 4-7 end (6 and 7 after a
# store of their own, if `storing`): the ended waves no longer count, so the
# barrier releases when the last of them ends, and waves 0-3 store after it. The
# waves that end do so together (s_endpgm over a cohort: machine.decode_control,
# end_all), those with a store outstanding one by one.
ENDING_WAVES = """
\tv_readfirstlane_b32 s4, v0
\ts_load_dwordx2 s[0:1], s[0:1], 0x0
\ts_lshl_b32 s5, s2, 11
\tv_lshlrev_b32_e32 v2, 2, v0
\tv_add_u32_e32 v2, s5, v2
\ts_waitcnt lgkmcnt(0)
\ts_cmp_ge_u32 s4, 256
\ts_cbranch_scc1 .LBB0_1
\ts_barrier
\tv_mov_b32_e32 v1, 3
\tglobal_store_dword v2, v1, s[0:1]
\ts_endpgm
.LBB0_1:
\ts_cmp_lt_u32 s4, {first_storing}
\ts_cbranch_scc1 .LBB0_2
\tv_mov_b32_e32 v1, 2
\tglobal_store_dword v2, v1, s[0:1]
.LBB0_2:"""


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("storing", [False, True])
def test_waves_that_end_release_the_barrier_the_others_wait_at(arch, storing):
    out = np.zeros(2 * 512, np.uint32)
    body = ENDING_WAVES.format(first_storing=384 if storing else 512)
    stats = run_handwritten(arch, body, out, grid=(2,), block=(512,))
    wave = np.arange(2 * 512) % 512 // 64
    np.testing.assert_array_equal(out, np.select([wave < 4, (wave >= 6) & storing], [3, 2], 0))
    assert stats.barriers == 2

# LDS stores under exec masks that differ from wave to wave (lane % 4 <= wave).
# Before any s_waitcnt each wave reads the next wave's slots: a wave's LDS access
# performs its own queued stores and no other's, so the stores of the next wave
# are not there yet (only wave 7 sees wave 0's, which ran ahead of it): a batch
# must queue each wave's own lanes. After a barrier every lane reads another
# wave's slot.
MASKED_LDS_STORE = """
\tv_lshlrev_b32_e32 v1, 2, v0
\tv_and_b32_e32 v2, 3, v0
\tv_lshrrev_b32_e32 v3, 6, v0
\tv_mov_b32_e32 v4, 0
\tds_write_b32 v1, v4
\ts_waitcnt lgkmcnt(0)
\ts_barrier
\tv_cmp_le_u32_e32 vcc, v2, v3
\ts_and_saveexec_b64 s[4:5], vcc
\tv_add_u32_e32 v5, 0x3e8, v0
\tds_write_b32 v1, v5
\ts_mov_b64 exec, s[4:5]
\tv_add_u32_e32 v9, 0x100, v1
\tv_and_b32_e32 v9, 0x7ff, v9
\tds_read_b32 v8, v9
\ts_waitcnt lgkmcnt(0)
\ts_barrier
\tv_xor_b32_e32 v6, 0x1fc, v1
\tds_read_b32 v7, v6
\ts_load_dwordx2 s[0:1], s[0:1], 0x0
\ts_waitcnt lgkmcnt(0)
\tglobal_store_dword v1, v7, s[0:1]
\tglobal_store_dword v1, v8, s[0:1] offset:2048"""


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("batched", [True, False])
def test_lds_stores_under_per_wave_exec_masks(arch, batched):
    out = np.zeros(1024, np.uint32)
    machine = Machine(arch, trace=None if batched else (lambda w, ins: None))
    kernargs = machine.map(out).to_bytes(8, "little")
    stats = machine.launch(handwritten(arch, MASKED_LDS_STORE, lds_bytes=2048), "hand", block=(512,),
                           kernargs=kernargs)
    t = np.arange(512)
    lds = np.where(t % 4 <= t // 64, t + 1000, 0)
    np.testing.assert_array_equal(out[:512], lds[t ^ 127])
    np.testing.assert_array_equal(out[512:], np.where(t >= 448, lds[(t + 64) % 512], 0))
    assert stats.lds_written == 4 * (512 + int((t % 4 <= t // 64).sum()))
    assert (stats.batched > 0) == batched


# s_getpc_b64 reads the wave's pc, which a cohort leaves behind over batched VALU
# and SALU steps (machine.Machine._run_cohort): it must still see its own place.
# Two workgroups of four waves take one turn; v2, v3 = the low words of the two pcs.
PC_AFTER_BATCHED = """
\tv_lshlrev_b32_e32 v1, 3, v0
\ts_getpc_b64 s[8:9]
\ts_mov_b32 s10, s8
\ts_getpc_b64 s[12:13]
\tv_mov_b32_e32 v2, s10
\tv_mov_b32_e32 v3, s12
\ts_load_dwordx2 s[0:1], s[0:1], 0x0
\ts_waitcnt lgkmcnt(0)
\tglobal_store_dwordx2 v1, v[2:3], s[0:1]"""


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("batched", [True, False])
def test_getpc_in_a_cohort_reads_its_own_place(arch, batched):
    out = np.zeros((256, 2), np.uint32)
    machine = Machine(arch, trace=None if batched else (lambda w, ins: None))
    kernargs = machine.map(out).to_bytes(8, "little")
    stats = machine.launch(handwritten(arch, PC_AFTER_BATCHED), "hand", grid=(2,), block=(256,), kernargs=kernargs)
    base = CODE_ADDRESS & 0xFFFFFFFF  # instructions 8 bytes apart; s_getpc gives the next one's
    np.testing.assert_array_equal(out, np.broadcast_to([base + 8 * 2, base + 8 * 4], (256, 2)))
    assert (stats.batched > 0) == batched


# Waves 0 and 2 of each workgroup take one branch, waves 1 and 3 the other: the
# waves at a VALU or MFMA instruction are not in consecutive slots, and run it once
# as a state.Gathered (registers copied in and the written ones back). Forms:
# 64-bit, 16-bit, float, selects, carries, an MFMA with AGPRs under the branch.
PARITY = module("""
define amdgpu_kernel void @parity(ptr addrspace(1) %x, ptr addrspace(1) %out, ptr addrspace(1) %acc) #0 {
entry:
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  %wg = call i32 @llvm.amdgcn.workgroup.id.x()
  %base = mul i32 %wg, 256
  %gid = add i32 %base, %tid
  %px = getelementptr i32, ptr addrspace(1) %x, i32 %gid
  %v = load i32, ptr addrspace(1) %px
  %wave = lshr i32 %tid, 6
  %wv = call i32 @llvm.amdgcn.readfirstlane(i32 %wave)
  %odd = and i32 %wv, 1
  %isodd = icmp ne i32 %odd, 0
  br i1 %isodd, label %b, label %a
a:
  %v64 = zext i32 %v to i64
  %m64 = mul i64 %v64, 11400714819323198485
  %lo = trunc i64 %m64 to i32
  %hi64 = lshr i64 %m64, 32
  %hi = trunc i64 %hi64 to i32
  %h = trunc i32 %v to i16
  %h2 = mul i16 %h, 7
  %hz = zext i16 %h2 to i32
  %f = uitofp i32 %v to float
  %f2 = fmul float %f, 5.000000e-01
  %fi = fptoui float %f2 to i32
  %c = icmp ugt i32 %v, 2147483648
  %sel = select i1 %c, i32 %lo, i32 %hi
  %a1 = add i32 %sel, %hz
  %a2 = xor i32 %a1, %fi
  %bits = and i32 %v, 65535
  %pair = insertelement <4 x i16> zeroinitializer, i16 %h, i32 0
  %pair2 = insertelement <4 x i16> %pair, i16 %h2, i32 2
  %mf = call <4 x float> @llvm.amdgcn.mfma.f32.16x16x16bf16.1k(<4 x i16> %pair2, <4 x i16> %pair2, <4 x float> zeroinitializer, i32 0, i32 0, i32 0)
  %mf2 = call <4 x float> @llvm.amdgcn.mfma.f32.16x16x16bf16.1k(<4 x i16> %pair2, <4 x i16> %pair, <4 x float> %mf, i32 0, i32 0, i32 0)
  br label %join
b:
  %b1 = mul i32 %v, 3
  %b2 = add i32 %b1, %wg
  br label %join
join:
  %r = phi i32 [ %a2, %a ], [ %b2, %b ]
  %m = phi <4 x float> [ %mf2, %a ], [ zeroinitializer, %b ]
  %po = getelementptr i32, ptr addrspace(1) %out, i32 %gid
  store i32 %r, ptr addrspace(1) %po
  %pa = getelementptr <4 x float>, ptr addrspace(1) %acc, i32 %gid
  store <4 x float> %m, ptr addrspace(1) %pa
  ret void
}
declare i32 @llvm.amdgcn.workitem.id.x()
declare i32 @llvm.amdgcn.workgroup.id.x()
declare i32 @llvm.amdgcn.readfirstlane(i32)
declare <4 x float> @llvm.amdgcn.mfma.f32.16x16x16bf16.1k(<4 x i16>, <4 x i16>, <4 x float>, i32, i32, i32)
""")


def parity_reference(x: np.ndarray) -> np.ndarray:
    t = np.arange(x.size)
    v = x.astype(np.uint64)
    m = (v * np.uint64(11400714819323198485)) & np.uint64(2**64 - 1)
    lo, hi = (m & np.uint64(0xFFFFFFFF)).astype(np.uint32), (m >> np.uint64(32)).astype(np.uint32)
    hz = ((x & 0xFFFF) * 7 & 0xFFFF).astype(np.uint32)
    fi = (x.astype(np.float32) * np.float32(0.5)).astype(np.uint32)
    a = (np.where(x > 2**31, lo, hi) + hz) ^ fi
    b = x * np.uint32(3) + (t // 256).astype(np.uint32)
    return np.where((t // 64) % 2 == 1, b, a)


@pytest.mark.parametrize("arch", ARCHS)
def test_waves_in_slots_apart_run_a_valu_or_mfma_once_gathered(arch):
    x = rng(5).integers(0, 2**32, 512, dtype=np.uint64).astype(np.uint32)
    results = []
    for batched in (True, False):
        out, acc = np.zeros(512, np.uint32), np.zeros((512, 4), np.float32)
        machine = Machine(arch, trace=None if batched else (lambda w, ins: None))
        stats = run(PARITY, arch, "parity", {"x": x, "out": out, "acc": acc}, grid=(2,), block=(256,),
                    machine=machine)
        np.testing.assert_array_equal(out, parity_reference(x))
        results.append((out, acc.view(np.uint32), stats))
    (_, acc, stats), (_, alone_acc, alone_stats) = results
    np.testing.assert_array_equal(acc, alone_acc)  # the MFMA's bits, batched or not
    assert acc.any()
    mine, theirs = dataclasses.asdict(stats), dataclasses.asdict(alone_stats)
    assert {k: mine[k] for k in SAME_COUNTERS} == {k: theirs[k] for k in SAME_COUNTERS}
    # every batched step ran once for its waves: the two workgroups take one turn,
    # their waves 0 and 2 run branch a together, 1 and 3 branch b (four waves each)
    assert stats.instructions["mfma"] == 2 * 4 and stats.batched >= 4 * stats.batches


@pytest.mark.parametrize("seed", range(4))
def test_row_spans_cover_exactly_the_rows_of_a_mask_up_to_joined_gaps(seed):
    from k2back.emu.state import row_spans
    rows = sorted(set(rng(seed).integers(0, 300, 12).tolist()))
    mask = sum(1 << r for r in rows)
    spans = row_spans(mask, gap=4)
    covered = {r for lo, hi in spans for r in range(lo, hi)}
    assert set(rows) <= covered
    assert all(lo in rows and hi - 1 in rows for lo, hi in spans)  # spans start and end on rows
    assert all(b[0] - a[1] >= 4 for a, b in itertools.pairwise(spans))  # gaps under 4 rows joined
    extra = covered - set(rows)  # only rows of joined gaps (fewer than 4 rows between two)
    assert all(any(a < r < b and b - a - 1 < 4 for a, b in itertools.pairwise(rows)) for r in extra)
    assert row_spans(0) == []
