"""Memory semantics through compiled code: buffer resources and their range
check, kernarg packing, sub-dword accesses, atomics, and loud faults."""

import numpy as np
import pytest

from k2back.emu import EmulatorError, Machine, MemoryFault, UnsupportedInstruction
from k2back.emu.testing import ARCHS, assemble, metadata, module, rng, run
from k2back.runtime.kernargs import LaunchDims, pack_kernargs

DECLS = """
declare i32 @llvm.amdgcn.workitem.id.x()
declare i32 @llvm.amdgcn.workgroup.id.x()
declare ptr addrspace(8) @llvm.amdgcn.make.buffer.rsrc.p8.p1(ptr addrspace(1), i16, i64, i32)
declare <4 x i32> @llvm.amdgcn.raw.ptr.buffer.load.v4i32(ptr addrspace(8), i32, i32, i32)
declare i32 @llvm.amdgcn.raw.ptr.buffer.load.i32(ptr addrspace(8), i32, i32, i32)
declare void @llvm.amdgcn.raw.ptr.buffer.store.v4i32(<4 x i32>, ptr addrspace(8), i32, i32, i32)
"""

# Each lane loads 16 B at tid*16 (and 4 B at tid*16 + 12) through a resource of
# `records` bytes, and stores 16 B the same way into a second resource.
BUFFER = module("""
define amdgpu_kernel void @buffer(ptr addrspace(1) %src, ptr addrspace(1) %dst,
                                  ptr addrspace(1) %out, ptr addrspace(1) %out1, i64 %records) #0 {
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  %in = call ptr addrspace(8) @llvm.amdgcn.make.buffer.rsrc.p8.p1(ptr addrspace(1) %src, i16 0, i64 %records, i32 131072)
  %st = call ptr addrspace(8) @llvm.amdgcn.make.buffer.rsrc.p8.p1(ptr addrspace(1) %dst, i16 0, i64 %records, i32 131072)
  %off = mul i32 %tid, 16
  %v = call <4 x i32> @llvm.amdgcn.raw.ptr.buffer.load.v4i32(ptr addrspace(8) %in, i32 %off, i32 0, i32 0)
  %off1 = add i32 %off, 12
  %w = call i32 @llvm.amdgcn.raw.ptr.buffer.load.i32(ptr addrspace(8) %in, i32 %off1, i32 0, i32 0)
  %po = getelementptr <4 x i32>, ptr addrspace(1) %out, i32 %tid
  store <4 x i32> %v, ptr addrspace(1) %po
  %p1 = getelementptr i32, ptr addrspace(1) %out1, i32 %tid
  store i32 %w, ptr addrspace(1) %p1
  %neg = xor <4 x i32> %v, <i32 -1, i32 -1, i32 -1, i32 -1>
  call void @llvm.amdgcn.raw.ptr.buffer.store.v4i32(<4 x i32> %neg, ptr addrspace(8) %st, i32 %off, i32 0, i32 0)
  ret void
}
""" + DECLS)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("records", [1024, 1000, 0])
def test_raw_buffer_out_of_range_reads_zero_and_drops_writes(arch, records):
    src = rng(4).integers(1, 2**31, 256, dtype=np.int64).astype(np.int32)  # 1024 B, no zeros
    dst = np.full(256, 0x5A5A5A5A, np.int32)
    out = np.full(256, -1, np.int32)
    out1 = np.full(64, -1, np.int32)
    stats = run(BUFFER, arch, "buffer", {"src": src, "dst": dst, "out": out, "out1": out1,
                                         "records": records})
    in_range = np.arange(256) * 4 + 4 <= records  # per dword
    np.testing.assert_array_equal(out, np.where(in_range, src, 0))
    np.testing.assert_array_equal(out1, np.where(in_range[3::4], src[3::4], 0))
    np.testing.assert_array_equal(dst, np.where(in_range, ~src, 0x5A5A5A5A))
    assert stats.cache_policy[("buffer load", "default")] == 2


MIXED_ARGS = module("""
define amdgpu_kernel void @mixed(ptr addrspace(1) %out, i32 %a, i64 %b, float %c,
                                 ptr addrspace(1) %p, i32 %d, i64 %e) #0 {
  %pv = load i32, ptr addrspace(1) %p
  %bl = trunc i64 %b to i32
  %bh64 = lshr i64 %b, 32
  %bh = trunc i64 %bh64 to i32
  %cb = bitcast float %c to i32
  %el = trunc i64 %e to i32
  %eh64 = lshr i64 %e, 32
  %eh = trunc i64 %eh64 to i32
  %vals = insertelement <8 x i32> poison, i32 %a, i32 0
  %v1 = insertelement <8 x i32> %vals, i32 %bl, i32 1
  %v2 = insertelement <8 x i32> %v1, i32 %bh, i32 2
  %v3 = insertelement <8 x i32> %v2, i32 %cb, i32 3
  %v4 = insertelement <8 x i32> %v3, i32 %pv, i32 4
  %v5 = insertelement <8 x i32> %v4, i32 %d, i32 5
  %v6 = insertelement <8 x i32> %v5, i32 %el, i32 6
  %v7 = insertelement <8 x i32> %v6, i32 %eh, i32 7
  store <8 x i32> %v7, ptr addrspace(1) %out
  ret void
}
""" + DECLS)


@pytest.mark.parametrize("arch", ARCHS)
def test_kernarg_packing_of_mixed_arguments(arch):
    out = np.zeros(8, np.uint32)
    p = np.array([0x1234_5678], np.uint32)
    values = {"out": out, "a": -7, "b": (3 << 40) | 0xDEAD_BEEF, "c": 0.1, "p": p,
              "d": 0xFFFF_FFFF, "e": -2}
    run(MIXED_ARGS, arch, "mixed", values, block=(1,))
    b, e = values["b"], values["e"] & (2**64 - 1)
    want = [2**32 - 7, b & 0xFFFFFFFF, b >> 32, np.float32(0.1).view(np.uint32), 0x1234_5678,
            0xFFFF_FFFF, e & 0xFFFFFFFF, e >> 32]
    np.testing.assert_array_equal(out, np.array(want, np.uint32))


ATOMICS = module("""
@lds_total = internal addrspace(3) global i32 poison, align 4
define amdgpu_kernel void @atomics(ptr addrspace(1) %counter, ptr addrspace(1) %tickets,
                                   ptr addrspace(1) %maxima, ptr addrspace(1) %owner,
                                   ptr addrspace(1) %lds_out, ptr addrspace(1) %x) #0 {
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  %wg = call i32 @llvm.amdgcn.workgroup.id.x()
  %base = mul i32 %wg, 128
  %i = add i32 %base, %tid
  %first = icmp eq i32 %tid, 0
  br i1 %first, label %init, label %go
init:
  store i32 0, ptr addrspace(3) @lds_total
  br label %go
go:
  call void @llvm.amdgcn.s.barrier()
  %t = atomicrmw add ptr addrspace(1) %counter, i32 1 syncscope("agent") monotonic
  %pt = getelementptr i32, ptr addrspace(1) %tickets, i32 %i
  store i32 %t, ptr addrspace(1) %pt
  %px = getelementptr i32, ptr addrspace(1) %x, i32 %i
  %xv = load i32, ptr addrspace(1) %px
  %slot = and i32 %i, 7
  %pm = getelementptr i32, ptr addrspace(1) %maxima, i32 %slot
  %old = atomicrmw max ptr addrspace(1) %pm, i32 %xv syncscope("agent") monotonic
  %po = getelementptr i32, ptr addrspace(1) %owner, i32 %slot
  %cx = cmpxchg ptr addrspace(1) %po, i32 -1, i32 %i syncscope("agent") monotonic monotonic
  %lo = atomicrmw add ptr addrspace(3) @lds_total, i32 %xv monotonic
  call void @llvm.amdgcn.s.barrier()
  br i1 %first, label %publish, label %done
publish:
  %total = load i32, ptr addrspace(3) @lds_total
  %pl = getelementptr i32, ptr addrspace(1) %lds_out, i32 %wg
  store i32 %total, ptr addrspace(1) %pl
  br label %done
done:
  ret void
}
declare void @llvm.amdgcn.s.barrier()
""" + DECLS)


@pytest.mark.parametrize("arch", ARCHS)
def test_global_and_lds_atomics(arch):
    groups, threads = 3, 128
    x = rng(5).integers(-1000, 1000, groups * threads).astype(np.int32)
    counter = np.zeros(1, np.int32)
    tickets = np.full(groups * threads, -1, np.int32)
    maxima = np.full(8, -(2**31), np.int32)
    owner = np.full(8, -1, np.int32)
    lds_out = np.zeros(groups, np.int32)
    run(ATOMICS, arch, "atomics", {"counter": counter, "tickets": tickets, "maxima": maxima,
                                   "owner": owner, "lds_out": lds_out, "x": x},
        grid=(groups,), block=(threads,))
    assert counter[0] == groups * threads
    np.testing.assert_array_equal(np.sort(tickets), np.arange(groups * threads))
    np.testing.assert_array_equal(maxima, x.reshape(-1, 8).max(axis=0))
    assert all(owner[s] % 8 == s for s in range(8))  # exactly one winner per slot
    np.testing.assert_array_equal(lds_out, x.reshape(groups, threads).sum(axis=1))


LOAD_AT = module("""
@table = internal addrspace(3) global [64 x i32] poison, align 4
define amdgpu_kernel void @load_at(ptr addrspace(1) %p, i64 %index, i32 %lds_index, ptr addrspace(1) %out) #0 {
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  %pl = getelementptr i32, ptr addrspace(3) @table, i32 %tid
  store i32 %tid, ptr addrspace(3) %pl
  %q = getelementptr i32, ptr addrspace(1) %p, i64 %index
  %v = load i32, ptr addrspace(1) %q
  %li = add i32 %lds_index, %tid
  %pr = getelementptr i32, ptr addrspace(3) @table, i32 %li
  %w = load i32, ptr addrspace(3) %pr
  %s = add i32 %v, %w
  %po = getelementptr i32, ptr addrspace(1) %out, i32 %tid
  store i32 %s, ptr addrspace(1) %po
  ret void
}
""" + DECLS)


@pytest.mark.parametrize("arch", ARCHS)
def test_faults_name_the_address_wave_and_instruction(arch):
    p, out = np.arange(16, dtype=np.int32), np.zeros(64, np.int32)
    run(LOAD_AT, arch, "load_at", {"p": p, "index": 3, "lds_index": 0, "out": out})
    np.testing.assert_array_equal(out, 3 + np.arange(64))
    with pytest.raises(MemoryFault, match=r"unmapped global address 0x[0-9a-f]+ .*wave 0.*line \d+: s_load"):
        run(LOAD_AT, arch, "load_at", {"p": p, "index": 1 << 20, "lds_index": 0, "out": out})
    with pytest.raises(MemoryFault, match=r"LDS address 256 .*256 bytes.*line \d+: ds_read"):
        run(LOAD_AT, arch, "load_at", {"p": p, "index": 0, "lds_index": 1, "out": out})


@pytest.mark.parametrize("arch", ARCHS)
def test_unimplemented_instruction_is_named_with_its_line(arch):
    asm = assemble(LOAD_AT, arch)
    lines = asm.splitlines()
    number = next(i for i, line in enumerate(lines) if "v_add_u32" in line)
    lines[number] = "\tv_frobnicate_b32 v1, v1, v2"
    edited = "\n".join(lines)
    machine = Machine(arch)
    p, out = np.arange(16, dtype=np.int32), np.zeros(64, np.int32)
    kernargs = pack_kernargs(metadata(edited, "load_at"),
                             {"p": machine.map(p), "index": 0, "lds_index": 0, "out": machine.map(out)},
                             LaunchDims((1, 1, 1), (64, 1, 1)))
    with pytest.raises(UnsupportedInstruction, match=rf"v_frobnicate_b32 not implemented .*line {number + 1}:"):
        machine.launch(edited, "load_at", kernargs=kernargs)
    assert not out.any()  # nothing after the bad instruction ran


BUFFER_ATOMICS = module("""
define amdgpu_kernel void @buffer_atomics(ptr addrspace(1) %counts, ptr addrspace(1) %old,
                                          ptr addrspace(1) %table, ptr addrspace(1) %out, i64 %records) #0 {
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  %rsrc = call ptr addrspace(8) @llvm.amdgcn.make.buffer.rsrc.p8.p1(ptr addrspace(1) %counts, i16 0, i64 %records, i32 131072)
  %slot = and i32 %tid, 15
  %off = shl i32 %slot, 2
  %prev = call i32 @llvm.amdgcn.raw.ptr.buffer.atomic.add.i32(i32 %tid, ptr addrspace(8) %rsrc, i32 %off, i32 0, i32 0)
  %po = getelementptr i32, ptr addrspace(1) %old, i32 %tid
  store i32 %prev, ptr addrspace(1) %po
  %ti = ptrtoint ptr addrspace(1) %table to i64
  %tlo = trunc i64 %ti to i32
  %thi64 = lshr i64 %ti, 32
  %thi = trunc i64 %thi64 to i32
  %thi16 = and i32 %thi, 65535
  %tv0 = insertelement <4 x i32> poison, i32 %tlo, i32 0
  %tv1 = insertelement <4 x i32> %tv0, i32 %thi16, i32 1
  %tv2 = insertelement <4 x i32> %tv1, i32 24, i32 2
  %tv = insertelement <4 x i32> %tv2, i32 131072, i32 3
  %t = call <4 x i32> @llvm.amdgcn.s.buffer.load.v4i32(<4 x i32> %tv, i32 16, i32 0)
  %t0 = extractelement <4 x i32> %t, i32 0
  %t3 = extractelement <4 x i32> %t, i32 3
  %sum = add i32 %t0, %t3
  %first = icmp eq i32 %tid, 0
  br i1 %first, label %write, label %done
write:
  store i32 %sum, ptr addrspace(1) %out
  %t1 = extractelement <4 x i32> %t, i32 1
  %o1 = getelementptr i32, ptr addrspace(1) %out, i32 1
  store i32 %t1, ptr addrspace(1) %o1
  br label %done
done:
  ret void
}
declare i32 @llvm.amdgcn.raw.ptr.buffer.atomic.add.i32(i32, ptr addrspace(8), i32, i32, i32)
declare <4 x i32> @llvm.amdgcn.s.buffer.load.v4i32(<4 x i32>, i32, i32)
""" + DECLS)


@pytest.mark.parametrize("arch", ARCHS)
def test_buffer_atomics_and_scalar_buffer_loads_respect_num_records(arch):
    counts = np.zeros(16, np.int32)
    old = np.full(64, -1, np.int32)
    table = np.arange(100, 108, dtype=np.int32)  # 32 B, the resource covers 24
    out = np.zeros(2, np.int32)
    run(BUFFER_ATOMICS, arch, "buffer_atomics",
        {"counts": counts, "old": old, "table": table, "out": out, "records": 40}, block=(64,))
    lane = np.arange(64)
    in_range = lane % 16 < 10  # slots 10..15 lie past 40 bytes: dropped, return 0
    want = np.array([lane[lane % 16 == s].sum() if s < 10 else 0 for s in range(16)])
    np.testing.assert_array_equal(counts, want)
    running = np.array([lane[(lane % 16 == lane[i] % 16) & (lane < lane[i])].sum() for i in range(64)])
    np.testing.assert_array_equal(old, np.where(in_range, running, 0))
    # s_buffer_load of the dwords at bytes 16..31 through a 24-byte resource: 104, 105, 0, 0
    np.testing.assert_array_equal(out, [104 + 0, 105])


def test_bad_launch_arguments_are_named_before_anything_runs():
    arch = "gfx942"
    asm = assemble(LOAD_AT, arch)
    machine = Machine(arch)
    with pytest.raises(EmulatorError, match=r"arch: expected one of .*got 'gfx90a'"):
        Machine("gfx90a")
    with pytest.raises(EmulatorError, match=r"array: expected a C-contiguous array"):
        machine.map(np.zeros((4, 4), np.int32)[:, ::2])
    with pytest.raises(EmulatorError, match=r"array: expected a numpy array or torch tensor, got list"):
        machine.map([1, 2, 3])
    with pytest.raises(EmulatorError, match=r"kernel_name: no label 'nope'"):
        machine.launch(asm, "nope")
    with pytest.raises(EmulatorError, match=r"grid: expected up to 3 positive ints, got \(0, 1\)"):
        machine.launch(asm, "load_at", grid=(0, 1), kernargs=bytes(64))
    with pytest.raises(EmulatorError, match=r"kernargs: expected at least \d+ bytes .* got 8"):
        machine.launch(asm, "load_at", kernargs=bytes(8))
    with pytest.raises(EmulatorError, match=r"dynamic_lds: \d+ bytes of LDS exceed gfx942's 65536"):
        machine.launch(asm, "load_at", kernargs=bytes(512), dynamic_lds=65536)
    with pytest.raises(EmulatorError, match=r"order: expected a permutation of range\(2\), got \[0, 0\]"):
        machine.launch(asm, "load_at", grid=(2,), kernargs=bytes(512), order=[0, 0])


# ---- vector loads batched over the waves of a workgroup (memops.vmem_load): the
# bytes, registers and counters of wave by wave (a trace turns batching off).
# 8 waves; words 0..4095 of `out` are input, results go to 4096 + 512 * slot + tid.
# s[2:3] `out`, v30 / s12 the wave, v31 the lane, v1 4 * the thread
WAVE_PROLOGUE = """
\ts_load_dwordx2 s[2:3], s[0:1], 0x0
\tv_lshrrev_b32_e32 v30, 6, v0
\ts_nop 0
\tv_readfirstlane_b32 s12, v30
\tv_and_b32_e32 v31, 63, v0
\tv_lshlrev_b32_e32 v1, 2, v0
"""
WAVE_LOADS = WAVE_PROLOGUE + """
\tv_add_u32_e32 v29, 0x4000, v1
\tv_mov_b32_e32 v20, 0x5eed
\tv_mov_b32_e32 v24, 0
\ts_waitcnt lgkmcnt(0)
\tv_mov_b32_e32 v3, s3
\tv_add_co_u32_e32 v2, vcc, s2, v1
\tv_addc_co_u32_e32 v3, vcc, 0, v3, vcc
\tglobal_load_dword v10, v[2:3], off offset:12
\tglobal_load_dword v11, v1, s[2:3] offset:4 sc1
\ts_lshl_b32 s13, s12, 6
\ts_add_u32 s14, s2, s13
\ts_addc_u32 s15, s3, 0
\tglobal_load_dword v12, v1, s[14:15]
\ts_nop 0
\tv_lshlrev_b32_e32 v7, 2, v30
\tv_add_u32_e32 v7, v0, v7
\tv_lshlrev_b32_e32 v7, 2, v7
\tglobal_store_dword v7, v20, s[2:3] offset:8200
\tglobal_load_dword v13, v7, s[2:3] offset:8192
\ts_nop 0
\ts_mov_b32 s8, s2
\ts_and_b32 s9, s3, 0xffff
\ts_movk_i32 s10, 0x1fc8
\ts_mov_b32 s11, 0x20000
\tv_mul_u32_u24_e32 v4, 0x88, v0
\tbuffer_load_dwordx2 v[14:15], v4, s[8:11], 0 offen offset:8
\ts_nop 0
\tv_mul_u32_u24_e32 v5, 20, v0
\tbuffer_load_dwordx4 v[16:19], v5, s[8:11], 0 offen offset:60
\ts_nop 0
\ts_add_u32 s10, s12, 0x1f00
\tbuffer_load_dword v21, v5, s[8:11], 0 offen
\ts_nop 0
\ts_mov_b32 s10, 0x4000
\tv_mul_u32_u24_e32 v6, 7, v30
\tv_cmp_lt_u32_e32 vcc, v31, v6
\ts_and_saveexec_b64 s[20:21], vcc
\tglobal_load_ushort v22, v1, s[2:3] offset:2
\ts_nop 0
\tbuffer_load_ubyte v23, v1, s[8:11], 0 offen offset:3
\ts_nop 0
\tglobal_load_dword v24, v7, s[2:3] offset:8192
\ts_nop 0
\ts_or_b64 exec, exec, s[20:21]
\ts_waitcnt vmcnt(0)
""" + "".join(f"\tglobal_store_dword v29, v{reg}, s[2:3] offset:{2048 * slot}\n"
              for slot, reg in enumerate((10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 21, 22, 23, 24)))


@pytest.mark.parametrize("arch", ARCHS)
def test_batched_vector_loads_match_wave_by_wave(arch):
    """Global loads (64-bit address, SGPR base, an SGPR base that differs per wave),
    a load seeing the wave's own unperformed store (no wave reads another's), buffer
    loads with lanes wholly and partly out of range and a per-wave num_records,
    sub-dword loads and one of the wave's own store under per-wave exec masks (one
    wave's empty): batched, they leave the bytes and counters of wave by wave, and
    those of an independent model."""
    from k2back.emu.testing import handwritten

    g = rng(41)
    image = g.integers(0, 2**32, 4096, dtype=np.uint64).astype(np.uint32)
    results, all_stats = [], []
    for batched in (True, False):
        out = np.zeros(4096 + 512 * 16, np.uint32)
        out[:4096] = image
        machine = Machine(arch, trace=None if batched else (lambda w, ins: None))
        kernargs = machine.map(out).to_bytes(8, "little")
        stats = machine.launch(handwritten(arch, WAVE_LOADS), "hand", block=(512,), kernargs=kernargs)
        assert (stats.batched > 0) == batched
        results.append(out[4096:].reshape(16, 512))
        all_stats.append(stats)
    np.testing.assert_array_equal(results[0], results[1])
    keys = ("instructions", "bytes_read", "bytes_written", "cache_policy", "stale_bytes", "written_back")
    counted = [{k: getattr(s, k) for k in keys} for s in all_stats]
    assert counted[0] == counted[1]
    t = np.arange(512)
    wave, lane = t // 64, t % 64
    words = image.view(np.uint8)

    def dword(byte, records=None):
        value = words[byte:byte + 4].view(np.uint32)[0] if byte + 4 <= 4 * 4096 else 0
        return value if records is None or byte + 4 <= records else 0

    got = results[0]
    np.testing.assert_array_equal(got[0], image[t + 3])
    np.testing.assert_array_equal(got[1], image[t + 1])
    np.testing.assert_array_equal(got[2], image[t + 16 * wave])
    # lane l of wave k reads word 2048 + 68k + l, its wave stored words 2048 + 68k + 2.. + 65
    np.testing.assert_array_equal(got[3], np.where(lane >= 2, 0x5eed, image[2048 + 68 * wave + lane]))
    np.testing.assert_array_equal(got[4], [dword(136 * i + 8, 0x1fc8) for i in t])
    np.testing.assert_array_equal(got[5], [dword(136 * i + 12, 0x1fc8) for i in t])
    for j in range(4):
        np.testing.assert_array_equal(got[6 + j], [dword(20 * i + 60 + 4 * j, 0x1fc8) for i in t])
    np.testing.assert_array_equal(got[10], [dword(20 * i, 0x1f00 + i // 64) for i in t])
    active = lane < 7 * wave
    np.testing.assert_array_equal(got[11], np.where(active, image[t] >> 16, 0))
    np.testing.assert_array_equal(got[12], np.where(active, image[t] >> 24, 0))
    np.testing.assert_array_equal(got[13], np.where(active, got[3], 0))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("access", ["global_load_dword v10, v1, s[2:3]", "global_store_dword v1, v30, s[2:3]"])
def test_a_batched_access_out_of_range_names_its_wave(arch, access):
    from k2back.emu.testing import run_handwritten

    body = f"""
\ts_load_dwordx2 s[2:3], s[0:1], 0x0
\tv_lshrrev_b32_e32 v30, 6, v0
\tv_lshlrev_b32_e32 v1, 20, v30
\ts_waitcnt lgkmcnt(0)
\t{access}
\ts_waitcnt vmcnt(0)"""
    name = access.split()[0]
    with pytest.raises(MemoryFault, match=rf"by workgroup 0 wave 1, line \d+: {name}"):
        run_handwritten(arch, body, np.zeros(64, np.uint32), block=(256,))


# ---- vector stores batched over the waves of a workgroup (memops.vmem_store): each
# wave issues the store of its own lanes, so the bytes, the order they perform in and
# the counters are those of wave by wave (a trace turns batching off). 8 waves; `out`
# (64 KiB) starts as random words; each store writes a region of its own but R3,
# which every wave writes (the last wave to perform wins). Byte offsets:
# R0 0 (64-bit address), R1 2048 (SGPR base), R2 4096 + 256 wave (an SGPR base per
# wave), R3 6144 (lane), R4 8192 (short), R5 10240 (byte d16_hi), R6 12288 (dwordx4),
# buffers at 24576 (dwordx2, lanes wholly out of range), 32768 (dwordx4, a lane partly
# out of range), 40960 (num_records per wave), 57344 (short under per-wave exec, wave
# 0's empty), 49152 (dword under it), 61440 (a load of the wave's own unperformed R1
# store, stored after s_waitcnt).
WAVE_STORES = WAVE_PROLOGUE + """
\tv_mul_u32_u24_e32 v20, 0x10001, v0
\tv_add_u32_e32 v21, 0x5eed0000, v0
\tv_mul_u32_u24_e32 v22, 0x10101, v0
\tv_xor_b32_e32 v23, 0x77, v0
\tv_lshlrev_b32_e32 v6, 2, v31
\tv_lshlrev_b32_e32 v7, 1, v0
\tv_lshlrev_b32_e32 v9, 4, v0
\tv_mul_u32_u24_e32 v4, 0x88, v0
\tv_mul_u32_u24_e32 v5, 20, v0
\ts_waitcnt lgkmcnt(0)
\tv_mov_b32_e32 v3, s3
\tv_add_co_u32_e32 v2, vcc, s2, v1
\tv_addc_co_u32_e32 v3, vcc, 0, v3, vcc
\tglobal_store_dword v[2:3], v20, off
\tglobal_store_dword v1, v21, s[2:3] offset:2048
\ts_lshl_b32 s13, s12, 8
\ts_add_u32 s14, s2, s13
\ts_addc_u32 s15, s3, 0
\tglobal_store_dword v6, v22, s[14:15] offset:4096
\tglobal_store_dword v6, v20, s[2:3] offset:6144
\tglobal_store_short v7, v22, s[2:3] offset:8192
\tglobal_store_byte_d16_hi v0, v22, s[2:3] offset:10240
\tglobal_store_dwordx4 v9, v[20:23], s[2:3] offset:12288
\ts_add_u32 s8, s2, 0x6000
\ts_addc_u32 s9, s3, 0
\ts_and_b32 s9, s9, 0xffff
\ts_movk_i32 s10, 0x1fc8
\ts_mov_b32 s11, 0x20000
\tbuffer_store_dwordx2 v[20:21], v4, s[8:11], 0 offen offset:8
\ts_add_u32 s24, s2, 0x8000
\ts_addc_u32 s25, s3, 0
\ts_and_b32 s25, s25, 0xffff
\ts_movk_i32 s26, 0x1fc6
\ts_mov_b32 s27, 0x20000
\tbuffer_store_dwordx4 v[20:23], v5, s[24:27], 0 offen offset:60
\ts_add_u32 s28, s2, 0xa000
\ts_addc_u32 s29, s3, 0
\ts_and_b32 s29, s29, 0xffff
\ts_add_u32 s30, s12, 0x1f00
\ts_mov_b32 s31, 0x20000
\tbuffer_store_dword v21, v5, s[28:31], 0 offen
\tglobal_load_dword v24, v1, s[2:3] offset:2048
\ts_add_u32 s32, s2, 0xe000
\ts_addc_u32 s33, s3, 0
\ts_and_b32 s33, s33, 0xffff
\ts_movk_i32 s34, 0x800
\ts_mov_b32 s35, 0x20000
\ts_add_u32 s16, s2, 0xc000
\ts_addc_u32 s17, s3, 0
\tv_mul_u32_u24_e32 v8, 7, v30
\tv_cmp_lt_u32_e32 vcc, v31, v8
\ts_and_saveexec_b64 s[20:21], vcc
\tbuffer_store_short v23, v1, s[32:35], 0 offen offset:4
\tglobal_store_dword v1, v23, s[16:17]
\ts_or_b64 exec, exec, s[20:21]
\ts_waitcnt vmcnt(0)
\ts_add_u32 s18, s2, 0xf000
\ts_addc_u32 s19, s3, 0
\tglobal_store_dword v1, v24, s[18:19]
\ts_waitcnt vmcnt(0)
"""


@pytest.mark.parametrize("arch", ARCHS)
def test_batched_vector_stores_match_wave_by_wave(arch, monkeypatch):
    """Global stores (64-bit address, SGPR base, an SGPR base that differs per wave,
    sub-dword, d16_hi, dwordx4), buffer stores with lanes wholly and partly out of
    range and a per-wave num_records, stores under per-wave exec masks (one wave's
    empty), every wave storing to the same words, and a load of the wave's own
    unperformed store: batched (the stores reach DecodeContext.store as a Batch),
    they leave the bytes and counters of wave by wave, and those of an independent
    model."""
    from k2back.emu import machine as machine_module
    from k2back.emu.testing import handwritten

    issued = []
    store = machine_module.DecodeContext.store

    def spy(self, w, *args):
        issued.append(w.waves is not None)
        return store(self, w, *args)
    monkeypatch.setattr(machine_module.DecodeContext, "store", spy)
    image = rng(43).integers(0, 2**32, 16384, dtype=np.uint64).astype(np.uint32)
    results, all_stats = [], []
    for batched in (True, False):
        issued.clear()
        out = image.copy()
        machine = Machine(arch, trace=None if batched else (lambda w, ins: None))
        kernargs = machine.map(out).to_bytes(8, "little")
        stats = machine.launch(handwritten(arch, WAVE_STORES), "hand", block=(512,), kernargs=kernargs)
        assert any(issued) == batched
        results.append(out)
        all_stats.append(stats)
    np.testing.assert_array_equal(results[0], results[1])
    keys = ("instructions", "bytes_read", "bytes_written", "cache_policy", "stale_bytes", "written_back")
    counted = [{k: getattr(s, k) for k in keys} for s in all_stats]
    assert counted[0] == counted[1]

    t = np.arange(512, dtype=np.uint32)
    wave, lane = t // 64, t % 64
    v20, v21, v22, v23 = t * 0x10001, t + 0x5eed0000, t * 0x10101, t ^ 0x77
    expect = image.copy()
    data = expect.view(np.uint8)
    expect[t] = v20
    expect[512 + t] = v21
    expect[1024 + 64 * wave + lane] = v22
    data[8192 + 2 * t.astype(np.int64)] = v22 & 0xFF
    data[8193 + 2 * t.astype(np.int64)] = (v22 >> 8) & 0xFF
    data[10240 + t] = (v22 >> 16) & 0xFF
    expect[3072 + 4 * t], expect[3073 + 4 * t], expect[3074 + 4 * t], expect[3075 + 4 * t] = v20, v21, v22, v23

    def buffer_dwords(base, starts, records, values):
        for start, limit, value in zip(starts.tolist(), np.broadcast_to(records, starts.shape).tolist(), values):
            for j, word in enumerate(value):
                if start + 4 * j + 4 <= limit:
                    expect[(base + start) // 4 + j] = word
    buffer_dwords(0x6000, 136 * t + 8, 0x1fc8, zip(v20, v21))
    buffer_dwords(0x8000, 20 * t + 60, 0x1fc6, zip(v20, v21, v22, v23))
    buffer_dwords(0xa000, 20 * t, 0x1f00 + wave, zip(v21))
    active = lane < 7 * wave
    for i in np.flatnonzero(active):
        data[0xe000 + 4 * i + 4:0xe000 + 4 * i + 6] = v23[i:i + 1].view(np.uint8)[:2]
    expect[0xc000 // 4 + t[active]] = v23[active]
    expect[0xf000 // 4 + t] = v21  # the wave's own R1 store
    expect[1536:1600] = results[0][1536:1600]  # R3: some wave's lanes, checked below
    np.testing.assert_array_equal(results[0], expect)
    assert any((results[0][1536:1600] == v20[64 * k:64 * k + 64]).all() for k in range(8))


# ---- vector loads and stores batched over the waves of several workgroups (a
# batch of a stage's workgroups, machine._turns): one access, each workgroup's CU
# its own view of its lanes (DecodeContext.load), a workgroup at a time where
# the workgroups disagree on an SGPR (memops.ByWorkgroup). 8 workgroups of 2
# waves, one a XCD: every workgroup stores its id to words 0..127 and reads them
# back (its own L2's dirty bytes), reads words memory still holds through L1 and
# with sc1, through a base address of its own, and through a buffer its second
# wave's lanes lie beyond; results at 16384 + 4096 k + 512 workgroup bytes.
GROUP_LOADS = """
\ts_mov_b32 s12, s2
\ts_load_dwordx2 s[2:3], s[0:1], 0x0
\tv_lshlrev_b32_e32 v1, 2, v0
\tv_mov_b32_e32 v20, s12
\tv_lshlrev_b32_e32 v21, 16, v20
\tv_or_b32_e32 v21, v21, v0
\tv_lshlrev_b32_e32 v22, 9, v20
\tv_add_u32_e32 v22, v22, v1
\ts_waitcnt lgkmcnt(0)
\tglobal_load_dword v10, v1, s[2:3] offset:4096
\ts_nop 0
\tglobal_store_dword v1, v21, s[2:3]
\ts_waitcnt vmcnt(0)
\tglobal_load_dword v11, v1, s[2:3]
\tglobal_load_dword v12, v1, s[2:3] offset:4096 sc1
\ts_lshl_b32 s13, s12, 9
\ts_add_u32 s14, s2, s13
\ts_addc_u32 s15, s3, 0
\tglobal_load_dword v13, v1, s[14:15] offset:8192
\ts_mov_b32 s8, s2
\ts_and_b32 s9, s3, 0xffff
\ts_movk_i32 s10, 0x1000
\ts_mov_b32 s11, 0x20000
\tbuffer_load_dword v14, v1, s[8:11], 0 offen offset:3840
\ts_waitcnt vmcnt(0)
\tglobal_store_dword v22, v10, s[2:3] offset:16384
\tglobal_store_dword v22, v11, s[2:3] offset:20480
\tglobal_store_dword v22, v12, s[2:3] offset:24576
\tglobal_store_dword v22, v13, s[2:3] offset:28672
\tglobal_store_dword v22, v14, s[2:3] offset:32768
\ts_waitcnt vmcnt(0)
"""


@pytest.mark.parametrize("arch", ARCHS)
def test_loads_and_stores_batched_over_workgroups_match_wave_by_wave(arch, monkeypatch):
    """Loads and stores of a batch of several workgroups' waves leave the bytes and
    counters of one workgroup at a time and of wave by wave, and those of an
    independent model: each workgroup reads its own L2's dirty bytes of words every
    workgroup stored, memory's bytes elsewhere, through its own base address, and
    zeros past a buffer's end."""
    from k2back.emu import machine as machine_module
    from k2back.emu.testing import handwritten

    across = []
    load_over_waves, store = machine_module.DecodeContext._load_over_waves, machine_module.DecodeContext.store

    def spy_load(self, batch, *args):
        across.append(batch.group is None)
        return load_over_waves(self, batch, *args)

    def spy_store(self, w, *args):
        across.append(w.waves is not None and w.group is None)
        return store(self, w, *args)
    monkeypatch.setattr(machine_module.DecodeContext, "_load_over_waves", spy_load)
    monkeypatch.setattr(machine_module.DecodeContext, "store", spy_store)
    image = rng(44).integers(0, 2**32, 9216, dtype=np.uint64).astype(np.uint32)
    results, all_stats = [], []
    for mode in ("across", "by workgroup", "wave by wave"):
        across.clear()
        out = image.copy()
        machine = Machine(arch, trace=(lambda w, ins: None) if mode == "wave by wave" else None)
        machine.batch_workgroups = mode == "across"
        kernargs = machine.map(out).to_bytes(8, "little")
        stats = machine.launch(handwritten(arch, GROUP_LOADS), "hand", grid=(8,), block=(128,), kernargs=kernargs)
        assert any(across) == (mode == "across"), mode
        results.append(out)
        all_stats.append(stats)
    keys = ("instructions", "bytes_read", "bytes_written", "cache_policy", "stale_bytes", "written_back")
    for got, stats in zip(results[1:], all_stats[1:]):
        np.testing.assert_array_equal(results[0], got)
        assert {k: getattr(stats, k) for k in keys} == {k: getattr(all_stats[0], k) for k in keys}
    group, tid = np.divmod(np.arange(8 * 128), 128)
    stored = (group << 16 | tid).astype(np.uint32)
    expect = image.copy()
    expect[:128] = stored[-128:]  # the end-of-kernel write-backs, XCD 7's last
    expect[4096:5120] = image[1024 + tid]
    expect[5120:6144] = stored
    expect[6144:7168] = image[1024 + tid]
    expect[7168:8192] = image[2048 + 128 * group + tid]
    expect[8192:] = np.where(tid < 64, image[960 + tid % 64], 0)  # 4096 bytes in range
    np.testing.assert_array_equal(results[0], expect)


def test_a_regions_rows_are_its_bytes_at_any_alignment():
    """Region.rows (a vector load's bytes: a record each when every lane is aligned
    to a 4, 8 or 16 byte access, else a byte window) returns the bytes at each
    offset for aligned, unaligned and mixed lanes."""
    from k2back.emu.memory import Region

    data = rng(5).integers(0, 256, 4099, dtype=np.uint8)  # not a multiple of 16
    region = Region(1 << 32, data, "data", data)
    for size in (1, 2, 4, 8, 12, 16):
        for offsets in (np.arange(0, 4099 - size, 16)[:64], np.arange(3, 4099 - size, 16)[:64],
                        np.array([0, 4099 - size - (4099 - size) % 4, size * 3, 1])):
            expect = data[offsets[:, None] + np.arange(size)]
            np.testing.assert_array_equal(region.rows(offsets.astype(np.int64), size), expect,
                                          err_msg=f"size {size} offsets {offsets[:4]}")
