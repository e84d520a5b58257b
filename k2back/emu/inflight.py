"""What a wave has in flight: its outstanding memory instructions, what an
s_waitcnt retires, and the scoreboard that turns a register used before its
load returned into an error.

Counters (LLVM AMDGPUUsage "Memory Model GFX942"; LLVM SIInsertWaitcnts.cpp):
- vmcnt counts a wave's vector memory instructions (loads, stores, atomics,
  buffer_wbl2; not buffer_inv, which SIInsertWaitcnts does not count), exec 0 or
  not. Their "completion is reported to a wavefront in execution order", so
  `s_waitcnt vmcnt(N)` completes every one but the N newest.
- lgkmcnt counts LDS instructions (DS, ds_swizzle/permute too), completed in
  order, and SMEM ones (s_load*, s_buffer_load*, s_memtime), which return out of
  order: `lgkmcnt(N)` completes every LDS instruction but the N newest, and SMEM
  ones only at N = 0.

A load's data is read when it is issued (the oldest value it may return) and sits
in its registers, but the scoreboard forbids touching them until the counter
covers the load. A store is performed (coherence.py says what that makes
visible) only when the counter covering it retires it, or at s_endpgm: as late as
allowed. One s_waitcnt's stores perform in an order the ISA allows and the kernel
likes least: completion is reported in order, but the L2 channels perform writes
in any order ("a separate request queue per channel", AMDGPUUsage), so newest
first; a buffer_wbl2 after every older store of its wave (it writes back the
wave's earlier stores, SIMemoryLegalizer), and an older store never overwrites a
newer one's bytes (a wave's own accesses stay coherent). When a store reaches a
line another wave sleeps on (a flag), the storing wave stops there and retries
the s_waitcnt on its next turn: the sleeper sees that store before the rest.
A wave sees its own stores at once: a load takes the bytes of the wave's own
unperformed stores. An atomic first performs the wave's unperformed stores (in
order). LDS stores perform at the lgkmcnt that covers them or at the wave's next
LDS access (a wave's LDS operations stay in order; other waves' may see them late).

The scoreboard (ScoreboardError, naming register, load, reader and asm lines):
- reading a register an outstanding load (VMEM load, atomic with return, LDS
  read or cross-lane op, SMEM load) will write, before the s_waitcnt covering it;
- writing such a register (the load's return would overwrite it), except by a
  later load of the same in-order counter (vmcnt, or LDS), whose return comes after.
A store's data and address VGPRs are read when it issues on gfx9: SIInsertWaitcnts
keeps them locked until completion only before Sea Islands
(`vmemWriteNeedsExpWaitcnt`), so overwriting them after the issue is allowed.
"""

from __future__ import annotations

import itertools

import numpy as np

from .coherence import ATOM, LINE_BITS, among, byte_addresses, store_phases
from .errors import ScoreboardError, UnsupportedInstruction
from .operands import parse

LOAD, STORE, WRITEBACK, LDS_STORE = range(4)
TORN = object()  # Op.parts of a store of several pieces until it performs (_phases)
SGPR_BIT = 512  # scoreboard bits: unified VGPR/AGPR rows 0.., then SGPRs


class Op:
    """One outstanding memory instruction: the registers its return writes (`dst`,
    a bit mask) and, until it is performed (`done`), what it still has to do: a
    store's bytes (`flat` addresses, `values`; `span`: the lowest and highest
    address; `parts`: of a store wider than its atomic pieces, TORN until it
    performs, then the (flat, values) of each phase still to perform, coherence.
    store_phases, or None when it performs whole, _phases), an LDS store's (write,
    args) or a write-back's scope (True: agent or system) in `perform`."""

    __slots__ = ("done", "dst", "flat", "ins", "kind", "parts", "perform", "span", "values")

    def __init__(self, ins, kind: int, dst: int = 0, done: bool = True):
        self.ins, self.kind, self.dst, self.done = ins, kind, dst, done
        self.flat = self.values = self.perform = self.span = self.parts = None


class Load:
    """An Op of kind LOAD (done when issued), the most frequent: only its
    instruction and the registers it returns to are its own. Never changed once
    queued (_expect replaces it): several waves' queues may hold one."""

    __slots__ = ("dst", "ins")
    kind, done = LOAD, True
    flat = values = perform = span = parts = None

    def __init__(self, ins, dst: int):
        self.ins, self.dst = ins, dst


# ------------------------------------------------------------------ issue


def _expect(w, queue, op) -> None:
    """The registers op's return writes are not ready until it is covered; a newer
    load of the same in-order queue takes them over from an older one (which
    becomes a Load of its other registers: a Load may be in several waves'
    queues, issue_over, and is never changed)."""
    if op.dst:
        if w.pending & op.dst:
            for index, older in enumerate(queue):
                if older.dst & op.dst:  # a Load (the other kinds return to no register)
                    queue[index] = Load(older.ins, older.dst & ~op.dst)
        w.pending |= op.dst
    queue.append(op)


def issue_vm(w, ins, dst: int = 0) -> None:
    """A vector memory load or atomic (performed when issued), or one with exec 0."""
    _expect(w, w.vm, Load(ins, dst))


def issue_store(w, ins, mem, flat: np.ndarray, values: np.ndarray, span=None) -> None:
    """A store (`flat`, `values`: its bytes, every lane's; `span`: (flat.min(),
    flat.max()) when the caller knows them): covering more than one single-copy
    atomic piece, its phases perform one by one (coherence.store_phases), a sleeper
    woken by one sees it before the next (_phases: computed when it performs, and
    only if a wave sleeps on its lines)."""
    op = Op(ins, STORE, 0, not mem.strict)
    op.flat, op.values = flat, values
    if mem.strict:
        op.span = (int(flat.min()), int(flat.max())) if span is None else span
        if op.span[0] // ATOM != op.span[1] // ATOM:  # more than one single-copy atomic piece
            op.parts = TORN  # its phases, when it performs (_perform)
        w.unperformed += 1
    else:
        mem.store(w.group.cu, flat, values)
    w.vm.append(op)


def issue_writeback(w, ins, mem, agent: bool) -> None:
    op = Op(ins, WRITEBACK, done=not mem.strict)
    op.perform = agent
    if mem.strict:
        w.unperformed += 1
    w.vm.append(op)


def issue_lds(w, ins, dst: int = 0) -> None:
    _expect(w, w.lds, Load(ins, dst))


def issue_lds_store(w, ins, mem, write, args) -> None:
    op = Op(ins, LDS_STORE, done=not mem.strict)
    if mem.strict:
        op.perform = (write, args)
        w.lds_unperformed += 1
    else:
        write(*args)
    w.lds.append(op)


def issue_smem(w, ins, dst: int) -> None:
    _expect(w, w.smem, Load(ins, dst))


def issue_over(waves, queue: str, ins, dst: int, masked: bool = True) -> None:
    """issue_vm, issue_lds or issue_smem (`queue`: "vm", "lds", "smem") of each of
    `waves`, whose return writes `dst` (nothing, for a wave with exec 0, where
    `masked`), one Load for all (never changed: _expect): a wave with none of
    those registers pending only appends it."""
    op = Load(ins, dst)
    blank = Load(ins, 0) if masked and dst else op
    for w in waves:
        mine = op if blank is op or w.exec else blank
        if w.pending & mine.dst:
            _expect(w, getattr(w, queue), mine)
        else:
            w.pending |= mine.dst
            getattr(w, queue).append(mine)


# ------------------------------------------------------------------ what a wave sees of its own stores


def forward(w, addresses: np.ndarray, size: int, data: np.ndarray) -> None:
    """Bytes of a load (`data` [lanes, size]) the wave's own unperformed stores
    wrote: theirs, oldest first."""
    flat = byte_addresses(addresses, size)
    values = data.reshape(-1)
    for op in w.vm:
        if op.kind == STORE and not op.done:
            order = np.argsort(op.flat, kind="stable")
            keys = op.flat[order]
            at = np.searchsorted(keys, flat, side="right") - 1
            hit = (at >= 0) & (keys[np.maximum(at, 0)] == flat)
            values[hit] = op.values[order[at[hit]]]


def perform_own_stores(w, mem) -> None:
    """Perform the wave's unperformed stores in program order (before an atomic)."""
    for op in w.vm:
        while not op.done:
            _perform(w, op, mem, ())
    w.unperformed = 0


def drain_lds(w) -> None:
    """Before a wave's LDS access: its earlier LDS stores, in order."""
    for op in w.lds:
        if not op.done:
            write, args = op.perform
            write(*args)
            op.done = True
    w.lds_unperformed = 0


# ------------------------------------------------------------------ retirement


def retire_vm(w, keep: int, mem, progress) -> bool:
    """`s_waitcnt vmcnt(keep)`: complete all but the `keep` newest. Returns True when
    the wave must stop and retry (a store woke a sleeper, more remain)."""
    queue = w.vm
    count = len(queue) - keep
    if count <= 0:
        return False
    if w.unperformed:
        batch = list(itertools.islice(queue, count))
        if _unwatched(batch, mem):
            _perform_in_order(w, batch, mem)
            progress()
        elif _perform_newest_first(w, batch, mem, progress):
            return True
    pending, take = w.pending, queue.popleft
    for _ in range(count):
        pending &= ~take().dst
    w.pending = pending
    return False


def retire_all_unwatched(w, mem) -> bool:
    """retire_vm(w, 0, ...) where it performs its stores and write-backs at once, in
    program order (_unwatched; or it has none): then True, the queue empty (the
    caller calls progress() if w.unperformed was not 0); else False, nothing done."""
    queue = w.vm
    if w.unperformed == 1 and len(queue) == 1:  # one store or write-back (mostly): _unwatched, inline
        op = queue[0]
        if op.kind == STORE:
            first, last = op.span
            if mem.polled and mem.polled_between(first >> LINE_BITS, last >> LINE_BITS):
                return False
            op.done, op.parts = True, None
            mem.store(w.group.cu, op.flat, op.values, op.span)
        else:
            op.done = True
            mem.writeback(w.group.cu, op.perform)
        w.unperformed = 0
        queue.clear()
        return True
    if w.unperformed:
        batch = list(queue)
        if not _unwatched(batch, mem):
            return False
        _perform_in_order(w, batch, mem)
    pending = w.pending
    if pending:
        for op in queue:
            pending &= ~op.dst
        w.pending = pending
    queue.clear()
    return True


def _perform_in_order(w, batch, mem) -> None:
    """Perform the stores and write-backs of `batch`, none performed yet, in program
    order (_unwatched holds): the stores whole (_phases), a newer one's bytes
    overwriting an older one's, the write-backs last."""
    cu = w.group.cu
    for op in batch:
        if op.kind == STORE:
            op.done, op.parts = True, None
            mem.store(cu, op.flat, op.values, op.span)
    for op in batch:
        if not op.done:  # the write-backs, last
            op.done = True
            mem.writeback(cu, op.perform)
    w.unperformed -= sum(1 for op in batch if op.kind != LOAD)


def _perform_newest_first(w, batch, mem, progress) -> bool:
    """retire_vm's stores and write-backs of `batch` where a sleeper may see their
    order: newest store first, write-backs last (after their wave's older stores).
    Returns True when the wave must stop and retry (a store woke a sleeper, more remain)."""
    todo = [i for i in range(len(batch) - 1, -1, -1) if not batch[i].done and batch[i].kind == STORE]
    todo += [i for i, op in enumerate(batch) if not op.done and op.kind != STORE]
    for step, i in enumerate(todo):
        op = batch[i]
        newer = [other for other in batch[i + 1:] if other.kind == STORE and other.done]
        woke = _perform(w, op, mem, newer)
        progress()
        while not op.done:  # a torn store: its next phase on the wave's next turn if it woke one
            if woke:
                return True
            woke = _perform(w, op, mem, newer)
        w.unperformed -= 1
        if woke and step + 1 < len(todo):
            return True
    return False


def _unwatched(batch, mem) -> bool:
    """Whether the stores and write-backs of a retired `batch` may perform at once in
    program order (retire_vm): none is performed yet (no newer one holds its bytes
    already) and no wave sleeps on a line a store writes (none wakes a sleeper, so
    nothing runs between them, and each byte ends up the newest store's in the
    L2 either way: newest first, an older store skips a newer one's bytes)."""
    low = high = None
    for op in batch:
        if op.kind != LOAD:
            if op.done:
                return False
            if op.kind == STORE:
                first, last = op.span
                if low is None:
                    low, high = first, last
                else:
                    low, high = min(low, first), max(high, last)
    return low is None or not mem.polled_between(low >> LINE_BITS, high >> LINE_BITS)


def _perform(w, op, mem, newer) -> bool:
    """Perform op, or the next phase of a torn store (op.done once its last is)."""
    if op.kind == WRITEBACK:
        op.done = True
        mem.writeback(w.group.cu, op.perform)
        return False
    if op.parts is TORN:
        op.parts = _phases(op, mem)
    if op.parts:
        flat, values = op.parts.pop(0)
        op.done = not op.parts
    else:
        op.done = True
        flat, values = op.flat, op.values
    low, high = op.span
    newer = [other.flat for other in newer if other.span[1] >= low and other.span[0] <= high]
    span = op.span
    if newer:  # bytes a newer store of the batch wrote stay the newer store's
        keep = ~among(flat, np.concatenate(newer))
        flat, values, span = flat[keep], values[keep], None
    return bool(flat.size) and mem.store(w.group.cu, flat, values, span)


def _phases(op, mem) -> list | None:
    """The (flat, values) of each phase of a store of several single-copy atomic
    pieces (coherence.store_phases), or None to perform it whole: when no wave
    sleeps on a line it writes, its phases perform back to back (one _perform
    call after another, as retire_vm and perform_own_stores do when the first
    woke nobody), and nothing runs between them that could tell them apart."""
    low, high = op.span
    if not mem.polled_between(low >> LINE_BITS, high >> LINE_BITS):
        return None
    phases = store_phases(op.flat)
    if phases is None:
        return None
    first = phases == 0
    return [(op.flat[first], op.values[first]), (op.flat[~first], op.values[~first])]


def retire_lgkm(w, keep: int, progress) -> None:
    """`s_waitcnt lgkmcnt(keep)`: LDS operations but the `keep` newest, in order;
    SMEM loads only when keep is 0."""
    queue = w.lds
    while len(queue) > keep:
        op = queue.popleft()
        if not op.done:
            write, args = op.perform
            write(*args)
            op.done = True
            w.lds_unperformed -= 1
            progress()
        w.pending &= ~op.dst
    if keep == 0 and w.smem:
        for op in w.smem:
            w.pending &= ~op.dst
        w.smem.clear()


def retire_loads_over(waves, keep: int) -> bool:
    """retire_vm(w, keep, ...) of each of `waves` where none has a store or write-back
    among those it retires (then each retires loads only: nothing performs, none
    stops); returns True, having done nothing, where one has."""
    for w in waves:
        if w.unperformed and len(w.vm) > keep:
            return True
    for w in waves:
        queue = w.vm
        count = len(queue) - keep
        if count > 0:
            pending, take = w.pending, queue.popleft
            for _ in range(count):
                pending &= ~take().dst
            w.pending = pending
    return False


def retire_lgkm_over(waves, keep: int, progress) -> None:
    """retire_lgkm of each of `waves` that has an LDS or SMEM operation outstanding,
    in order (`s_waitcnt lgkmcnt(keep)` of a cohort: it neither stops a wave nor
    performs a global store); a wave with SMEM loads only, at keep 0, clears them."""
    for w in waves:
        if w.lds:
            retire_lgkm(w, keep, progress)
        elif w.smem and not keep:
            returned = 0
            for op in w.smem:
                returned |= op.dst
            w.pending &= ~returned
            w.smem.clear()


# ------------------------------------------------------------------ scoreboard

NO_DESTINATION = ("s_cmp", "s_bitcmp", "s_cbranch", "s_branch", "s_waitcnt", "s_nop", "s_sleep",
                  "s_barrier", "s_endpgm", "s_setprio", "s_dcache", "s_icache", "s_setpc",
                  "s_sendmsg", "s_trap", "buffer_wbl2", "buffer_inv", "buffer_wbinvl1")
SMEM_LOADS = ("s_load", "s_buffer_load", "s_memtime", "s_memrealtime")


def _bits(token: str, accum_offset: int, ins) -> int:
    try:
        op = parse(token, accum_offset, ins)
    except UnsupportedInstruction:  # labels, `off`, counters
        return 0
    if op.file == "v":
        return ((1 << op.count) - 1) << op.index
    if op.file == "s":
        return ((1 << op.count) - 1) << (SGPR_BIT + op.index)
    return 0


def register_effects(ins, accum_offset: int) -> tuple[int, int, object]:
    """(registers read, registers written, the in-order queue a load's return uses
    or None) of an instruction, from its explicit operands."""
    name, operands = ins.mnemonic, ins.operands
    bits = [_bits(t, accum_offset, ins) for t in operands]
    segment = name.split("_", 1)[0]
    if name.startswith(NO_DESTINATION) or "_store" in name or name.startswith("ds_write"):
        return _union(bits), 0, None
    if segment in ("global", "flat", "buffer") and "_atomic" in name:
        returns = (bool(ins.modifiers.get("sc0") or ins.modifiers.get("glc")) if segment == "buffer"
                   else len(operands) == (4 if segment == "global" else 3))
        if not returns:
            return _union(bits), 0, None
        if segment == "buffer":  # the old value replaces the data operand
            return _union(bits), bits[0], "vm"
        return _union(bits[1:]), bits[0], "vm"
    if segment == "ds":
        parts = name.split("_")
        if not ("read" in parts[1] or "rtn" in parts or parts[1] in ("swizzle", "bpermute", "permute")):
            return _union(bits), 0, None
        return _union(bits[1:]), bits[0] if bits else 0, "lds"
    queue = "vm" if segment in ("global", "flat", "buffer") else "smem" if name.startswith(SMEM_LOADS) else None
    return _union(bits[1:]), bits[0] if bits else 0, queue


def _union(masks) -> int:
    total = 0
    for mask in masks:
        total |= mask
    return total


class Scoreboard:
    """Every instruction's register effects, checked before it runs while its wave
    has loads outstanding."""

    def __init__(self, kernel, accum_offset: int):
        self.kernel, self.accum_offset = kernel, accum_offset
        self.effects = [register_effects(ins, accum_offset) for ins in kernel.instructions]
        self.effects.append((0, 0, None))  # past the end
        self.touches = [reads | writes for reads, writes, _ in self.effects]  # the quick test

    def check(self, w, pc: int) -> None:
        reads, writes, queue = self.effects[pc]
        hit = w.pending & reads
        if hit:
            raise self._error(w, pc, hit, "reads")
        hit = w.pending & writes
        if hit and not (queue in ("vm", "lds") and not hit & ~_union(op.dst for op in getattr(w, queue))):
            raise self._error(w, pc, hit, "overwrites")

    def _error(self, w, pc: int, hit: int, verb: str) -> ScoreboardError:
        bit = (hit & -hit).bit_length() - 1
        user = self.kernel.instructions[pc]
        for queue, counter in ((w.vm, "vmcnt"), (w.lds, "lgkmcnt"), (w.smem, "lgkmcnt")):
            ops = list(queue)
            for index, op in enumerate(ops):
                if op.dst >> bit & 1:
                    allowed = 0 if queue is w.smem else len(ops) - index - 1
                    return ScoreboardError(
                        f"{self._name(bit)} is used before its load returned: line {user.line}: "
                        f"{user.text} {verb} {self._name(bit)}, which {op.ins.where()} has not "
                        f"written yet (it needs s_waitcnt {counter}({allowed}) or lower first) [{w.name}]")
        raise AssertionError("a pending register without an outstanding load")

    def _name(self, bit: int) -> str:
        if bit >= SGPR_BIT:
            return f"s{bit - SGPR_BIT}"
        if bit >= self.accum_offset:
            return f"a{bit - self.accum_offset}"
        return f"v{bit}"
