"""Vector ALU decoding: operand plumbing for VOP1/VOP2/VOP3/VOPC/VOP3P, DPP and
SDWA, the cross-lane moves and the fp8 converts. What each operation computes is
the op table in `valu_ops`."""

from __future__ import annotations

import copy

import numpy as np

from . import numerics as nx
from .errors import UnsupportedInstruction
from .operands import MASK, TYPES, vector_reader, vector_writer, with_modifiers
from .state import LANES, mask_to_int
from .valu_ops import (
    IMPLICIT_VCC,
    PRESERVES_HIGH16,
    TIED,
    fma16,
    fma32,
    lanes,
    minmax,
    op_spec,
    split_mnemonic,
)

U32, F32 = np.uint32, np.float32
LANE = np.arange(LANES)
# ops the ISA promises to 1 ulp (Machine(transcendental_error_seed=) errs by that)
TRANSCENDENTAL = {*nx.TRANSCENDENTALS, "v_rcp_iflag_f32"}


# ---------------------------------------------------------------- DPP lane maps

# DPP controls that move data within a row of 16 lanes: the source position of
# row position i, given the control's count n (an invalid position reads nothing).
_ROW_CONTROLS = {
    "row_shl": lambda i, n: i + n,
    "row_shr": lambda i, n: i - n,
    "row_ror": lambda i, n: (i - n) % 16,
    "row_mirror": lambda i, n: 15 - i,
    "row_half_mirror": lambda i, n: (i & 8) + 7 - (i & 7),
}
# Whole-wave controls (count 1 only): lane step and whether it wraps around.
_WAVE_CONTROLS = {"wave_shl": (1, False), "wave_rol": (1, True), "wave_shr": (-1, False),
                  "wave_ror": (-1, True)}
# row_bcast:15 copies lane 15 of each row into the next; row_bcast:31 lane 31 into rows 2-3.
_ROW_BCAST = {15: (LANE - LANE % 16 - 1, LANE >= 16), 31: (np.full(LANES, 31), LANE >= 32)}


def _dpp_map(modifiers: dict) -> tuple[np.ndarray, np.ndarray]:
    """Source lane of every lane and whether it exists, from the DPP control modifiers."""
    if "quad_perm" in modifiers:
        perm = np.array([int(x) for x in modifiers["quad_perm"].strip("[]").split(",")])
        return (LANE & ~3) | perm[LANE & 3], np.ones(LANES, bool)
    for key, position in _ROW_CONTROLS.items():
        if key in modifiers:
            within = LANE % 16
            src = position(within, int(modifiers[key], 0) if modifiers[key] is not True else 0)
            return LANE - within + np.clip(src, 0, 15), (src >= 0) & (src < 16)
    for key, (step, wraps) in _WAVE_CONTROLS.items():
        if key in modifiers:
            src = LANE + step
            return src % LANES, np.ones(LANES, bool) if wraps else (src >= 0) & (src < LANES)
    if "row_bcast" in modifiers:
        src, valid = _ROW_BCAST[int(modifiers["row_bcast"], 0)]
        return np.maximum(src, 0), valid
    raise UnsupportedInstruction(f"DPP control {sorted(modifiers)} not implemented")


def dpp_controls(ins) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    src, valid = _dpp_map(ins.modifiers)
    row_mask = int(ins.modifiers.get("row_mask", "0xf"), 0)
    bank_mask = int(ins.modifiers.get("bank_mask", "0xf"), 0)
    # GCN3/Vega ISA, DPP BANK_MASK: bit b enables lanes 4b..4b+3 of every row;
    # both masks gate only the destination write.
    enabled = (((row_mask >> (LANE // 16)) & (bank_mask >> ((LANE % 16) // 4))) & 1).astype(bool)
    return src, valid, enabled, "bound_ctrl" in ins.modifiers


# ---------------------------------------------------------------- decode


def _bits(text: str | None, count: int, default: int = 0) -> list[int]:
    if text is None:
        return [default] * count
    values = [int(x) for x in text.strip("[]").split(",")]
    return values + [default] * (count - len(values))


def _write_masked(w, write, value, lanes):
    """`write` into the active lanes that are also in `lanes` (DPP row masks, invalid sources)."""
    saved_mask, saved_full = w.mask, w.full
    w.mask, w.full = saved_mask & lanes, False
    try:
        write(w, value)
    finally:
        w.mask, w.full = saved_mask, saved_full


def decode_valu(ins, ctx):
    base, encoding = split_mnemonic(ins.mnemonic)
    special = CROSS_LANE.get(base) or CONVERTS.get(base)
    if special is not None:
        return special(ins, ctx, base)
    if base.startswith("v_pk_"):
        return _decode_packed(ins, ctx, base)
    spec = op_spec(base)
    if spec is None:
        raise UnsupportedInstruction(f"{ins.mnemonic} not implemented ({ins.where()})")
    dst_types, src_types, fn = spec[0].split(), spec[1].split(), spec[2]
    for key in ("mul", "div"):
        if key in ins.modifiers:
            raise UnsupportedInstruction(f"output modifier {key}: on {ins.mnemonic} ({ins.where()})")
    operands = [ctx.operand(t, ins) for t in ins.operands]
    dst_ops, src_ops = operands[: len(dst_types)], operands[len(dst_types):]
    if base in TIED:
        src_ops = src_ops + [dst_ops[0]]
    if base in IMPLICIT_VCC:
        src_ops = src_ops + [ctx.operand("vcc", ins)]
    if len(src_ops) != len(src_types):
        raise UnsupportedInstruction(
            f"{ins.mnemonic}: expected {len(src_types)} sources, got {len(src_ops)} ({ins.where()})")
    where = ins.where()
    # op_sel lists one bit per source, then the destination's.
    op_sel = _bits(ins.modifiers.get("op_sel"), len(src_types) + 1)
    if encoding == "sdwa":
        reads = [_sdwa_reader(op, t, ins, i) for i, (op, t) in enumerate(zip(src_ops, src_types))]
        writes = [_sdwa_writer(dst_ops[0], dst_types[0], ins)]
        writes += [_typed_writer(op, t, where, 0) for op, t in zip(dst_ops[1:], dst_types[1:])]
    else:
        reads = [_typed_reader(op, t, where, s) for op, t, s in zip(src_ops, src_types, op_sel)]
        preserve = base in PRESERVES_HIGH16
        writes = [_typed_writer(op, t, where, op_sel[len(src_types)], preserve)
                  for op, t in zip(dst_ops, dst_types)]
    if base in TRANSCENDENTAL:
        fn = ctx.machine.numerics.transcendental(fn)
    if ins.modifiers.get("clamp"):
        if dst_types[0] not in ("f32", "f16", "f64"):
            raise UnsupportedInstruction(f"integer clamp on {ins.mnemonic} ({where})")
        fn = _clamped(fn)
    if base.startswith("v_cmpx"):  # the mask goes to sdst and to exec
        fn = _twice(fn)
        writes.append(lambda w, m: w.set_exec(w.exec & mask_to_int(np.broadcast_to(m, (LANES,)))))
        return _run(fn, reads, writes)
    if encoding == "dpp":
        return _dpp(ins, fn, reads, writes)
    return batchable(_run(fn, reads, writes)) if encoding != "sdwa" else _run(fn, reads, writes)


def batchable(run):
    """Mark a closure that computes lane-wise from registers, constants and SGPRs
    and writes VGPRs or masks: it may run on a state.Batch of waves."""
    run.batchable = True
    return run


def _clamped(fn):
    """The clamp bit on a float result: clip to [0, 1]."""
    return lambda *sources: np.clip(fn(*sources), 0, 1)


def _twice(fn):
    """v_cmpx: one compare result for two destinations (sdst, then exec)."""
    def both(*sources):
        mask = fn(*sources)
        return mask, mask
    return both


def _typed_reader(op, type_name, where, high):
    dtype = TYPES[type_name]
    if high and (dtype is MASK or dtype.itemsize != 2):
        raise UnsupportedInstruction(f"op_sel on a {type_name} operand ({where})")
    return vector_reader(op, dtype, where, bool(high))


def _typed_writer(op, type_name, where, high, preserve=False):
    dtype = TYPES[type_name]
    if dtype is not MASK and dtype.itemsize == 2:
        return vector_writer(op, dtype, where, bool(high), zero_high=not (high or preserve))
    if high:
        raise UnsupportedInstruction(f"op_sel on a {type_name} destination ({where})")
    return vector_writer(op, dtype, where)


def _run(fn, reads, writes):
    if len(writes) == 1:
        (write,) = writes
        if len(reads) == 1:
            (r0,) = reads
            return lambda w: write(w, fn(r0(w)))
        if len(reads) == 2:
            r0, r1 = reads
            return lambda w: write(w, fn(r0(w), r1(w)))
        if len(reads) == 3:
            r0, r1, r2 = reads
            return lambda w: write(w, fn(r0(w), r1(w), r2(w)))
        return lambda w: write(w, fn(*[r(w) for r in reads]))

    def run(w):
        results = fn(*[r(w) for r in reads])
        for write, value in zip(writes, results):
            write(w, value)
    return run


def _dpp(ins, fn, reads, writes):
    src, valid, enabled, bound_ctrl = dpp_controls(ins)
    read0, rest = reads[0], reads[1:]
    (write,) = writes

    def run(w):  # a wave's lanes [64], or a Batch's [waves, 64]
        source_ok = valid & w.mask[..., src]
        value = np.broadcast_to(read0(w), w.mask.shape)[..., src]
        if bound_ctrl:
            value = np.where(source_ok, value, np.zeros((), value.dtype))
            lanes = enabled
        else:
            lanes = enabled & source_ok
        _write_masked(w, write, fn(value, *[r(w) for r in rest]), lanes)
    return batchable(run)


_SEL = {"BYTE_0": (0, 8), "BYTE_1": (8, 8), "BYTE_2": (16, 8), "BYTE_3": (24, 8),
        "WORD_0": (0, 16), "WORD_1": (16, 16), "DWORD": (0, 32)}


def _sdwa_reader(op, type_name, ins, index):
    shift, width = _SEL[ins.modifiers.get(f"src{index}_sel", "DWORD")]
    raw = vector_reader(_strip_modifiers(op), np.dtype(U32), ins.where())
    dtype = TYPES[type_name]
    mask = U32((1 << width) - 1) if width < 32 else U32(0xFFFFFFFF)

    def read(w):
        field = (np.asarray(raw(w), U32) >> U32(shift)) & mask
        if dtype.itemsize == 2:
            return field.astype(np.uint16).view(dtype)
        return field.view(dtype)
    return with_modifiers(op, read, dtype)


def _strip_modifiers(op):
    plain = copy.copy(op)
    plain.neg = plain.abs = False
    return plain


def _sdwa_writer(op, type_name, ins):
    shift, width = _SEL[ins.modifiers.get("dst_sel", "DWORD")]
    unused = ins.modifiers.get("dst_unused", "UNUSED_PAD")
    if width == 32:
        return vector_writer(op, TYPES[type_name], ins.where())
    if unused != "UNUSED_PAD":
        raise UnsupportedInstruction(f"SDWA dst_unused:{unused} ({ins.where()})")
    write = vector_writer(op, np.dtype(U32), ins.where())
    dtype = TYPES[type_name]
    field_mask = U32((1 << width) - 1)

    def write_field(w, value):
        bits = np.asarray(value, dtype).view(np.uint16 if dtype.itemsize == 2 else U32).astype(U32)
        write(w, (bits & field_mask) << U32(shift))
    return write_field


# ---------------------------------------------------------------- packed (VOP3P)

def _decode_packed(ins, ctx, base):
    _, _, op, kind = base.split("_", 3)
    dtype = TYPES.get(kind)
    fns = {
        "add": np.add, "mul": np.multiply, "sub": np.subtract,
        "fma": {"f32": fma32, "f16": fma16}.get(kind),
        "min": minmax(dtype)[0] if dtype is not None else None,
        "max": minmax(dtype)[1] if dtype is not None else None,
        "mul_lo": np.multiply,
        "mov": lambda a, b: (a, b),
    }
    fn = fns.get(op) if dtype is not None else None
    if fn is None and base != "v_pk_mov_b32":
        raise UnsupportedInstruction(f"{ins.mnemonic} not implemented ({ins.where()})")
    operands = [ctx.operand(t, ins) for t in ins.operands]
    dst, srcs = operands[0], operands[1:]
    n = len(srcs)
    op_sel = _bits(ins.modifiers.get("op_sel"), n)
    op_sel_hi = _bits(ins.modifiers.get("op_sel_hi"), n, 1)
    neg_lo = _bits(ins.modifiers.get("neg_lo"), n)
    neg_hi = _bits(ins.modifiers.get("neg_hi"), n)
    where = ins.where()
    if base == "v_pk_mov_b32":
        dtype = np.dtype(U32)
        fn = None
    if dtype.itemsize == 4:
        lo = [_half_of_pair(op, dtype, s, where) for op, s in zip(srcs, op_sel)]
        hi = [_half_of_pair(op, dtype, s, where) for op, s in zip(srcs, op_sel_hi)]
    else:
        lo = [vector_reader(op, dtype, where, bool(s)) for op, s in zip(srcs, op_sel)]
        hi = [vector_reader(op, dtype, where, bool(s)) for op, s in zip(srcs, op_sel_hi)]
    lo = [_negated(r) if neg else r for r, neg in zip(lo, neg_lo)]
    hi = [_negated(r) if neg else r for r, neg in zip(hi, neg_hi)]
    if base == "v_pk_mov_b32":
        write_lo = vector_writer(_register(dst, 0), dtype, where)
        write_hi = vector_writer(_register(dst, 1), dtype, where)

        # ISA: D[31:0] = S0 dword OPSEL[0], D[63:32] = S1 dword OPSEL[1] (op_sel_hi unused)
        high = _half_of_pair(srcs[1], dtype, op_sel[1], where)
        if neg_hi[1]:
            high = _negated(high)

        def pk_mov(w):
            a, b = np.array(lo[0](w)), np.array(high(w))  # copies: the halves may overlap
            write_lo(w, a)
            write_hi(w, b)
        return batchable(pk_mov)
    if dtype.itemsize == 4:
        write_lo = vector_writer(_register(dst, 0), dtype, where)
        write_hi = vector_writer(_register(dst, 1), dtype, where)

        def pk32(w):
            a = fn(*[r(w) for r in lo])
            b = fn(*[r(w) for r in hi])
            write_lo(w, a)
            write_hi(w, b)
        return batchable(pk32)
    write = vector_writer(dst, np.dtype(U32), where)

    def pk16(w):  # a wave's lanes [64], or a Batch's [waves, 64]
        a = np.broadcast_to(np.asarray(fn(*[r(w) for r in lo]), dtype), w.mask.shape)
        b = np.broadcast_to(np.asarray(fn(*[r(w) for r in hi]), dtype), w.mask.shape)
        write(w, a.view(np.uint16).astype(U32) | (b.view(np.uint16).astype(U32) << U32(16)))
    return batchable(pk16)


def _register(op, offset):
    one = copy.copy(op)
    one.index, one.count = op.index + offset, 1
    return one


def _half_of_pair(op, dtype, select, where):
    if op.file in ("v", "s"):
        return vector_reader(_register(op, select), dtype, where)
    return vector_reader(op, dtype, where)  # a constant feeds both halves


def _negated(read):
    return lambda w: -read(w)


# ---------------------------------------------------------------- cross-lane and converts


def _readfirstlane(ins, ctx, base):
    write = ctx.scalar_writer(ins.operands[0], 32, ins)
    src = ctx.operand(ins.operands[1], ins)
    read = vector_reader(src, np.dtype(U32), ins.where())

    def run(w):  # a wave, or each wave of a Batch its own first lane
        by_row = getattr(w, "write_rows", None)
        if by_row is not None:  # the rows of a launch's opening (opening.Rows): at once
            first = w.mask.argmax(axis=-1) if not w.full else np.zeros(w.count, np.intp)  # (0: none on)
            values = np.broadcast_to(read(w), (w.count, LANES))[np.arange(w.count), first]
            return by_row(write, values.astype(np.uint64))
        waves = w.waves or (w,)
        first = [(v.exec & -v.exec).bit_length() - 1 if v.exec else 0 for v in waves]
        values = np.broadcast_to(read(w), (len(waves), LANES))[np.arange(len(waves)), first]
        for v, value in zip(waves, values.tolist()):
            write(v, value)
    return batchable(run)


def _readlane(ins, ctx, base):
    write = ctx.scalar_writer(ins.operands[0], 32, ins)
    read = vector_reader(ctx.operand(ins.operands[1], ins), np.dtype(U32), ins.where())
    lane = ctx.scalar_reader(ins.operands[2], 32, ins)
    return lambda w: write(w, int(np.broadcast_to(read(w), (LANES,))[lane(w) & 63]))


def _writelane(ins, ctx, base):
    dst = ctx.operand(ins.operands[0], ins)
    value = ctx.scalar_reader(ins.operands[1], 32, ins)
    lane = ctx.scalar_reader(ins.operands[2], 32, ins)
    row = ctx.vector_row(dst, 1, ins)

    def run(w):
        w.r[row, lane(w) & 63] = value(w)
    return run


def _permlane_swap(ins, ctx, base):
    """v_permlane16_swap: odd rows of vdst <-> even rows of src; v_permlane32_swap:
    rows 2-3 of vdst <-> rows 0-1 of src (a row is 16 lanes). Both registers change."""
    a = ctx.vector_row(ctx.operand(ins.operands[0], ins), 1, ins)
    b = ctx.vector_row(ctx.operand(ins.operands[1], ins), 1, ins)
    span = 16 if "16" in base else 32
    first = np.concatenate([np.arange(start + span, start + 2 * span) for start in range(0, LANES, 2 * span)])
    second = first - span

    def run(w):
        if not w.full:
            raise UnsupportedInstruction(f"{base} with a partial exec mask ({ins.where()})")
        w.r[a, first], w.r[b, second] = w.r[b, second].copy(), w.r[a, first].copy()
    return run


def _fp8_convert(ins, ctx, base):
    """v_cvt_[pk_]f32_{fp8,bf8}, v_cvt_pk_{fp8,bf8}_f32 and the gfx950 scalef32 forms."""
    parts = base.split("_")
    kind = next(p for p in parts if p in ("fp8", "bf8"))
    fmt = ctx.machine.numerics.encoder_format(nx.fp8_format(ctx.arch, kind))
    where = ins.where()
    if ins.modifiers.get("clamp"):
        raise UnsupportedInstruction(f"clamp on {ins.mnemonic}: fp8 saturation not modelled ({where})")
    operands = [ctx.operand(t, ins) for t in ins.operands]
    dst, srcs = operands[0], operands[1:]
    op_sel = _bits(ins.modifiers.get("op_sel"), len(srcs) + 1)  # sources, then destination
    encoding = split_mnemonic(ins.mnemonic)[1]
    if encoding == "sdwa":
        # ISA: v_cvt_f32_fp8 takes only the BYTE selects, v_cvt_pk_f32_fp8 only the WORD ones
        sel = ins.modifiers.get("src0_sel", "DWORD")
        legal = ("WORD_0", "WORD_1") if "_pk_" in base else ("BYTE_0", "BYTE_1", "BYTE_2", "BYTE_3")
        if sel not in legal:
            raise UnsupportedInstruction(f"{ins.mnemonic} with src0_sel:{sel}: the ISA allows only "
                                         f"{', '.join(legal)} there ({where})")
        select = _SEL[sel][0]
        byte_sel, word_sel = select // 8, select // 16
    else:
        byte_sel, word_sel = op_sel[0] + 2 * op_sel[1], op_sel[0]
    u32 = np.dtype(U32)
    src = [vector_reader(op, u32 if i == 0 or "scalef32" not in base else np.dtype(F32), where)
           for i, op in enumerate(srcs)]
    decode_pk = f"v_cvt_pk_f32_{kind}"
    if base in (f"v_cvt_f32_{kind}", f"v_cvt_scalef32_f32_{kind}"):
        write = vector_writer(dst, np.dtype(F32), where)
        if "scalef32" in base:
            return batchable(lambda w: write(w, nx.cvt_scalef32_f32_fp8(fmt, src[0](w), src[1](w), byte_sel)))
        return batchable(lambda w: write(w, nx.cvt_f32_fp8(fmt, src[0](w), byte_sel)))
    if base in (decode_pk, f"v_cvt_scalef32_pk_f32_{kind}"):
        ctx.vector_row(dst, 2, ins)
        write_lo, write_hi = (vector_writer(_register(dst, i), np.dtype(F32), where) for i in (0, 1))
        if "scalef32" in base:
            def decode_scaled_pair(w):
                value = nx.cvt_scalef32_pk_f32_fp8(fmt, src[0](w), src[1](w), word_sel)
                write_lo(w, value[..., 0])
                write_hi(w, value[..., 1])
            return batchable(decode_scaled_pair)

        table = fmt.values  # numerics' decode table of the format, indexed by the byte

        def decode_pair(w):  # the two bytes of the selected word
            codes = lanes(src[0](w)).view(np.uint8)
            low, high = table[codes[..., 2 * word_sel::4]], table[codes[..., 2 * word_sel + 1::4]]
            write_lo(w, low)  # the destination may be the source register
            write_hi(w, high)
        return batchable(decode_pair)
    if base == f"v_cvt_scalef32_pk_bf16_{kind}":
        write = vector_writer(dst, u32, where)
        return batchable(lambda w: write(w, nx.cvt_scalef32_pk_bf16_fp8(fmt, src[0](w), src[1](w), word_sel)))
    if base in (f"v_cvt_pk_{kind}_f32", f"v_cvt_scalef32_pk_{kind}_f32"):
        f32 = [vector_reader(op, np.dtype(F32), where) for op in srcs]
        old = vector_reader(dst, u32, where)
        write = vector_writer(dst, u32, where)
        word = op_sel[len(srcs)]
        if "scalef32" in base:
            return batchable(lambda w: write(w, nx.cvt_scalef32_pk_fp8_f32(
                fmt, f32[0](w), f32[1](w), f32[2](w), old(w), word)))
        return batchable(lambda w: write(w, nx.cvt_pk_fp8_f32(fmt, f32[0](w), f32[1](w), old(w), word)))
    raise UnsupportedInstruction(f"{ins.mnemonic} not implemented ({where})")


CROSS_LANE = {
    "v_readfirstlane_b32": _readfirstlane,
    "v_readlane_b32": _readlane,
    "v_writelane_b32": _writelane,
    "v_permlane16_swap_b32": _permlane_swap,
    "v_permlane32_swap_b32": _permlane_swap,
}
CONVERTS = {
    f"v_cvt{scale}_{form}": _fp8_convert
    for scale in ("", "_scalef32")
    for kind in ("fp8", "bf8")
    for form in (f"f32_{kind}", f"pk_f32_{kind}", f"pk_{kind}_f32") + ((f"pk_bf16_{kind}",) if scale else ())
}
