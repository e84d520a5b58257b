"""The emulator's timing mode: `Machine(arch, timing=True)` gives every wave a
clock and runs waves in time order; `Stats.modeled_ns` is the launch start to
the last wave's end, `Stats.spans` each workgroup's (start, end) in ns.

The costs are the part's table (`timing_parts.PARTS`, sources in
docs/timing-model.md); this module is only the mechanics that charge them:

- Scheduling (discrete events, coarsened): the wave with the earliest clock
  runs next, until its clock passes the next earliest wave's by `WINDOW_NS`, or
  it sleeps, waits at a barrier, retries an s_waitcnt or ends. Functional
  results do not depend on the order (the kernels are race-free), only the
  strict memory model's choices of what is stale do, as they do on the GPU.
- Issue: each instruction costs its class's issue cycles
  (`Part.issue_cycles`, transcendentals `valu_slow`); a taken branch
  `branch_taken_cycles`; `s_nop n` n + 1 slots; `s_sleep n` adds
  `sleep_cycles(n)`. Waves are spread over the CU's SIMDs by index (wave i on
  SIMD i mod 4): VALU ops of waves sharing a SIMD take turns, and an MFMA holds
  its SIMD's matrix core for its `Part.mfma_cycles` (the next MFMA of that SIMD
  starts after it); both are `Pipe`s of busy time, so that waves running out of
  time order within the window do not push each other out by it.
- Memory: a load's data is ready at issue + the latency of the farthest level
  one of its lines comes from: the vector L1 of its CU (loads without sc0/sc1),
  the L2 of its XCD, the Infinity Cache (a line touched earlier in the launch:
  the first touch of a line misses to HBM), HBM. Residency is tracked per line
  (128 B) here, beside coherence.py's value model, with the same topology
  (workgroup i on a CU of its own, XCD i mod 8) and the same invalidations
  (`buffer_inv` sc0 drops the L1, sc1 also the L2); a store drops the line from
  the other XCDs' L2s. Capacities are not modelled (our kernels read each byte
  about once). Bandwidth: the bytes of HBM misses share `hbm_bytes_per_s`, an
  XCD's L2 traffic its `l2_bytes_per_cycle_per_xcd`, a CU's traffic its
  `cu_bytes_per_cycle` (`Pipe`: time bins, a transfer takes the earliest free
  capacity). Scalar loads: the scalar cache (64 B lines), then the L2's miss
  penalty, then memory. LDS: latency + port cycles (`Part.lds_cycles`).
  Stores complete at the L2's latency. A wave's vector memory instruction
  waits to issue while `Part.wave_vm_outstanding` of its own are in flight
  (vmcnt's range; the counter retires in order).
- s_waitcnt (and s_endpgm): the wave's clock moves to the ready time of the
  oldest operations the counter retires (the queues mirror inflight.py's).
- Hand-offs: `buffer_wbl2 sc1` completes `release_fence_ns` after issue,
  `buffer_inv sc1` stalls the wave `acquire_fence_ns`; a line another XCD
  stored is visible `remote_visibility_ns` after the store's issue, and a load
  that sees it is ready no earlier than that + its own latency. The remote
  visibility is derived so that a release, a poll served by the Infinity
  Cache and an acquire add up to the table's measured `handoff_ns`.
- Barriers release at the last arrival's clock.

Optional `regions` (a name per instruction, e.g. the kernel's stage; None: the
wave stays in the region it is in, FIRST_REGION at its start) record
`Stats.timeline`: per wave, (region, start, end) segments and waits (runs of
s_sleep polls; barrier waits).
"""

from __future__ import annotations

import collections
import heapq
import itertools
import math
import re

from .coherence import LINE_BITS, XCDS, lines_of
from .errors import Deadlock
from .timing_parts import Part
from .timing_parts import part as part_of

WINDOW_NS = 200.0  # how far a wave may run ahead of the next earliest before it yields
BIN_NS = 32.0  # bandwidth accounting granularity
POLL_GAP_NS = 2000.0  # sleeps closer than this belong to one wait
FIRST_REGION = "entry"  # a wave's region until it runs an instruction of a named one
SCALAR_LINE_BITS = 6  # 64-byte scalar cache lines (Part.sl1_line_bytes)
LINE_BYTES = 1 << LINE_BITS

_LDS_BYTES = (("read2st64_b64", 16), ("write2st64_b64", 16), ("read2_b64", 16), ("write2_b64", 16),
              ("read2", 8), ("write2", 8), ("b128", 16), ("b96", 12), ("b64", 8), ("u16", 2),
              ("i16", 2), ("b16", 2), ("u8", 1), ("i8", 1), ("b8", 1))


def lds_bytes_per_lane(mnemonic: str) -> int:
    """Bytes a lane moves in one DS instruction (4 for dword ops, atomics, swizzles)."""
    for suffix, size in _LDS_BYTES:
        if suffix in mnemonic:
            return size
    return 4


def remote_visibility_ns(p) -> float:
    """Store issue -> visible to another XCD: what the measured one-way hand-off
    leaves after the release, the poll's Infinity Cache hit and the acquire (derived)."""
    return max(0.0, p.handoff_ns - p.release_fence_ns - p.acquire_fence_ns - p.mall_hit_ns)


class Pipe:
    """Bandwidth shared over time, `rate` bytes/ns counted in bins of BIN_NS: a
    transfer takes the earliest free capacity at or after its start, so waves
    that run out of time order still saturate it at its rate."""

    __slots__ = ("capacity", "rate", "used")

    def __init__(self, bytes_per_ns: float):
        self.rate = bytes_per_ns
        self.capacity = bytes_per_ns * BIN_NS
        self.used = {}

    def transfer(self, start: float, nbytes: float) -> float:
        """When `nbytes` started at `start` are through."""
        used, capacity, total = self.used, self.capacity, nbytes
        b = int(start // BIN_NS)
        while True:
            filled = used.get(b, 0.0)
            if filled < capacity:
                take = min(capacity - filled, nbytes)
                used[b] = filled = filled + take
                nbytes -= take
                if nbytes <= 0:
                    return max(start + total / self.rate, b * BIN_NS + filled / self.rate)
            b += 1


class Timing:
    """The cost model of one launch: wave clocks, caches' residency, pipes, queues."""

    def __init__(self, machine, kernel, classes, regions=None):
        """`classes`: each instruction's class (machine.DISPATCH); `regions`: a name
        for each instruction, or None (no timeline)."""
        self.machine = machine
        p = self.part = machine.timing if isinstance(machine.timing, Part) else part_of(machine.arch)
        self.ns = 1.0 / p.clock_ghz
        self.latency = {"l1": p.vl1_hit_cycles * self.ns, "l2": p.l2_hit_cycles * self.ns,
                        "mall": p.mall_hit_ns, "hbm": p.hbm_ns}
        self.remote_ns = remote_visibility_ns(p)
        self.hbm = Pipe(p.hbm_bytes_per_s / 1e9)
        self.l2_pipe = [Pipe(p.l2_bytes_per_cycle_per_xcd * p.clock_ghz) for _ in range(XCDS)]
        self.cu_pipes = collections.defaultdict(lambda: Pipe(p.cu_bytes_per_cycle * p.clock_ghz))
        self.l1 = collections.defaultdict(set)  # workgroup -> vector L1 lines
        self.scalar = collections.defaultdict(set)  # workgroup -> scalar cache lines (64 B)
        self.l2 = [set() for _ in range(XCDS)]
        self.touched = set()  # lines any access reached this launch (then in the Infinity Cache)
        self.visible = {}  # line -> (time visible to other XCDs, storing XCD)
        # (workgroup, SIMD) -> its VALU and its matrix core, as pipes of busy ns a ns: waves
        # sharing a SIMD take turns even when they run out of time order
        self.simd_valu = collections.defaultdict(lambda: Pipe(1.0))
        self.simd_matrix = collections.defaultdict(lambda: Pipe(1.0))
        self.handlers = [self._handler(ins, cls) for ins, cls in zip(kernel.instructions, classes)]
        self.handlers.append(self._plain(0.0))  # the guard past the end
        self.regions = regions
        self.timeline = collections.defaultdict(list)  # (workgroup, wave) -> [(kind, region, start, end)]
        self.region_at = {}  # (workgroup, wave) -> (region, since)
        self.ends = {}
        self.t = 0.0  # the current wave's clock
        self.ready = None  # when the current instruction's memory operation completes
        self.limit = math.inf

    # ------------------------------------------------------------------ per-instruction costs

    def executed(self, w, pc: int, signal) -> bool:
        """The hook after each executed instruction: charge it; True when the wave
        should yield (its clock passed the scheduling window)."""
        self.pc = pc
        self.handlers[pc](w, signal)
        if self.regions is not None:
            self._note_region(w, self.regions[pc])
        return self.t > self.limit

    def _handler(self, ins, cls: str):
        p, ns, name = self.part, self.ns, ins.mnemonic
        issue = p.issue_cycles.get(cls, p.issue_cycles["salu"]) * ns
        if cls == "valu":
            return self._valu(p.valu_cycles(name) * ns)
        if cls == "mfma":
            mods = ins.modifiers
            cycles = p.mfma_cycles(name, int(mods.get("cbsz", 0)), int(mods.get("blgp", 0)))
            return self._mfma(issue, cycles * ns)
        if cls == "branch":
            return self._branch(p.branch_taken_cycles * ns, p.branch_not_taken_cycles * ns)
        if cls == "nop":
            return self._plain(p.nop_cycles(int(ins.operands[0], 0) if ins.operands else 0) * ns)
        if cls == "sleep":
            return self._plain(issue + p.sleep_cycles(int(ins.operands[0], 0) if ins.operands else 0) * ns,
                               sleep=True)
        if cls == "lds":
            write = bool(re.match(r"ds_(write|store|add|sub|max|min|and|or|xor|inc|dec|cmpst)", name))
            return self._memory(issue, p.lds_latency_cycles * ns
                                + p.lds_cycles(lds_bytes_per_lane(name), write) * ns)
        if cls == "cache" and name.startswith("buffer_wbl2"):
            return self._memory(issue, p.release_fence_ns if ins.modifiers.get("sc1") else 0.0)
        if cls in ("vmem_load", "vmem_store", "vmem_atomic", "smem", "waitcnt", "endpgm", "cache"):
            return self._memory(issue, p.sl1_hit_cycles * ns if cls == "smem" else 0.0)
        return self._plain(issue)

    def _plain(self, cost: float, sleep: bool = False):
        def run(w, signal):
            if sleep:
                self._note_wait(w, "poll", self.t, self.t + cost)
            self.t += cost
        return run

    def _valu(self, cost: float):
        def run(w, signal):
            self.t = self.simd_valu[(w.group.index, w.index % self.part.simds_per_cu)].transfer(self.t, cost)
        return run

    def _mfma(self, issue: float, busy: float):
        def run(w, signal):
            done = self.simd_matrix[(w.group.index, w.index % self.part.simds_per_cu)].transfer(self.t, busy)
            self.t = done - busy + issue
        return run

    def _branch(self, taken: float, not_taken: float):
        def run(w, signal):
            self.t += not_taken if w.pc == self.pc + 1 else taken
        return run

    def _memory(self, issue: float, default: float):
        """Memory instructions, s_waitcnt, s_endpgm: new operations join the wave's
        queues (ready as the access hooks computed, else issue + `default`);
        operations the counters retired hold the wave until they are ready."""
        def run(w, signal):
            if signal == "retry":
                self.ready = None
                return
            t = self.t
            for real, mine in ((w.vm, self.vmq), (w.lds, self.ldsq), (w.smem, self.smemq)):
                excess = len(mine) - len(real)
                if excess > 0:
                    for _ in range(excess):
                        t = max(t, mine.popleft())
                elif excess < 0:
                    ready = self.ready if self.ready is not None else self.t + default
                    mine.extend([ready] * -excess)
            self.ready = None
            self.t = t + issue
        return run

    def stamp(self, realtime: bool) -> int:
        """The current wave's clock as s_memtime (core cycles) or s_memrealtime
        (`memrealtime_hz` ticks) read it."""
        p = self.part
        return int(self.t * (p.memrealtime_hz / 1e9 if realtime else p.clock_ghz))

    # ------------------------------------------------------------------ memory hooks

    def attach(self, mem) -> None:
        """Route the memory model's accesses through the cost model (instance
        attributes over its methods: coherence.py is unchanged)."""
        load, load_scalar, touch, atomic = mem.load, mem.load_scalar, mem.touch, mem.atomic
        invalidate, invalidate_scalar = mem.invalidate, mem.invalidate_scalar

        def timed_load(w, addresses, size, who, through_l1):
            self._vector(w, addresses, size, through_l1)
            return load(w, addresses, size, who, through_l1)

        def timed_load_scalar(w, region, start, count, cached):
            self._scalar(w, region.base + start, count, cached)
            return load_scalar(w, region, start, count, cached)

        def timed_touch(addresses, size, who):
            touch(addresses, size, who)
            self._store(self.current, addresses, size)

        def timed_atomic(w, addresses, dtype, update, sources, who):
            self._atomic(w, addresses, dtype.itemsize)
            return atomic(w, addresses, dtype, update, sources, who)

        def timed_invalidate(cu, l1, l2):
            g = self.current.group.index
            if l1 or l2:
                self.l1[g].clear()
            if l2:
                self.l2[g % XCDS].clear()
                self.t += self.part.acquire_fence_ns
            invalidate(cu, l1, l2)

        def timed_invalidate_scalar(cu):
            self.scalar[self.current.group.index].clear()
            invalidate_scalar(cu)

        mem.load, mem.load_scalar, mem.touch, mem.atomic = timed_load, timed_load_scalar, timed_touch, timed_atomic
        mem.invalidate, mem.invalidate_scalar = timed_invalidate, timed_invalidate_scalar

    def _vm_issue(self) -> float:
        """The current wave's clock once its vector memory instruction may issue:
        with `wave_vm_outstanding` in flight it waits for the oldest to retire
        (vmcnt counts in order: an operation retires when all before it are ready)."""
        queue, most = self.vmq, self.part.wave_vm_outstanding
        if len(queue) >= most:
            self.t = max(self.t, max(itertools.islice(queue, len(queue) - most + 1)))
        return self.t

    def _vector(self, w, addresses, size: int, through_l1: bool) -> None:
        g = w.group.index
        xcd = g % XCDS
        lines = set(lines_of(addresses, size).tolist())
        l1, l2, lat = self.l1[g], self.l2[xcd], self.latency
        hit_l1 = lines & l1 if through_l1 else set()
        beyond_l1 = lines - hit_l1 if hit_l1 else lines
        beyond_l2 = beyond_l1 - l2
        new = beyond_l2 - self.touched
        level = "hbm" if new else "mall" if beyond_l2 else "l2" if beyond_l1 else "l1"
        t = self._vm_issue()
        ready = t + lat[level]
        ready = max(ready, self.cu_pipes[g].transfer(t, len(lines) * LINE_BYTES))
        if beyond_l1:
            ready = max(ready, self.l2_pipe[xcd].transfer(t, len(beyond_l1) * LINE_BYTES))
        if new:
            ready = max(ready, self.hbm.transfer(t, len(new) * LINE_BYTES))
            self.touched |= new
        if self.visible and beyond_l2:
            for line in beyond_l2 & self.visible.keys():
                at, writer = self.visible[line]
                if writer != xcd:
                    ready = max(ready, at + lat[level])
        l2 |= beyond_l1
        if through_l1:
            l1 |= lines
        self.ready = ready

    def _scalar(self, w, address: int, count: int, cached: bool) -> None:
        g = w.group.index
        p, lat = self.part, self.latency
        lines = set(range(address >> SCALAR_LINE_BITS, ((address + count - 1) >> SCALAR_LINE_BITS) + 1))
        cache = self.scalar[g]
        if cached and lines <= cache:
            self.ready = self.t + p.sl1_hit_cycles * self.ns
            return
        wide = {line >> (LINE_BITS - SCALAR_LINE_BITS) for line in lines}
        l2 = self.l2[g % XCDS]
        miss = wide - l2
        if not miss:
            extra = p.sl1_miss_extra_cycles * self.ns
        elif miss - self.touched:
            extra = lat["hbm"]
        else:
            extra = lat["mall"]
        self.touched |= miss
        l2 |= wide
        if cached:
            cache |= lines
        self.ready = self.t + p.sl1_hit_cycles * self.ns + extra

    def _store(self, w, addresses, size: int) -> None:
        g = w.group.index
        xcd = g % XCDS
        lines = set(lines_of(addresses, size).tolist())
        t = self._vm_issue()
        ready = t + self.latency["l2"]
        ready = max(ready, self.cu_pipes[g].transfer(t, len(lines) * LINE_BYTES))
        ready = max(ready, self.l2_pipe[xcd].transfer(t, len(lines) * LINE_BYTES))
        self._written(lines, xcd, t)
        self.ready = ready

    def _atomic(self, w, addresses, size: int) -> None:
        g = w.group.index
        xcd = g % XCDS
        lines = set(lines_of(addresses, size).tolist())
        level = "hbm" if lines - self.touched else "mall"
        self._vm_issue()
        self._written(lines, xcd, self.t)
        self.ready = self.t + self.latency[level]

    def _written(self, lines: set, xcd: int, t: float) -> None:
        """Lines stored from `xcd` at t: in its L2, out of the others', visible to
        them remote_ns later."""
        self.touched |= lines
        for index, l2 in enumerate(self.l2):
            if index == xcd:
                l2 |= lines
            elif l2:
                l2 -= lines
        at = (t + self.remote_ns, xcd)
        for line in lines:
            self.visible[line] = at

    # ------------------------------------------------------------------ regions and waits

    def _note_region(self, w, region) -> None:
        key = (w.group.index, w.index)
        current = self.region_at.get(key)
        if region is None:  # no region of its own: the wave stays in the one it is in
            if current is not None:
                return
            region = FIRST_REGION
        if current is None or current[0] != region:
            if current is not None:
                self.timeline[key].append(("run", current[0], current[1], self.t))
            self.region_at[key] = (region, self.t)

    def _note_wait(self, w, kind: str, start: float, end: float) -> None:
        if self.regions is None or end <= start:
            return
        key = (w.group.index, w.index)
        events = self.timeline[key]
        region = self.region_at.get(key, (FIRST_REGION,))[0]
        if events and events[-1][0] == kind and events[-1][1] == region and start - events[-1][3] < POLL_GAP_NS:
            events[-1] = (kind, region, events[-1][2], end)
        else:
            events.append((kind, region, start, end))

    # ------------------------------------------------------------------ the scheduler

    def schedule(self, groups, code, kernel, stats, scoreboard) -> None:
        """Run the launch's waves in time order (Machine._schedule's timed twin)."""
        from .machine import _deadlock_report

        machine = self.machine
        waves = [w for g in groups for w in g.waves if not w.done]
        machine._hits = hits = [0] * len(code)
        clock = dict.fromkeys(waves, 0.0)
        queues = {w: (collections.deque(), collections.deque(), collections.deque()) for w in waves}
        heap = [(0.0, i, w) for i, w in enumerate(waves)]
        seq = len(heap)
        arrivals = collections.defaultdict(list)  # workgroup -> [(wave, clock at s_barrier)]
        self.region_at = {}
        executed = quiet = turns = 0
        while heap:
            _, _, w = heapq.heappop(heap)
            self.current, self.t, self.pc = w, clock[w], w.pc
            self.vmq, self.ldsq, self.smemq = queues[w]
            self.limit = (heap[0][0] if heap else math.inf) + WINDOW_NS
            machine._progress = False
            start_pc = w.pc
            ran, reason = machine._run_quantum(w, code, hits, kernel, scoreboard, machine.quantum)
            executed, turns = executed + ran, turns + 1
            clock[w] = self.t
            g = w.group
            if reason == "barrier":
                arrivals[g].append((w, self.t))
            elif w.done:
                self._ended(w)
            else:
                seq += 1
                heapq.heappush(heap, (self.t, seq, w))
            if arrivals[g] and not any(p.waiting for p, _ in arrivals[g]):  # the barrier released
                release = max([self.t if w.done else 0.0] + [at for _, at in arrivals[g]])
                for p, at in arrivals[g]:
                    self._note_wait(p, "barrier", at, release)
                    clock[p] = release
                    seq += 1
                    heapq.heappush(heap, (release, seq, p))
                arrivals[g] = []
            progressed = machine._progress or reason in ("quantum", "time") or w.pc != start_pc
            quiet = 0 if progressed else quiet + 1
            if heap and quiet > machine.stall_rounds * len(heap):
                raise Deadlock(_deadlock_report([e[2] for e in heap], kernel,
                                                f"no progress for {quiet} timed turns"))
            if executed > machine.max_wave_instructions:
                raise Deadlock(_deadlock_report([e[2] for e in heap], kernel,
                                                f"more than {machine.max_wave_instructions:,} wave-instructions"))
        stuck = [p for waiting in arrivals.values() for p, _ in waiting]
        if stuck:
            raise Deadlock(_deadlock_report(stuck, kernel, "waves wait at a barrier no other wave reaches"))
        machine._clock += executed
        stats.rounds = turns
        self._record(stats, groups)

    def _ended(self, w) -> None:
        self.ends[w] = self.t
        key = (w.group.index, w.index)
        if key in self.region_at:
            region, since = self.region_at.pop(key)
            self.timeline[key].append(("run", region, since, self.t))

    def _record(self, stats, groups) -> None:
        stats.spans = {g.index: (0.0, max((self.ends.get(w, 0.0) for w in g.waves), default=0.0))
                       for g in groups}
        stats.modeled_ns = max((end for _, end in stats.spans.values()), default=0.0)
        if self.regions is not None:
            stats.timeline = dict(self.timeline)

