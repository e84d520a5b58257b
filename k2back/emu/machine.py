"""The machine: memory map, launch set-up from the kernel descriptor, and the scheduler.

Scheduling: every workgroup of a launch is resident. Waves run round-robin in
quanta of `quantum` instructions, workgroups in `order`; within a workgroup's
turn the waves at the lowest PC go first, in lock-step, and several waves at one
VALU, MFMA, LDS or vector memory instruction run it once over [waves, 64] lanes
(`Machine._run_turn`). Consecutive workgroups whose waves are at the same places
when their turns come (the workgroups of a stage) take one turn together: their
waves run as the waves of one workgroup, such an instruction once for all
(`_turns`; a vector load or store with each workgroup's CU its own view, an LDS
instruction with each lane addressing its own workgroup's LDS, state.Grid.lds),
waves in slots apart too (state.Gathered). A wave gives up the rest of its quantum at `s_sleep N`
(and then sits out N rounds, unless a store reaches the line it polls:
coherence.py), at `s_barrier` (until every live wave of its workgroup arrived),
at `s_endpgm`, and when an `s_waitcnt` stops between two stores it retires
(inflight.py): it retries that s_waitcnt on its next turn. A workgroup's turn
ends when one of its waves performs stores, before its other waves perform theirs.

Memory (`memory=`): "strict", the default, is the GFX942 memory model with every
freedom taken against the kernel (coherence.py: per-XCD L2s, per-CU L1 and
scalar caches; inflight.py: stores performed as late as the s_waitcnt counters
allow, in an adversarial order); "ideal" is one coherent memory, accesses
performed when issued. In both, a register read or overwritten before the
s_waitcnt covering the load that writes it raises `ScoreboardError`.

Deadlock: progress is a global/LDS write or atomic, a barrier release, a wave
ending, or a wave using a whole quantum without sleeping. After `stall_rounds`
rounds without progress, or beyond `max_wave_instructions` (a wave spinning on a
flag without s_sleep looks busy), the launch raises `Deadlock` naming the waves
still running and where they are.

Counters (`Stats`): executed wave-instructions by class, global bytes read and
written per mapped buffer (bytes the active lanes requested, in range), LDS
bytes, barriers released, polls per wave = its `s_sleep` executions (our
kernels sleep once per unsuccessful poll of a flag), and what the strict memory
did: bytes loads took from stale copies, bytes L2s wrote back.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import gc
import itertools

import numpy as np

from . import asm as asm_text
from . import hazards, inflight
from . import numerics as nx
from .coherence import MEMORY_MODELS, IdealMemory, StrictMemory, byte_addresses
from .errors import Deadlock, EmulatorError, UnsupportedInstruction
from .matrix import decode_mfma
from .memops import ByWorkgroup, decode_buffer, decode_ds, decode_global, decode_smem
from .memory import GlobalMemory
from .opening import Opening
from .opening import kinds as opening_kinds
from .operands import parse, scalar_reader, scalar_writer
from .salu import decode_branch, decode_sop
from .state import LANES, M64, SGPR_SLOTS, Gathered, Grid, exec_state, row_spans
from .valu import decode_valu

ARCH_LDS_BYTES = {"gfx942": 64 * 1024, "gfx950": 160 * 1024}
MEMORY = {"strict": StrictMemory, "ideal": IdealMemory}
assert tuple(MEMORY) == MEMORY_MODELS
CODE_ADDRESS = 0x7F00_0000_0000  # where the emulated code lives (s_getpc_b64)

@dataclasses.dataclass
class Stats:
    """What one launch did (all counts are deterministic)."""

    instructions: dict = dataclasses.field(default_factory=dict)  # class -> wave-instructions
    wave_instructions: int = 0
    bytes_read: dict = dataclasses.field(default_factory=dict)  # buffer name -> bytes
    bytes_written: dict = dataclasses.field(default_factory=dict)
    lds_read: int = 0
    lds_written: int = 0
    barriers: int = 0
    polls: dict = dataclasses.field(default_factory=dict)  # (workgroup, wave) -> s_sleep count
    executed: list = dataclasses.field(default_factory=list)  # wave-instructions run at each instruction (asm order)
    cache_policy: dict = dataclasses.field(default_factory=dict)  # (access, bits) -> count
    workgroups: int = 0
    waves: int = 0
    rounds: int = 0
    stale_bytes: int = 0  # bytes loads took from a cached copy older than memory (strict)
    written_back: int = 0  # bytes L2s wrote back to memory (strict)
    modeled_ns: float | None = None  # timing mode: launch start to the last wave's end
    spans: dict = dataclasses.field(default_factory=dict)  # timing: workgroup -> (start, end) ns
    timeline: dict = dataclasses.field(default_factory=dict)  # timing + regions: timing.Timing.timeline
    batched: int = 0  # wave-instructions executed once for several waves (state.Batch)
    batches: int = 0  # executions of those: one per batch (or lone wave) of a batched step

    @property
    def total_polls(self) -> int:
        return sum(self.polls.values())

    def report(self) -> str:
        """A human-readable summary: instruction mix, bytes per buffer, sync."""
        lines = [(f"{self.workgroups} workgroups, {self.waves} waves, "
                  f"{self.wave_instructions:,} wave-instructions in {self.rounds} rounds "
                  f"({self.batched:,} of them batched, in {self.batches:,} executions)")]
        lines += [f"  {cls:<12} {count:>12,}" for cls, count in self.instructions.items()]
        for name in sorted(set(self.bytes_read) | set(self.bytes_written)):
            read, written = self.bytes_read.get(name, 0), self.bytes_written.get(name, 0)
            if read or written:
                lines.append(f"  {name:<24} read {read:>12,} B  written {written:>12,} B")
        lines.append(f"  LDS read {self.lds_read:,} B, written {self.lds_written:,} B; "
                     f"{self.barriers} barriers; {self.total_polls} polls")
        lines.append(f"  L2 write-backs {self.written_back:,} B; loads from stale copies "
                     f"{self.stale_bytes:,} B")
        return "\n".join(lines)


class DecodeContext:
    """What decoders may ask about the launch while turning asm into closures."""

    def __init__(self, machine, kernel, accum_offset: int, stats: Stats, mem):
        self.machine, self.kernel, self.mem = machine, kernel, mem
        self.arch = machine.arch
        self.accum_offset = accum_offset
        self.labels = kernel.labels
        self.memory = machine.memory
        self.stats = stats
        self.code_address = CODE_ADDRESS

    def operand(self, token: str, ins):
        return parse(token, self.accum_offset, ins)

    def scalar_reader(self, token: str, bits: int, ins):
        return scalar_reader(self.operand(token, ins), bits, ins.where())

    def scalar_writer(self, token: str, bits: int, ins):
        return scalar_writer(self.operand(token, ins), bits, ins.where())

    def vector_row(self, op, count: int, ins) -> int:
        if op.file != "v" or op.count != count or op.neg or op.abs:
            raise UnsupportedInstruction(
                f"expected {count} vector register(s), got {op.token!r} ({ins.where()})")
        return op.index

    def progress(self) -> None:
        self.machine._progress = True

    def load(self, w, addresses, size: int, who, through_l1: bool, owners=None):
        """uint8 [lanes, size] a vector load reads: memory as the wave's caches show
        it, and the wave's own stores still in flight. For a Batch of one
        workgroup's waves, `owners` is each address's wave (position, ascending):
        one access when the addresses lie in one buffer, each wave's own
        bookkeeping as though it loaded alone, in wave order."""
        if owners is not None:
            return self._load_over_waves(w, addresses, owners, size, who, through_l1)
        mem = self.mem
        _note_load(mem, w, addresses, size, through_l1)
        data = mem.load(w, addresses, size, who, through_l1)
        if w.unperformed:
            inflight.forward(w, addresses, size, data)
        return data

    def _load_over_waves(self, batch, addresses, owners, size, who, through_l1):
        bounds = _wave_bounds(owners, len(batch.waves))
        spans = [(v, slice(a, b)) for v, a, b in zip(batch.waves, bounds, bounds[1:]) if a < b]
        region = self.memory.region_at(int(addresses.min()))
        if region is None or int(addresses.max()) + size > region.end:  # several buffers: wave by wave
            return np.concatenate([self.load(v, addresses[s], size, who, through_l1) for v, s in spans])
        mem = self.mem
        for v, s in spans:
            _note_load(mem, v, addresses[s], size, through_l1)
        cus = None
        if batch.group is None:  # waves of several workgroups: each one's CU and lanes
            runs = []  # [workgroup, first lane, end]
            for v, s in spans:
                if runs and runs[-1][0] is v.group:
                    runs[-1][2] = s.stop
                else:
                    runs.append([v.group, s.start, s.stop])
            cus = [(group.cu, slice(a, b)) for group, a, b in runs]
        data = mem.load(batch, addresses, size, who, through_l1, cus)
        for v, s in spans:
            if v.unperformed:
                inflight.forward(v, addresses[s], size, data[s])
        return data

    def store(self, w, ins, addresses, data, who, owners=None) -> None:
        """Issue a store of data [lanes, size]: performed when a counter retires it.
        For a Batch of one workgroup's waves, `owners` is each address's wave
        (position, ascending): the bytes are checked and counted at once, and each
        wave with an active lane issues the store of its own, in wave order."""
        size = data.shape[1]
        if addresses.size:
            self.mem.touch(addresses, size, who)
            flat, values = byte_addresses(addresses, size), data.reshape(-1).copy()
        if owners is None:
            if addresses.size:
                inflight.issue_store(w, ins, self.mem, flat, values)
            else:
                inflight.issue_vm(w, ins)
            return
        lanes = _wave_bounds(owners, len(w.waves))
        spans = None
        if self.mem.strict and addresses.size:  # each wave's (lowest, highest) byte, at once
            starts = [a for a, b in itertools.pairwise(lanes) if a < b]
            spans = iter(zip(np.minimum.reduceat(addresses, starts).tolist(),
                             (np.maximum.reduceat(addresses, starts) + np.uint64(size - 1)).tolist()))
        for v, a, b in zip(w.waves, lanes, lanes[1:]):
            if a < b:
                inflight.issue_store(v, ins, self.mem, flat[a * size:b * size], values[a * size:b * size],
                                     spans and next(spans))
            elif v.exec:
                inflight.issue_vm(v, ins)

    def atomic(self, w, addresses, dtype, update, sources, who):
        """A read-modify-write at memory after the wave's own earlier stores; returns
        the old values."""
        if w.unperformed:
            inflight.perform_own_stores(w, self.mem)
        self.progress()
        return self.mem.atomic(w, addresses, dtype, update, sources, who)

    def clock(self, realtime: bool = False) -> int:
        """s_memtime / s_memrealtime: in timing mode the wave's modeled clock (core
        cycles / reference-clock ticks); else wave-instructions executed on this
        machine so far, this one included (deterministic)."""
        if self.machine._timer is not None:
            return self.machine._timer.stamp(realtime)
        return self.machine._clock + sum(self.machine._hits)


class Machine:
    """A gfx942/gfx950 device with no GPU: map host buffers, launch kernels from asm text."""

    def __init__(self, arch: str, *, memory: str = "strict", quantum: int = 256,
                 stall_rounds: int = 2000, max_wave_instructions: int = 100_000_000, trace=None,
                 mfma_accumulate: str = "exact", transcendental_error_seed=None,
                 fnuz_negative_zero: int = 0x00, timing=False, regions=None, opening: bool = True):
        """`memory`: "strict" (the GFX942 memory model, adversarial: coherence.py) or
        "ideal" (one coherent memory, every access performed when issued: cheaper,
        for unit tests of instructions). `trace(wave, instruction)`, if given, is
        called after every executed instruction (a debugging aid: it makes the
        launch several times slower; a wave object is the launch's only while it
        runs: later launches start it again, state.Grid.release). `mfma_accumulate`, `transcendental_error_seed`,
        `fnuz_negative_zero`: the results it picks where the hardware leaves room
        (`numerics.Options`). `timing` (True, or a timing_parts.Part to charge
        instead of the arch's): run waves in modeled time order and fill
        Stats.modeled_ns / spans (timing.py); `regions(kernel)`, if given, names each
        instruction (e.g. its stage) for Stats.timeline. `opening`: run every wave's
        private start (its instructions no other wave can see or change) as arrays
        before the scheduler, a wave that ends in it never scheduled (opening.py;
        off in timing mode and when tracing; the same results either way)."""
        try:
            self.numerics = nx.Options(mfma_accumulate, transcendental_error_seed, fnuz_negative_zero)
        except ValueError as error:
            raise EmulatorError(str(error)) from None
        if memory not in MEMORY:
            raise EmulatorError(f"memory: expected one of {tuple(MEMORY)}, got {memory!r}")
        if arch not in ARCH_LDS_BYTES:
            raise EmulatorError(f"arch: expected one of {tuple(ARCH_LDS_BYTES)}, got {arch!r}")
        self.arch = arch
        self.memory_model = memory
        self.quantum = quantum
        self.stall_rounds = stall_rounds
        self.max_wave_instructions = max_wave_instructions
        self.trace = trace
        self.batching = trace is None  # several waves at one instruction run it once (_run_turn)
        self.batch_workgroups = True  # ... also waves of several workgroups (_turns)
        self.memory = GlobalMemory()
        self._clock = 0
        self._progress = False
        self._wake = {}
        self._round = 0  # the scheduling round (_schedule)
        self.timing, self.regions = timing, regions
        self.opening = opening
        self._timer = None

    def map(self, array, name: str | None = None) -> int:
        """Map a host array/tensor in place; returns its device address."""
        return self.memory.map(array, name)

    # ------------------------------------------------------------------ launch

    def launch(self, asm: str, kernel_name: str, grid=(1, 1, 1), block=(64, 1, 1),
               kernargs: bytes = b"", dynamic_lds: int = 0, order="forward") -> Stats:
        """Run `kernel_name` from LLVM's asm text over `grid` workgroups of `block` threads.

        `order` is the workgroup start/scheduling order: "forward", "reverse", or a
        sequence of linear workgroup indices."""
        with _cycle_collection_paused():
            return self._launch(asm, kernel_name, grid, block, kernargs, dynamic_lds, order)

    def _launch(self, asm, kernel_name, grid, block, kernargs, dynamic_lds, order) -> Stats:
        if not isinstance(asm, str):
            raise EmulatorError(f"asm: expected the assembly text (str), got {type(asm).__name__}")
        if not isinstance(dynamic_lds, int) or dynamic_lds < 0:
            raise EmulatorError(f"dynamic_lds: expected a byte count >= 0, got {dynamic_lds!r}")
        kernel = asm_text.parse_kernel(asm, kernel_name)
        grid, block = _dims("grid", grid), _dims("block", block)
        setup = LaunchSetup(self, kernel, grid, block, bytes(kernargs), dynamic_lds)
        stats = Stats()
        for region in self.memory.regions:  # counters are per launch
            region.read = region.written = 0
            region.touched = False
        mem = MEMORY[self.memory_model](self.memory, self._wake_now)  # caches start empty
        ctx = DecodeContext(self, kernel, setup.accum_offset, stats, mem)
        code, classes = self._decode(kernel, ctx)
        checked = hazards.instrument(kernel, code, self.arch, setup.accum_offset)
        batchable = [getattr(run, "batchable", False) and run is checked[pc] for pc, run in enumerate(code)]
        # where a wave running alone stops to let the scheduler choose again: before
        # a batchable instruction, and before every memory or synchronising one
        stops = [batch or cls not in SOLO_CLASSES for batch, cls in zip(batchable, classes)]
        jumps = [cls == "branch" for cls in classes]
        quiet = [cls in QUIET_CLASSES and run is checked[pc] and kernel.instructions[pc].mnemonic != "s_getpc_b64"
                 for pc, (run, cls) in enumerate(zip(code, classes))]
        self._timer = timer = self._timing(kernel, classes, mem)
        scoreboard = inflight.Scoreboard(kernel, setup.accum_offset)
        spans = _gather_spans(scoreboard, batchable, classes)
        # the waves' private start, run as arrays before the scheduler (opening.py)
        opened = None
        if self.opening and self.batching and timer is None:
            kinds = opening_kinds(kernel, code, checked, classes, batchable, quiet, scoreboard.effects,
                                  setup.accum_offset)
            opened = Opening(checked, kinds, spans, scoreboard.touches)
        launch_buffers = [self.memory.map(array, name) for name, array in setup.launch_buffers.items()]
        try:
            with np.errstate(all="ignore"):  # integer wrap-around and IEEE specials are the ISA's
                groups, registers = setup.workgroups(*launch_buffers, _order(order, grid), mem, opened)
                if timer is not None:  # timing mode: waves one at a time, in modeled time order
                    timer.schedule(groups, checked, kernel, stats, scoreboard)
                else:
                    self._schedule(groups, registers, checked, (batchable, stops, jumps, quiet, spans),
                                   kernel, stats, scoreboard, opened)
            mem.end()
        finally:
            for base in launch_buffers:
                self.memory.unmap(base)
        stats.stale_bytes, stats.written_back = mem.stale_bytes, mem.written_back
        self._finish(stats, classes, groups, opened.ended if opened else 0)
        registers.release()
        self._wake = {}
        return stats

    def _timing(self, kernel, classes, mem):
        """The timing mode's cost model for this launch (None: functional only)."""
        if not self.timing:
            return None
        from .timing import Timing

        timer = Timing(self, kernel, classes, self.regions(kernel) if self.regions else None)
        timer.attach(mem)
        return timer

    def _wake_now(self, wave) -> None:
        """A sleeping wave runs again on its next turn (a store reached its poll)."""
        if wave in self._wake:
            self._wake[wave] = 0

    def _decode(self, kernel, ctx):
        code, classes = [], []
        for ins in kernel.instructions:
            classes.append(dispatch(ins.mnemonic)[0])
            try:
                code.append(decode(ins, ctx))
            except (UnsupportedInstruction, ValueError, KeyError, IndexError) as error:
                code.append(_raiser(error, ins))
        code.append(_raiser(EmulatorError("execution ran past the kernel's last instruction"), None))
        classes.append("none")
        return code, classes

    def _schedule(self, groups, grid, code, steps, kernel, stats: Stats, scoreboard, opened=None) -> None:
        """Run the launch's `groups` to their end (`opened`: its opening, whose
        wave-instructions count in)."""
        hits = self._hits = list(opened.hits) if opened else [0] * len(code)
        self._batched, self._batches = (opened.batched, opened.batches) if opened else (0, 0)
        live = [g for g in groups if g.live]
        quiet_rounds, round_number, executed = 0, 0, opened.executed if opened else 0
        wake = self._wake = {}
        while live:
            round_number += 1
            self._progress = False
            self._round = round_number
            def ready(w, now=round_number):
                return not (w.done or w.waiting or wake.get(w, 0) > now)
            for turn, key in (_turns(live, wake, round_number) if self.batching and self.batch_workgroups
                              else ((g, None) for g in live)):
                for ends in self._run_turn(turn, key, grid, ready, code, steps, hits, kernel, scoreboard):
                    if type(ends) is tuple:  # _run_together's, for waves by the thousand
                        stopped, granted, budget = ends
                        executed += sum(map(granted.__getitem__, stopped)) - sum(map(budget.__getitem__, stopped))
                        reasons = set(stopped.values())
                        if "quantum" in reasons:
                            self._progress = True
                        if "sleep" not in reasons:
                            continue
                        ends = [(w, 0, reason) for w, reason in stopped.items()]
                    for w, ran, reason in ends:
                        executed += ran
                        if reason == "sleep":
                            wake[w] = round_number + 1 + w.sleep_rounds
                        elif reason == "quantum":
                            self._progress = True
            live = [g for g in live if g.live]
            quiet_rounds = 0 if self._progress else quiet_rounds + 1
            if live and quiet_rounds > self.stall_rounds:
                raise Deadlock(_deadlock_report(_live_waves(live), kernel, f"no progress for {quiet_rounds} "
                                                                           "scheduling rounds"))
            if live and executed > self.max_wave_instructions:  # a spin without s_sleep
                raise Deadlock(_deadlock_report(_live_waves(live), kernel,
                                                f"more than {self.max_wave_instructions:,} wave-instructions"))
        stats.rounds, stats.batched, stats.batches = round_number, self._batched, self._batches
        self._clock += executed

    def _run_turn(self, group, key, grid, ready, code, steps, hits, kernel, scoreboard):
        """One round's turn of a workgroup, or of consecutive workgroups whose waves
        are at the same places (`_turns`: they run as one, `group` has their waves,
        `key`: where they are, -1 for a wave not ready, as `_turns` saw them):
        each wave that is `ready` runs up to a quantum; yields lists of (wave,
        instructions run, why it stopped), in the order the waves stopped (a list:
        the waves that stopped at one step of the turn, handed over at once), or
        for waves that ran together ({wave: why it stopped}, {wave: instructions
        granted}, {wave: instructions left}).

        This is where the machine picks what runs next. Wave by wave, in order,
        when `batching` is off (a trace turns it off), or while fewer than two
        are ready: a wave released by a barrier or woken during the turn runs in
        it if its place comes later.
        Otherwise (from when two or more of the waves whose place comes later
        are ready: e.g. the waves a barrier released, with the lone wave that
        released them, which runs on with them) the waves at the lowest PC
        run in lock-step (`_run_cohort`) while they stay the only waves there:
        a batchable instruction once over each contiguous run of them
        (state.Batch), any other one wave by wave in wave order. So memory and
        synchronising instructions are reached in wave order, lowest PC first;
        waves that become ready join the turn. When a wave performs stores (an
        s_waitcnt, an atomic), the turn ends (each wave of the cohort first runs
        on to its next batchable, memory or synchronising instruction, `stops`):
        other workgroups see those stores before the stores the workgroup's
        other waves have issued meanwhile perform. A wave whose quantum ends
        behind or level with the turn's waves still to run gets one more
        (`_catch_up`), so that waves apart run as one batch again."""
        if not self.batching:
            for w in group.waves:
                if ready(w):
                    yield [(w, *self._run_quantum(w, code, hits, kernel, scoreboard, self.quantum))]
            return
        budget, granted, turn, going, fresh = {}, {}, [], [], []
        wake, now = self._wake, self._round
        groups = group.groups if type(group) is _Turn else (group,)
        # `key` holds for the turn's workgroups after the first (`_turns` saw those after
        # the turns before this one ran) until a wave of the turn runs (alone, below)
        known = key is not None and len(groups) > 1
        if known:
            at = [k for k, pc in enumerate(key) if pc >= 0]  # the ready waves' places
            everyone = len(at) == len(key)
        for g in groups:
            if known and g is not groups[0]:
                mine = g.waves if everyone else [g.waves[k] for k in at]
            elif wake:  # ready(w), inline (waves by the thousand)
                mine = [w for w in g.waves if not (w.done or w.waiting or wake.get(w, 0) > now)]
            else:  # no wave has slept yet
                mine = [w for w in g.waves if not (w.done or w.waiting)]
            if len(mine) == 1 and not g.thinned:  # it runs alone while no other wave of its workgroup is ready
                known = False
                mine = yield from self._run_alone(g, mine, budget, granted, ready, code, hits, kernel, scoreboard)
            else:  # (a workgroup the opening thinned: the first turn as with its waves that ended there)
                fresh += mine  # each a quantum (granted below, in one go)
                g.thinned = False
            if mine:
                turn += mine
                going.append(g)
        if fresh:
            budget.update(dict.fromkeys(fresh, self.quantum))
            granted.update(dict.fromkeys(fresh, self.quantum))
        if going:
            yield from self._run_together(going[0] if len(going) == 1 else _Turn(going), turn, budget, granted,
                                          grid, ready, code, steps, hits, kernel, scoreboard)

    def _run_alone(self, group, turn, budget, granted, ready, code, hits, kernel, scoreboard):
        """The start of a workgroup's turn while fewer than two of its waves are
        ready (`_run_turn`; `turn`: the one that is); returns the waves that run on
        together, with their quanta in `budget` and `granted`."""
        alone, ran = [], 0
        while len(turn) == 1:
            w = turn[0]
            ran, reason = self._run_quantum(w, code, hits, kernel, scoreboard, self.quantum)
            if reason == "barrier" and ran < self.quantum and ready(w):  # it arrived last: it runs on
                turn = [v for v in group.waves if v not in alone and ready(v)]  # with the waves it released
                if len(turn) > 1:
                    break
            alone.append(w)
            yield [(w, ran, reason)]
            turn, ran = [v for v in group.waves if v.slot > w.slot and ready(v)], 0
        budget.update(dict.fromkeys(alone, 0))  # those waves had their turn
        budget.update(dict.fromkeys(turn, self.quantum))
        granted.update(dict.fromkeys(alone, 0))
        granted.update(dict.fromkeys(turn, self.quantum))
        if len(turn) > 1 and ran:
            budget[w] -= ran
        return turn

    def _run_together(self, group, turn, budget, granted, grid, ready, code, steps, hits, kernel, scoreboard):
        """The rest of a turn from when two or more waves are in it (`_run_turn`).
        The waves of workgroups that take a turn together (`_Turn`) run as the
        waves of one, but each workgroup's turn ends on its own when its waves
        perform stores (`ended`)."""
        stops, ended = steps[1], set()
        while turn:
            pcs = [w.pc for w in turn]
            pc = min(pcs)
            if pcs.count(pc) == len(pcs):
                at, others = list(turn), len(code)
            else:
                at = [w for w in turn if w.pc == pc]
                others = min(set(pcs).difference((pc,)))
            stopped, performed = self._run_cohort(grid, at, pc, others, budget, code, steps, hits,
                                                  kernel, scoreboard)
            if performed:  # other workgroups see those stores before this one's other waves perform theirs
                for w in at:
                    if w.group in performed and w not in stopped and not stops[w.pc]:
                        ran, reason = self._run_quantum(w, code, hits, kernel, scoreboard, budget[w], stops)
                        budget[w] -= ran
                        if reason:
                            stopped[w] = reason
                ended |= performed
                stopped.update((w, "yield") for w in turn if w.group in performed and w not in stopped)
            if not stopped:
                continue
            self._catch_up(stopped, turn, budget, granted, ended)
            if stopped:
                yield stopped, granted, budget  # (read before the turn goes on)
                turn = [w for w in turn if w not in stopped]
            if stopped and not performed:  # a barrier released, a sleeper woken
                joining = [w for w in group.waves if w not in budget and w.group not in ended and ready(w)]
                if joining:
                    budget.update(dict.fromkeys(joining, self.quantum))
                    granted.update(dict.fromkeys(joining, self.quantum))
                    turn = sorted(turn + joining, key=lambda w: w.slot)

    def _catch_up(self, stopped, turn, budget, granted, ended) -> None:
        """A wave whose quantum ended behind the turn's other running waves runs
        one more (once a turn), so that it reaches them and they run as one batch
        again (else a wave that fell behind, e.g. while it polled, stays behind:
        each turn it and they run a quantum each, apart). Not in a workgroup whose
        turn `ended`."""
        quantum = self.quantum
        behind = [w for w, reason in stopped.items()
                  if reason == "quantum" and granted[w] == quantum and w.group not in ended]
        if not behind:
            return
        ahead = max((w.pc for w in turn if w not in stopped and w.group not in ended), default=-1)
        for w in behind:
            if w.pc <= ahead:
                budget[w] += quantum
                granted[w] += quantum
                del stopped[w]

    def _run_cohort(self, grid, at, pc, others, budget, code, steps, hits, kernel, scoreboard):
        """Run the waves `at` (all at `pc`, in slot order) in lock-step while they
        stay together below `others` (the lowest PC of the turn's other waves) and
        none stops; returns ({wave: why it stopped}, the workgroups whose waves
        performed stores).
        A batched step leaves the waves' `pc` behind (no batchable closure reads
        it) until an unbatched step or the end of the cohort. So does a closure's
        `cohort` form (SALU, saveexec, SMEM loads, s_waitcnt: fn(waves), no signal,
        no global store, no read of the pc; an s_waitcnt's returns True, having
        done nothing, where a wave would perform stores: then wave by wave; a
        branch: fn(waves, pc after it) -> the pc they all go to, or None when they
        part), which runs the instruction for all the waves at once, as each
        would alone, in order (salu.py, memops.py, decode_control)."""
        batchable, stops, jumps, quiet, spans = steps
        touches, effects = scoreboard.touches, scoreboard.effects
        count = len(at)
        runs = None  # its batches (runs of consecutive slots), made at first need
        gathered = None  # [state.Gathered of all `at`] for GATHERED_CLASSES steps, made at first need
        limit = min(map(budget.__getitem__, at))  # steps before the first wave's quantum ends
        pending = _pending(at)
        stopped, performed, taken, batched, batches = {}, set(), 0, 0, 0
        who = at[0]
        try:
            while True:
                mask = touches[pc]
                if pending & mask:
                    for w in at:
                        if w.pending & mask:
                            scoreboard.check(w, pc)
                taken += 1
                if count > 1 and batchable[pc]:
                    if runs is None:
                        runs = _contiguous(grid, at)
                    if spans[pc] is not None and len(runs) > 1:  # once over all, gathered
                        gathered = gathered or [Gathered(grid, [w.slot for w in at])]
                        batches += self._run_batched(grid, gathered, code[pc], kernel, pc, spans[pc])
                    else:
                        batches += self._run_batched(grid, runs, code[pc], kernel, pc, spans[pc])
                    hits[pc] += count
                    batched += count
                    if effects[pc][2]:  # a load (LDS): its destinations are pending now
                        pending = _pending(at)
                    pc += 1
                    if taken == limit or pc >= others:
                        break
                    continue
                run = code[pc]
                if quiet[pc]:  # SALU: no signal, no store, no read of the pc (left behind as above)
                    over = getattr(run, "cohort", None)  # once for the cohort's waves (salu.py)
                    if over is not None:
                        over(at)
                    else:
                        for who in at:
                            run(who)
                    hits[pc] += count
                    pc += 1
                    if taken == limit or pc >= others:
                        break
                    continue
                if jumps[pc]:  # a branch: no signal, no store
                    over = getattr(run, "cohort", None)  # decided once for the cohort (salu.py)
                    if over is not None:
                        hits[pc] += count
                        pc = over(at, pc + 1)  # None: they part, each wave's pc set
                        if pc is None or taken == limit or pc >= others:
                            break
                        continue
                    after = pc + 1
                    for who in at:
                        who.pc = after
                        run(who)
                    hits[pc] += count
                    pc = at[0].pc
                    if taken == limit or count > 1 and any(w.pc != pc for w in at):
                        pc = None  # their pcs are theirs
                        break
                    if pc >= others:
                        break
                    continue
                over = getattr(run, "cohort", None)
                if over is not None and not over(at):  # once for the cohort's waves (an SMEM load, an
                    # s_waitcnt: no signal, no global store; True: it did nothing, wave by wave below)
                    hits[pc] += count
                    pending = _pending(at)
                    pc += 1
                    if taken == limit or pc >= others:
                        break
                    continue
                going = at
                over = getattr(run, "over", None)  # s_endpgm: the cohort's waves end at once
                if over is not None:
                    stopped = dict.fromkeys(at, "end")  # (in wave order)
                    going = over(at, pc + 1, performed)  # those left to end wave by wave
                for who in going:
                    who.pc = pc + 1
                    unperformed = who.unperformed
                    signal = run(who)
                    if who.unperformed < unperformed:
                        performed.add(who.group)
                    if signal:
                        if signal == "retry":  # not done: the same instruction next turn
                            who.pc = pc
                            hits[pc] -= 1
                            budget[who] += 1
                        stopped[who] = signal
                hits[pc] += count
                if stopped or performed or taken == limit:
                    pc = None
                    break
                if stops[pc]:  # a memory or synchronising instruction may issue or retire loads
                    pending = _pending(at)
                pc += 1
                if pc >= others:  # the turn's other waves are there (or lower): choose again
                    break
        except Exception as error:  # numpy/indexing failures inside an instruction too
            if isinstance(error, EmulatorError) and "wave" in str(error):
                raise
            raise _named(error, who, kernel, pc) from error
        self._batched += batched
        self._batches += batches
        if pc is not None:
            for w in at:
                w.pc = pc
        for w in at:
            left = budget[w] = budget[w] - taken
            if not left and w not in stopped:
                stopped[w] = "quantum"
        return stopped, performed

    @staticmethod
    def _run_batched(grid, runs, run, kernel, pc, spans) -> int:
        """Run the instruction at `pc` once for each of `runs` (state.Batch, a
        state.Gathered with the register `spans` it copies, or a wave), a batch of
        several workgroups a workgroup at a time when it says so
        (memops.ByWorkgroup); returns how many runs it took."""
        taken = 0
        for batch in runs:
            if batch.waves is not None:
                batch.read_exec()
            try:
                if type(batch) is Gathered:
                    batch.run(run, grid.registers, spans)
                else:
                    run(batch)
                taken += 1
            except ByWorkgroup:
                taken += Machine._run_batched(grid, _contiguous(grid, batch.waves, by_group=True), run, kernel,
                                              pc, spans)
            except Exception as error:  # numpy/indexing failures inside an instruction too
                if isinstance(error, EmulatorError) and "wave" in str(error):
                    raise
                raise _named(error, batch, kernel, pc) from error
        return taken

    def _run_quantum(self, w, code, hits, kernel, scoreboard, budget, stops=None):
        """Run `w` for up to `budget` instructions, stopping before one of `stops`
        (not the first) if given; returns (instructions run, why it stopped: None
        when at a stop)."""
        trace, touches, quantum, timer = self.trace, scoreboard.touches, budget, self._timer
        pc = w.pc
        try:
            while budget:
                pc = w.pc
                if stops is not None and budget < quantum and stops[pc]:
                    return quantum - budget, None
                if w.pending & touches[pc]:
                    scoreboard.check(w, pc)
                w.pc = pc + 1
                hits[pc] += 1
                budget -= 1
                signal = code[pc](w)
                if timer is not None and timer.executed(w, pc, signal) and not signal:
                    return quantum - budget, "time"  # past the timed scheduler's window
                if trace is not None:
                    trace(w, kernel.instructions[pc] if pc < len(kernel.instructions) else None)
                if signal:
                    if signal == "retry":  # not done: the same instruction next turn
                        w.pc, hits[pc], budget = pc, hits[pc] - 1, budget + 1
                    return quantum - budget, signal
        except Exception as error:  # numpy/indexing failures inside an instruction too
            if isinstance(error, EmulatorError) and "wave" in str(error):
                raise
            raise _named(error, w, kernel, pc) from error
        return quantum, "quantum"

    def _finish(self, stats: Stats, classes, groups, ended: int) -> None:
        """The launch's counters; `ended`: its waves that ended in its opening."""
        counts = collections.Counter()
        for cls, hit in zip(classes, self._hits):
            counts[cls] += hit
        counts.pop("none", None)
        stats.instructions = dict(sorted(counts.items()))
        stats.executed = list(self._hits)
        stats.wave_instructions = sum(counts.values())
        for region in self.memory.regions:
            stats.bytes_read[region.name] = region.read
            stats.bytes_written[region.name] = region.written
        stats.cache_policy = {key: cell[0] for key, cell in stats.cache_policy.items() if cell[0]}
        stats.workgroups = len(groups)
        stats.waves = sum(len(g.waves) for g in groups) + ended
        stats.polls = {(g.index, w.index): w.polls for g in groups for w in g.waves if w.polls}


@contextlib.contextmanager
def _cycle_collection_paused():
    """A launch allocates a great many containers that live to its end (waves and
    their queues, closures, caches) and frees its temporaries by reference count;
    the cycle collector those allocations trigger would walk every object of the
    process again and again (torch's too: two thirds of an idle-grid launch). It
    is paused for the launch and collects its cycles after."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _named(error, w, kernel, pc: int) -> EmulatorError:
    """`error` from the instruction at `pc` of `w` (a wave or a batch) naming the
    wave; a numpy/indexing failure as an EmulatorError naming the instruction too."""
    if isinstance(error, EmulatorError):
        return type(error)(f"{error} [{w.name}]")
    ins = kernel.instructions[pc] if pc < len(kernel.instructions) else None
    where = ins.where() if ins else "past the end"
    return EmulatorError(f"{type(error).__name__}: {error} at {where} [{w.name}]")


def _contiguous(grid, waves, by_group: bool = False) -> list:
    """`waves` (in slot order) as one state.Batch per run of consecutive slots (of
    one workgroup if `by_group`), a lone wave as itself."""
    first, last = waves[0], waves[-1]
    if last.slot - first.slot == len(waves) - 1 and (not by_group or first.group is last.group):
        return [grid.batch(first.slot, last.slot + 1) if len(waves) > 1 else first]  # one run (slots ascend)
    runs, first = [], 0
    for k in range(1, len(waves) + 1):
        if (k == len(waves) or waves[k].slot != waves[k - 1].slot + 1
                or by_group and waves[k].group is not waves[k - 1].group):
            runs.append(grid.batch(waves[first].slot, waves[k - 1].slot + 1) if k - first > 1
                        else waves[first])
            first = k
    return runs


class _Turn:
    """Consecutive workgroups that take their turn as one (`_turns`); `waves`, all
    their waves, made at first use."""

    __slots__ = ("_waves", "groups")

    def __init__(self, groups):
        self.groups = groups
        self._waves = None

    @property
    def waves(self) -> list:
        if self._waves is None:
            self._waves = [w for g in self.groups for w in g.waves]
        return self._waves


def _turns(live, wake, now):
    """The round's turns: each workgroup of `live` in order, where consecutive ones
    whose waves are ready at the same PCs (the workgroups of a stage, mostly) take
    one turn together, so that their waves run in lock-step and a VALU, MFMA, LDS
    or vector memory instruction once for all of them. Ready: as Machine._schedule's
    `ready` (round `now`, sleepers' wake-up rounds `wake`), inline. Yields (turn,
    its waves' pcs, -1 for those not ready, as seen here: a turn's first
    workgroup is seen before the turn before it runs, the others after)."""
    run, key = [], None
    for g in live:
        if not wake and g.live == len(g.waves) and not g.arrived:  # none done, none at a barrier
            mine = [w.pc for w in g.waves]
        elif wake:
            mine = [-1 if w.done or w.waiting or wake.get(w, 0) > now else w.pc for w in g.waves]
        else:  # no wave has slept yet
            mine = [-1 if w.done or w.waiting else w.pc for w in g.waves]
        if mine != key and run:
            yield run[0] if len(run) == 1 else _Turn(run), key
            run = []
        run.append(g)
        key = mine
    if run:
        yield run[0] if len(run) == 1 else _Turn(run), key


# run once over waves in slots apart (state.Gathered)
GATHERED_CLASSES = frozenset(("valu", "mfma", "lds", "vmem_load", "vmem_store"))


def _gather_spans(scoreboard, batchable, classes) -> list:
    """Per instruction a state.Gathered runs (a batchable VALU, MFMA, LDS or vector
    memory instruction), the spans of
    vector register rows it reads or writes and of those it writes (the scoreboard's
    register effects: its explicit operands; a batchable closure writes its first
    operand's registers only), else None."""
    rows = (1 << inflight.SGPR_BIT) - 1
    return [(row_spans((reads | writes) & rows), row_spans(writes & rows))
            if batch and cls in GATHERED_CLASSES else None
            for (reads, writes, _), batch, cls in zip(scoreboard.effects, batchable, classes)]


def _wave_bounds(owners, waves: int) -> list[int]:
    """Where each of a batch's `waves` begins in its active lanes (`owners`: each
    lane's wave, ascending), and the end."""
    return np.searchsorted(owners, np.arange(waves + 1)).tolist()


def _note_load(mem, w, addresses, size: int, through_l1: bool) -> None:
    """w issues a vector load: what its next sleep polls (coherence.StrictMemory.poll)."""
    if w.polled_lines:
        mem.unpoll(w)
    w.last_load = (addresses, size)
    if not w.pending:  # no load outstanding: a new burst
        w.bypass_loads = []
    if not through_l1:
        w.bypass_loads.append(w.last_load)


def _pending(waves) -> int:
    """Registers an outstanding load of any of `waves` still writes."""
    pending = 0
    for w in waves:
        pending |= w.pending
    return pending


def _dims(name: str, value) -> tuple[int, int, int]:
    dims = tuple(value) + (1,) * (3 - len(tuple(value)))
    if len(dims) != 3 or not all(isinstance(d, int) and d >= 1 for d in dims):
        raise EmulatorError(f"{name}: expected up to 3 positive ints, got {value!r}")
    return dims


def _order(order, grid) -> list[int]:
    count = grid[0] * grid[1] * grid[2]
    if order == "forward":
        return list(range(count))
    if order == "reverse":
        return list(range(count))[::-1]
    order = list(order)
    if sorted(order) != list(range(count)):
        raise EmulatorError(f"order: expected a permutation of range({count}), got {order!r}")
    return order


def _raiser(error, ins):
    message = str(error) if ins is None or ins.where() in str(error) else f"{error} ({ins.where()})"
    kind = type(error) if isinstance(error, EmulatorError) else UnsupportedInstruction

    def raise_it(w):
        raise kind(message)
    raise_it.raises = True  # (an opening leaves it to the scheduler: opening.kinds)
    return raise_it


def _live_waves(groups) -> list:
    return [w for g in groups for w in g.waves if not w.done]


def _deadlock_report(live, kernel, reason: str) -> str:
    lines = []
    for w in live[:16]:
        pc = max(w.pc - 1, 0)
        ins = kernel.instructions[min(pc, len(kernel.instructions) - 1)]
        state = "at s_barrier" if w.waiting else f"polling ({w.polls} sleeps)" if w.polls else "running"
        lines.append(f"  {w.name}: {state}, last at {ins.where()}")
    more = f"\n  ... and {len(live) - 16} more waves" if len(live) > 16 else ""
    return (f"{reason}; {len(live)} waves still running:\n"
            + "\n".join(lines) + more)


# ---------------------------------------------------------------- control instructions


def dispatch(mnemonic: str) -> tuple[str, object]:
    """(instruction class, decoder) of a mnemonic: the first matching DISPATCH prefix."""
    for prefix, cls, decoder in DISPATCH:
        if mnemonic.startswith(prefix):
            return cls, decoder
    return "unknown", None


def decode(ins, ctx):
    decoder = dispatch(ins.mnemonic)[1]
    if decoder is None:
        raise UnsupportedInstruction(f"{ins.mnemonic} not implemented ({ins.where()})")
    return decoder(ins, ctx)


def decode_control(ins, ctx):
    name = ins.mnemonic
    if name == "s_waitcnt":
        vm, lgkm = _counter(ins, "vmcnt"), _counter(ins, "lgkmcnt")
        mem, progress = ctx.mem, ctx.progress

        def wait(w):
            if vm is not None and len(w.vm) > vm and inflight.retire_vm(w, vm, mem, progress):
                return "retry"
            if lgkm is not None and (w.lds or w.smem):
                inflight.retire_lgkm(w, lgkm, progress)
        def wait_over(waves):
            """`wait` of each of a cohort's waves, where none performs a store (an
            LDS store performs, no wave stops); True, having done nothing, where
            one would (inflight.retire_loads_over)."""
            if vm is not None and inflight.retire_loads_over(waves, vm):
                return True
            if lgkm is not None:
                inflight.retire_lgkm_over(waves, lgkm, progress)
            return None
        if vm is not None or lgkm is not None:
            wait.cohort = wait_over
        return wait
    if name in ("s_nop", "s_setprio", "s_icache_inv"):
        return lambda w: None
    if name == "s_sleep":
        rounds = int(ins.operands[0], 0) if ins.operands else 0

        def sleep(w):
            w.polls += 1
            w.sleep_rounds = rounds
            ctx.mem.poll(w)
            return "sleep"
        return sleep
    if name == "s_barrier":
        return lambda w: _arrive(w, ctx)
    if name == "s_endpgm":
        machine, mem = ctx.machine, ctx.mem

        def end(w):
            if w.vm and inflight.retire_vm(w, 0, ctx.mem, ctx.progress):
                return "retry"  # its stores still perform, one at a time
            if w.lds or w.smem:
                inflight.retire_lgkm(w, 0, ctx.progress)
            if w.polled_lines:
                ctx.mem.unpoll(w)
            w.done = True
            group = w.group
            group.live -= 1
            machine._progress = True  # ctx.progress(), inline: every wave ends here
            if group.arrived:  # its other waves wait at a barrier
                _release_if_complete(group, ctx)
            return "end"

        def end_all(waves, after: int, performed: set) -> list:
            """s_endpgm of a cohort's `waves` at once (their pc set to `after`), as `end`
            wave by wave, in wave order, for those that have no LDS or SMEM
            operation outstanding and sleep on no line, of workgroups not waiting
            at a barrier, and whose vector memory instructions retire at once
            (inflight.retire_all_unwatched: loads; stores and write-backs
            performed in program order, no store reaching a line a wave sleeps on,
            and only while no wave before them was left to `end`); adds the
            workgroups of the waves that performed stores to `performed`. Returns
            the others, untouched, to end wave by wave (what their ends do, retire
            their counters, perform their stores, does not read whether another
            wave ended; a wave with stores after one of them is among them, so
            that the waves' stores perform in wave order)."""
            rest = []
            for w in waves:
                group = w.group
                if w.lds or w.smem or w.polled_lines or group.arrived:
                    rest.append(w)
                    continue
                if w.vm:
                    unperformed = w.unperformed
                    if unperformed and rest or not inflight.retire_all_unwatched(w, mem):
                        rest.append(w)
                        continue
                    if unperformed:
                        performed.add(group)
                w.pc = after
                w.done = True
                group.live -= 1
            if len(rest) < len(waves):
                machine._progress = True
            return rest
        end.over = end_all
        return end
    raise UnsupportedInstruction(f"{name} not implemented ({ins.where()})")


# The gfx9 s_waitcnt immediate: vmcnt bits 3:0 and 15:14, lgkmcnt bits 11:8.
_RAW_COUNTERS = {"vmcnt": lambda v: (v & 0xF) | ((v >> 14) & 3) << 4, "lgkmcnt": lambda v: (v >> 8) & 0xF}


def _counter(ins, name: str) -> int | None:
    """The count an s_waitcnt waits for on counter `name` (None: it does not wait on it)."""
    for token in ins.operands:
        if token.startswith(f"{name}("):
            return int(token[len(name) + 1:-1])
        if token[0].isdigit():
            return _RAW_COUNTERS[name](int(token, 0))
    return None


def _arrive(w, ctx):
    w.waiting = True
    w.group.arrived += 1
    _release_if_complete(w.group, ctx)
    return "barrier"


def _release_if_complete(group, ctx) -> None:
    if not group.arrived:
        return
    live = [w for w in group.waves if not w.done]
    if group.arrived == len(live):
        for w in live:
            w.waiting = False
        group.arrived = 0
        ctx.stats.barriers += 1
        ctx.progress()


# ---------------------------------------------------------------- initial state


class LaunchSetup:
    """Initial wave state as the kernel descriptor (`.amdhsa_*`) asks (AMDGPUUsage,
    "Initial Kernel Execution State"): user SGPRs, then system SGPRs, then v0."""

    USER_SGPRS = (  # directive, SGPR count, value source
        ("user_sgpr_private_segment_buffer", 4, "zero"),
        ("user_sgpr_dispatch_ptr", 2, "dispatch"),
        ("user_sgpr_queue_ptr", 2, "queue"),
        ("user_sgpr_kernarg_segment_ptr", 2, "kernarg"),
        ("user_sgpr_dispatch_id", 2, "zero"),
        ("user_sgpr_flat_scratch_init", 2, "zero"),
        ("user_sgpr_private_segment_size", 1, "zero"),
    )

    def __init__(self, machine, kernel, grid, block, kernargs: bytes, dynamic_lds: int):
        self.machine, self.kernel, self.grid, self.block = machine, kernel, grid, block
        d = kernel.directive
        if d("float_denorm_mode_32", 3) != 3:
            raise UnsupportedInstruction("f32 denormal flushing (.amdhsa_float_denorm_mode_32 != 3) "
                                         "is not modelled")
        if d("private_segment_fixed_size", 0) or d("uses_dynamic_stack", 0):
            raise UnsupportedInstruction(f"kernel {kernel.name!r} uses scratch (private segment), "
                                         "which the emulator does not model")
        needed = d("kernarg_size", 0)
        if len(kernargs) < needed:
            raise EmulatorError(f"kernargs: expected at least {needed} bytes "
                                f"(.amdhsa_kernarg_size, hidden arguments included), got {len(kernargs)}")
        self.kernarg_bytes = kernargs + bytes(-len(kernargs) % 8)
        threads = block[0] * block[1] * block[2]
        if threads > 1024:
            raise EmulatorError(f"block: expected at most 1024 threads, got {block} = {threads}")
        self.lds_bytes = d("group_segment_fixed_size", 0) + dynamic_lds
        limit = ARCH_LDS_BYTES[machine.arch]
        if self.lds_bytes > limit:
            raise EmulatorError(f"dynamic_lds: {self.lds_bytes} bytes of LDS exceed {machine.arch}'s {limit}")
        self.accum_offset = d("accum_offset", 4)
        self.vector_registers = max(d("next_free_vgpr", 1), self.accum_offset, 1)
        self.threads = threads

        self.launch_buffers = {  # launch-private memory the initial SGPRs point at
            "kernargs": np.frombuffer(bytearray(self.kernarg_bytes), np.uint8),
            "dispatch_packet": self._dispatch_packet(),
            "queue": np.zeros(256, np.uint8),
        }

    def _user_sgprs(self, kernarg_base: int, packet: int, queue: int) -> list[int]:
        d = self.kernel.directive
        values = []
        for directive, count, source in self.USER_SGPRS:
            if not d(directive, 0):
                continue
            address = {"kernarg": kernarg_base, "dispatch": packet, "queue": queue}.get(source, 0)
            values += [address & 0xFFFFFFFF, address >> 32][:count] + [0] * max(0, count - 2)
        preload = d("user_sgpr_kernarg_preload_length", 0)
        if preload:
            start = d("user_sgpr_kernarg_preload_offset", 0)
            words = np.frombuffer(self.kernarg_bytes, "<u4")
            values += words[start // 4:start // 4 + preload].tolist()
        expected = d("user_sgpr_count", len(values))
        if len(values) != expected:
            raise UnsupportedInstruction(f"user SGPR layout: directives enable {len(values)} SGPRs "
                                         f"but .amdhsa_user_sgpr_count is {expected}")
        return values

    def _dispatch_packet(self) -> np.ndarray:
        """An AQL kernel dispatch packet, for kernels that read the dispatch pointer."""
        packet = np.zeros(64, np.uint8)
        packet[4:10] = np.array(self.block, "<u2").view(np.uint8)
        grid_size = [g * b for g, b in zip(self.grid, self.block)]
        packet[12:24] = np.array(grid_size, "<u4").view(np.uint8)
        packet[28:32] = np.array([self.lds_bytes], "<u4").view(np.uint8)
        return packet

    def workgroups(self, kernarg: int, packet: int, queue: int, order: list[int], mem, opening=None):
        """The launch's workgroups in `order`, and their Grid of vector registers;
        with an `opening` (opening.Opening), the waves as it left them (those that
        ended in it not among them)."""
        d = self.kernel.directive
        user = self._user_sgprs(kernarg, packet, queue)
        system = [axis for axis in "xyz" if d(f"system_sgpr_workgroup_id_{axis}", 0)]
        if d("system_sgpr_workgroup_info", 0):
            raise UnsupportedInstruction("workgroup_info system SGPR is not modelled")
        v0 = self._work_item_ids(d("system_vgpr_workitem_id", 0) + 1)
        execs = [exec_state(M64 >> (LANES - min(LANES, self.threads - index * LANES))) for index in range(len(v0))]
        gx, gy, _ = self.grid
        blank = [0] * (SGPR_SLOTS - len(user) - len(system))
        axes = ["xyz".index(axis) for axis in system]
        starts = []
        for linear in order:
            group_id = (linear % gx, (linear // gx) % gy, linear // (gx * gy))
            starts.append((linear, group_id, mem.cu(linear), user + [group_id[a] for a in axes] + blank))
        waves = len(order) * len(v0)
        if opening is not None and opening.kinds[0] is not None:
            registers = np.zeros((self.vector_registers, waves, LANES), np.uint32)  # (register-major)
            registers[0] = np.tile(v0, (len(order), 1))
            going = opening.run(starts, execs, range(len(user), len(user) + len(axes)), registers)
            if going is not None:
                rows, likes, own = going
                grid = Grid(len(rows), self.vector_registers, len(order), self.lds_bytes)
                grid.registers[:] = registers[:, rows].transpose(1, 0, 2)
                return grid.resume(starts, len(v0), rows.tolist(), likes, own), grid
        grid = Grid(waves, self.vector_registers, len(order), self.lds_bytes)
        grid.registers[:, 0] = np.tile(v0, (len(order), 1))
        return grid.start(starts, execs), grid

    def _work_item_ids(self, components: int) -> np.ndarray:
        """v0 of every wave of a workgroup, [waves, 64]: gfx90a+ packs the work-item
        ids into it, x[9:0], y[19:10], z[29:20]."""
        thread = np.arange(-(-self.threads // LANES) * LANES).reshape(-1, LANES)
        bx, by, _ = self.block
        ids = (thread % bx, (thread // bx) % by, thread // (bx * by))
        v0 = np.zeros(thread.shape, np.uint32)
        for axis in range(components):
            v0 |= (ids[axis] << (10 * axis)).astype(np.uint32)
        return v0


# classes a wave may run alone between scheduler choices (machine.Machine._run_turn)
SOLO_CLASSES = frozenset(("salu", "branch", "nop", "valu"))
# classes whose closures never stop a wave, perform a store or read its pc (s_getpc_b64
# excepted): a cohort runs them wave after wave with no bookkeeping (Machine._run_cohort)
QUIET_CLASSES = frozenset(("salu", "nop"))

# mnemonic prefix -> instruction class (the counters' key) and decoder; first match wins.
DISPATCH = (
    ("v_mfma", "mfma", decode_mfma),
    ("v_", "valu", decode_valu),
    ("s_cbranch", "branch", decode_branch),
    ("s_branch", "branch", decode_branch),
    *((f"s_{name}", name, decode_control) for name in ("barrier", "waitcnt", "sleep", "nop", "endpgm")),
    *((name, "salu", decode_control) for name in ("s_setprio", "s_icache_inv")),
    *((name, "smem", decode_smem)
      for name in ("s_load", "s_buffer_load", "s_memtime", "s_memrealtime", "s_dcache")),
    ("s_", "salu", decode_sop),
    ("ds_", "lds", decode_ds),
    *((name, "cache", decode_buffer) for name in ("buffer_wbl2", "buffer_inv", "buffer_wbinvl1")),
    *((f"{segment}_{op}", f"vmem_{op}", decoder)
      for segment, decoder in (("global", decode_global), ("flat", decode_global), ("buffer", decode_buffer))
      for op in ("load", "store", "atomic")),
)
