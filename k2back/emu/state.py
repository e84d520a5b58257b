"""Architectural state of one wave, of one workgroup and of a launch's vector registers."""

from __future__ import annotations

import functools
import itertools
import operator
from collections import deque

import numpy as np

LANES = 64
M32 = 0xFFFFFFFF
M64 = 0xFFFFFFFFFFFFFFFF
ALL_LANES = np.ones(LANES, dtype=bool)
ALL_LANES.flags.writeable = False

# SGPR-file slots of the named scalar registers (their gfx9 operand encodings).
VCC, M0 = 106, 124
SGPR_SLOTS = 128


def mask_to_int(mask: np.ndarray) -> int:
    return int(np.packbits(mask, bitorder="little").view("<u8")[0])


def lane_masks(value):
    """The lane mask(s) of an exec/vcc value: [64] for an int, [waves, 64] for a
    column of per-wave values (a Batch's SGPRs)."""
    if type(value) is int:
        return int_to_mask(value)
    raw = np.asarray(value, "<u8").reshape(-1, 1).view(np.uint8)
    return np.unpackbits(raw, axis=1, bitorder="little").view(bool)


@functools.lru_cache(maxsize=4096)
def int_to_mask(value: int) -> np.ndarray:
    """The lane mask of a 64-bit exec/vcc value (cached: kernels reuse a few masks;
    the array is read-only so that sharing it is safe)."""
    raw = np.array([value & M64], dtype="<u8").view(np.uint8)
    mask = np.unpackbits(raw, bitorder="little").view(bool)
    mask.flags.writeable = False
    return mask


@functools.lru_cache(maxsize=64)
def all_lanes(waves: int) -> np.ndarray:
    """A Batch's exec mask [waves, 64] when every lane is on (read-only: shared)."""
    mask = np.ones((waves, LANES), dtype=bool)
    mask.flags.writeable = False
    return mask


class Wave:
    """One wave64: scalar file as Python ints, the unified VGPR/AGPR file as numpy rows.

    `r[i]` is v_i and `r[accum_offset + i]` is a_i (gfx90a+ unified register file).
    The exec mask is kept both as an int (scalar ops) and as a lane mask (vector ops).
    """

    __slots__ = (
        "bypass_loads",
        "done",
        "exec",
        "f",
        "full",
        "group",
        "i",
        "index",
        "last_load",
        "lds",
        "lds_unperformed",
        "mask",
        "pc",
        "pending",
        "polled_lines",
        "polls",
        "r",
        "s",
        "scc",
        "sleep_rounds",
        "slot",
        "smem",
        "unperformed",
        "vm",
        "waiting",
    )

    waves = None  # not a Batch

    def __init__(self):
        """A wave's containers (its scalar file and counter queues); Grid.start gives
        it its launch state. Made once and kept: a launch's waves, when it ended,
        become the next launch's (`spare`), so that a grid of thousands of waves
        neither allocates nor frees them (most of an idle grid's cost)."""
        self.s = []
        # outstanding memory instructions by counter (inflight.Op), oldest first
        self.vm = deque()  # vmcnt
        self.lds = deque()  # lgkmcnt, LDS (in order)
        self.smem = deque()  # lgkmcnt, SMEM (out of order)

    def set_exec(self, value: int) -> None:
        self.group.exec_epoch += 1  # the workgroup's batches read their masks again
        value &= M64  # exec_state, inline (every s_*_saveexec of every wave sets it)
        self.exec = value
        if value == M64:
            self.full, self.mask = True, ALL_LANES
        else:
            self.full, self.mask = False, int_to_mask(value)

    @property
    def name(self) -> str:
        return f"workgroup {self.group.index} wave {self.index}"


def exec_state(value: int) -> tuple[int, bool, np.ndarray]:
    """A wave's (exec, full, mask) for the exec value `value`."""
    value &= M64
    if value == M64:
        return value, True, ALL_LANES
    return value, False, int_to_mask(value)


class Grid:
    """The vector registers of every wave of a launch, one array [waves, registers,
    64] in the workgroups' scheduling order, so that a run of waves at the same
    instruction, of one workgroup or of several, executes it once (Batch); and
    the LDS of every workgroup, one array [workgroups, bytes] (`lds`, a row
    each, `lds_cells`: the whole as bytes and as dwords), so that an LDS
    instruction of several workgroups' waves executes once too, each lane
    addressing its own workgroup's row (memops.py)."""

    __slots__ = ("batches", "lds", "lds_cells", "lds_size", "registers", "waves")

    def __init__(self, waves: int, vector_registers: int, workgroups: int = 1, lds_bytes: int = 0):
        self.registers = np.zeros((waves, vector_registers, LANES), dtype=np.uint32)
        # rows a multiple of 16 bytes apart: a dword cell never straddles two workgroups
        self.lds_size = max(lds_bytes, 4)  # a workgroup's
        self.lds = np.zeros((workgroups, -(-self.lds_size // 16) * 16), dtype=np.uint8)
        flat = self.lds.reshape(-1)
        self.lds_cells = (flat, flat.view("<u4"))
        self.waves: list[Wave] = []  # by slot
        self.batches = {}  # (first slot, last slot + 1) -> Batch

    def start(self, workgroups: list[tuple], execs: list[tuple]) -> list[Workgroup]:
        """Start the launch's `workgroups`, (index, id, CU caches (coherence.Cu),
        initial scalar file) each, in scheduling order, of waves with initial exec
        states `execs` (`exec_state` of each wave's exec mask), their waves in
        slot order, each workgroup its row of `lds`. In one pass over the
        waves, one assignment a field (a grid starts thousands): a wave's scalar
        file is a copy of its workgroup's; its counter queues are empty
        (`release`); its vector registers are its rows of `registers` as u32, f32
        and i32 views (made in bulk: numpy's iteration over the three views)."""
        per = len(execs)
        groups = self._groups(workgroups)
        waves = spare(len(workgroups) * per)
        registers = self.registers
        rows = zip(registers, registers.view(np.float32), registers.view(np.int32))
        slot = 0
        for g, (_, _, _, sgprs) in zip(groups, workgroups):
            g.waves = mine = waves[slot:slot + per]
            g.live = per  # its waves not done (s_endpgm counts them down)
            for k, w, (value, full, mask), (r, f, i) in zip(range(per), mine, execs, rows):
                w.s[:] = sgprs
                w.r, w.f, w.i = r, f, i  # its rows of the launch's registers
                w.group = g
                w.index = k  # in its workgroup
                w.slot = slot  # in the launch (Grid.waves)
                slot += 1
                w.scc = w.pc = 0
                _fresh(w)
                # as set_exec sets them (no batch of its workgroup has read a mask yet)
                w.exec = value
                w.full = full
                w.mask = mask
        self.waves = waves
        return groups

    def resume(self, workgroups: list[tuple], per: int, rows: list[int], likes: list[Wave],
               own: dict) -> list[Workgroup]:
        """Start `workgroups` (as `start`, of `per` waves each at the launch's start)
        with the waves a launch's opening left them (opening.py): those in `rows` of
        the launch (ascending), in this Grid's slots in turn (its registers are
        theirs), each with the pc, scalar file, SCC and exec of its Wave in
        `likes`, and, where that file leaves an SGPR out (None), the row's own
        value of it (`own`: {slot: [value a row]})."""
        groups = self._groups(workgroups)
        for g in groups:
            g.waves = []
        registers = zip(self.registers, self.registers.view(np.float32), self.registers.view(np.int32))
        fresh = spare(len(rows))
        for slot, row, like, w, (r, f, i) in zip(itertools.count(), rows, likes, fresh, registers):
            g = groups[row // per]
            w.s[:] = like.s
            for k, values in own.items():
                if w.s[k] is None:
                    w.s[k] = values[slot]
            w.r, w.f, w.i = r, f, i
            w.group = g
            w.index = row % per
            w.slot = slot
            w.scc, w.pc = like.scc, like.pc
            _fresh(w)
            w.exec, w.full, w.mask = like.exec, like.full, like.mask
            g.waves.append(w)
        for g in groups:
            g.live = len(g.waves)
            # some of its waves ended in the opening: in its first turn (machine.Machine._run_turn)
            # its waves run together with the turn's others, as they would have with those
            g.thinned = 0 < g.live < per
        self.waves = fresh
        return groups

    def _groups(self, workgroups: list[tuple]) -> list[Workgroup]:
        """The Workgroups of `workgroups` ((index, id, CU, _) each), an LDS row each in turn."""
        cells = self.lds_cells
        groups = []
        new = Workgroup.__new__
        for base, (index, group_id, cu, _) in zip(range(0, self.lds.size, self.lds.shape[1]), workgroups):
            g = new(Workgroup)
            g.index, g.id, g.cu, g.grid = index, group_id, cu, self
            g.lds_base, g.lds_cells = base, cells
            g.exec_epoch = g.arrived = 0  # exec_epoch: counts exec writes of its waves (Batch.read_exec)
            g.thinned = False  # see resume
            groups.append(g)
        return groups

    def batch(self, first: int, stop: int) -> Batch:
        """The waves in slots first..stop-1 as one Batch (made once)."""
        batch = self.batches.get((first, stop))
        if batch is None:
            batch = self.batches[first, stop] = Batch(self, first, stop)
        return batch

    def release(self) -> None:
        """At the launch's end: its waves drop their references to the launch's state
        (their workgroups: the cycles of its state, so that reference counting frees
        it at once, the cycle collector would walk every wave of a big grid; their
        registers) and become spare waves (`spare`, up to SPARE_WAVES). Called when
        the launch ended, every wave at s_endpgm, which empties its counter queues
        (machine.decode_control: `end`, `end_all`; a launch that raised does not
        release its waves)."""
        for w in self.waves:
            w.group = w.r = w.f = w.i = None
        self.batches.clear()
        keep, self.waves = self.waves[:max(0, SPARE_WAVES - len(_SPARE))], []
        _SPARE.extend(reversed(keep))  # the first to start last


SPARE_WAVES = 4096  # at most as many spare waves kept (Grid.release)
# waves of ended launches, started again by the next (Grid.start), from the end: in
# the order the launch they ended had them
_SPARE: list[Wave] = []


def _fresh(w: Wave) -> None:
    """A starting wave's scheduling state: s_sleep executions; scoreboard: registers
    an outstanding load still writes (bit mask); stores / write-backs in `vm` not
    performed yet; not done, not at a barrier (`waiting`); no vector load yet
    (`last_load`: (lane addresses, bytes a lane)); no line polled
    (coherence.StrictMemory.poll); (lane addresses, bytes a lane) of its
    L1-bypassing vector loads issued since it last had no load outstanding (what
    a sleep polls: coherence.StrictMemory.poll)."""
    w.polls = w.sleep_rounds = w.pending = w.unperformed = w.lds_unperformed = 0
    w.done = w.waiting = False
    w.last_load = None
    w.polled_lines = ()
    w.bypass_loads = []


def spare(count: int) -> list[Wave]:
    """`count` waves to start: spare ones (of ended launches) first, then new ones."""
    taken = _SPARE[:-count - 1:-1]
    del _SPARE[len(_SPARE) - len(taken):]
    return taken + [Wave() for _ in range(count - len(taken))]


class Workgroup:
    """Workgroup `index` (`id`: its (x, y, z)) of a launch's `grid` (Grid.start makes
    it): its waves' vector registers are consecutive rows of the Grid, its LDS
    (`lds`) a row of the Grid's LDS, `lds_base` bytes into Grid.lds_cells; `cu`:
    its compute unit's caches (coherence.Cu)."""

    __slots__ = ("arrived", "cu", "exec_epoch", "grid", "id", "index", "lds_base", "lds_cells", "live",
                 "thinned", "waves")

    @property
    def lds(self) -> np.ndarray:
        """Its LDS, as bytes (a view of its row of the Grid's)."""
        return self.lds_cells[0][self.lds_base:self.lds_base + self.grid.lds_size]


_EPOCH = operator.attrgetter("exec_epoch")


class Batch:
    """The waves in slots first..stop-1 of a launch (of one workgroup or of several
    consecutive ones), all at the same instruction, seen as one wave of [waves,
    64] lanes by a VALU, MFMA, LDS or vector memory closure: vector registers are views [register,
    wave, lane] of the launch's array, the exec mask is [waves, 64], and an SGPR
    reads as an int when the waves agree on it, else as a column [waves, 1]; a mask
    destination is written wave by wave (operands.vector_writer). `group` is its
    workgroup, None when it spans several."""

    __slots__ = ("all_lanes", "epoch", "f", "full", "group", "groups", "i", "mask", "r", "s", "waves")

    def __init__(self, grid: Grid, first: int, stop: int):
        self._take(grid.waves[first:stop], grid.registers[first:stop])

    def _take(self, waves: list[Wave], registers: np.ndarray) -> None:
        """`registers`: the waves' vector registers [waves, registers, 64]."""
        self.waves = waves
        self.groups = list(dict.fromkeys([w.group for w in waves]))
        self.group = self.groups[0] if len(self.groups) == 1 else None
        self.r = registers.transpose(1, 0, 2)
        self.f, self.i = self.r.view(np.float32), self.r.view(np.int32)
        self.all_lanes = all_lanes(len(waves))
        self.s = _BatchScalars(waves)
        self.epoch = None

    def read_exec(self) -> None:
        """Take the waves' exec masks (again only if one of their workgroups' changed)."""
        group = self.group
        epoch = group.exec_epoch if group is not None else sum(map(_EPOCH, self.groups))
        if self.epoch != epoch:
            self.epoch = epoch
            self.full = all(w.full for w in self.waves)
            self.mask = self.all_lanes if self.full else np.array([w.mask for w in self.waves])

    @property
    def exec(self):
        return _agreed([w.exec for w in self.waves])

    @property
    def name(self) -> str:
        first, last = self.waves[0], self.waves[-1]
        if first.group is last.group:
            return f"workgroup {first.group.index} waves {first.index}-{last.index}"
        return f"workgroup {first.group.index} wave {first.index} to workgroup {last.group.index} wave {last.index}"


class Gathered(Batch):
    """Waves of a launch in slots that are not consecutive (e.g. waves 0-1 of each
    workgroup of a stage), all at the same VALU, MFMA, LDS or vector memory
    instruction, as one Batch: its vector registers are a copy [register, wave,
    lane] (`stage`) that `run` fills with the registers the instruction reads and
    writes, before it, and copies the ones it writes back to the launch's array
    after it. Once per instruction over the waves, instead of once per run of
    consecutive slots. A closure that falls back to running wave by wave must not
    do so on a Gathered (the waves' registers are not its copy): it raises
    memops.ByWorkgroup, and the machine runs the runs of consecutive slots.
    Made for a cohort (machine.Machine._run_cohort) and dropped after it: kept,
    the stages of a launch's cohorts held as much memory as its registers."""

    __slots__ = ("slots", "stage")

    def __init__(self, grid: Grid, slots: list[int]):
        self.slots = np.array(slots)
        # register-major, so that the rows it fills are all the memory it touches
        self.stage = np.empty((grid.registers.shape[1], len(slots), LANES), np.uint32)
        self._take([grid.waves[slot] for slot in slots], self.stage.transpose(1, 0, 2))

    def run(self, run, registers: np.ndarray, rows: tuple) -> None:
        """Run closure `run` on the waves; `rows`: (the spans (lo, hi) of register rows it
        reads or writes, the spans of those it writes), as `row_spans` gives them."""
        reads, writes = rows
        slots, stage = self.slots, self.stage
        for lo, hi in reads:
            stage[lo:hi] = registers[slots, lo:hi].transpose(1, 0, 2)
        run(self)
        for lo, hi in writes:
            registers[slots, lo:hi] = stage[lo:hi].transpose(1, 0, 2)


def row_spans(mask: int, gap: int = 16) -> list[tuple[int, int]]:
    """The register rows of bit mask `mask` as spans [lo, hi), spans fewer than `gap`
    rows apart joined (one copy of a few rows more is cheaper than two copies)."""
    spans = []
    row = 0
    while mask:
        skip = (mask & -mask).bit_length() - 1
        mask >>= skip
        row += skip
        run = (~mask & (mask + 1)).bit_length() - 1  # its trailing ones
        if spans and row - spans[-1][1] < gap:
            spans[-1] = (spans[-1][0], row + run)
        else:
            spans.append((row, row + run))
        mask >>= run
        row += run
    return spans


class _BatchScalars:
    __slots__ = ("waves",)

    def __init__(self, waves):
        self.waves = waves

    def __getitem__(self, i):
        return _agreed([w.s[i] for w in self.waves])


def _agreed(values: list):
    first = values[0]
    if values.count(first) == len(values):
        return first
    return np.array(values, np.uint64).reshape(-1, 1)
