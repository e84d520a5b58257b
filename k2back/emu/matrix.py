"""MFMA operand plumbing: register tuples in, `mfma.MFMA_FORMS` does the math.

`v_mfma_* d, a, b, c[, scale_a, scale_b]`: a, b, c, d are VGPR or AGPR tuples
(c may be an inline constant, e.g. 0); cbsz/blgp pick the element formats of
the f8f6f4 forms; the scaled forms' E8M0 byte selects are printed as
op_sel[i] + 2 * op_sel_hi[i] (i = 0 for A's scale, 1 for B's; LLVM omits
op_sel_hi when it is the VOP3P default, all ones); scale operands other than
VGPRs are refused (which bits of an SGPR or constant are read is undocumented).
MFMA is executed only under a full exec mask: the emulator refuses a partial
one rather than guess how the hardware treats it.
"""

from __future__ import annotations

import numpy as np

from . import mfma
from .errors import UnsupportedInstruction
from .operands import vector_reader

U32 = np.uint32


def decode_mfma(ins, ctx):
    base = ins.mnemonic.removesuffix("_e64")
    try:
        form = mfma.mfma_form(ctx.arch, base)
    except ValueError as error:
        raise UnsupportedInstruction(f"{error} ({ins.where()})") from None
    where = ins.where()
    mods = {k: int(ins.modifiers.get(k, "0"), 0) for k in ("cbsz", "abid", "blgp")}
    op_sel = _pair(ins.modifiers.get("op_sel"), 0)
    op_sel_hi = _pair(ins.modifiers.get("op_sel_hi"), 1 if form.scaled else 0)  # VOP3P: default 1
    for key in ("neg_lo", "neg_hi"):
        if key in ins.modifiers:
            raise UnsupportedInstruction(f"{key} on {ins.mnemonic} ({where})")
    if not form.scaled and (any(op_sel) or any(op_sel_hi)):
        raise UnsupportedInstruction(f"op_sel on unscaled {ins.mnemonic} ({where})")
    try:
        counts = form.a_regs(mods["cbsz"]), form.b_regs(mods["blgp"])
    except ValueError as error:
        raise UnsupportedInstruction(f"{error} ({where})") from None
    dst, a, b, c, *scales = (ctx.operand(t, ins) for t in ins.operands)
    d_row = ctx.vector_row(dst, form.c_regs, ins)
    a_row = ctx.vector_row(a, counts[0], ins)
    b_row = ctx.vector_row(b, counts[1], ins)
    read_c = _accumulator(ctx, c, form.c_regs, ins)
    extra = {}
    if form.scaled:
        if len(scales) != 2:
            raise UnsupportedInstruction(f"{ins.mnemonic}: expected two scale operands ({where})")
        for scale in scales:  # which bits of an SGPR / constant the hardware reads: undocumented
            if scale.file != "v":
                raise UnsupportedInstruction(f"{ins.mnemonic}: scale operand {scale.token!r} is not a "
                                             f"VGPR, whose byte select is not modelled ({where})")
        read_scale_a, read_scale_b = (vector_reader(s, np.dtype(U32), where) for s in scales)
        extra = {"scale_a_byte": op_sel[0] + 2 * op_sel_hi[0],
                 "scale_b_byte": op_sel[1] + 2 * op_sel_hi[1]}
    na, nb, nc = counts[0], counts[1], form.c_regs
    extra["accumulate"] = ctx.machine.numerics.mfma_accumulate
    if not mods["abid"] and form.on_registers_ok(mods["cbsz"], mods["blgp"]):
        scales = None
        if form.scaled:
            scales = read_scale_a, extra["scale_a_byte"], read_scale_b, extra["scale_b_byte"]
        return _on_registers(ins, form, (a_row, na), (b_row, nb), (d_row, nc), c, extra["accumulate"],
                             ctx, mods, scales)

    def run(w):
        if not w.full:
            raise UnsupportedInstruction(f"{ins.mnemonic} under a partial exec mask ({where}, {w.name})")
        r = w.r
        if form.scaled:
            extra["scale_a"] = np.broadcast_to(read_scale_a(w), (64,))
            extra["scale_b"] = np.broadcast_to(read_scale_b(w), (64,))
        result = form(_lane_major(r[a_row:a_row + na]), _lane_major(r[b_row:b_row + nb]), read_c(w),
                      **mods, **extra)
        r[d_row:d_row + nc] = _register_major(result).view(U32)
    if not form.scaled:  # a Batch's registers are [register, wave, lane]
        run.batchable = True
    return run


def _lane_major(rows: np.ndarray) -> np.ndarray:
    """Register rows [regs, 64] -> [64, regs]; a Batch's [regs, waves, 64] -> [waves, 64, regs]."""
    return rows.T if rows.ndim == 2 else rows.transpose(1, 2, 0)


def _register_major(lanes: np.ndarray) -> np.ndarray:
    """The inverse of _lane_major."""
    return lanes.T if lanes.ndim == 2 else lanes.transpose(2, 0, 1)


def _pair(text, default: int):
    if text is None:
        return [default] * 3
    return [int(x) for x in text.strip("[]").split(",")]


def _accumulator(ctx, op, count, ins):
    """fn(wave) -> f32 [64, count] accumulator input (a register tuple or a constant)."""
    if op.file == "const":
        value = vector_reader(op, np.dtype(np.float32), ins.where())(None)
        constant = np.full((64, count), value, np.float32)
        return lambda w: constant
    row = ctx.vector_row(op, count, ins)
    return lambda w: _lane_major(w.r[row:row + count]).view(np.float32)


def _on_registers(ins, form, a, b, d, c, accumulate, ctx, mods, scales):
    """The run of a form with 8- or 16-bit elements: operands read and the result
    written register-major (mfma.MfmaForm.on_registers), no lane-major copies;
    `scales`: (read scale A, its byte, read scale B, its byte) of a scaled form."""
    where = ins.where()
    (a_row, na), (b_row, nb), (d_row, nc) = a, b, d
    read_c = _accumulator_rows(ctx, c, nc, ins)
    formats = {"cbsz": mods["cbsz"], "blgp": mods["blgp"]}

    def run(w):
        if not w.full:
            raise UnsupportedInstruction(f"{ins.mnemonic} under a partial exec mask ({where}, {w.name})")
        chosen = None
        if scales is not None:
            read_a, a_byte, read_b, b_byte = scales
            chosen = read_a(w), a_byte, read_b(w), b_byte
        result = form.on_registers(_rows(w, a_row, na), _rows(w, b_row, nb), read_c(w), accumulate,
                                   **formats, scales=chosen)
        r = w.r
        if result.ndim == 1:
            r[d_row:d_row + nc] = result.view(U32).reshape(nc, 64)
        else:  # a Batch's registers are [register, wave, lane]
            r[d_row:d_row + nc] = result.view(U32).reshape(result.shape[0], nc, 64).transpose(1, 0, 2)
    run.batchable = True
    return run


def _accumulator_rows(ctx, op, count, ins):
    """fn(wave) -> f32 accumulator input register-major, [count * 64] or [waves,
    count * 64] (a register tuple or a constant)."""
    if op.file == "const":
        constant = _accumulator(ctx, op, count, ins)(None).T.reshape(-1)
        return lambda w: constant
    row = ctx.vector_row(op, count, ins)
    return lambda w: _rows(w, row, count).view(np.float32)


def _rows(w, row: int, count: int) -> np.ndarray:
    """Registers row..row+count-1 register-major: [count * 64] of a wave, [waves,
    count * 64] of a Batch (views where the layout allows)."""
    rows = w.r[row:row + count]
    return rows.reshape(-1) if rows.ndim == 2 else rows.transpose(1, 0, 2).reshape(rows.shape[1], -1)
