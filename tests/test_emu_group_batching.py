"""LDS instructions batched over several workgroups' waves (state.Grid.lds: every
workgroup's LDS a row of one array; memops._over_waves): each lane addresses its
own workgroup's LDS, a batch of waves in slots apart runs as a state.Gathered,
and a launch leaves the bytes and counters of one workgroup at a time and of
wave by wave (a trace turns batching off), and those of an independent model."""

import dataclasses

import numpy as np
import pytest

from k2back.emu import Machine, MemoryFault, memops
from k2back.emu.state import Gathered
from k2back.emu.testing import ARCHS, handwritten, module, rng, run

# 4 waves a workgroup, 4 workgroups (one turn: their waves run as one batch).
# x -> LDS words, a barrier; then waves 0 and 2 of every workgroup (slots apart:
# gathered) read a neighbour's word, store a word of their own and read it back
# before any s_waitcnt (the store still to perform: each wave drains its own),
# read a halfword and bpermute; waves 1 and 3 store a byte and read it back, and
# read2 a pair of words.
LDS_GROUPS = module("""
@buf = internal addrspace(3) global [512 x i32] poison, align 16
@bytes = internal addrspace(3) global [256 x i8] poison, align 16
define amdgpu_kernel void @groups(ptr addrspace(1) %x, ptr addrspace(1) %out) #0 {
entry:
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  %wg = call i32 @llvm.amdgcn.workgroup.id.x()
  %base = mul i32 %wg, 256
  %gid = add i32 %base, %tid
  %px = getelementptr i32, ptr addrspace(1) %x, i32 %gid
  %v = load i32, ptr addrspace(1) %px
  %slot = getelementptr i32, ptr addrspace(3) @buf, i32 %tid
  store i32 %v, ptr addrspace(3) %slot
  fence syncscope("workgroup") release
  call void @llvm.amdgcn.s.barrier()
  fence syncscope("workgroup") acquire
  %wave = lshr i32 %tid, 6
  %wv = call i32 @llvm.amdgcn.readfirstlane(i32 %wave)
  %odd = and i32 %wv, 1
  %isodd = icmp ne i32 %odd, 0
  br i1 %isodd, label %b, label %a
a:
  %t7 = mul i32 %tid, 7
  %w3 = mul i32 %wg, 3
  %n = add i32 %t7, %w3
  %ni = and i32 %n, 255
  %pn = getelementptr i32, ptr addrspace(3) @buf, i32 %ni
  %na = load i32, ptr addrspace(3) %pn
  %mine = xor i32 %na, 23130
  %t2 = add i32 %tid, 256
  %own = getelementptr i32, ptr addrspace(3) @buf, i32 %t2
  store volatile i32 %mine, ptr addrspace(3) %own
  %back = load volatile i32, ptr addrspace(3) %own
  %t5 = mul i32 %tid, 5
  %hi = and i32 %t5, 511
  %ph = getelementptr i16, ptr addrspace(3) @buf, i32 %hi
  %h = load i16, ptr addrspace(3) %ph
  %hz = zext i16 %h to i32
  %l13 = mul i32 %tid, 13
  %lane = and i32 %l13, 63
  %addr = shl i32 %lane, 2
  %bp = call i32 @llvm.amdgcn.ds.bpermute(i32 %addr, i32 %na)
  %r1 = mul i32 %back, 3
  %r2 = mul i32 %hz, 5
  %r3 = mul i32 %bp, 7
  %s1 = add i32 %na, %r1
  %s2 = add i32 %s1, %r2
  %ra = add i32 %s2, %r3
  br label %join
b:
  %t3 = mul i32 %tid, 3
  %m = add i32 %t3, 1
  %mi = and i32 %m, 254
  %pm = getelementptr i32, ptr addrspace(3) @buf, i32 %mi
  %pair = load <2 x i32>, ptr addrspace(3) %pm, align 8
  %p0 = extractelement <2 x i32> %pair, i32 0
  %p1 = extractelement <2 x i32> %pair, i32 1
  %byte = trunc i32 %p0 to i8
  %pb = getelementptr i8, ptr addrspace(3) @bytes, i32 %tid
  store volatile i8 %byte, ptr addrspace(3) %pb
  %bb = load volatile i8, ptr addrspace(3) %pb
  %bz = zext i8 %bb to i32
  %q1 = mul i32 %p1, 11
  %q2 = add i32 %q1, %bz
  %rb = xor i32 %q2, %wg
  br label %join
join:
  %r = phi i32 [ %ra, %a ], [ %rb, %b ]
  %po = getelementptr i32, ptr addrspace(1) %out, i32 %gid
  store i32 %r, ptr addrspace(1) %po
  ret void
}
declare i32 @llvm.amdgcn.workitem.id.x()
declare i32 @llvm.amdgcn.workgroup.id.x()
declare i32 @llvm.amdgcn.readfirstlane(i32)
declare i32 @llvm.amdgcn.ds.bpermute(i32, i32)
declare void @llvm.amdgcn.s.barrier()
""")
GROUPS = 4


def groups_reference(x: np.ndarray) -> np.ndarray:
    u32 = np.uint32
    out = np.zeros_like(x)
    t = np.arange(256, dtype=np.uint32)
    for wg in range(GROUPS):
        buf = x[256 * wg:256 * (wg + 1)]
        na = buf[(t * 7 + u32(3 * wg)) & 255]
        back = na ^ u32(23130)
        hz = buf.view(np.uint16)[(t * 5) & 511].astype(u32)
        bp = na[(t & ~u32(63)) + ((t * 13) & 63)]
        ra = na + back * u32(3) + hz * u32(5) + bp * u32(7)
        pair = (t * 3 + 1) & 254
        p0, p1 = buf[pair], buf[pair + 1]
        rb = (p1 * u32(11) + (p0 & u32(0xFF))) ^ u32(wg)
        out[256 * wg:256 * (wg + 1)] = np.where((t // 64) % 2 == 1, rb, ra)
    return out


# what must not depend on batching (rounds and the batched count may)
SAME_COUNTERS = ("instructions", "wave_instructions", "bytes_read", "bytes_written", "lds_read",
                 "lds_written", "barriers", "polls", "cache_policy", "workgroups", "waves",
                 "stale_bytes", "written_back")


@pytest.mark.parametrize("arch", ARCHS)
def test_lds_batched_over_workgroups_matches_one_workgroup_at_a_time_and_wave_by_wave(arch, monkeypatch):
    seen = []  # (a wave, a state.Gathered or a Batch; spans several workgroups) of each LDS access
    lds_space = memops._lds_space

    def spy(w, addresses):
        kind = "wave" if w.waves is None else "gathered" if type(w) is Gathered else "batch"
        seen.append((kind, w.group is None))
        return lds_space(w, addresses)
    monkeypatch.setattr(memops, "_lds_space", spy)
    x = rng(17).integers(0, 2**32, 256 * GROUPS, dtype=np.uint64).astype(np.uint32)
    results = {}
    for mode in ("across", "by workgroup", "wave by wave"):
        seen.clear()
        out = np.zeros_like(x)
        machine = Machine(arch, trace=(lambda w, ins: None) if mode == "wave by wave" else None)
        machine.batch_workgroups = mode == "across"
        stats = run(LDS_GROUPS, arch, "groups", {"x": x, "out": out}, grid=(GROUPS,), block=(256,),
                    machine=machine)
        np.testing.assert_array_equal(out, groups_reference(x), err_msg=mode)
        results[mode] = (out, stats, set(seen))
    across, by_group, alone = (results[m][1] for m in ("across", "by workgroup", "wave by wave"))
    # across: batches spanning workgroups, gathered ones (waves 0 and 2, 1 and 3 of
    # each), and waves alone where a later wave of a batch drains its own store first
    assert {("batch", True), ("gathered", True), ("wave", False)} <= results["across"][2]
    assert not any(spans for _, spans in results["by workgroup"][2])
    assert alone.batched == 0 and across.batches < by_group.batches
    for stats in (by_group, alone):
        mine, theirs = dataclasses.asdict(across), dataclasses.asdict(stats)
        assert {k: mine[k] for k in SAME_COUNTERS} == {k: theirs[k] for k in SAME_COUNTERS}


# Waves 1-3 of workgroups 1 and 2 read past the LDS (wave * workgroup MiB): a
# batch of several workgroups' waves must name the first, as one workgroup at a
# time and wave by wave do.
STRAY = """
\tv_lshrrev_b32_e32 v30, 6, v0
\tv_mul_u32_u24_e32 v1, s2, v30
\tv_lshlrev_b32_e32 v1, 20, v1
\tds_read_b32 v10, v1
\ts_waitcnt lgkmcnt(0)"""


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("mode", ["across", "by workgroup", "wave by wave"])
def test_an_lds_read_out_of_range_in_a_batch_of_workgroups_names_its_wave(arch, mode):
    machine = Machine(arch, trace=(lambda w, ins: None) if mode == "wave by wave" else None)
    machine.batch_workgroups = mode == "across"
    kernargs = machine.map(np.zeros(64, np.uint32)).to_bytes(8, "little")
    with pytest.raises(MemoryFault, match=r"outside the workgroup's 2048 bytes, workgroup 1 wave 1,"):
        machine.launch(handwritten(arch, STRAY, lds_bytes=2048), "hand", grid=(3,), block=(256,), kernargs=kernargs)


def test_each_workgroups_lds_is_its_own_row_of_the_grids():
    """A workgroup's LDS is its row of state.Grid.lds (as bytes and dwords in
    Grid.lds_cells from lds_base), rows 16-byte aligned, each its own size."""
    from k2back.emu.state import Grid, exec_state

    grid = Grid(6, 4, workgroups=3, lds_bytes=1030)
    groups = grid.start([(i, (i, 0, 0), None, [0] * 128) for i in range(3)], [exec_state(2**64 - 1)] * 2)
    flat, words = grid.lds_cells
    for i, g in enumerate(groups):
        assert g.lds.size == 1030 and g.lds_base % 16 == 0
        g.lds[:] = i + 1
        assert (flat[g.lds_base:g.lds_base + 1030] == i + 1).all()
        assert (words[g.lds_base // 4:(g.lds_base + 1028) // 4] == (i + 1) * 0x01010101).all()
    assert np.shares_memory(groups[0].lds, flat) and grid.lds.shape == (3, 1040)


# Vector loads and stores of waves in slots apart (waves 0 and 2, 1 and 3 of each of
# 4 workgroups) run once as a state.Gathered: a load through the kernel's base
# (every wave agrees: one access over all workgroups), loads through an SGPR base
# of each wave's own and of each workgroup's own and buffer loads with a
# num_records of each wave's own (each lane its wave's; a dwordx4 whose lanes are
# partly in range, element by element), a buffer load with an
# soffset of each wave's own (a batch of several workgroups splits, a workgroup
# at a time; a Gathered of one workgroup's waves, wave by wave), stores of waves
# 0 and 2.
VMEM_GROUPS = module("""
define amdgpu_kernel void @vmem(ptr addrspace(1) %x, ptr addrspace(1) %out, ptr addrspace(1) %out2) #0 {
entry:
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  %wg = call i32 @llvm.amdgcn.workgroup.id.x()
  %base = mul i32 %wg, 256
  %gid = add i32 %base, %tid
  %wave = lshr i32 %tid, 6
  %wv = call i32 @llvm.amdgcn.readfirstlane(i32 %wave)
  %odd = and i32 %wv, 1
  %isodd = icmp ne i32 %odd, 0
  %po = getelementptr i32, ptr addrspace(1) %out, i32 %gid
  br i1 %isodd, label %b, label %a
a:
  %i1 = mul i32 %gid, 3
  %j1 = and i32 %i1, 1023
  %p1 = getelementptr i32, ptr addrspace(1) %x, i32 %j1
  %v1 = load i32, ptr addrspace(1) %p1
  %wbase = mul i32 %wv, 100
  %pw = getelementptr i32, ptr addrspace(1) %x, i32 %wbase
  %lane = and i32 %tid, 63
  %p2 = getelementptr i32, ptr addrspace(1) %pw, i32 %lane
  %v2 = load i32, ptr addrspace(1) %p2
  %wv1 = add i32 %wv, 1
  %records32 = mul i32 %wv1, 80
  %records = zext i32 %records32 to i64
  %rsrc = call ptr addrspace(8) @llvm.amdgcn.make.buffer.rsrc.p8.p1(ptr addrspace(1) %x, i16 0, i64 %records, i32 159744)
  %off = shl i32 %lane, 2
  %v4 = call i32 @llvm.amdgcn.raw.ptr.buffer.load.i32(ptr addrspace(8) %rsrc, i32 %off, i32 0, i32 0)
  %whole = call ptr addrspace(8) @llvm.amdgcn.make.buffer.rsrc.p8.p1(ptr addrspace(1) %x, i16 0, i64 4096, i32 159744)
  %soffset = shl i32 %wv, 2
  %v5 = call i32 @llvm.amdgcn.raw.ptr.buffer.load.i32(ptr addrspace(8) %whole, i32 %off, i32 %soffset, i32 0)
  %v45 = mul i32 %v5, 7
  %v4x = add i32 %v4, %v45
  %q = call <4 x i32> @llvm.amdgcn.raw.ptr.buffer.load.v4i32(ptr addrspace(8) %rsrc, i32 %off, i32 0, i32 0)
  %q0 = extractelement <4 x i32> %q, i32 0
  %q1 = extractelement <4 x i32> %q, i32 1
  %q2 = extractelement <4 x i32> %q, i32 2
  %q3 = extractelement <4 x i32> %q, i32 3
  %q1m = mul i32 %q1, 3
  %q2m = mul i32 %q2, 5
  %q3m = mul i32 %q3, 9
  %qa = add i32 %q0, %q1m
  %qb = add i32 %q2m, %q3m
  %qs = add i32 %qa, %qb
  %v4q = add i32 %v4x, %qs
  %v24 = add i32 %v2, %v4q
  %r1 = mul i32 %v1, 3
  %ra = add i32 %r1, %v2
  store i32 %ra, ptr addrspace(1) %po
  %po2 = getelementptr i32, ptr addrspace(1) %out2, i32 %gid
  store i32 %v24, ptr addrspace(1) %po2
  br label %done
b:
  %gbase = mul i32 %wg, 200
  %pg = getelementptr i32, ptr addrspace(1) %x, i32 %gbase
  %p3 = getelementptr i32, ptr addrspace(1) %pg, i32 %tid
  %v3 = load i32, ptr addrspace(1) %p3
  %rb = xor i32 %v3, 4660
  store i32 %rb, ptr addrspace(1) %po
  br label %done
done:
  ret void
}
declare i32 @llvm.amdgcn.workitem.id.x()
declare i32 @llvm.amdgcn.workgroup.id.x()
declare i32 @llvm.amdgcn.readfirstlane(i32)
declare ptr addrspace(8) @llvm.amdgcn.make.buffer.rsrc.p8.p1(ptr addrspace(1), i16, i64, i32)
declare i32 @llvm.amdgcn.raw.ptr.buffer.load.i32(ptr addrspace(8), i32, i32, i32)
declare <4 x i32> @llvm.amdgcn.raw.ptr.buffer.load.v4i32(ptr addrspace(8), i32, i32, i32)
""")


def vmem_reference(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    gid = np.arange(256 * GROUPS)
    wg, tid = np.divmod(gid, 256)
    wave = tid // 64
    lane = tid % 64
    v2 = x[100 * wave + lane]
    a = x[(gid * 3) & 1023] * np.uint32(3) + v2
    b = x[200 * wg + tid] ^ np.uint32(4660)
    v4 = np.where(4 * lane + 4 <= 80 * (wave + 1), x[lane], 0)  # the buffer's range: each wave its own
    v5 = x[lane + wave]  # soffset: each wave its own
    # 4 dwords from dword `lane`, each in range or not: a lane's access partly in range
    q = [np.where(4 * (lane + k) + 4 <= 80 * (wave + 1), x[lane + k], 0) for k in range(4)]
    qs = q[0] + q[1] * np.uint32(3) + q[2] * np.uint32(5) + q[3] * np.uint32(9)
    odd = wave % 2 == 1
    return np.where(odd, b, a), np.where(odd, 0, v2 + v4 + v5 * np.uint32(7) + qs)


@pytest.mark.parametrize("arch", ARCHS)
def test_vector_memory_of_waves_in_slots_apart_runs_gathered_as_one_workgroup_at_a_time(arch, monkeypatch):
    from k2back.emu import machine as machine_module

    seen = []  # (a state.Gathered, spans several workgroups) of each batched load and store
    load_over_waves, store = machine_module.DecodeContext._load_over_waves, machine_module.DecodeContext.store

    def spy_load(self, batch, *args):
        seen.append(("load", type(batch) is Gathered, batch.group is None))
        return load_over_waves(self, batch, *args)

    def spy_store(self, w, *args):
        if w.waves is not None:
            seen.append(("store", type(w) is Gathered, w.group is None))
        return store(self, w, *args)
    monkeypatch.setattr(machine_module.DecodeContext, "_load_over_waves", spy_load)
    monkeypatch.setattr(machine_module.DecodeContext, "store", spy_store)
    x = rng(23).integers(0, 2**32, 1024, dtype=np.uint64).astype(np.uint32)
    results = {}
    for mode in ("across", "by workgroup", "wave by wave"):
        seen.clear()
        out, out2 = np.zeros(256 * GROUPS, np.uint32), np.zeros(256 * GROUPS, np.uint32)
        machine = Machine(arch, trace=(lambda w, ins: None) if mode == "wave by wave" else None)
        machine.batch_workgroups = mode == "across"
        stats = run(VMEM_GROUPS, arch, "vmem", {"x": x, "out": out, "out2": out2}, grid=(GROUPS,),
                    block=(256,), machine=machine)
        want, want2 = vmem_reference(x)
        np.testing.assert_array_equal(out, want, err_msg=mode)
        np.testing.assert_array_equal(out2, want2, err_msg=mode)
        results[mode] = (stats, set(seen))
    assert {("load", True, True), ("store", True, True)} <= results["across"][1]
    assert not any(spans for _, _, spans in results["by workgroup"][1])
    (across, _), (by_group, _), (alone, _) = results.values()
    assert alone.batched == 0 and across.batches < by_group.batches
    for stats in (by_group, alone):
        mine, theirs = dataclasses.asdict(across), dataclasses.asdict(stats)
        assert {k: mine[k] for k in SAME_COUNTERS} == {k: theirs[k] for k in SAME_COUNTERS}


@pytest.mark.parametrize("arch", ARCHS)
def test_a_batched_store_gives_each_wave_the_span_of_its_own_bytes(arch, monkeypatch):
    """A store a batch runs once issues each wave's store of its own lanes with its
    lowest and highest byte computed for all waves at once (DecodeContext.store):
    they are those of the wave's bytes (what decides whether it performs in pieces
    and whether it may reach a polled line)."""
    from k2back.emu import inflight

    issued = []
    issue_store = inflight.issue_store

    def spy(w, ins, mem, flat, values, span=None):
        issued.append((span, int(flat.min()), int(flat.max())))
        return issue_store(w, ins, mem, flat, values, span)
    monkeypatch.setattr(inflight, "issue_store", spy)
    x = rng(23).integers(0, 2**32, 1024, dtype=np.uint64).astype(np.uint32)
    out, out2 = np.zeros(256 * GROUPS, np.uint32), np.zeros(256 * GROUPS, np.uint32)
    run(VMEM_GROUPS, arch, "vmem", {"x": x, "out": out, "out2": out2}, grid=(GROUPS,), block=(256,),
        machine=Machine(arch))
    given = [(span, (low, high)) for span, low, high in issued if span is not None]
    assert len(given) > len(issued) // 2  # most were batched
    assert all(span == bytes_ for span, bytes_ in given)
