"""A launch's opening: the waves' private instructions, run as arrays before any wave is scheduled.

An instruction is private when no other wave can change what it computes or see
what it does: SALU and forward branches (the wave's scalar file, SCC, exec and
pc), VALU on its own registers (v_cmp masks into its SGPRs included), s_nop, and
s_endpgm of a wave with nothing outstanding. Such instructions commute with
everything every other wave does, so each wave may run its private start before
the scheduler begins, with the same results as in any schedule. The machine then
starts each wave where its opening stopped — at its first memory, LDS,
synchronising, hazard-checked or unrun instruction, or a backward branch's
target — with the state it reached, and a wave whose opening reached s_endpgm
is counted and never becomes a Wave (most waves of an idle persistent grid:
the opening is what makes a grid of thousands of waves cheap to start).

Waves with one scalar state (a class: SGPRs, SCC, exec, pc) run a scalar
instruction once, on a Wave standing for all of them; a VALU instruction runs
once over the rows of every class at its pc (the launch's vector registers,
state.Grid.registers), and a mask it writes into SGPRs or exec splits the
classes by the values written (`Rows.write_mask`). The SGPRs that differ
between workgroups at the start (the workgroup ids) are left out of a class's
state (None in its Wave's scalar file) until an instruction names them: then
the class splits by their values.
"""

from __future__ import annotations

import functools

import numpy as np

from .inflight import SGPR_BIT
from .operands import parse
from .state import LANES, Batch, Wave, all_lanes

# Waves a class at least, on average, for the opening to run an instruction: below,
# its waves run their scalar instructions one by one anyway, and the scheduler's
# cohort forms do that cheaper than classes (the opening stops them there).
SHARED = 4


class _Group:
    """The workgroup of the waves standing for classes: what Wave.set_exec and the
    cohort forms touch of a workgroup."""

    __slots__ = ("exec_epoch",)

    def __init__(self):
        self.exec_epoch = 0


def kinds(kernel, code, checked, classes, batchable, quiet, effects, accum_offset: int) -> list:
    """Per instruction, how the opening runs it: "scalar" (a quiet SALU, once per
    class), "branch", "vector" (a VALU once over the rows of its classes), "end"
    (s_endpgm), or None: the waves there stop their opening."""
    sgprs = ~((1 << SGPR_BIT) - 1)
    out = []
    for pc, ins in enumerate(kernel.instructions):
        cls, run = classes[pc], code[pc]
        if run is not checked[pc] or getattr(run, "raises", False):
            out.append(None)
        elif quiet[pc]:
            out.append("scalar")
        elif cls in ("branch", "endpgm"):
            out.append("end" if cls == "endpgm" else cls)
        elif cls == "valu" and batchable[pc] and _private_vector(ins, effects[pc][1] & sgprs, accum_offset):
            out.append("vector")
        else:
            out.append(None)
    return out + [None]  # past the end


def _private_vector(ins, sgpr_writes: int, accum_offset: int) -> bool:
    """A VALU instruction whose writes the opening keeps exact: a compare (its masks
    go through operands.vector_writer's write_mask, Rows.write_mask here), a
    v_readfirstlane (Rows.write_rows), or one whose destination is a vector
    register and that writes no SGPR."""
    if ins.mnemonic.startswith(("v_cmp", "v_readfirstlane")):
        return True
    return not sgpr_writes and bool(ins.operands) and parse(ins.operands[0], accum_offset, ins).file == "v"


class Class:
    """Waves (`rows` of the launch's registers, ascending) with one scalar state,
    `wave`'s (pc, SGPRs, SCC, exec); `stopped`: its opening is over."""

    __slots__ = ("rows", "stopped", "wave")

    def __init__(self, wave: Wave, rows: np.ndarray):
        self.wave, self.rows, self.stopped = wave, rows, False


def _give(slots: tuple, w: Wave, values: list) -> None:
    """`w`'s SGPRs `slots` take `values`."""
    for i, value in zip(slots, values):
        w.s[i] = value


def _copy(w: Wave) -> Wave:
    """A Wave standing for a new class, with `w`'s scalar state (no counter queues:
    the opening runs no memory instruction)."""
    c = Wave.__new__(Wave)
    c.s = list(w.s)
    c.scc, c.pc, c.group = w.scc, w.pc, w.group
    c.exec, c.full, c.mask = w.exec, w.full, w.mask
    return c


def _grouping(owner: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """Rows in groups of one class (`owner`: each row's) and one value of each of
    `keys` ([k, rows]): (the rows' order, by class, then keys, rows in order within;
    where each group starts in it)."""
    order = np.lexsort((*keys[::-1], owner))
    owner, keys = owner[order], keys[:, order]
    edge = np.ones(len(order), bool)
    edge[1:] = (owner[1:] != owner[:-1]) | (keys[:, 1:] != keys[:, :-1]).any(axis=0)
    return order, np.flatnonzero(edge).tolist()


def _regroup(classes: list[Class], owner: np.ndarray, keys: np.ndarray, rows: np.ndarray, starts: list,
             assign) -> list[Class]:
    """A class of each group (`_grouping`; `owner`, `keys`, `rows` in its order), its
    Wave given its group's keys by `assign(wave, keys)`: a class's own Wave for its
    last group, copies of it (made before it changes) for the others."""
    out, values = [], keys[:, starts].T.tolist()
    ends = starts[1:] + [len(rows)]
    for k, lo, hi, own in zip(owner[starts].tolist(), starts, ends, values):
        w = classes[k].wave
        w = _copy(w) if hi < len(rows) and owner[hi] == k else w
        assign(w, own)
        out.append(Class(w, rows[lo:hi]))
    return out


class Opening:
    """Runs a launch's waves through their private instructions: `code` (the
    launch's checked closures), `kinds` (`kinds()`), `spans` (the register rows
    each VALU reads and writes, machine._gather_spans), `touches` (each
    instruction's register bits, inflight.Scoreboard.touches: the SGPRs it names).
    Counts `hits[pc]`, wave-instructions run at each, `executed` in all, the
    waves that `ended`, and VALU steps also as `batched` wave-instructions in
    `batches` runs."""

    def __init__(self, code, kinds: list, spans: list, touches: list):
        self.code, self.kinds, self.spans, self.touches = code, kinds, spans, touches
        self.hits = [0] * len(code)
        self.executed = self.batched = self.batches = self.ended = 0
        self.registers = None
        self.varying = {}  # SGPR slot -> each row's value (uint64) where a class leaves it out (None)

    def run(self, starts: list, execs: list, varying: list, registers: np.ndarray) -> list[tuple]:
        """Run the waves of `starts` ((index, id, CU, initial scalar file) a workgroup,
        in scheduling order), with exec states `execs` (state.exec_state, a wave
        each of a workgroup), on the launch's vector `registers` [registers, waves,
        64] (register-major: a register of every wave is one block), a row each
        wave in that order; `varying`: the SGPR slots whose initial
        values differ between workgroups. Returns the waves that go on: their
        rows (ascending), a Wave standing for each (its pc, scalar file, SCC and
        exec), and each row's own values of the SGPRs such a Wave leaves out
        ({slot: [value a row]}); or None, its counts back at 0, when no wave
        ended in it (then the waves start as without it)."""
        per = len(execs)
        self.registers = registers
        self.varying = {i: np.repeat(np.array([start[3][i] for start in starts], np.uint64), per)
                        for i in varying}
        kinds, touches = self.kinds, self.touches
        at, stopped = {0: self._first(starts[0][3], execs, len(starts))}, []  # classes by pc
        while at:
            pc = min(at)  # the lowest first: every class reaches its stop (pcs only grow here)
            here = at.pop(pc)
            kind = kinds[pc]
            if kind is None:
                stopped += here
                continue
            count = sum(len(c.rows) for c in here)
            if kind in ("scalar", "branch"):  # (a VALU reads the workgroup ids row by row)
                named = [i for i in self.varying if touches[pc] >> (SGPR_BIT + i) & 1]
                split = self._split(here, named, count // SHARED)
                if split is None:  # few waves a class: the scheduler's turn (its cohort forms are cheaper)
                    stopped += here
                    continue
                here = split
            if kind != "end" and len(here) * SHARED > count:  # (as above)
                stopped += here
                continue
            if kind == "end":
                self.ended += count
                here = ()
            elif kind == "vector":
                moved = self._vector(here, pc)
                if moved is None:
                    stopped += here
                    continue
                here = moved
            elif kind == "scalar":
                self._scalar(here, pc)
            else:
                self._branch(here, pc)
            self.hits[pc] += count
            self.executed += count
            for c in here:
                if c.stopped:
                    stopped.append(c)
                else:
                    at.setdefault(c.wave.pc, []).append(c)
        self.registers = None
        if not self.ended:  # undone: resuming its waves costs more than starting them again
            self.hits = [0] * len(self.code)
            self.executed = self.batched = self.batches = 0
            return None
        if not stopped:
            return np.zeros(0, np.intp), [], {}
        rows = np.concatenate([c.rows for c in stopped])
        owner = np.repeat(np.arange(len(stopped)), [len(c.rows) for c in stopped])
        order = np.argsort(rows, kind="stable")
        rows = rows[order]
        return rows, [stopped[k].wave for k in owner[order].tolist()], {
            i: values[rows].tolist() for i, values in self.varying.items()
            if any(c.wave.s[i] is None for c in stopped)}

    def _first(self, sgprs: list, execs: list, workgroups: int) -> list[Class]:
        """The launch's classes at its start: its waves with one exec state (a wave
        each of a workgroup), the `varying` SGPRs left out."""
        per, group = len(execs), _Group()
        by_exec = {}
        for k, state in enumerate(execs):
            by_exec.setdefault(state[0], []).append(k)
        rows = np.arange(workgroups * per).reshape(workgroups, per)
        classes = []
        for indices in by_exec.values():
            w = Wave.__new__(Wave)  # (no counter queues: the opening runs no memory instruction)
            w.s = list(sgprs)
            for i in self.varying:
                w.s[i] = None
            w.scc = w.pc = 0
            w.group = group
            w.exec, w.full, w.mask = execs[indices[0]]
            classes.append(Class(w, rows[:, indices].ravel()))
        return classes

    def _split(self, classes: list[Class], slots: list, limit: int) -> list[Class] | None:
        """`classes` where those that leave out any of SGPR `slots` split by their
        rows' values there (each new class holding them); None, nothing changed,
        if that would make more than `limit` classes."""
        if not slots:
            return classes
        alike = {}  # by the slots they leave out
        for c in classes:
            alike.setdefault(tuple(i for i in slots if c.wave.s[i] is None), []).append(c)
        if () in alike and len(alike) == 1:
            return classes
        plans = [(missing, them, self._grouping(them, missing) if missing else None)
                 for missing, them in alike.items()]
        if sum(len(them) if plan is None else len(plan[-1]) for _, them, plan in plans) > limit:
            return None
        return [part for missing, them, plan in plans
                for part in (them if plan is None else _regroup(them, *plan, functools.partial(_give, missing)))]

    def _grouping(self, classes: list[Class], missing: tuple) -> tuple:
        """The rows of `classes` in groups of one class and one value of each of SGPRs
        `missing`, as `_regroup` takes them (each row's class, the values, the rows,
        in `_grouping`'s order; where each group starts)."""
        rows = np.concatenate([c.rows for c in classes])
        owner = np.repeat(np.arange(len(classes)), [len(c.rows) for c in classes])
        keys = np.stack([self.varying[i][rows] for i in missing])
        order, starts = _grouping(owner, keys)
        return owner[order], keys[:, order], rows[order], starts

    def _scalar(self, here: list[Class], pc: int) -> None:
        run = self.code[pc]
        waves = [c.wave for c in here]
        over = getattr(run, "cohort", None)  # once for all (salu.py), as run wave by wave
        if over is not None:
            over(waves)
        else:
            for w in waves:
                run(w)
        for w in waves:
            w.pc = pc + 1

    def _branch(self, here: list[Class], pc: int) -> None:
        run = self.code[pc]
        waves = [c.wave for c in here]
        over = getattr(run, "cohort", None)  # decided once for all (salu.py)
        target = over(waves, pc + 1) if over is not None else None
        if target is not None:
            for w in waves:
                w.pc = target
        elif over is None:
            for w in waves:
                w.pc = pc + 1
                run(w)
        for c in here:  # a loop: the waves go on in the scheduler (the opening ends)
            if c.wave.pc <= pc:
                c.stopped = True

    def _vector(self, here: list[Class], pc: int):
        """The VALU at `pc` once over the rows of `here`; returns the classes they are
        now (split by the masks it wrote), or None when it could not run here (the
        classes stop, untouched)."""
        rows = Rows(here, self.registers, self.varying)
        try:
            if rows.contiguous:
                self.code[pc](rows)
            else:
                rows.gathered(self.code[pc], self.registers, self.spans[pc])
        except _NotPrivate:
            for c in here:
                c.stopped = True
            return None
        for c in rows.parts:
            c.wave.pc = pc + 1
        self.batched += rows.count
        self.batches += 1
        return rows.parts


class _NotPrivate(Exception):
    """A VALU closure asked for what the opening does not give (its waves one by one)."""


class _NoWaves:
    """Rows.waves: a closure that would run wave by wave (an SGPR destination other
    than a compare's mask) stops before it writes (valu._readfirstlane reads `waves`
    first; kinds() admits no such instruction: this is the guard)."""

    def __iter__(self):
        raise _NotPrivate

    def __len__(self):
        raise _NotPrivate

    def __getitem__(self, item):
        raise _NotPrivate


_NO_WAVES = _NoWaves()


class Rows(Batch):
    """The rows of classes at one VALU instruction, seen as one state.Batch: vector
    registers are the launch's rows (Opening.run's registers: a view when they are
    consecutive, else a stage as state.Gathered's), exec masks and SGPRs each row its class's (or its
    own, `varying`, where its class leaves an SGPR out)."""

    __slots__ = ("contiguous", "count", "parts", "positions", "slots", "varying")

    def __init__(self, parts: list[Class], registers: np.ndarray, varying: dict):
        self.parts, self.varying = parts, varying
        rows = np.concatenate([c.rows for c in parts]) if len(parts) > 1 else parts[0].rows
        order = np.argsort(rows, kind="stable")
        self.slots = rows[order]  # ascending
        self.count = count = len(rows)
        owner = np.repeat(np.arange(len(parts)), [len(c.rows) for c in parts])
        self.positions = owner[order]  # each row's class (an index into parts)
        first = int(self.slots[0])
        self.contiguous = int(self.slots[-1]) - first == count - 1
        if self.contiguous:
            self.r = registers[:, first:first + count]
        else:
            self.r = np.empty((registers.shape[0], count, LANES), np.uint32)
        self.f, self.i = self.r.view(np.float32), self.r.view(np.int32)
        self.waves, self.group, self.groups, self.epoch = _NO_WAVES, None, (), None
        self.all_lanes = all_lanes(count)
        self.s = _RowScalars(self)
        self.full = all(c.wave.full for c in parts)
        self.mask = self.all_lanes if self.full else np.stack([c.wave.mask for c in parts])[self.positions]

    def gathered(self, run, registers: np.ndarray, spans: tuple) -> None:
        """`run` over the rows through a stage (state.Gathered.run's copies)."""
        reads, writes = spans
        slots, stage = self.slots, self.r
        for lo, hi in reads:
            stage[lo:hi] = registers[lo:hi, slots]
        run(self)
        for lo, hi in writes:
            registers[lo:hi, slots] = stage[lo:hi]

    def read_exec(self) -> None:
        pass

    def column(self, values: list, slot=None):
        """Each row's class value of `values` (one a class; None: the class leaves
        SGPR `slot` out, each row its own): an int when they agree, else a uint64
        column [rows, 1] (as a Batch's SGPR reads)."""
        first = values[0]
        if first is not None and values.count(first) == len(values):
            return first
        column = np.array([0 if v is None else v for v in values], np.uint64)[self.positions]
        if None in values:
            own = np.isin(self.positions, [k for k, v in enumerate(values) if v is None])
            column[own] = self.varying[slot][self.slots[own]]
            if (column == column[0]).all():
                return int(column[0])
        return column.reshape(-1, 1)

    @property
    def exec(self):
        return self.column([c.wave.exec for c in self.parts])

    @property
    def name(self) -> str:
        return f"{self.count} waves in the launch's opening"

    def write_mask(self, write, bits: np.ndarray) -> None:
        """A compare's mask write: each row's `bits` (uint64 [rows], row order) ANDed
        with its exec (operands.vector_writer), stored as `write_rows` does."""
        execs = np.array([c.wave.exec for c in self.parts], np.uint64)[self.positions]
        self.write_rows(write, bits & execs)

    def write_rows(self, write, values: np.ndarray) -> None:
        """Each row's scalar `values` (uint64 [rows], row order) stored by
        `write(wave, value)` (operands.scalar_writer) once for each class and
        value; a class whose rows wrote different values splits into one class
        per value (`parts`, in order; rows ascending)."""
        parts, positions = self.parts, self.positions
        order, starts = _grouping(positions, values[None])
        if len(starts) == len(parts):  # no class split
            for c, v in zip(parts, values[order[starts]].tolist()):
                write(c.wave, v)
            return
        self.parts = _regroup(parts, positions[order], values[None, order], self.slots[order], starts,
                              lambda w, own: write(w, own[0]))
        owner = np.empty(self.count, np.int64)
        owner[order] = np.repeat(np.arange(len(self.parts)), np.diff(starts + [self.count]))
        self.positions = owner


class _RowScalars:
    __slots__ = ("rows",)

    def __init__(self, rows: Rows):
        self.rows = rows

    def __getitem__(self, i):
        rows = self.rows
        return rows.column([c.wave.s[i] for c in rows.parts], i)
