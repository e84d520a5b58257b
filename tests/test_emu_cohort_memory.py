"""Memory instructions run once over a cohort of waves (machine.Machine._run_cohort:
a closure's `cohort` form, s_endpgm's `over`) against the same closures run wave
by wave: SMEM loads (memops.decode_smem: load_over), `s_waitcnt lgkmcnt`
(machine.decode_control: inflight.retire_lgkm_over) and s_endpgm of waves with
memory instructions outstanding (machine.decode_control: end_all), on random
queues, caches and memory, then the same probes of what every cache shows; and
whole launches with every cohort form taken away."""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest

from k2back.emu import inflight
from k2back.emu import machine as machine_module
from k2back.emu.asm import parse_instruction
from k2back.emu.memops import decode_smem
from k2back.emu.state import Wave
from k2back.emu.testing import ARCHS, handwritten

WORDS = 256  # each buffer's size in words


class Group:
    """A workgroup as the closures see it (hashable: the machine keeps sets of them)."""

    def __init__(self, **fields):
        self.__dict__.update(fields)


class World:
    """A launch's memory without a launch: two mapped buffers (`quiet`, as the
    kernargs, no store touches it; `busy`, which stores touch), CUs of
    `workgroups` workgroups (two of them on each XCD's L2 for 10 or more), and
    history in the caches: scalar caches that read both buffers, stores into
    `busy` before (stale copies, dirty lines)."""

    def __init__(self, seed: int, memory: str = "strict", workgroups: int = 10):
        g = np.random.default_rng(seed)
        self.machine = machine_module.Machine("gfx942", memory=memory)
        self.arrays = [g.integers(0, 2**32, WORDS, dtype=np.uint32) for _ in range(2)]
        self.quiet, self.busy = (self.machine.map(a, name) for a, name in zip(self.arrays, ("quiet", "busy")))
        self.woken = []
        self.mem = machine_module.MEMORY[memory](self.machine.memory, self.woken.append)
        self.ctx = machine_module.DecodeContext(self.machine, SimpleNamespace(labels={}), 4,
                                                machine_module.Stats(), self.mem)
        self.groups = [Group(index=i, cu=self.mem.cu(i), live=8, arrived=0, waves=[]) for i in range(workgroups)]
        busy = self.machine.memory.region_of(self.busy, 4, None)
        for group in self.groups[::3]:  # scalar caches that read the busy buffer whole, before any store
            self.mem.load_scalar(self._wave(group, member=False), busy, 0, 16, True)
        for k, group in enumerate(self.groups[1::2]):  # stores into it: dirty lines, stale copies
            self.store(group.cu, self.busy + 64 * k + g.integers(0, 16) * 4, g.integers(0, 2**32, 4))

    def _wave(self, group, member: bool = True):
        w = Wave()
        w.group, w.index = group, len(group.waves) if member else -1
        w.s = [0] * 128
        w.pc = w.pending = w.unperformed = w.lds_unperformed = w.polls = 0
        w.polled_lines, w.bypass_loads, w.last_load, w.done, w.waiting = (), [], None, False, False
        if member:
            group.waves.append(w)
        return w

    def waves(self, count: int, seed: int) -> list[Wave]:
        """`count` waves, runs of them of one workgroup (one CU), in workgroup order."""
        g = random.Random(seed)
        per = sorted(g.randrange(len(self.groups)) for _ in range(count))
        return [self._wave(self.groups[i]) for i in per]

    def store(self, cu, address: int, words) -> None:
        addresses = np.array([address], np.uint64)
        self.mem.touch(addresses, 4 * len(words), lambda: "test")
        flat = (address + np.arange(4 * len(words))).astype(np.int64)
        self.mem.store(cu, flat, np.asarray(words, "<u4").view(np.uint8).copy())

    def probes(self) -> list:
        """What every CU's scalar cache shows of both buffers after a store into the
        quiet one from each XCD (a CU holding it saves its old bytes), the
        counters, and memory after the end-of-kernel write-back."""
        seen = []
        for k, group in enumerate(self.groups[:8]):
            self.store(group.cu, self.quiet + 4 * k, [k + 1])
        for group in self.groups:
            for base in (self.quiet, self.busy):
                region = self.machine.memory.region_of(base, 4, None)
                seen.append(self.mem.load_scalar(self._wave(group, member=False), region, 0, 4 * WORDS,
                                                 True).tolist())
        # (not StrictMemory.changes: only whether it moved matters, and load_over moves it once
        # for a run of one CU's loads of an address)
        seen.append((self.mem.stale_bytes, self.mem.written_back))
        self.mem.end()
        return seen + [a.tolist() for a in self.arrays]


def queues(ws) -> list:
    return [(w.pending, [(op.ins, op.dst, op.kind, op.done) for op in w.vm],
             [(op.ins, op.dst, op.kind, op.done) for op in w.lds], [(op.ins, op.dst) for op in w.smem],
             w.unperformed, w.lds_unperformed, w.done, w.pc) for w in ws]


SMEM_LOADS = ["s_load_dwordx2 s[4:5], s[0:1], 0x8", "s_load_dwordx4 s[8:11], s[0:1], s3",
              "s_load_dword s6, s[0:1], 0x10 glc", "s_load_dwordx2 s[4:5], s[0:1], s3 offset:0x4",
              "s_load_dwordx8 s[12:19], s[0:1], 0x0"]


def _smem_world(seed: int, text: str, memory: str = "strict"):
    world = World(seed, memory)
    g = random.Random(seed)
    ws = world.waves(40, seed)
    for w in ws:  # runs of waves with one address, from one CU and from several
        base = world.quiet if g.random() < 0.6 else world.busy
        if g.random() < 0.5 and w.index:
            w.s[:] = w.group.waves[w.index - 1].s
        elif g.random() < 0.3 and ws.index(w):
            w.s[:] = ws[ws.index(w) - 1].s
        else:
            w.s[0], w.s[1], w.s[3] = base & 0xFFFFFFFF, base >> 32, 4 * g.randrange(8)
        if g.random() < 0.3:  # an older SMEM load of some of its registers outstanding
            older = parse_instruction("s_load_dwordx4 s[4:7], s[0:1], 0x0", 1)
            inflight.issue_smem(w, older, 0xF << (inflight.SGPR_BIT + 4))
    return world, ws, decode_smem(parse_instruction(text, 2), world.ctx)


@pytest.mark.parametrize("text", SMEM_LOADS)
@pytest.mark.parametrize("memory", ["strict", "ideal"])
def test_an_smem_load_over_a_cohort_is_the_load_of_each_wave(text, memory):
    for seed in range(4):
        sides = []
        for cohort in (True, False):
            world, ws, load = _smem_world(seed, text, memory)
            if cohort:
                load.cohort(ws)
            else:
                for w in ws:
                    load(w)
            counters = (world.ctx.stats.cache_policy, [r.read for r in world.machine.memory.regions])
            sides.append(([w.s for w in ws], queues(ws), counters, world.probes()))
        assert sides[0] == sides[1]


@pytest.mark.parametrize("queue", ["vm", "lds", "smem"])
def test_a_later_load_leaves_the_load_it_shares_with_other_waves(queue):
    """The waves of a batch or a cohort share one Load (inflight.issue_over: a vector
    load, an LDS read, an SMEM load); a wave's later load of some of its registers
    takes them over in its own queue only; a wave with exec 0 returns to none of
    a vector or LDS load's registers."""
    ws = []
    for k in range(6):
        w = Wave()
        w.pending, w.exec = 0, 0 if k == 3 else 1
        ws.append(w)
    inflight.issue_over(ws, queue, "first", 0xF0, masked=queue != "smem")
    issue = {"vm": inflight.issue_vm, "lds": inflight.issue_lds, "smem": inflight.issue_smem}[queue]
    issue(ws[0], "later", 0x30)
    issue(ws[3], "later", 0x30)
    mine = [[(op.ins, op.dst) for op in getattr(w, queue)] for w in ws]
    blank = 0xF0 if queue == "smem" else 0
    assert mine[0] == [("first", 0xC0), ("later", 0x30)]
    assert mine[3] == [("first", blank & ~0x30), ("later", 0x30)]
    assert mine[1:3] + mine[4:] == [[("first", 0xF0)]] * 4
    assert [w.pending for w in ws] == [0xF0, 0xF0, 0xF0, blank | 0x30, 0xF0, 0xF0]


def _waiting_waves(seed: int, world: World, storing: bool):
    """Waves with random vector memory (loads; with `storing`, a store or write-back
    in some), LDS (LDS stores not performed yet, which record the order they
    perform in) and SMEM queues, some empty."""
    g = random.Random(seed)
    log, ws = [], []
    for k in range(30):
        w = Wave()
        w.group = world.groups[k % len(world.groups)]
        w.pending = w.lds_unperformed = w.unperformed = w.pc = 0
        w.done = False
        for n in range(g.choice((0, 0, 1, 2, 5))):
            if storing and g.random() < 0.1:
                flat = np.arange(world.busy + 8 * k, world.busy + 8 * k + 4, dtype=np.int64)
                world.mem.touch(np.array([flat[0]], np.uint64), 4, lambda: "test")
                inflight.issue_store(w, f"store {k}.{n}", world.mem, flat, np.full(4, k, np.uint8))
            elif storing and g.random() < 0.05:
                inflight.issue_writeback(w, f"buffer_wbl2 {k}.{n}", world.mem, True)
            else:
                inflight.issue_vm(w, f"load {k}.{n}", g.getrandbits(6) << 6 * n)
        for n in range(g.choice((0, 0, 1, 2, 4))):
            if g.random() < 0.4:
                op = inflight.Op(f"ds_write {k}.{n}", inflight.LDS_STORE, done=False)
                op.perform = (log.append, ((k, n),))
                w.lds_unperformed += 1
                w.lds.append(op)
            else:
                inflight.issue_lds(w, f"ds_read {k}.{n}", g.getrandbits(8) << 8 * n)
        for n in range(g.choice((0, 1, 1, 3))):
            inflight.issue_smem(w, f"s_load {k}.{n}", g.getrandbits(6) << inflight.SGPR_BIT + 6 * n)
        ws.append(w)
    return ws, log


WAITS = ["s_waitcnt lgkmcnt(0)", "s_waitcnt lgkmcnt(1)", "s_waitcnt lgkmcnt(3)", "s_waitcnt vmcnt(0)",
         "s_waitcnt vmcnt(2)", "s_waitcnt vmcnt(1) lgkmcnt(0)", "s_waitcnt vmcnt(0) lgkmcnt(2)", "s_waitcnt 0",
         "s_waitcnt expcnt(0)"]


@pytest.mark.parametrize("text", WAITS)
@pytest.mark.parametrize("storing", [False, True])
def test_a_wait_over_a_cohort_is_the_wait_of_each_wave(text, storing):
    """Where a wave has a store or write-back to perform the cohort form declines
    (True), having changed nothing, and the waves wait one by one (Machine._run_cohort)."""
    declined = 0
    for seed in range(8):
        sides = []
        for cohort in (True, False):
            world = World(seed)
            wait = machine_module.decode_control(parse_instruction(text, 1), world.ctx)
            ws, log = _waiting_waves(seed, world, storing)
            world.machine._progress = False
            signals = []
            if cohort and getattr(wait, "cohort", None) is not None:
                before = (queues(ws), list(log))
                if wait.cohort(ws):
                    assert (queues(ws), log, world.machine._progress) == (*before, False)
                    declined += 1
                    cohort = False
            if not cohort:
                signals = [wait(w) for w in ws]
            sides.append((queues(ws), log, world.machine._progress, signals, world.probes()))
        assert sides[0][:3] == sides[1][:3] and sides[0][4:] == sides[1][4:]
        assert set(sides[1][3]) == {None}
    assert declined or not storing or "vmcnt" not in text and text != "s_waitcnt 0"
    assert hasattr(wait, "cohort") == (text != "s_waitcnt expcnt(0)")


def _ending_world(seed: int):
    """Waves of several workgroups at s_endpgm with stores (several bytes alike across
    waves and XCDs: which performs last shows), write-backs, loads outstanding, or
    none; from a point on (none, in some seeds) also waves with LDS operations
    outstanding, waves of workgroups waiting at a barrier, and waves sleeping on
    a line of the busy buffer's first two, which some stores reach."""
    world = World(seed, workgroups=12)
    g = random.Random(seed)
    ws = world.waves(48, seed)
    cut = g.choice((12, 24, 36, 48))  # the first wave that may be any
    store = parse_instruction("global_store_dword v0, v1, s[0:1]", 3)
    for k, w in enumerate(ws):
        kinds = g.choice(["none", "none", "store", "store", "stores", "load", "wb", "lds", "mixed"])
        if kinds == "lds" and k < cut:
            kinds = "store"
        for n in range({"none": 0, "stores": 3, "mixed": 4}.get(kinds, 1)):
            kind = kinds if kinds not in ("stores", "mixed") else g.choice(["store", "load", "wb"])
            if kind == "store":  # now and then into the lines sleepers poll
                line = g.randrange(2) if g.random() < 0.2 else g.randrange(2, 8)
                start = world.busy + 128 * line + 4 * g.randrange(4) + g.choice((0, 0, 2))
                flat = (start + np.arange(4 * g.choice((1, 1, 3)))).astype(np.int64)
                world.mem.touch(np.array([start], np.uint64), flat.size, lambda: "test")
                values = np.frombuffer(g.randbytes(flat.size), np.uint8).copy()
                inflight.issue_store(w, store, world.mem, flat, values)
            elif kind == "load":
                inflight.issue_vm(w, "load", g.getrandbits(4) << 4 * n)
            elif kind == "wb":
                inflight.issue_writeback(w, "buffer_wbl2", world.mem, g.random() < 0.7)
            else:
                inflight.issue_lds(w, "ds_read", 1)
        if k >= cut and g.random() < 0.1:
            w.group.arrived = 1
    sleepers = [w for w in ws[cut:] if not w.vm and not w.lds and g.random() < 0.5]
    for w in sleepers:
        address = world.busy + 128 * g.randrange(2) + 4 * g.randrange(4)
        w.last_load = (np.array([address], np.uint64), 4)
        world.mem.poll(w)
    return world, ws


def _ends(make) -> tuple:
    """(what the waves of `make`() are left with after s_endpgm over the cohort, the
    same wave by wave, as Machine._run_cohort runs them: their queues, the
    workgroups that performed stores, those still live, the waves woken, the
    probes of every cache and memory), and how many end_all left."""
    sides = []
    for cohort in (True, False):
        world, ws = make()
        end = machine_module.decode_control(parse_instruction("s_endpgm", 4), world.ctx)
        performed, after = set(), 9
        going = end.over(ws, after, performed) if cohort else ws
        signals = []
        for w in going:
            w.pc = after
            unperformed = w.unperformed
            signals.append(end(w))
            if w.unperformed < unperformed:
                performed.add(w.group)
        lives = [(g.live, g.arrived) for g in world.groups]
        woken = [(w.group.index, w.index) for w in world.woken]
        sides.append((queues(ws), sorted(g.index for g in performed), lives, woken, world.probes(),
                      world.machine._progress, signals.count("retry")))
        if cohort:
            left = len(going)
    return sides, left


@pytest.mark.parametrize("seed", range(12))
def test_an_end_over_a_cohort_is_the_end_of_each_wave(seed):
    sides, left = _ends(lambda: _ending_world(seed))
    assert sides[0][:-1] == sides[1][:-1]
    assert left < 48  # end_all ended some waves itself


def test_a_store_in_pieces_that_reaches_a_sleeper_ends_wave_by_wave():
    """Its first piece wakes the sleeper, which runs before the second performs (a
    retry): end_all leaves it, and the store of the wave after it, to `end`."""
    def make():
        world = World(3, workgroups=4)
        sleeper, torn, after = world.waves(3, 0)
        sleeper.last_load = (np.array([world.busy + 4], np.uint64), 4)
        world.mem.poll(sleeper)
        for w, start, size in ((torn, world.busy, 12), (after, world.busy + 256, 4)):
            flat = np.arange(start, start + size, dtype=np.int64)
            world.mem.touch(np.array([start], np.uint64), size, lambda: "test")
            inflight.issue_store(w, "store", world.mem, flat, np.full(size, 0xAB, np.uint8))
        return world, [torn, after, sleeper]
    sides, left = _ends(make)
    assert sides[0] == sides[1]
    assert left == 3 and sides[0][-1] == 1  # the torn store's wave retries


# ---------------------------------------------------------------- whole launches

# Waves 0-3 of each workgroup store a word each, wait for it, sleep, store another
# and end; waves 4-7 poll the word wave 0 of the next workgroup stores first
# (after an s_waitcnt lgkmcnt of their kernargs), sleeping between polls, then
# end with a store of their own.
POLL_AND_END = """
\ts_load_dwordx2 s[0:1], s[0:1], 0x0
\tv_readfirstlane_b32 s4, v0
\ts_lshl_b32 s5, s2, 11
\tv_lshlrev_b32_e32 v2, 2, v0
\tv_add_u32_e32 v2, s5, v2
\ts_waitcnt lgkmcnt(0)
\ts_cmp_ge_u32 s4, 256
\ts_cbranch_scc1 .Lpoll
\tv_mov_b32_e32 v1, 7
\tglobal_store_dword v2, v1, s[0:1] sc1
\ts_waitcnt vmcnt(0)
\ts_sleep 3
\tv_mov_b32_e32 v1, 9
\tglobal_store_dword v2, v1, s[0:1] offset:1024 sc1
\ts_endpgm
.Lpoll:
\tv_add_u32_e32 v3, 0x800, v2
\tv_and_b32_e32 v3, 0x1fff, v3
\tv_and_b32_e32 v3, 0xfffff800, v3
.Lwait:
\tglobal_load_dword v4, v3, s[0:1] sc1
\ts_waitcnt vmcnt(0)
\tv_cmp_eq_u32_e32 vcc, 7, v4
\ts_cbranch_vccnz .Lseen
\ts_sleep 1
\ts_branch .Lwait
.Lseen:
\tv_add_u32_e32 v4, 0x2000, v2
\tglobal_store_dword v4, v4, s[0:1]
"""


def _no_cohorts(monkeypatch):
    """Decode with every closure's cohort form and s_endpgm's `over` taken away."""
    decode = machine_module.decode

    def plain(ins, ctx):
        run = decode(ins, ctx)
        if getattr(run, "cohort", None) is not None or getattr(run, "over", None) is not None:
            def alone(w):
                return run(w)
            for key, value in vars(run).items():
                if key not in ("cohort", "over"):
                    setattr(alone, key, value)
            return alone
        return run
    monkeypatch.setattr(machine_module, "decode", plain)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("order", ["forward", "reverse"])
def test_launches_with_memory_cohort_forms_match_them_run_wave_by_wave(arch, order, monkeypatch):
    results = []
    for cohorts in (True, False):
        if not cohorts:
            _no_cohorts(monkeypatch)
        out = np.zeros(4 * 2048, np.uint32)
        machine = machine_module.Machine(arch)
        stats = machine.launch(handwritten(arch, POLL_AND_END), "hand", grid=(4,), block=(512,),
                               kernargs=machine.map(out).to_bytes(8, "little"), order=order)
        results.append((out.tolist(), stats.wave_instructions, stats.executed, stats.stale_bytes,
                        stats.written_back, stats.polls, stats.rounds, stats.bytes_written))
    assert results[0] == results[1]
    out = np.array(results[0][0]).reshape(16, 512)  # each workgroup's own words, then the pollers'
    assert (out[:4, :256] == 7).all() and (out[:4, 256:] == 9).all() and (out[4:8, 256:] != 0).all()
