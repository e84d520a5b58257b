"""Accesses wider than 8 bytes are not single-copy atomic (coherence.tear_phases).

Only a naturally aligned 8-byte access is one copy on gfx942/gfx950: LLVM lowers
`load/store atomic i64` to one *_dwordx2 (with sc1 at agent scope, AMDGPUUsage
"Memory Model GFX942") and no atomic wider than 64 bits to one instruction
(AMDGPUISelLowering: setMaxAtomicSizeInBitsSupported(64)). The strict model
tears a wider store into 8-byte phases that perform one at a time (a sleeper
woken by the first sees it before the next), and a wider load reads its later
pieces in the newest view the model allows, the first in the oldest: in even
16-byte granules the high piece goes first, in odd ones the low piece.

The kernels: workgroup 0 writes, per thread, a 16-byte line [p0, tag, p1, tag]
(the NCCL "LL" layout: a tag in each 8-byte half); workgroups 1..8 (the other
XCDs, and XCD 0's second CU) read it with one 16-byte load. A reader that checks
both tags gets the new line whole; one that trusts one tag of the two gets, in
some lanes, the other half stale: the kernel relying on 16-byte atomicity fails."""

import numpy as np
import pytest

from k2back.emu import Machine
from k2back.emu.testing import ARCHS, module, run

DECLS = """
declare i32 @llvm.amdgcn.workitem.id.x()
declare i32 @llvm.amdgcn.workgroup.id.x()
declare void @llvm.amdgcn.s.sleep(i32)
declare ptr addrspace(8) @llvm.amdgcn.make.buffer.rsrc.p8.p1(ptr addrspace(1), i16, i64, i32)
declare void @llvm.amdgcn.raw.ptr.buffer.store.v4i32(<4 x i32>, ptr addrspace(8), i32, i32, i32)
declare void @llvm.amdgcn.raw.ptr.buffer.store.v2i32(<2 x i32>, ptr addrspace(8), i32, i32, i32)
declare <4 x i32> @llvm.amdgcn.raw.ptr.buffer.load.v4i32(ptr addrspace(8), i32, i32, i32)
"""
SC1 = 16  # device scope (SPEC §4)
VOLATILE = -2147483648  # aux bit 31: the buffer intrinsic is volatile (kept, not merged)
TAG = 7
CONSUMERS = range(1, 9)
CHECKS = {"both": "and i1 %ok0, %ok1", "low": "and i1 %ok0, true", "high": "and i1 %ok1, true"}


def ll_kernel(check="both", pieces=1, flag=False, far=False):
    """Workgroup 0 stores thread t's line [1000 + t, TAG, 2000 + t, TAG] (one
    dwordx4, or `pieces` 2: two dwordx2; "lanes": a dwordx2 a word, thread t words t
    and t + 64: a line's halves stored by two lanes), no fence; the others load it with one
    dwordx4 (sc1) until the tags `check` names hold TAG, sleeping between, then
    write the line they accepted. `flag`: the writer then sets a flag by an
    atomic, the readers await it and read the line once, unchecked. `far`: the
    line is written twice, the second copy 1 KiB on, and read by a second load
    (a poll of several loads: both copies' tags checked)."""
    aux = SC1 + (0 if far else VOLATILE)  # far: both loads in flight at once
    if pieces == "lanes":  # thread t stores words t and t + 64 (line m = words 2m, 2m + 1)
        put = "".join(f"""  %wd{k} = add i32 %tid, {64 * k}
  %wm{k} = lshr i32 %wd{k}, 1
  %wo{k} = and i32 %wd{k}, 1
  %wq{k} = icmp ne i32 %wo{k}, 0
  %wb{k} = select i1 %wq{k}, i32 2000, i32 1000
  %wp{k} = add i32 %wb{k}, %wm{k}
  %wv{k} = insertelement <2 x i32> <i32 0, i32 {TAG}>, i32 %wp{k}, i32 0
  %wa{k} = shl i32 %wd{k}, 3
  call void @llvm.amdgcn.raw.ptr.buffer.store.v2i32(<2 x i32> %wv{k}, ptr addrspace(8) %rs, i32 %wa{k}, i32 0, i32 {aux})
""" for k in range(2))
    elif pieces == 1:
        put = (f"  call void @llvm.amdgcn.raw.ptr.buffer.store.v4i32(<4 x i32> %line, ptr addrspace(8) %rs, "
               f"i32 %off, i32 0, i32 {aux})\n")
    else:
        put = "".join(
            f"  %h{k} = shufflevector <4 x i32> %line, <4 x i32> poison, <2 x i32> <i32 {2 * k}, i32 {2 * k + 1}>\n"
            f"  %o{k} = add i32 %off, {8 * k}\n"
            f"  call void @llvm.amdgcn.raw.ptr.buffer.store.v2i32(<2 x i32> %h{k}, ptr addrspace(8) %rs, "
            f"i32 %o{k}, i32 0, i32 {aux})\n" for k in range(2))
    if far:
        put += (f"  %far = add i32 %off, 1024\n  call void @llvm.amdgcn.raw.ptr.buffer.store.v4i32(<4 x i32> "
                f"%line, ptr addrspace(8) %rs, i32 %far, i32 0, i32 {aux})\n")
    if flag:
        put += ('  fence syncscope("agent") release\n'
                "  %old = atomicrmw add ptr addrspace(1) %flag, i32 1 syncscope(\"agent\") monotonic\n")
        wait = """  br label %poll
poll:
  %f = load atomic i32, ptr addrspace(1) %flag syncscope("agent") monotonic, align 4
  %set = icmp ne i32 %f, 0
  br i1 %set, label %read, label %sleep
sleep:
  call void @llvm.amdgcn.s.sleep(i32 1)
  br label %poll
read:
"""
        accept = "  br label %consume\n"
    else:
        wait = """  br label %read
read:
"""
        both = CHECKS[check]
        if far:  # the second copy's tags too
            both = both.replace("%ok0", "%okl").replace("%ok1", "%okh")
        accept = ("  %okl = and i1 %ok0, %ok2\n  %okh = and i1 %ok1, %ok3\n" if far else "") + f"""  %ok = {both}
  br i1 %ok, label %consume, label %sleep
sleep:
  call void @llvm.amdgcn.s.sleep(i32 1)
  br label %read
"""
    far_read = f"""  %faroff = add i32 %off, 1024
  %got2 = call <4 x i32> @llvm.amdgcn.raw.ptr.buffer.load.v4i32(ptr addrspace(8) %rs, i32 %faroff, i32 0, i32 {SC1})
  %t2 = extractelement <4 x i32> %got2, i32 1
  %t3 = extractelement <4 x i32> %got2, i32 3
  %ok2 = icmp eq i32 %t2, {TAG}
  %ok3 = icmp eq i32 %t3, {TAG}
"""
    return module(f"""
define amdgpu_kernel void @ll(ptr addrspace(1) %data, ptr addrspace(1) %flag, ptr addrspace(1) %out) #0 {{
entry:
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  %wg = call i32 @llvm.amdgcn.workgroup.id.x()
  %rs = call ptr addrspace(8) @llvm.amdgcn.make.buffer.rsrc.p8.p1(ptr addrspace(1) %data, i16 0, i64 2048, i32 131072)
  %off = shl i32 %tid, 4
  %producer = icmp eq i32 %wg, 0
  br i1 %producer, label %produce, label %start
produce:
  %p0 = add i32 %tid, 1000
  %p1 = add i32 %tid, 2000
  %l0 = insertelement <4 x i32> <i32 0, i32 {TAG}, i32 0, i32 {TAG}>, i32 %p0, i32 0
  %line = insertelement <4 x i32> %l0, i32 %p1, i32 2
{put}  br label %done
start:
{wait}  %got = call <4 x i32> @llvm.amdgcn.raw.ptr.buffer.load.v4i32(ptr addrspace(8) %rs, i32 %off, i32 0, i32 {aux})
  %t0 = extractelement <4 x i32> %got, i32 1
  %t1 = extractelement <4 x i32> %got, i32 3
  %ok0 = icmp eq i32 %t0, {TAG}
  %ok1 = icmp eq i32 %t1, {TAG}
{far_read if far else ""}{accept}consume:
  %slot = mul i32 %wg, 64
  %i = add i32 %slot, %tid
  %po = getelementptr <4 x i32>, ptr addrspace(1) %out, i32 %i
  store <4 x i32> %got, ptr addrspace(1) %po
  br label %done
done:
  ret void
}}
""" + DECLS)


def launch(arch, ir, far=False):
    """out [9, 64, 4]: the line each reader thread accepted (the writer's row: -1).
    The readers start first (reverse order): they poll before the writer runs."""
    out = np.full((9, 64, 4), -1, np.int32)
    data = np.zeros((128 if far else 64, 4), np.int32)
    run(ir, arch, "ll", {"data": data, "flag": np.zeros(1, np.int32), "out": out},
        grid=(9,), block=(64,), machine=Machine(arch), order="reverse")
    new = np.stack([1000 + np.arange(64), np.full(64, TAG), 2000 + np.arange(64), np.full(64, TAG)], 1)
    assert (data[:64] == new).all() and (not far or (data[64:] == new).all())  # memory: the new lines
    return out[1:], new


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("pieces", [1, 2, "lanes"])
def test_a_reader_checking_every_tag_gets_the_line_whole(arch, pieces):
    out, new = launch(arch, ll_kernel("both", pieces))
    assert (out == new).all()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("check", ["low", "high"])
def test_a_reader_trusting_one_tag_of_a_torn_store_reads_stale_data(arch, check):
    """One dwordx4 store: its two 8-byte pieces perform apart, high first in even
    granules (lanes), low first in odd ones: a reader of either tag alone meets it."""
    out, new = launch(arch, ll_kernel(check, 1))
    half = 0 if check == "low" else 2  # the half whose tag was checked is new
    assert (out[:, :, half:half + 2] == new[:, half:half + 2]).all()
    other = 2 - half
    stale = (out[:, :, other] == 0).any(axis=0)
    assert stale.any(), "every reader got a whole line: the store was not torn"
    lanes = np.arange(64)
    # the stale other half: only in lanes whose checked piece performs first
    first = lanes % 2 == (1 if check == "low" else 0)
    assert not stale[~first].any() and stale[first].any()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("check", ["low", "high"])
def test_a_reader_trusting_one_tag_of_words_of_two_lanes_reads_stale_data(arch, check):
    """A dwordx2 a lane: one store instruction's lanes are no more one copy than a
    lane's pieces are. The line's halves, stored by neighbouring lanes, perform
    apart in the same order."""
    out, new = launch(arch, ll_kernel(check, "lanes"))
    half = 0 if check == "low" else 2
    assert (out[:, :, half:half + 2] == new[:, half:half + 2]).all()
    other = 2 - half
    stale = (out[:, :, other] == 0).any(axis=0)
    first = np.arange(64) % 2 == (1 if check == "low" else 0)
    assert not stale[~first].any() and stale[first].any()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("pieces", [1, 2])
def test_one_read_of_a_line_dirty_on_another_xcd_is_torn(arch, pieces):
    """The writer releases its line (written back to memory) and sets a flag by an
    atomic; readers on the other XCDs await the flag and read the line once with
    no acquire: each lane's first piece comes from its XCD's stale L2 (0), its
    later piece is the newest (the writer's). Never an 8-byte half torn, never
    the whole line either way. (A reader that awaits a flag must acquire: this
    is the read a tag check has to catch.)"""
    out, new = launch(arch, ll_kernel(pieces=pieces, flag=True))
    lanes = np.arange(64)
    high_first = lanes % 2 == 0  # even granules: the high piece is read first (oldest)
    for reader in range(8):
        got = out[reader]
        if reader == 7:  # workgroup 8 shares XCD 0's L2 with the writer: it sees the line whole
            assert (got == new).all()
            continue
        low_new = (got[:, :2] == new[:, :2]).all(axis=1)
        high_new = (got[:, 2:] == new[:, 2:]).all(axis=1)
        assert ((got[:, :2] == 0).all(axis=1) | low_new).all() and ((got[:, 2:] == 0).all(axis=1) | high_new).all()
        assert (low_new == high_first).all() and (high_new == ~high_first).all()


@pytest.mark.parametrize("arch", ARCHS)
def test_a_poll_of_several_loads_sees_every_line_it_waits_for(arch):
    """A reader polls two lines with two loads: a sleep makes coherent the lines of
    every L1-bypassing load its last s_waitcnt vmcnt(0) waited for, not only the
    last load's (else the first line stays dirty on XCD 0 until the launch ends)."""
    out, new = launch(arch, ll_kernel("both", far=True), far=True)
    assert (out == new).all()
