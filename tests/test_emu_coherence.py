"""The strict memory model's cache rules (k2back/emu/coherence.py), one at a time.

Workgroup 0 (XCD 0) stores 64 words and raises a flag; workgroups 1..8 (XCDs
1..7, and 8 on XCD 0 with the producer) poll the flag, sleeping between polls,
then read the words. What varies: the producer's release fence, the consumers'
acquire fence, the consumers' cache bits, an early read of the data before the
poll. Each case names exactly the consumers that must read the new words; the
others must read the old ones (0). The ideal memory gives every consumer the new
words in every case: the differences are the model's."""

import gc

import numpy as np
import pytest

from k2back.emu import Machine
from k2back.emu.coherence import L2, PrivateCache
from k2back.emu.testing import ARCHS, assemble, module, run, run_handwritten

DECLS = """
declare i32 @llvm.amdgcn.workitem.id.x()
declare i32 @llvm.amdgcn.workgroup.id.x()
declare void @llvm.amdgcn.s.barrier()
declare void @llvm.amdgcn.s.sleep(i32)
declare void @llvm.amdgcn.s.waitcnt(i32)
declare ptr addrspace(8) @llvm.amdgcn.make.buffer.rsrc.p8.p1(ptr addrspace(1), i16, i64, i32)
declare void @llvm.amdgcn.raw.ptr.buffer.store.i32(i32, ptr addrspace(8), i32, i32, i32)
declare i32 @llvm.amdgcn.raw.ptr.buffer.load.i32(ptr addrspace(8), i32, i32, i32)
declare i32 @llvm.amdgcn.s.buffer.load.i32(<4 x i32>, i32, i32)
"""
SC1 = 16  # the buffer intrinsics' cache-policy bits on gfx94x/95x (SPEC §4)
WAIT_VMCNT_0 = "  call void @llvm.amdgcn.s.waitcnt(i32 3952)\n"  # vmcnt 0, expcnt 7, lgkmcnt 15
CONSUMERS = range(1, 9)
SAME_XCD = {8}  # workgroup i runs on XCD i mod 8


def handoff(release="agent", acquire="agent", load_aux=SC1, early_read=False, flag_first=False,
            scalar=None):
    """The hand-off kernel. `release` / `acquire`: a fence scope or None (release
    "wait": only an s_waitcnt vmcnt(0), no write-back);
    `flag_first`: the flag store is issued before the release fence (the data's
    s_waitcnt); `scalar`: read the data with s_buffer_load (cache policy bits)."""
    fence = lambda order, scope: (WAIT_VMCNT_0 if scope == "wait" else
                                  f'  fence syncscope("{scope}") {order}\n' if scope else "")
    flag = '  store atomic i32 1, ptr addrspace(1) %flag syncscope("agent") monotonic, align 4\n'
    if scalar is None:
        read = lambda out: (f"  %{out} = call i32 @llvm.amdgcn.raw.ptr.buffer.load.i32("
                            f"ptr addrspace(8) %rs, i32 %off, i32 0, i32 {load_aux})")
    else:  # the early read takes word 1, the late one word 0: the same line, two loads
        read = lambda out: (f"  %{out} = call i32 @llvm.amdgcn.s.buffer.load.i32(<4 x i32> %desc, "
                            f"i32 {4 if out == 'e' else 0}, i32 {scalar})")
    return module(f"""
define amdgpu_kernel void @handoff(ptr addrspace(1) %data, ptr addrspace(1) %flag,
                                   ptr addrspace(1) %out, i32 %first) #0 {{
entry:
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  %base = ptrtoint ptr addrspace(1) %data to i64
  %base.lo = trunc i64 %base to i32
  %base.hi64 = lshr i64 %base, 32
  %base.hi = trunc i64 %base.hi64 to i32
  %desc.0 = insertelement <4 x i32> <i32 0, i32 0, i32 256, i32 131072>, i32 %base.lo, i32 0
  %desc = insertelement <4 x i32> %desc.0, i32 %base.hi, i32 1
  %wg = call i32 @llvm.amdgcn.workgroup.id.x()
  %rs = call ptr addrspace(8) @llvm.amdgcn.make.buffer.rsrc.p8.p1(ptr addrspace(1) %data, i16 0, i64 256, i32 131072)
  %off = shl i32 %tid, 2
  %slot = mul i32 %wg, 64
  %i = add i32 %slot, %tid
  %po = getelementptr i32, ptr addrspace(1) %out, i32 %i
  %producer = icmp eq i32 %wg, 0
  br i1 %producer, label %produce, label %early
produce:
  %v = add i32 %tid, %first
  call void @llvm.amdgcn.raw.ptr.buffer.store.i32(i32 %v, ptr addrspace(8) %rs, i32 %off, i32 0, i32 {SC1})
{flag if flag_first else ""}{fence("release", release)}{"" if flag_first else flag}  br label %done
early:
{read("e") if early_read else "  %e = add i32 0, 0"}
  store i32 %e, ptr addrspace(1) %po  ; keeps the early read before the poll
  br label %poll
poll:
  %f = load atomic i32, ptr addrspace(1) %flag syncscope("agent") monotonic, align 4
  %ready = icmp ne i32 %f, 0
  br i1 %ready, label %consume, label %sleep
sleep:
  call void @llvm.amdgcn.s.sleep(i32 1)
  br label %poll
consume:
{fence("acquire", acquire)}{read("d")}
  %de = add i32 %d, %e
  store i32 %de, ptr addrspace(1) %po
  br label %done
done:
  ret void
}}
""" + DECLS)


def launch(arch, ir, data, first, memory="strict"):
    """out [9, 64]: what each workgroup's threads read (the producer's row: -1).
    Consumers start first (reverse order): their early read and first polls come
    before the producer runs. The producer stores first + thread id."""
    out = np.full((9, 64), -1, np.int32)
    run(ir, arch, "handoff", {"data": data, "flag": np.zeros(1, np.int32), "out": out, "first": first},
        grid=(9,), block=(64,), machine=Machine(arch, memory=memory), order="reverse")
    assert (data == np.arange(64) + first).all()  # memory has the new words in the end
    return out


def fresh_consumers(arch, ir, new, memory="strict"):
    """The consumers that read the producer's words `new` (the others must read 0)."""
    out = launch(arch, ir, np.zeros(64, np.int32), 1000, memory)
    fresh = {c for c in CONSUMERS if (out[c] == new).all()}
    stale = {c for c in CONSUMERS if (out[c] == 0).all()}
    assert fresh | stale == set(CONSUMERS), out  # every consumer read one version, whole
    return fresh


CASES = {
    # release writes XCD 0's L2 back; acquire drops the consumers' stale L2 copies
    "release and acquire": ({}, set(CONSUMERS)),
    # without the acquire, other XCDs' L2s keep memory as it was when last invalidated
    "no acquire": ({"acquire": None}, SAME_XCD),
    "acquire at workgroup scope": ({"acquire": "workgroup"}, SAME_XCD),
    # waited for but not written back, the words stay dirty in XCD 0's L2
    "stores waited for, no release": ({"release": "wait"}, SAME_XCD),
    # a workgroup-scope release on gfx9 waits for nothing (no vmcnt): the flag, the
    # newest store, arrives before the words everywhere
    "release at workgroup scope": ({"release": "workgroup"}, set()),
    # plain loads go through the L1 too: buffer_inv sc1 drops it as well
    "plain loads, release and acquire": ({"load_aux": 0}, set(CONSUMERS)),
    # an early plain read leaves the line in the consumer's L1; without an acquire
    # even the same XCD reads it there
    "plain loads, early read, no acquire": ({"load_aux": 0, "early_read": True, "acquire": None}, set()),
    # sc1 loads bypass the L1
    "sc1 loads, early read, no acquire": ({"early_read": True, "acquire": None}, SAME_XCD),
    "plain loads, early read, acquire": ({"load_aux": 0, "early_read": True}, set(CONSUMERS)),
    # the scalar cache keeps what it read: buffer_inv does not drop it; glc bypasses
    # it. (LLVM takes s_buffer_load for readnone and issues the late one above the
    # acquire's buffer_inv: other XCDs then read their stale L2 lines either way.)
    "scalar loads, early read, acquire": ({"scalar": 0, "early_read": True}, set()),
    "scalar loads with glc, early read, acquire": ({"scalar": 1, "early_read": True}, SAME_XCD),
}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("case", CASES)
def test_which_consumers_read_the_new_words(arch, case):
    options, fresh = CASES[case]
    ir = handoff(**options)
    new = 1000 if "scalar" in options else np.arange(64) + 1000  # s_buffer_load reads word 0
    if options.get("early_read"):  # the early read and the late one are two loads
        loads = "s_buffer_load_dword " if "scalar" in options else "\tbuffer_load_dword "
        assert assemble(ir, arch).count(loads) == 2
    assert fresh_consumers(arch, ir, new) == fresh
    assert fresh_consumers(arch, ir, new, memory="ideal") == set(CONSUMERS)


# One wave: a scalar load fills the CU's scalar cache, a vector store changes the
# word (vector stores do not update the scalar cache), then three scalar loads:
# from the cache (stale), with glc (bypassing it), after s_dcache_inv.
SCALAR_CACHE = """
\ts_load_dwordx2 s[2:3], s[0:1], 0x0
\ts_waitcnt lgkmcnt(0)
\ts_load_dword s4, s[2:3], 0x0
\ts_waitcnt lgkmcnt(0)
\tv_mov_b32_e32 v1, 0
\tv_mov_b32_e32 v2, 7
\tglobal_store_dword v1, v2, s[2:3]
\ts_waitcnt vmcnt(0)
\ts_load_dword s5, s[2:3], 0x0
\ts_load_dword s6, s[2:3], 0x0 glc
\ts_waitcnt lgkmcnt(0)
\ts_dcache_inv
\ts_load_dword s7, s[2:3], 0x0
\ts_waitcnt lgkmcnt(0)
\tv_mov_b32_e32 v2, s5
\tv_mov_b32_e32 v3, s6
\tv_mov_b32_e32 v4, s7
\tglobal_store_dwordx3 v1, v[2:4], s[2:3] offset:4
\ts_waitcnt vmcnt(0)"""


@pytest.mark.parametrize("arch", ARCHS)
def test_the_scalar_cache_keeps_what_it_read(arch):
    for memory, want in (("strict", [7, 100, 7, 7]), ("ideal", [7, 7, 7, 7])):
        out = np.full(4, 100, np.uint32)
        run_handwritten(arch, SCALAR_CACHE, out, memory=memory)
        np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("arch", ARCHS)
def test_a_flag_stored_before_the_datas_waitcnt_arrives_first(arch):
    """The flag store issued before the release fence: one s_waitcnt retires both,
    newest first, and the flag reaches the sleeping consumers (started first, so
    they sleep on it) before the words leave the producer: every consumer reads 0."""
    ir, new = handoff(flag_first=True), np.arange(64) + 1000
    asm = assemble(ir, arch)
    flag_store, wait = asm.index("global_store_dword"), asm.index("s_waitcnt vmcnt(0)", asm.index("buffer_wbl2"))
    assert flag_store < wait  # the edit applied: the flag is issued before the data's wait
    assert fresh_consumers(arch, ir, new) == set()
    assert fresh_consumers(arch, ir, new, memory="ideal") == set(CONSUMERS)
    assert fresh_consumers(arch, handoff(), new) == set(CONSUMERS)


@pytest.mark.parametrize("arch", ARCHS)
def test_a_missing_acquire_reads_the_previous_launch(arch):
    """Launches share memory, not caches: without an acquire, the second launch's
    consumers on other XCDs read what memory held when it started (the first
    launch's words, written back at its end), the producer's XCD the new words."""
    ir, data = handoff(acquire=None), np.zeros(64, np.int32)
    first = launch(arch, ir, data, 1000)
    np.testing.assert_array_equal(first[8], np.arange(64) + 1000)
    assert (first[1:8] == 0).all()
    second = launch(arch, ir, data, 2000)
    np.testing.assert_array_equal(second[8], np.arange(64) + 2000)
    np.testing.assert_array_equal(second[1:8], np.broadcast_to(np.arange(64) + 1000, (7, 64)))


def test_a_launch_leaves_no_cache_cycles_for_the_collector():
    """At its end a strict launch's caches are freed by reference count: none of
    its L2s or CU caches is left in a reference cycle (cyclic garbage costs
    every later collection a walk of the process's objects, torch's too)."""
    ir = handoff(scalar=0, early_read=True)  # vector and scalar caches hold lines
    launch("gfx942", ir, np.zeros(64, np.int32), 1000)  # compile outside the count
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        launch("gfx942", ir, np.zeros(64, np.int32), 1000)
        gc.collect()
        caches = [type(o).__name__ for o in gc.garbage if isinstance(o, (PrivateCache, L2))]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if enabled:
            gc.enable()
    assert caches == []


def test_an_overlays_waiting_puts_act_as_done_at_once():
    """An L2 receives memory's old bytes of a write-back as waiting puts (Overlay.put_later),
    done when the page is next looked at: after any mix of reads, drops, takes and
    later puts it holds what eager missing-only puts would have made it hold."""
    from k2back.emu.coherence import LINE_BITS, PAGE_BITS, Overlay

    rng = np.random.default_rng(12)
    span = 3 << PAGE_BITS  # three pages, so puts cross pages and pages wait apart
    for trial in range(40):
        lazy, eager = Overlay(), Overlay()
        for step in range(60):
            start = int(rng.integers(0, span - 600))
            flat = (1 << 20) + start + np.sort(rng.choice(600, int(rng.integers(1, 300)), replace=False))
            values = rng.integers(0, 256, flat.size, dtype=np.uint8)
            action = rng.choice(["later", "put", "apply", "drop", "drop_line", "take_line", "take",
                                 "lines", "has_page"], p=[.4, .1, .15, .1, .05, .05, .05, .05, .05])
            if action == "later":
                lazy.put_later(Overlay.by_page(flat, values))
                eager.put(flat, values, missing_only=True)
            elif action == "put":
                missing_only = bool(rng.integers(2))
                lazy.put(flat, values, missing_only)
                eager.put(flat, values, missing_only)
            elif action == "apply":
                seen_lazy, seen_eager = values.copy(), values.copy()
                assert lazy.apply(flat, seen_lazy) == eager.apply(flat, seen_eager)
                np.testing.assert_array_equal(seen_lazy, seen_eager)
            elif action in ("drop", "take"):
                results = [getattr(o, action)(flat) for o in (lazy, eager)]
                if action == "take":
                    assert (results[0] is None) == (results[1] is None)
                    if results[0] is not None:
                        for a, b in zip(*results):
                            np.testing.assert_array_equal(a, b)
            elif action in ("drop_line", "take_line"):
                results = [getattr(o, action)(int(flat[0]) >> LINE_BITS) for o in (lazy, eager)]
                if action == "take_line":
                    assert (results[0] is None) == (results[1] is None)
                    if results[0] is not None:
                        for a, b in zip(*results):
                            np.testing.assert_array_equal(a, b)
            elif action == "lines":
                np.testing.assert_array_equal(np.unique(lazy.lines()), np.unique(eager.lines()))
            else:
                line = int(flat[0]) >> LINE_BITS
                assert lazy.has_page(line) == eager.has_page(line), (trial, step)
            assert bool(lazy) == bool(eager), (trial, step, action)
        everything = (1 << 20) + np.arange(span)
        held_lazy, held_eager = np.zeros(span, np.uint8), np.zeros(span, np.uint8)
        assert lazy.apply(everything, held_lazy) == eager.apply(everything, held_eager)
        np.testing.assert_array_equal(held_lazy, held_eager)


def test_among_is_isin():
    """coherence.among (which bytes of a store a newer store of the same s_waitcnt
    wrote) by a table over close addresses, np.isin over far ones."""
    from k2back.emu.coherence import among

    rng = np.random.default_rng(7)
    for spread in (16, 600, 5000, 1 << 40):
        for _ in range(30):
            base = int(rng.integers(1 << 32, 1 << 33))
            values = base + rng.integers(0, spread, int(rng.integers(1, 400)))
            others = base + rng.integers(-spread // 4, spread + spread // 4, int(rng.integers(1, 400)))
            np.testing.assert_array_equal(among(values, others), np.isin(values, others))


@pytest.mark.parametrize("arch", ARCHS)
def test_a_newer_store_overlapping_an_older_one_wins_at_the_write_back(arch):
    """Each lane stores a dword at 8 i + 4, then (after the first performed) a dwordx2
    at 8 i with other words: the kernel-end write-back of the L2 must leave the newer
    bytes, though the newer store starts lower (3cc5b33 left the older ones)."""
    body = """\ts_load_dwordx2 s[2:3], s[0:1], 0x0
\ts_waitcnt lgkmcnt(0)
\tv_lshlrev_b32_e32 v1, 3, v0
\tv_mov_b32_e32 v2, 1
\tglobal_store_dword v1, v2, s[2:3] offset:4
\ts_waitcnt vmcnt(0)
\tv_mov_b32_e32 v2, 2
\tv_mov_b32_e32 v3, 3
\tglobal_store_dwordx2 v1, v[2:3], s[2:3]
\ts_waitcnt vmcnt(0)"""
    for memory in ("strict", "ideal"):
        out = np.zeros(128, np.uint32)
        run_handwritten(arch, body, out, memory=memory)
        np.testing.assert_array_equal(out, np.tile([2, 3], 64), err_msg=memory)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("wide_first", [False, True])
def test_overlapping_stores_retired_by_one_waitcnt_leave_the_newer_bytes(arch, wide_first):
    """Two stores of a wave whose bytes overlap, retired by one s_waitcnt (performed
    together, in whatever order): memory ends with the newer store's bytes where
    they overlap, as in the ideal memory (each lane: a dword at 8 i + 4 and a
    dwordx2 at 8 i, in either order), then a write-back and a kernel end."""
    dword = "\tglobal_store_dword v1, v2, s[2:3] offset:4\n"
    pair = "\tglobal_store_dwordx2 v1, v[3:4], s[2:3]\n"
    body = ("\ts_load_dwordx2 s[2:3], s[0:1], 0x0\n\ts_waitcnt lgkmcnt(0)\n"
            "\tv_lshlrev_b32_e32 v1, 3, v0\n\tv_mov_b32_e32 v2, 1\n"
            "\tv_mov_b32_e32 v3, 2\n\tv_mov_b32_e32 v4, 3\n"
            + (pair + dword if wide_first else dword + pair) + "\tbuffer_wbl2 sc1\n\ts_waitcnt vmcnt(0)")
    results = {}
    for memory in ("ideal", "strict"):
        out = np.zeros(128, np.uint32)
        run_handwritten(arch, body, out, memory=memory)
        results[memory] = out
    np.testing.assert_array_equal(results["ideal"], np.tile([2, 1] if wide_first else [2, 3], 64))
    np.testing.assert_array_equal(results["strict"], results["ideal"])


def test_a_take_of_queued_puts_returns_the_newest_bytes():
    """Overlay.take of plain puts still queued: where two overlap, the newer put's
    bytes, whichever starts lower; apart and ascending, their bytes in address order."""
    from k2back.emu.coherence import Overlay

    older, newer = np.arange(100, 140), np.arange(90, 120)
    overlay = Overlay()
    overlay.put(older, np.full(older.size, 1, np.uint8))
    overlay.put(newer, np.full(newer.size, 2, np.uint8))
    flat, values = overlay.take()
    np.testing.assert_array_equal(flat, np.arange(90, 140))
    np.testing.assert_array_equal(values, np.where(np.arange(90, 140) < 120, 2, 1))
    overlay.put(np.arange(300, 310), np.full(10, 3, np.uint8))
    overlay.put(np.arange(200, 210), np.full(10, 4, np.uint8))
    flat, values = overlay.take()
    np.testing.assert_array_equal(flat, np.r_[200:210, 300:310])
    np.testing.assert_array_equal(values, np.r_[[4] * 10, [3] * 10])


def test_an_overlay_holds_what_a_byte_map_would():
    """Overlay (pages, waiting missing-only puts, queued plain puts) against a dict of
    address -> byte: after any mix of puts, reads, drops and takes it holds the same
    bytes, and takes return the newest put of each address in address order."""
    from k2back.emu.coherence import LINE_BITS, PAGE_BITS, Overlay

    rng = np.random.default_rng(7)
    span = 3 << PAGE_BITS
    for trial in range(40):
        overlay, held = Overlay(), {}
        for step in range(60):
            start = int(rng.integers(0, span - 600))
            action = rng.choice(["put", "missing", "later", "apply", "drop", "drop_line", "take_line",
                                 "take", "take_all", "lines"], p=[.3, .1, .1, .1, .1, .05, .05, .05, .1, .05])
            # unsorted; a store's or an atomic's lanes may repeat an address, memory's bytes
            # (a write-back's, a line's) not
            repeats = action in ("put", "apply", "take")
            flat = (1 << 20) + start + rng.choice(600, int(rng.integers(1, 300)), replace=repeats)
            values = rng.integers(0, 256, flat.size, dtype=np.uint8)
            where = f"trial {trial} step {step} {action}"
            if action == "put":
                overlay.put(flat, values)
                held.update(zip(flat.tolist(), values.tolist()))
            elif action in ("missing", "later"):
                if action == "later":
                    overlay.put_later(Overlay.by_page(flat, values))
                else:
                    overlay.put(flat, values, missing_only=True)
                for address, value in zip(flat.tolist(), values.tolist()):
                    held.setdefault(address, value)
            elif action == "apply":
                seen = values.copy()
                expect = np.array([held.get(a, v) for a, v in zip(flat.tolist(), values.tolist())], np.uint8)
                assert overlay.apply(flat, seen) == sum(a in held for a in flat.tolist()), where
                np.testing.assert_array_equal(seen, expect, err_msg=where)
            elif action in ("drop", "drop_line", "take_line", "take", "take_all"):
                if action.endswith("_line"):
                    line = int(flat[0]) >> LINE_BITS
                    gone = [a for a in held if a >> LINE_BITS == line]
                    assert overlay.may_hold_line(line) or not gone, where
                    result = getattr(overlay, action)(line)
                else:
                    gone = list(held) if action == "take_all" else sorted(set(flat.tolist()) & held.keys())
                    result = (overlay.take() if action == "take_all" else
                              overlay.take(flat) if action == "take" else overlay.drop(flat))
                taken = sorted((a, held.pop(a)) for a in gone)
                if action.startswith("take"):
                    assert (result is None) == (not taken), where
                    if taken:  # each address once, in address order
                        np.testing.assert_array_equal(result[0], [a for a, _ in taken], err_msg=where)
                        np.testing.assert_array_equal(result[1], [v for _, v in taken], err_msg=where)
            else:
                np.testing.assert_array_equal(np.unique(overlay.lines()),
                                              sorted({a >> LINE_BITS for a in held}), err_msg=where)


def test_a_store_wakes_the_sleepers_on_its_line_in_the_order_they_polled():
    """The waves sleeping on a polled line are kept in the order they polled, not
    in the order of their hashes (a set's: ids, which vary from run to run): a
    store to the line refreshes their CUs' caches and wakes them in poll order.
    The sleepers here hash in the reverse of their poll order, so a set would
    wake them backwards."""
    from types import SimpleNamespace

    from k2back.emu.coherence import StrictMemory
    from k2back.emu.memory import GlobalMemory

    class Sleeper:
        def __init__(self, key, cu, addresses):
            self.key, self.group = key, SimpleNamespace(cu=cu)
            self.last_load, self.bypass_loads, self.polled_lines = (addresses, 4), [], ()

        def __hash__(self):
            return self.key

    memory = GlobalMemory()
    flag = memory.map(np.zeros(64, np.uint32), "flag")
    woken = []
    mem = StrictMemory(memory, woken.append)
    # workgroups on several XCDs, two of them sharing one (0 and 8, 1 and 9)
    cus = [mem.cu(workgroup) for workgroup in (3, 0, 9, 5, 8, 1, 2, 7)]
    sleepers = [Sleeper(len(cus) - i, cu, np.array([flag + 4 * i], np.uint64)) for i, cu in enumerate(cus)]
    for w in sleepers:
        mem.poll(w)
    assert list(mem.polled[flag >> 7]) == sleepers
    mem.unpoll(sleepers[2])  # it polls again: last
    mem.poll(sleepers[2])
    order = sleepers[:2] + sleepers[3:] + sleepers[2:3]
    flat = flag + np.arange(4, dtype=np.int64)
    assert mem.store(mem.cu(4), flat, np.ones(4, np.uint8))
    assert woken == order


def test_polled_between_is_whether_a_polled_line_lies_in_the_range():
    """StrictMemory.polled_between (whether a store may reach a sleeper: by the
    range's lines or by the polled lines, whichever are fewer) against a scan."""
    from k2back.emu.coherence import StrictMemory
    from k2back.emu.memory import GlobalMemory

    rng = np.random.default_rng(3)
    mem = StrictMemory(GlobalMemory(), lambda w: None)
    for _ in range(300):
        mem.polled = {int(line): {} for line in rng.integers(0, 64, int(rng.integers(0, 12)))}
        first = int(rng.integers(0, 64))
        last = first + int(rng.integers(0, 20))
        assert mem.polled_between(first, last) == any(first <= line <= last for line in mem.polled)


class _Wave:
    """A wave as StrictMemory sees it."""

    def __init__(self, name, cu):
        from types import SimpleNamespace

        self.group, self.name = SimpleNamespace(cu=cu), name
        self.bypass_loads, self.last_load, self.polled_lines = [], None, ()


def _replay(actions, reference, where=""):
    """Run `actions` [(action, wave, byte offsets, values, through_l1, l1, l2)] on a
    StrictMemory and on `reference` (a subclass): every read, wake-up, counter and
    memory's bytes in the end must agree. Waves 0 and 1 are two waves of
    workgroup 0 (one CU), 2..4 workgroups 1, 8 (the XCD of 0) and 3."""
    from k2back.emu.coherence import StrictMemory
    from k2back.emu.memory import ATOMICS, GlobalMemory

    who = lambda: "test"
    sides = []
    for cls in (StrictMemory, reference):
        memory = GlobalMemory()
        data = np.arange(384, dtype=np.uint8)  # three lines: accesses meet often
        base = memory.map(data, "buf")
        woken = []
        mem = cls(memory, lambda w, woken=woken: woken.append(w.name))
        cus = {g: mem.cu(g) for g in (0, 1, 8, 3)}
        waves = [_Wave(f"workgroup {g} wave {i}", cus[g]) for i, g in enumerate((0, 0, 1, 8, 3))]
        sides.append((mem, memory, data, base, waves, woken, []))
    for step, (action, k, offsets, values, through_l1, l1, l2) in enumerate(actions):
        for mem, memory, data, base, waves, woken, seen in sides:
            w = waves[k]
            addresses = None if offsets is None else (offsets + base).astype(np.uint64)
            if action == "store":
                mem.touch(addresses, 1, who)
                if mem.store(w.group.cu, addresses.astype(np.int64), values):
                    seen.append(("woke", list(woken)))
            elif action == "writeback":
                mem.writeback(w.group.cu, True)
            elif action == "invalidate":
                mem.invalidate(w.group.cu, l1, l2)
            elif action == "scalar_invalidate":
                mem.invalidate_scalar(w.group.cu)
            elif action == "load":
                seen.append(mem.load(w, addresses, 1, who, through_l1).copy())
                w.last_load = (addresses, 1)
            elif action == "scalar":
                region = memory.region_of(int(addresses[0]), 16, who)
                seen.append(mem.load_scalar(w, region, int(addresses[0]) - base, 16, through_l1).copy())
            elif action == "atomic":
                word = addresses[:1] & ~np.uint64(3)
                seen.append(mem.atomic(w, word, np.dtype(np.uint32), ATOMICS["add"], [np.ones(1, np.uint32)],
                                       who).copy())
            elif w.last_load is not None:
                mem.poll(w)
        here = f"{where} step {step} {action}"
        (mine, *_, mine_seen), (theirs, *_, theirs_seen) = sides
        assert len(mine_seen) == len(theirs_seen), here
        for a, b in zip(mine_seen, theirs_seen):
            if isinstance(a, tuple):
                assert a == b, here
            else:
                np.testing.assert_array_equal(a, b, err_msg=here)
        assert (mine.written_back, mine.stale_bytes) == (theirs.written_back, theirs.stale_bytes), here
    for mem, *_ in sides:
        mem.end()
    np.testing.assert_array_equal(sides[0][2], sides[1][2], err_msg=where)


def test_a_poll_after_one_of_its_cu_on_its_lines_with_nothing_between_changes_nothing():
    """A poll makes its lines coherent for its CU (write-backs, its caches' copies
    dropped); a wave of the same CU polling the same lines with no memory access
    between (the waves of a workgroup at one s_sleep, in lock-step) has nothing
    left to do (StrictMemory._refreshed). After any mix of stores, write-backs,
    invalidations, loads, atomics and polls, every read, counter and memory are
    those of every poll doing it all."""
    from k2back.emu.coherence import StrictMemory

    class EveryPoll(StrictMemory):
        def poll(self, w):
            self._refreshed = None
            super().poll(w)

    rng = np.random.default_rng(5)
    kinds = ["store", "writeback", "invalidate", "scalar_invalidate", "load", "scalar", "atomic", "poll"]
    for trial in range(60):
        actions = []
        for _ in range(60):
            start = int(rng.integers(0, 384 - 64))
            offsets = np.sort(rng.choice(64, int(rng.integers(1, 16)), replace=False)) + start
            kind = rng.choice(kinds, p=[.2, .1, .1, .05, .2, .05, .05, .25])
            wave = int(rng.integers(2)) if kind == "poll" and rng.integers(2) else int(rng.integers(5))
            actions.append((kind, wave, offsets, rng.integers(0, 256, offsets.size, dtype=np.uint8),
                            *(bool(b) for b in rng.integers(2, size=3))))
        _replay(actions, EveryPoll, f"trial {trial}")


@pytest.mark.parametrize("event", ["store", "store here", "writeback", "atomic", "invalidate", "load", "scalar",
                                   "scalar_invalidate", "none"])
def test_a_poll_after_one_of_its_cu_does_it_all_again_after_any_access(event):
    """Waves 0 and 1 of workgroup 0 load one line, wave 0 polls it, then `event`
    (workgroup 1 on another XCD stores into the line and writes back, ...), then
    wave 1 polls it and both read it: as when every poll does it all."""
    from k2back.emu.coherence import StrictMemory

    class EveryPoll(StrictMemory):
        def poll(self, w):
            self._refreshed = None
            super().poll(w)

    line, ones = np.arange(0, 128, 8), np.full(16, 7, np.uint8)
    act = lambda kind, wave, offsets=line, values=None, l1=False, l2=False: (
        kind, wave, offsets, values, True, l1, l2)
    before = [act("store", 3, values=ones), act("writeback", 3), act("load", 0), act("load", 1),
              act("store", 2, values=ones + 1)]  # workgroup 8 (XCD 0) reads the line, workgroup 1 stores it
    between = {"store": [act("store", 2, values=ones + 2)], "store here": [act("store", 3, values=ones + 3)],
               "writeback": [act("writeback", 2)], "atomic": [act("atomic", 2)],
               "invalidate": [act("invalidate", 3, l1=True, l2=True)], "load": [act("load", 3)],
               "scalar": [act("scalar", 3)], "scalar_invalidate": [act("scalar_invalidate", 0)], "none": []}[event]
    after = [act("poll", 1), act("load", 0), act("load", 1), act("load", 3), act("poll", 0), act("load", 0)]
    _replay([*before, act("poll", 0), *between, *after], EveryPoll, event)
