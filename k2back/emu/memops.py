"""Memory instructions: global/flat/buffer (VMEM), scalar loads (SMEM) and LDS (DS).

Each decoder turns one instruction into `fn(wave)`. Addresses are computed for
the active lanes only (inactive lanes may hold garbage addresses).

Buffer resources (V#): base = dword0 | (dword1 & 0xffff) << 32, stride =
dword1[29:16], num_records = dword2. Range check per element (a dword, or the
whole access when narrower): raw buffers (stride 0, no idxen) check
`voffset + inst_offset + element_offset + element_size <= num_records`;
idxen buffers check `index < num_records`. Whether the SGPR soffset takes
part is not pinned down by a source we could read: an access that is partly
out of range with a nonzero soffset raises. Out-of-range loads return 0,
out-of-range stores are dropped, atomics are all-or-nothing per lane (and
return 0).
"""

from __future__ import annotations

import struct

import numpy as np

from . import inflight
from .errors import EmulatorError, MemoryFault, UnsupportedInstruction
from .memory import ATOMICS, apply_atomic
from .operands import sgpr_or_constant
from .state import LANES, Gathered

U32, U64 = np.uint32, np.uint64

# suffix -> (bytes, register mapping). Mappings: 'dwords' (whole registers),
# 'zext'/'sext' (widened into one register), 'lo'/'hi' + z/s (loaded into a 16-bit
# half, the other half kept), 'low'/'high' (stores of the low bytes / of bits 16..).
# A store's *_d16_hi suffix means 'high' (STORE_ACCESS); a load's means 'hiz'/'his'.
ACCESS = {
    "dword": (4, "dwords"), "dwordx2": (8, "dwords"), "dwordx3": (12, "dwords"),
    "dwordx4": (16, "dwords"),
    "b32": (4, "dwords"), "b64": (8, "dwords"), "b96": (12, "dwords"), "b128": (16, "dwords"),
    "ubyte": (1, "zext"), "sbyte": (1, "sext"), "ushort": (2, "zext"), "sshort": (2, "sext"),
    "u8": (1, "zext"), "i8": (1, "sext"), "u16": (2, "zext"), "i16": (2, "sext"),
    "ubyte_d16": (1, "loz"), "sbyte_d16": (1, "los"), "short_d16": (2, "loz"),
    "ubyte_d16_hi": (1, "hiz"), "sbyte_d16_hi": (1, "his"), "short_d16_hi": (2, "hiz"),
    "u8_d16": (1, "loz"), "i8_d16": (1, "los"), "u16_d16": (2, "loz"),
    "u8_d16_hi": (1, "hiz"), "i8_d16_hi": (1, "his"), "u16_d16_hi": (2, "hiz"),
    "byte": (1, "low"), "short": (2, "low"), "b8": (1, "low"), "b16": (2, "low"),
}
STORE_ACCESS = {**ACCESS, "byte_d16_hi": (1, "high"), "short_d16_hi": (2, "high"),
                "b8_d16_hi": (1, "high"), "b16_d16_hi": (2, "high")}
ATOMIC_TYPES = {"i32": np.int32, "u32": np.uint32, "b32": np.uint32, "f32": np.float32,
                "i64": np.int64, "u64": np.uint64, "b64": np.uint64, "f64": np.float64}
CACHE_BITS = ("sc0", "sc1", "nt")


def registers(size: int) -> int:
    return max(1, size // 4)


def who(w, ins):
    return lambda: f"{w.name}, {ins.where()}"


def active(w, lanes):
    """The active lanes of `lanes` ([64], or [waves, 64] for a Batch), wave by wave."""
    return lanes.reshape(-1) if w.full else lanes[w.mask]


def read_rows(w, row: int, count: int) -> np.ndarray:
    """uint32 [active lanes, count] of registers row..row+count-1."""
    rows = w.r[row:row + count] if w.full else w.r[row:row + count, w.mask]
    return rows.reshape(count, -1).T.copy()  # a copy: queued stores must not see later register writes


def write_rows(w, row: int, values: np.ndarray) -> None:
    count = values.shape[1]
    if w.full:
        w.r[row:row + count] = values.T.reshape(count, *w.r.shape[1:])
    else:
        w.r[row:row + count, w.mask] = values.T


def store_bytes(w, row: int, size: int, kind: str) -> np.ndarray:
    """uint8 [active lanes, size] a store writes from registers starting at `row`."""
    raw = read_rows(w, row, registers(size)).view(np.uint8)
    return raw[:, 2:2 + size] if kind == "high" else raw[:, :size]


def load_lanes(w, row: int, data: np.ndarray, kind: str) -> None:
    """Put loaded bytes [active lanes, size] into registers as `kind` says."""
    size = data.shape[1]
    if kind == "dwords":
        write_rows(w, row, data.view("<u4"))
        return
    value = data.view("<u1" if size == 1 else "<u2")[:, 0].astype(U32)
    if kind in ("sext", "los", "his"):
        value = (value.astype(np.int32) << (32 - 8 * size) >> (32 - 8 * size)).view(U32)
    if kind in ("zext", "sext"):
        write_rows(w, row, value[:, None])
        return
    old = read_rows(w, row, 1)[:, 0]
    value &= U32(0xFFFF)
    merged = (old & U32(0xFFFF0000)) | value if kind.startswith("lo") else (old & U32(0xFFFF)) | (value << U32(16))
    write_rows(w, row, merged[:, None])


def vmem(counter, access, ins, dst: int = 0):
    """The instruction `access(w)`, run only when some lane is active, counted per
    cache policy; with exec 0 too it counts in vmcnt (a load's return writes `dst`)."""
    def run(w):
        if w.exec:
            counter[0] += 1
            access(w)
        inflight.issue_vm(w, ins, dst if w.exec else 0)
    return run


def vmem_load(counter, access, ins, dst: int):
    """A vector load (vmem): a Batch (state.Batch) runs `access` once over its
    waves' active lanes, each wave counted and issued as though it ran alone, in
    wave order (_over_workgroup: where the waves disagree on an SGPR operand or
    an access faults, a workgroup at a time, then wave by wave)."""
    def issued(waves):
        inflight.issue_over(waves, "vm", ins, dst)
    return _over_workgroup(counter, access, vmem(counter, access, ins, dst), issued)


def _over_workgroup(counter, access, alone, issued):
    """A vector memory instruction a Batch (state.Batch) runs once: `access(batch)`
    over its waves' active lanes, then `issued(waves)` (what access leaves to do
    for each wave, in wave order); each wave that has an active lane counted.
    `alone(wave)` runs it for one wave: for a wave, and for each wave of a batch
    of one workgroup whose waves disagree on an SGPR operand (_PerWave) or whose
    access faults (the error names the wave). A batch of several workgroups
    (several CUs: DecodeContext.load gives each its lanes) raises ByWorkgroup
    there instead, before anything is done (but what a fault, which ends the
    launch anyway, leaves): the machine runs it a workgroup at a time, and so
    it does at once for every later batch of several workgroups (the operand the
    workgroups disagreed on, a base address mostly, is a workgroup's own). So
    does a state.Gathered of one workgroup's waves (its registers are a copy
    that `alone` would not write), without the later batches."""
    split = []  # not empty once a batch of several workgroups had to split

    def run(w):
        waves = w.waves
        if waves is None:
            return alone(w)
        if split and w.group is None:
            raise ByWorkgroup
        try:
            live = sum(1 for v in waves if v.exec)
            if live:
                access(w)
        except (_PerWave, EmulatorError):
            if w.group is None:
                split.append(True)
                raise ByWorkgroup from None
            if type(w) is Gathered:
                raise ByWorkgroup from None
            for v in waves:
                alone(v)
            return
        counter[0] += live
        issued(waves)
    run.batchable = True
    return run


class ByWorkgroup(Exception):
    """A batch of several workgroups' waves that must run a workgroup at a time."""


class _PerWave(Exception):
    """A Batch's waves disagree on a scalar operand: run the instruction wave by wave."""


def agreed(value):
    """An SGPR value read from a wave or a Batch: the int the waves agree on, else _PerWave."""
    if type(value) is not int:
        raise _PerWave
    return value


def _by_lane(value):
    """An int, or a per-lane value [lanes] as a column [lanes, 1] (against [lanes, elements])."""
    return value if type(value) is int else value[:, None]


def lane_sgprs(w, first: int, count: int) -> list:
    """SGPRs first..first+count-1 of a wave, or of a Batch's waves: each the int
    they agree on, else int64 [active lanes], each lane's own wave's."""
    if w.waves is None:
        return w.s[first:first + count]
    values = w.waves[0].s[first:first + count]
    if all(v.s[first:first + count] == values for v in w.waves):
        return values
    columns = np.array([v.s[first:first + count] for v in w.waves], np.int64)[owners(w)]
    return [value if (columns[:, i] == value).all() else columns[:, i] for i, value in enumerate(values)]


def owners(w):
    """The wave (position in a Batch) of each active lane, wave-major; None for a wave."""
    if w.waves is None:
        return None
    return np.repeat(np.arange(len(w.waves)), LANES) if w.full else np.nonzero(w.mask)[0]


def vmem_store(counter, access, ins):
    """A store: `access(w)` issues it (with exec 0 it still counts in vmcnt). A
    Batch of one workgroup's waves (state.Batch) runs `access` once: it issues
    each wave's store of its own lanes, in wave order (DecodeContext.store), and a
    wave with exec 0 issues it after (each wave's queue is its own)."""
    def alone(w):
        if w.exec:
            counter[0] += 1
            access(w)
        else:
            inflight.issue_vm(w, ins)

    def issued(waves):
        for v in waves:
            if not v.exec:
                inflight.issue_vm(v, ins)
    return _over_workgroup(counter, access, alone, issued)


def row_bits(row: int, count: int) -> int:
    """Scoreboard bits of vector registers row..row+count-1."""
    return ((1 << count) - 1) << row


def _access(suffix: str, ins, store: bool):
    table = STORE_ACCESS if store else ACCESS
    if suffix not in table:
        raise UnsupportedInstruction(f"{ins.mnemonic}: access width {suffix!r} not implemented ({ins.where()})")
    return table[suffix]


def _note_cache_policy(ctx, ins, kind: str):
    bits = ("glc",) if kind.startswith("smem") else CACHE_BITS  # SMEM keeps gfx9's glc
    policy = " ".join(bit for bit in bits if ins.modifiers.get(bit))
    for legacy in ("glc", "slc", "dlc"):
        if legacy not in bits and ins.modifiers.get(legacy) and ctx.arch in ("gfx942", "gfx950"):
            raise UnsupportedInstruction(f"{legacy} is not a gfx94x/95x cache bit ({ins.where()})")
    key = (kind, policy or "default")
    return ctx.stats.cache_policy.setdefault(key, [0]), policy


# ---------------------------------------------------------------- global / flat


def decode_global(ins, ctx):
    segment, _, rest = ins.mnemonic.partition("_")  # global / flat
    op, _, suffix = rest.partition("_")
    offset = int(ins.modifiers.get("offset", "0"), 0)
    if op == "atomic":
        return _global_atomic(ins, ctx, suffix, offset, segment)
    if op not in ("load", "store") or suffix.startswith("lds"):
        raise UnsupportedInstruction(f"{ins.mnemonic} not implemented ({ins.where()})")
    size, kind = _access(suffix, ins, op == "store")
    counter, policy = _note_cache_policy(ctx, ins, f"{segment} {op}")
    if op == "load":
        data_op, addr_ops = ins.operands[0], ins.operands[1:]
    else:
        addr_ops, data_op = (ins.operands[0], *ins.operands[2:]), ins.operands[1]
    address = _global_address(ins, ctx, segment, addr_ops, offset)
    row = ctx.vector_row(ctx.operand(data_op, ins), registers(size), ins)
    through_l1 = bypasses_l1(policy)

    if op == "load":
        def load(w):
            load_lanes(w, row, ctx.load(w, address(w), size, who(w, ins), through_l1, owners(w)), kind)
        return vmem_load(counter, load, ins, row_bits(row, registers(size)))

    def store(w):
        ctx.store(w, ins, address(w), store_bytes(w, row, size, kind), who(w, ins), owners(w))
    return vmem_store(counter, store, ins)


def bypasses_l1(policy: str) -> bool:
    """Whether a load with these cache bits reads through the CU's L1: sc0 / sc1
    (workgroup scope and wider) bypass it (coherence.py)."""
    return not ("sc0" in policy or "sc1" in policy)


def _global_address(ins, ctx, segment, operands, offset):
    """fn(wave) -> uint64 addresses of the active lanes."""
    vaddr = ctx.operand(operands[0], ins)
    saddr = operands[1] if segment == "global" and len(operands) > 1 else "off"
    if saddr == "off":
        row = ctx.vector_row(vaddr, 2, ins)

        def address64(w):
            lanes = active(w, w.r[row])
            high = active(w, w.r[row + 1])
            return (lanes.astype(U64) | (high.astype(U64) << U64(32))) + U64(offset & (2**64 - 1))
        return address64
    base = ctx.scalar_reader(saddr, 64, ins)
    row = ctx.vector_row(vaddr, 1, ins)
    after = U64(offset & (2**64 - 1))

    def address_sbase(w):
        lanes = (w.r[row] if w.full else w.r[row, w.mask]).reshape(-1).astype(U64)
        sbase = base(w)
        if type(sbase) is int:
            return lanes + U64((sbase + offset) & (2**64 - 1))
        # a batch whose waves' bases differ ([waves, 1]): each lane its own wave's
        return lanes + (sbase[:, 0] + after)[owners(w)]
    return address_sbase


class AtomicForm:
    """One atomic op on elements of `dtype`: `values` source values a lane (2 for
    compare-swap), each `words` registers wide."""

    def __init__(self, name: str, ins):
        wide = name.endswith("_x2")  # 'add_f32' / 'smax_x2' / 'cmpswap'
        op, _, kind = name.removesuffix("_x2").partition("_")
        if kind in ("f32", "f64"):
            dtype = ATOMIC_TYPES[kind]
        elif kind or op not in ATOMICS:
            raise UnsupportedInstruction(f"{ins.mnemonic} not implemented ({ins.where()})")
        else:
            signed = op in ("smin", "smax")
            dtype = (np.int64 if signed else np.uint64) if wide else (np.int32 if signed else np.uint32)
        self.update, self.dtype = ATOMICS[op], np.dtype(dtype)
        self.values = 2 if op == "cmpswap" else 1
        self.words = self.dtype.itemsize // 4

    def sources(self, w, row: int) -> list[np.ndarray]:
        data = read_rows(w, row, self.words * self.values).view(self.dtype)
        return [data[:, i] for i in range(self.values)]

    def returned(self, old: np.ndarray) -> np.ndarray:
        return old.view(U32).reshape(-1, self.words)


def _global_atomic(ins, ctx, name, offset, segment):
    form = AtomicForm(name, ins)
    returns = len(ins.operands) == (4 if segment == "global" else 3)
    operands = ins.operands[1:] if returns else ins.operands
    address = _global_address(ins, ctx, segment, (operands[0], *operands[2:]), offset)
    data_row = ctx.vector_row(ctx.operand(operands[1], ins), form.words * form.values, ins)
    dst_row = ctx.vector_row(ctx.operand(ins.operands[0], ins), form.words, ins) if returns else None
    counter, _ = _note_cache_policy(ctx, ins, f"{segment} atomic")

    def atomic(w):
        old = ctx.atomic(w, address(w), form.dtype, form.update, form.sources(w, data_row), who(w, ins))
        if returns:
            write_rows(w, dst_row, form.returned(old))
    return vmem(counter, atomic, ins, row_bits(dst_row, form.words) if returns else 0)


# ---------------------------------------------------------------- buffer (MUBUF)


def decode_buffer(ins, ctx):
    _, _, rest = ins.mnemonic.partition("_")
    op, _, suffix = rest.partition("_")
    if op in ("wbl2", "inv", "wbinvl1"):
        return _cache_control(ins, ctx, op)
    if ins.modifiers.get("lds") or suffix.startswith("format") or op not in ("load", "store", "atomic"):
        raise UnsupportedInstruction(f"{ins.mnemonic} not implemented ({ins.where()})")
    data_op, vaddr_op, rsrc_op, soffset_op = ins.operands
    offen, idxen = bool(ins.modifiers.get("offen")), bool(ins.modifiers.get("idxen"))
    inst_offset = int(ins.modifiers.get("offset", "0"), 0)
    rsrc = ctx.operand(rsrc_op, ins)
    if rsrc.file != "s" or rsrc.count != 4:
        raise UnsupportedInstruction(f"buffer resource {rsrc_op!r} is not 4 SGPRs ({ins.where()})")
    soffset = ctx.scalar_reader(soffset_op, 32, ins)
    vrow = ctx.vector_row(ctx.operand(vaddr_op, ins), int(offen) + int(idxen), ins) if offen or idxen else None
    counter, policy = _note_cache_policy(ctx, ins, f"buffer {op}")
    s0 = rsrc.index

    def locate(w, element: int, count: int):
        """(the start address of each lane's access [lanes], which lanes' accesses
        lie wholly in range (None: all), and only when some lane's access is partly
        in range (addresses [lanes, count], in-range [lanes, count]) of each
        element, else None)."""
        # ints, or int64 [lanes] where a batch's waves differ (each lane its own wave's V#)
        word0, word1, records = lane_sgprs(w, s0, 3)
        base = word0 | ((word1 & 0xFFFF) << 32)
        stride = (word1 >> 16) & 0x3FFF
        sgpr_offset = agreed(soffset(w))
        start = base + sgpr_offset + inst_offset
        voffset = active(w, w.r[vrow + int(idxen)]).astype(np.int64) if offen else None
        if idxen:
            index = active(w, w.r[vrow]).astype(np.int64)
            starts = index * stride + (voffset if offen else 0)
            lane_ok = index < records
        else:
            starts = voffset if offen else np.zeros(w.mask.size if w.full else np.count_nonzero(w.mask), np.int64)
            lane_ok = None
        # each lane's end, or (one V#) the last one's
        end = None if idxen else (starts.max() if type(records) is int else starts) + inst_offset + element * count
        if sgpr_offset and end is not None and (end + sgpr_offset > records).any():
            # whether soffset takes part in the range check is not pinned down
            raise UnsupportedInstruction(f"buffer range check with a nonzero soffset ({sgpr_offset}) "
                                         f"is not modelled ({ins.where()}, {w.name})")
        if lane_ok.all() if idxen else (end <= records).all():
            return (starts + start).astype(U64), None, None
        if idxen:  # a lane's elements are all in range or all out
            return (starts + start).astype(U64), lane_ok, None
        whole = starts + (inst_offset + element * count) <= records  # its last element is in range
        if (whole == (starts + (inst_offset + element) <= records)).all():  # so is its first: all or none
            return (starts + start).astype(U64), whole, None
        offsets = starts[:, None] + element * np.arange(count)
        return (starts + start).astype(U64), whole, ((offsets + _by_lane(start)).astype(U64),
                                                     offsets + inst_offset + element <= _by_lane(records))

    if op == "atomic":
        return _buffer_atomic(ins, ctx, suffix, data_op, locate, counter)
    size, kind = _access(suffix, ins, op == "store")
    element = min(size, 4)
    count = size // element
    row = ctx.vector_row(ctx.operand(data_op, ins), registers(size), ins)
    through_l1 = bypasses_l1(policy)

    if op == "load":
        def load(w):
            addresses, whole, parts = locate(w, element, count)
            lanes = owners(w)
            if whole is None:
                load_lanes(w, row, ctx.load(w, addresses, size, who(w, ins), through_l1, lanes), kind)
                return
            data = np.zeros((addresses.shape[0], size), np.uint8)
            if parts is None:  # each lane all in range or all out: whole lanes
                if whole.any():  # (the same bytes, and lines, as element by element)
                    data[whole] = ctx.load(w, addresses[whole], size, who(w, ins), through_l1,
                                           None if lanes is None else lanes[whole])
            else:
                elements, in_range = parts
                if in_range.any():
                    data.reshape(elements.shape + (element,))[in_range] = ctx.load(
                        w, elements[in_range], element, who(w, ins), through_l1,
                        None if lanes is None else np.broadcast_to(lanes[:, None], in_range.shape)[in_range])
            load_lanes(w, row, data, kind)
        return vmem_load(counter, load, ins, row_bits(row, registers(size)))

    def store(w):
        addresses, whole, parts = locate(w, element, count)
        data = store_bytes(w, row, size, kind)
        lanes = owners(w)
        if whole is None:
            ctx.store(w, ins, addresses, data, who(w, ins), lanes)
        elif parts is None:  # whole lanes (the same bytes as element by element)
            ctx.store(w, ins, addresses[whole], data[whole], who(w, ins), None if lanes is None else lanes[whole])
        else:
            elements, in_range = parts
            ctx.store(w, ins, elements[in_range], data.reshape(elements.shape + (element,))[in_range], who(w, ins),
                      None if lanes is None else np.broadcast_to(lanes[:, None], in_range.shape)[in_range])
    return vmem_store(counter, store, ins)


def _buffer_atomic(ins, ctx, name, data_op, locate, counter):
    form = AtomicForm(name, ins)
    returns = bool(ins.modifiers.get("sc0") or ins.modifiers.get("glc"))
    row = ctx.vector_row(ctx.operand(data_op, ins), form.words * form.values, ins)

    def atomic(w):
        addresses, in_range, _ = locate(w, form.dtype.itemsize, 1)  # one element: all or none
        if in_range is None:
            in_range = np.ones(addresses.size, bool)
        old = np.zeros(addresses.size, form.dtype)  # out of range: not performed, returns 0
        if in_range.any():
            sources = [s[in_range] for s in form.sources(w, row)]
            old[in_range] = ctx.atomic(w, addresses[in_range], form.dtype, form.update, sources, who(w, ins))
        if returns:
            write_rows(w, row, form.returned(old))
    return vmem(counter, atomic, ins, row_bits(row, form.words) if returns else 0)


def _cache_control(ins, ctx, op):
    """buffer_wbl2 (counted in vmcnt, performed when retired), buffer_inv and
    buffer_wbinvl1 (in effect at once for the wave's later accesses)."""
    counter, policy = _note_cache_policy(ctx, ins, ins.mnemonic)
    agent = "sc1" in policy
    if op == "wbl2":
        def writeback(w):
            counter[0] += 1
            inflight.issue_writeback(w, ins, ctx.mem, agent)
        return writeback

    def invalidate(w):
        counter[0] += 1
        ctx.mem.invalidate(w.group.cu, l1=True, l2=agent and op == "inv")
    return invalidate


# ---------------------------------------------------------------- scalar memory (SMEM)


def decode_smem(ins, ctx):
    name = ins.mnemonic
    if name in ("s_memtime", "s_memrealtime"):
        write = ctx.scalar_writer(ins.operands[0], 64, ins)
        dst = scalar_bits(ctx.operand(ins.operands[0], ins))

        realtime = name == "s_memrealtime"

        def clock(w):  # deterministic: the modeled clock, or wave-instructions executed so far
            write(w, ctx.clock(realtime))
            inflight.issue_smem(w, ins, dst)
        return clock
    if name == "s_dcache_inv":
        return lambda w: ctx.mem.invalidate_scalar(w.group.cu)
    if name == "s_dcache_wb":  # nothing to write back: the kernels make no scalar stores
        return lambda w: None
    op, _, suffix = name.partition("_load_")
    if op not in ("s", "s_buffer") or suffix not in ("dword", "dwordx2", "dwordx4", "dwordx8", "dwordx16"):
        raise UnsupportedInstruction(f"{name} not implemented ({ins.where()})")
    count = 1 if suffix == "dword" else int(suffix[6:])
    dst = ctx.operand(ins.operands[0], ins)
    if dst.file != "s" or dst.count != count:
        raise UnsupportedInstruction(f"{name}: destination {dst.token!r} ({ins.where()})")
    base_op = ctx.operand(ins.operands[1], ins)
    offset = ctx.scalar_reader(ins.operands[2], 32, ins) if len(ins.operands) > 2 else (lambda w: 0)
    # the offset's SGPR or its constant (load_over reads it on the wave's SGPR list itself)
    k, constant = sgpr_or_constant(ctx.operand(ins.operands[2], ins), 32) if len(ins.operands) > 2 else (None, 0)
    extra = int(ins.modifiers.get("offset", "0"), 0)
    memory, first, b = ctx.memory, dst.index, base_op.index
    counter, policy = _note_cache_policy(ctx, ins, "smem load")
    cached, dst_bits = policy != "glc", scalar_bits(dst)
    unpack = struct.Struct(f"<{count}I").unpack  # the loaded bytes as words (ints)

    def load(w):
        counter[0] += 1
        if op == "s":
            address = (w.s[b] | (w.s[b + 1] << 32)) + offset(w) + extra
            valid = count
        else:
            address = (w.s[b] | ((w.s[b + 1] & 0xFFFF) << 32)) + offset(w) + extra
            valid = max(0, min(count, (w.s[b + 2] - (offset(w) + extra)) // 4))
        address &= ~3  # SMEM ignores the two low address bits
        words = [0] * count
        if valid:
            region = memory.region_of(address, 4 * valid, who(w, ins))
            raw = ctx.mem.load_scalar(w, region, address - region.base, 4 * valid, cached)
            words[:valid] = raw.view("<u4").tolist()
            region.read += 4 * valid
        w.s[first:first + count] = words
        inflight.issue_smem(w, ins, dst_bits)

    def load_over(waves):
        """`load` of each of a cohort's waves, in order, where consecutive waves on
        one CU load from one address (the waves of a workgroup, their kernargs):
        the first loads through the CU's scalar cache, those after it take its
        words and count what it counted (what they would load: nothing comes
        between, no store, no other load); a wave of another CU loading the
        address the wave before it loaded takes its words too where memory's
        bytes are what it loads (coherence: repeat_scalar, a buffer no store
        touched: the waves of a grid, their kernargs)."""
        mem, cu, address, words, stale = ctx.mem, None, None, None, 0
        size = 4 * count
        for w in waves:
            s = w.s
            at = ((s[b] | (s[b + 1] << 32)) + (s[k] if k is not None else constant) + extra) & ~3
            mine = w.group.cu
            if at != address:
                address, cu = at, mine
                before = mem.stale_bytes
                region = memory.region_of(at, size, who(w, ins))
                words = unpack(mem.load_scalar(w, region, at - region.base, size, cached))
                stale = mem.stale_bytes - before
            elif mine is cu:
                if stale:
                    mem.stale_bytes += stale
            else:
                cu, stale = mine, 0
                if not mem.repeat_scalar(cu, region, cached):
                    before = mem.stale_bytes
                    words = unpack(mem.load_scalar(w, region, at - region.base, size, cached))
                    stale = mem.stale_bytes - before
            region.read += size
            s[first:first + count] = words
        counter[0] += len(waves)
        inflight.issue_over(waves, "smem", ins, dst_bits, masked=False)

    # (timing mode charges each wave its own access; an exec offset reads no SGPR)
    if op == "s" and (k is not None or constant is not None) and not ctx.machine.timing:
        load.cohort = load_over  # (which does not call `load`: no reference cycle a launch)
    return load


def scalar_bits(op) -> int:
    """Scoreboard bits of an SGPR operand."""
    return ((1 << op.count) - 1) << (inflight.SGPR_BIT + op.index)


# ---------------------------------------------------------------- LDS (DS)


def _lds_addresses(w, row, offset, size, ins):
    """int64 LDS byte addresses of the active lanes, checked for range and alignment
    (each in its own workgroup's LDS)."""
    addresses = active(w, w.r[row]).astype(np.int64) + offset  # never negative
    lds = (w.group or w.waves[0].group).lds  # a batch's workgroups have LDS of one size
    if addresses.size and addresses.max() + size > lds.size:
        bad = int(addresses[np.argmax(addresses + size > lds.size)])
        raise MemoryFault(f"LDS address {bad} (+{size} bytes) outside the workgroup's "
                          f"{lds.size} bytes, {w.name}, {ins.where()}")
    align = min(size, 4)
    if align > 1 and (addresses & (align - 1)).any():
        bad = int(addresses[np.argmax(addresses & (align - 1) != 0)])
        raise MemoryFault(f"misaligned LDS address {bad} for a {size}-byte access, {w.name}, {ins.where()}")
    return addresses


def _lds_space(w, addresses: np.ndarray):
    """(the launch's LDS, state.Grid.lds_cells, the active lanes' `addresses` as
    positions in it): each lane's in its own workgroup's row."""
    group = w.group
    if group is not None:
        return group.lds_cells, addresses + group.lds_base
    bases = np.array([v.group.lds_base for v in w.waves], np.int64)
    return w.waves[0].group.lds_cells, addresses + bases[owners(w)]


def _lds_cells(space, positions: np.ndarray, size: int):
    """(the launch's LDS `space` (bytes, dwords) as an array of cells, the cells
    [lanes, per lane] a `size`-byte access at each byte position covers): dwords
    when size is a multiple of 4 (then _lds_addresses checked them dword-aligned,
    and a workgroup's row starts at a multiple of 16), else bytes."""
    if size % 4:
        return space[0], positions[:, None] + _SPANS[size]
    return space[1], ((positions >> 2)[:, None] + _SPANS[size >> 2] if size > 4 else (positions >> 2)[:, None])


def _span(n: int) -> np.ndarray:
    cells = np.arange(n)
    cells.flags.writeable = False
    return cells


_SPANS = [_span(n) for n in range(17)]  # the cells an access covers, by count (shared: read-only)


def _lds_rows(w, addresses: np.ndarray, size: int) -> np.ndarray:
    """uint8 [lanes, size] of the LDS of `w`'s workgroup(s) at byte `addresses` (checked
    by _lds_addresses)."""
    cells, where = _lds_cells(*_lds_space(w, addresses), size)
    return cells[where].view(np.uint8)


def decode_ds(ins, ctx):
    name = ins.mnemonic
    if name in CROSS_LANE_DS:
        return _over_waves(CROSS_LANE_DS[name](ins, ctx))
    parts = name.split("_")
    op = parts[1]
    if op in ("read", "read2", "read2st64"):
        return _over_waves(_ds_move(ins, ctx, op, "_".join(parts[2:])))
    if op in ("write", "write2", "write2st64"):
        return _over_waves(_ds_move(ins, ctx, op, "_".join(parts[2:])), drains=False)
    return _ds_atomic(ins, ctx)


def _over_waves(run, drains: bool = True):
    """An LDS read, store or cross-lane op that a Batch (state.Batch, of one
    workgroup's waves or of several workgroups', each addressing its own LDS)
    runs once, as one access in wave order: `run` takes a wave or a batch. A
    batch where a wave other than its workgroup's first in it still has LDS
    stores to perform runs a read (`drains`) wave by wave (each performs its own
    before its access: performing them all first would show them to the earlier
    waves' reads, kinder than wave by wave), and so does one with an access out
    of range (the error names the wave); a batch of several workgroups' waves,
    or a state.Gathered (its registers are a copy), raises ByWorkgroup there
    instead, before anything but such a first wave's own earlier stores is
    performed: the machine runs it a workgroup at a time."""
    def each(w):
        waves = w.waves
        if waves is None:
            return run(w)
        if drains and any(v.lds_unperformed and not first for v, first in zip(waves, _firsts(w))):
            if w.group is None or type(w) is Gathered:
                raise ByWorkgroup
            for v in waves:
                run(v)
            return
        try:
            run(w)
        except MemoryFault:
            if w.group is None or type(w) is Gathered:
                raise ByWorkgroup from None
            for v in waves:
                run(v)
    each.batchable = True
    return each


def _firsts(w) -> list[bool]:
    """Whether each wave of a batch is the first of its workgroup in it."""
    if w.group is not None:
        return [True] + [False] * (len(w.waves) - 1)
    before = None
    firsts = []
    for v in w.waves:
        firsts.append(v.group is not before)
        before = v.group
    return firsts


def _issue_lds(w, ins, dst: int, masked: bool = True) -> None:
    """Each wave of `w` (a wave or a batch) issued `ins` (whose return writes
    `dst`; nothing with exec 0 when `masked`)."""
    if w.waves is None:
        inflight.issue_lds(w, ins, dst if w.exec or not masked else 0)
    else:
        inflight.issue_over(w.waves, "lds", ins, dst, masked)


def _ds_move(ins, ctx, op, suffix):
    size, kind = _access(suffix, ins, op.startswith("write"))
    stats = ctx.stats
    pair = op.endswith(("2", "2st64"))
    if pair:
        unit = size * (64 if op.endswith("st64") else 1)
        offsets = [int(ins.modifiers.get(f"offset{i}", "0"), 0) * unit for i in (0, 1)]
    else:
        offsets = [int(ins.modifiers.get("offset", "0"), 0)]
    is_load = op.startswith("read")
    if is_load:
        dst, addr = ins.operands
        data_rows = [ctx.vector_row(ctx.operand(dst, ins), registers(size) * len(offsets), ins)]
        data_rows = [data_rows[0] + i * registers(size) for i in range(len(offsets))]
    else:
        addr, *datas = ins.operands
        data_rows = [ctx.vector_row(ctx.operand(d, ins), registers(size), ins) for d in datas]
    addr_row = ctx.vector_row(ctx.operand(addr, ins), 1, ins)

    if is_load:
        dst_bits = row_bits(data_rows[0], registers(size) * len(offsets))

        def lds_load(w):
            if w.waves is None:
                if not w.exec:
                    inflight.issue_lds(w, ins)
                    return
                if w.lds_unperformed:
                    inflight.drain_lds(w)
            else:  # each workgroup's first wave in the batch (_over_waves: the others have none)
                for v, first in zip(w.waves, _firsts(w)):
                    if first and v.lds_unperformed and v.exec:
                        inflight.drain_lds(v)
            # Both halves of a read2 are read before either is written: the
            # destination may overlap the address register.
            data = [_lds_rows(w, _lds_addresses(w, addr_row, offset, size, ins), size) for offset in offsets]
            for row, values in zip(data_rows, data):
                load_lanes(w, row, values, kind)
                stats.lds_read += values.size
            _issue_lds(w, ins, dst_bits)
        return lds_load

    def lds_store(w):
        if w.waves is None and not w.exec:
            inflight.issue_lds(w, ins)
            return
        writes = [_lds_write(w, _lds_addresses(w, addr_row, offset, size, ins), store_bytes(w, row, size, kind))
                  for row, offset in zip(data_rows, offsets)]
        if w.waves is None:
            inflight.issue_lds_store(w, ins, ctx.mem, _write_lds, (writes, stats))
            return
        # a batch: each wave queues the stores of its own lanes, in wave order
        lanes = [LANES] * len(w.waves) if w.full else w.mask.sum(1).tolist()
        start = 0
        for v, count in zip(w.waves, lanes):
            if not v.exec:
                inflight.issue_lds(v, ins)
                continue
            own = [(cells, where[start:start + count], data[start:start + count]) for cells, where, data in writes]
            inflight.issue_lds_store(v, ins, ctx.mem, _write_lds, (own, stats))
            start += count
    return lds_store


def _lds_write(w, addresses: np.ndarray, data: np.ndarray):
    """A store of uint8 data [lanes, size] at LDS byte `addresses` of `w`'s
    workgroup(s) as _write_lds takes it: (cells, which of them [lanes, per lane],
    their values)."""
    cells, where = _lds_cells(*_lds_space(w, addresses), data.shape[1])
    return cells, where, data.view(cells.dtype)


def _write_lds(writes, stats) -> None:
    for cells, where, data in writes:
        cells[where] = data
        stats.lds_written += data.nbytes


def _ds_atomic(ins, ctx):
    # ds_<op>[_rtn]_<type>: ds_add_u32, ds_add_rtn_f32, ds_cmpst_rtn_b32, ds_max_i32 ...
    parts = ins.mnemonic.split("_")
    returns = "rtn" in parts
    op, kind = parts[1], parts[-1]
    if op in ("min", "max") and kind in ("i32", "i64"):
        op = "s" + op
    if op not in ATOMICS or kind not in ATOMIC_TYPES:
        raise UnsupportedInstruction(f"{ins.mnemonic} not implemented ({ins.where()})")
    dtype = np.dtype(ATOMIC_TYPES[kind])
    per_value = dtype.itemsize // 4
    operands = ins.operands[1:] if returns else ins.operands
    addr_row = ctx.vector_row(ctx.operand(operands[0], ins), 1, ins)
    data_rows = [ctx.vector_row(ctx.operand(t, ins), per_value, ins) for t in operands[1:]]
    dst_row = ctx.vector_row(ctx.operand(ins.operands[0], ins), per_value, ins) if returns else None
    offset = int(ins.modifiers.get("offset", "0"), 0)
    update, stats = ATOMICS[op], ctx.stats
    dst_bits = row_bits(dst_row, per_value) if returns else 0

    def lds_atomic(w):
        if not w.exec:
            inflight.issue_lds(w, ins)
            return
        if w.lds_unperformed:
            inflight.drain_lds(w)
        addresses = _lds_addresses(w, addr_row, offset, dtype.itemsize, ins)
        sources = [read_rows(w, row, per_value).view(dtype)[:, 0] for row in data_rows]
        old = apply_atomic(w.group.lds, addresses, dtype, update, sources, who(w, ins))
        stats.lds_read += old.nbytes
        stats.lds_written += old.nbytes
        if returns:
            write_rows(w, dst_row, old.view(U32).reshape(-1, per_value))
        ctx.progress()
        inflight.issue_lds(w, ins, dst_bits)
    return lds_atomic


# ---------------------------------------------------------------- cross-lane DS ops


SWIZZLE_MODES = ("QUAD_PERM", "BITMASK_PERM", "SWAP", "REVERSE", "BROADCAST")


def swizzle_offset(text: str) -> int:
    """The 16-bit ds_swizzle offset of `offset:swizzle(...)` or a plain number."""
    if not text.startswith("swizzle("):
        return int(text, 0)
    mode, *args = [a.strip().strip('"') for a in text[len("swizzle("):-1].split(",")]
    if mode == "QUAD_PERM":
        return 0x8000 | sum(int(a) << (2 * i) for i, a in enumerate(args))
    if mode == "BITMASK_PERM":  # 5 chars, most significant lane bit first: 0 1 p(reserve) i(nvert)
        and_mask = or_mask = xor_mask = 0
        for i, ch in enumerate(reversed(args[0])):
            bit = 1 << i
            and_mask |= bit if ch in "pi" else 0
            or_mask |= bit if ch == "1" else 0
            xor_mask |= bit if ch == "i" else 0
        return and_mask | or_mask << 5 | xor_mask << 10
    if mode == "SWAP":
        return 0x1F | int(args[0]) << 10
    if mode == "REVERSE":
        return 0x1F | (int(args[0]) - 1) << 10
    if mode == "BROADCAST":
        size, lane = int(args[0]), int(args[1])
        return (0x20 - size) | lane << 5
    raise UnsupportedInstruction(f"ds_swizzle mode {mode}")


def swizzle_sources(offset: int) -> np.ndarray:
    lane = np.arange(64)
    if offset & 0x8000:
        return (lane & ~3) | ((offset >> (2 * (lane & 3))) & 3)
    and_mask, or_mask, xor_mask = offset & 0x1F, (offset >> 5) & 0x1F, (offset >> 10) & 0x1F
    return (lane & ~31) | (((lane & and_mask) | or_mask) ^ xor_mask)


def _ds_swizzle(ins, ctx):
    src = swizzle_sources(swizzle_offset(ins.modifiers.get("offset", "0")))
    dst = ctx.vector_row(ctx.operand(ins.operands[0], ins), 1, ins)
    data = ctx.vector_row(ctx.operand(ins.operands[1], ins), 1, ins)

    def swizzle(w):
        # A lane reading an inactive lane gets 0 (as the other cross-lane DS ops).
        value = np.where(w.mask[..., src], w.r[data][..., src], U32(0))
        np.copyto(w.r[dst], value, where=w.mask)
        _issue_lds(w, ins, row_bits(dst, 1), masked=False)  # an LDS-counter op: lgkmcnt covers it
    return swizzle


def _ds_permute(ins, ctx):
    backward = ins.mnemonic == "ds_bpermute_b32"
    dst, addr, data = (ctx.vector_row(ctx.operand(t, ins), 1, ins) for t in ins.operands)
    offset = int(ins.modifiers.get("offset", "0"), 0)

    def permute(w):  # lanes [64] of a wave or [waves, 64] of a batch
        lanes = ((w.r[addr].astype(np.int64) + offset) >> 2) & 63
        mask = w.mask
        if backward:  # pull: lane i reads lane lanes[i]; inactive sources read 0
            value = np.where(np.take_along_axis(mask, lanes, -1),
                             np.take_along_axis(w.r[data], lanes, -1), U32(0))
        else:  # push: lane i writes lane lanes[i]; the highest active writer wins
            value = np.zeros(lanes.shape, U32)
            writers = np.nonzero(mask)
            value[writers[:-1] + (lanes[writers],)] = w.r[data][writers]
        np.copyto(w.r[dst], value, where=mask)
        _issue_lds(w, ins, row_bits(dst, 1), masked=False)
    return permute


CROSS_LANE_DS = {"ds_swizzle_b32": _ds_swizzle, "ds_bpermute_b32": _ds_permute,
                 "ds_permute_b32": _ds_permute}
