"""Vector ALU: VOP1/VOP2/VOP3/VOPC/VOP3P with DPP and SDWA, and cross-lane moves.

`VOP[name] = (destination types, source types, fn)`; fn takes the sources as
numpy lanes of those types and returns the destination value(s). The names are
the mnemonic without its encoding suffix (_e32/_e64/_dpp/_sdwa): the
encoding changes only where operands come from, which decode handles.

Float arithmetic is numpy's IEEE f32/f64 with denormals kept (the kernels run
with `.amdhsa_float_denorm_mode_32 3`; launch refuses other modes). fma is
computed in float64 and rounded once to f32: exact product, so it differs from
a fused f32 fma only by double rounding of the sum (rare, <= 1 ulp).
IEEE-mode min/max return the non-NaN operand (np.fmin/np.fmax).
"""

from __future__ import annotations

import copy

import numpy as np

from . import numerics as nx
from .errors import UnsupportedInstruction
from .operands import MASK, TYPES, vector_reader, vector_writer, with_modifiers
from .state import LANES, mask_to_int

U32, I32, F32 = np.uint32, np.int32, np.float32
LANE = np.arange(LANES)


def _fma32(a, b, c):
    return (np.float64(1) * a * b + c).astype(F32)


def _fma16(a, b, c):
    return (np.float32(1) * a * b + c).astype(np.float16)


def _fma64(a, b, c):
    return (np.longdouble(1) * a * b + c).astype(np.float64)


def _to_int(x, lo, hi, dtype):
    """Float -> integer as v_cvt_{i,u}32: truncate, saturate, NaN -> 0."""
    x = np.asarray(x, np.float64)
    return np.where(np.isnan(x), 0, np.clip(np.trunc(x), lo, hi)).astype(dtype)


def _f16_rtz(x):
    """f32 -> f16 rounding toward zero (v_cvt_pkrtz_f16_f32)."""
    x = np.asarray(x, F32)
    nearest = x.astype(np.float16)
    away = np.abs(nearest.astype(F32)) > np.abs(x)
    return np.where(away & np.isfinite(x), np.nextafter(nearest, np.float16(0)), nearest)


def _bfe(value, offset, width, signed):
    offset, width = offset & U32(31), width & U32(31)
    field = (value >> offset) & ((U32(1) << width) - U32(1))
    if not signed:
        return field
    shift = (U32(32) - width) & U32(31)
    extended = ((field << shift).view(I32) >> shift.astype(I32)).view(U32)
    return np.where(width == 0, U32(0), extended)


def _lanes(x, dtype=U32):
    x = np.asarray(x, dtype)
    return x if x.ndim else np.full(LANES, x, dtype)


def _perm(a, b, sel):
    """v_perm_b32: selector byte i picks from {src0, src1} (src1 = bytes 0-3), the
    sign of byte 1/3/5/7 (8-11), 0x00 (12) or 0xFF (13 and up)."""
    if np.ndim(sel) == 0:  # the usual case: one selector for the wave
        halves = _PERM_HALVES.get(int(sel))
        if halves is not None:
            return halves(a, b)
    pair = np.empty((LANES, 2), U32)
    pair[:, 0], pair[:, 1] = b, a
    pool = np.zeros((LANES, 16), np.uint8)
    pool[:, :8] = pair.view(np.uint8)  # src1 bytes, then src0 bytes
    pool[:, 8:12] = np.where(pool[:, 1:8:2] & 0x80, 0xFF, 0)
    pool[:, 13:] = 0xFF
    picks = np.minimum(_lanes(sel).view(np.uint8).reshape(LANES, 4), 15)
    return np.ascontiguousarray(pool[LANE[:, None], picks]).view(U32)[:, 0]


def _perm_halves(low: int, high: int):
    """v_perm_b32 for selectors moving whole 16-bit halves (byte picks `low`,
    low+1 and `high`, high+1 even): shifts and masks instead of a byte gather."""
    low_from_src0, high_from_src0 = low >= 4, high >= 4
    low_is_upper, high_is_upper = low % 4 == 2, high % 4 == 2

    def perm(a, b):
        x, y = (a if low_from_src0 else b), (a if high_from_src0 else b)
        lo = (x >> U32(16)) if low_is_upper else (x & U32(0xFFFF))
        hi = (y & U32(0xFFFF0000)) if high_is_upper else (y << U32(16))
        return lo | hi
    return perm


_PERM_HALVES = {low | (low + 1) << 8 | high << 16 | (high + 1) << 24: _perm_halves(low, high)
                for low in (0, 2, 4, 6) for high in (0, 2, 4, 6)}


def _ffbh(a):
    a = np.asarray(a, U32)
    return np.where(a == 0, U32(0xFFFFFFFF), U32(31) - np.floor(np.log2(np.maximum(a, 1))).astype(U32))


def _ffbl(a):
    a = np.asarray(a, U32)
    low = a & (~a + U32(1))
    return np.where(a == 0, U32(0xFFFFFFFF), np.floor(np.log2(np.maximum(low, 1))).astype(U32))


_REVERSED_BYTES = np.array([int(f"{b:08b}"[::-1], 2) for b in range(256)], dtype=np.uint8)


def _bfrev(a):
    return _REVERSED_BYTES[np.asarray(a, U32).reshape(-1, 1).view(np.uint8)][:, ::-1].copy().view(U32).reshape(np.shape(a))


def _fract(x):
    return np.minimum(x - np.floor(x), np.nextafter(F32(1), F32(0)))


def _med3(a, b, c):
    return np.fmax(np.fmin(a, b), np.fmin(np.fmax(a, b), c))


def _class(x, mask):
    """v_cmp_class: bit i of mask tests class i (sNaN, qNaN, -inf, -norm, -denorm, -0, +0, ...)."""
    x = np.asarray(x)
    finfo = np.finfo(x.dtype)
    neg, mag = np.signbit(x), np.abs(x)
    nan = np.isnan(x)
    quiet_bit = {4: 1 << 22, 8: 1 << 51, 2: 1 << 9}[x.dtype.itemsize]
    quiet = nan & ((x.view({4: U32, 8: np.uint64, 2: np.uint16}[x.dtype.itemsize]) & quiet_bit) != 0)
    inf, zero = np.isinf(x), mag == 0
    denorm = (mag < finfo.tiny) & ~zero
    normal = ~nan & ~inf & ~zero & ~denorm
    classes = [nan & ~quiet, quiet, inf & neg, normal & neg, denorm & neg, zero & neg,
               zero & ~neg, denorm & ~neg, normal & ~neg, inf & ~neg]
    mask = np.asarray(mask, U32)
    return np.logical_or.reduce([c & ((mask >> U32(i)) & U32(1)).astype(bool) for i, c in enumerate(classes)])


def _mbcnt(half):
    below = np.where(LANE < 32 * half, 0, np.minimum(LANE - 32 * half, 32))
    prefix = ((np.uint64(1) << below.astype(np.uint64)) - np.uint64(1)).astype(U32)
    return lambda mask, add: np.bitwise_count(np.asarray(mask, U32) & prefix).astype(U32) + add


def _carry_add(a, b, c=False):
    total = a.astype(np.uint64) + b + np.asarray(c, np.uint64)
    return total.astype(U32), total > np.uint64(0xFFFFFFFF)


def _borrow_sub(a, b, c=False):
    sub = np.asarray(b, np.uint64) + np.asarray(c, np.uint64)
    return (a.astype(np.uint64) - sub).astype(U32), sub > a


def _mad64(a, b, c, kind):
    product = a.astype(kind) * b.astype(kind)
    total = product + c
    carry = (total < c) if kind == np.uint64 else np.zeros(np.shape(total), bool)
    return total, carry


def _ldexp(x, e):
    return np.ldexp(x, np.clip(e, -1000, 1000))


def _ubyte_to_f32(index: int):
    shift = U32(8 * index)
    return lambda a: ((a >> shift) & U32(0xFF)).astype(F32)


def _transcendental(name):
    fn = nx.TRANSCENDENTALS[name]
    return lambda x: fn(x, denormals=True)


def _div_fixup(quotient, denominator, numerator):
    # The LLVM fdiv expansion (div_scale, rcp, fma refinement, div_fmas, div_fixup)
    # yields the correctly rounded IEEE quotient; fixup is modelled as exactly that.
    return numerator / denominator


def _minmax(dtype):
    if np.dtype(dtype).kind == "f":
        return np.fmin, np.fmax
    return np.minimum, np.maximum


VOP: dict[str, tuple[str, str, object]] = {
    "v_mov_b32": ("b32", "b32", lambda a: a),
    "v_mov_b64": ("b64", "b64", lambda a: a),
    "v_accvgpr_write_b32": ("b32", "b32", lambda a: a),
    "v_accvgpr_read_b32": ("b32", "b32", lambda a: a),
    "v_accvgpr_mov_b32": ("b32", "b32", lambda a: a),
    "v_cndmask_b32": ("b32", "b32 b32 mask", lambda a, b, m: np.where(m, b, a)),
    # f32
    "v_add_f32": ("f32", "f32 f32", np.add),
    "v_sub_f32": ("f32", "f32 f32", np.subtract),
    "v_subrev_f32": ("f32", "f32 f32", lambda a, b: b - a),
    "v_mul_f32": ("f32", "f32 f32", np.multiply),
    "v_fma_f32": ("f32", "f32 f32 f32", _fma32),
    "v_fmac_f32": ("f32", "f32 f32 f32", _fma32),
    "v_ldexp_f32": ("f32", "f32 i32", _ldexp),
    "v_med3_f32": ("f32", "f32 f32 f32", _med3),
    "v_fract_f32": ("f32", "f32", _fract),
    "v_floor_f32": ("f32", "f32", np.floor),
    "v_ceil_f32": ("f32", "f32", np.ceil),
    "v_trunc_f32": ("f32", "f32", np.trunc),
    "v_rndne_f32": ("f32", "f32", np.rint),
    "v_frexp_mant_f32": ("f32", "f32", lambda x: np.frexp(x)[0]),
    "v_frexp_exp_i32_f32": ("i32", "f32", lambda x: np.frexp(x)[1].astype(I32)),
    "v_div_scale_f32": ("f32 mask", "f32 f32 f32", lambda a, b, c: (a, np.zeros(LANES, bool))),
    "v_div_fmas_f32": ("f32", "f32 f32 f32", _fma32),
    "v_div_fixup_f32": ("f32", "f32 f32 f32", _div_fixup),
    "v_cvt_f32_i32": ("f32", "i32", lambda a: a.astype(F32)),
    "v_cvt_f32_u32": ("f32", "u32", lambda a: a.astype(F32)),
    "v_cvt_i32_f32": ("i32", "f32", lambda a: _to_int(a, -2**31, 2**31 - 1, I32)),
    "v_cvt_u32_f32": ("u32", "f32", lambda a: _to_int(a, 0, 2**32 - 1, U32)),
    "v_cvt_f16_f32": ("f16", "f32", lambda a: a.astype(np.float16)),
    "v_cvt_f32_f16": ("f32", "f16", lambda a: a.astype(F32)),
    "v_cvt_f64_f32": ("f64", "f32", lambda a: a.astype(np.float64)),
    "v_cvt_f32_f64": ("f32", "f64", lambda a: a.astype(F32)),
    "v_cvt_f64_i32": ("f64", "i32", lambda a: a.astype(np.float64)),
    "v_cvt_f64_u32": ("f64", "u32", lambda a: a.astype(np.float64)),
    "v_cvt_i32_f64": ("i32", "f64", lambda a: _to_int(a, -2**31, 2**31 - 1, I32)),
    "v_cvt_u32_f64": ("u32", "f64", lambda a: _to_int(a, 0, 2**32 - 1, U32)),
    **{f"v_cvt_f32_ubyte{i}": ("f32", "u32", _ubyte_to_f32(i)) for i in range(4)},
    "v_cvt_pkrtz_f16_f32": ("b32", "f32 f32", lambda a, b: nx.pack_halves(
        np.stack(np.broadcast_arrays(_f16_rtz(a).view(np.uint16), _f16_rtz(b).view(np.uint16)), -1))),
    "v_cvt_pk_bf16_f32": ("b32", "f32 f32", lambda a, b: nx.cvt_pk_bf16_f32(*np.broadcast_arrays(a, b))),
    "v_pack_b32_f16": ("b32", "b16 b16", lambda a, b: a.astype(U32) | (b.astype(U32) << U32(16))),
    # f64
    "v_add_f64": ("f64", "f64 f64", np.add),
    "v_mul_f64": ("f64", "f64 f64", np.multiply),
    "v_fma_f64": ("f64", "f64 f64 f64", _fma64),
    "v_ldexp_f64": ("f64", "f64 i32", _ldexp),
    "v_div_scale_f64": ("f64 mask", "f64 f64 f64", lambda a, b, c: (a, np.zeros(LANES, bool))),
    "v_div_fmas_f64": ("f64", "f64 f64 f64", _fma64),
    "v_div_fixup_f64": ("f64", "f64 f64 f64", _div_fixup),
    # f16
    "v_add_f16": ("f16", "f16 f16", np.add),
    "v_sub_f16": ("f16", "f16 f16", np.subtract),
    "v_mul_f16": ("f16", "f16 f16", np.multiply),
    "v_fma_f16": ("f16", "f16 f16 f16", _fma16),
    "v_fmac_f16": ("f16", "f16 f16 f16", _fma16),
    # 32-bit integer
    "v_add_u32": ("u32", "u32 u32", np.add),
    "v_sub_u32": ("u32", "u32 u32", np.subtract),
    "v_subrev_u32": ("u32", "u32 u32", lambda a, b: b - a),
    "v_add_co_u32": ("u32 mask", "u32 u32", _carry_add),
    "v_addc_co_u32": ("u32 mask", "u32 u32 mask", _carry_add),
    "v_sub_co_u32": ("u32 mask", "u32 u32", _borrow_sub),
    "v_subb_co_u32": ("u32 mask", "u32 u32 mask", _borrow_sub),
    "v_subrev_co_u32": ("u32 mask", "u32 u32", lambda a, b: _borrow_sub(b, a)),
    "v_subbrev_co_u32": ("u32 mask", "u32 u32 mask", lambda a, b, c: _borrow_sub(b, a, c)),
    "v_mul_lo_u32": ("u32", "u32 u32", np.multiply),
    "v_mul_hi_u32": ("u32", "u32 u32", lambda a, b: ((a.astype(np.uint64) * b) >> np.uint64(32)).astype(U32)),
    "v_mul_hi_i32": ("i32", "i32 i32", lambda a, b: ((a.astype(np.int64) * b) >> 32).astype(I32)),
    "v_mul_u32_u24": ("u32", "u32 u32", lambda a, b: (a & U32(0xFFFFFF)) * (b & U32(0xFFFFFF))),
    "v_mul_hi_u32_u24": ("u32", "u32 u32", lambda a, b: (
        ((a & U32(0xFFFFFF)).astype(np.uint64) * (b & U32(0xFFFFFF))) >> np.uint64(32)).astype(U32)),
    "v_mul_i32_i24": ("i32", "i32 i32", lambda a, b: ((a << 8) >> 8) * ((b << 8) >> 8)),
    "v_mad_u32_u24": ("u32", "u32 u32 u32", lambda a, b, c: (a & U32(0xFFFFFF)) * (b & U32(0xFFFFFF)) + c),
    "v_mad_i32_i24": ("i32", "i32 i32 i32", lambda a, b, c: ((a << 8) >> 8) * ((b << 8) >> 8) + c),
    "v_mad_u64_u32": ("u64 mask", "u32 u32 u64", lambda a, b, c: _mad64(a, b, c, np.uint64)),
    "v_mad_i64_i32": ("i64 mask", "i32 i32 i64", lambda a, b, c: _mad64(a, b, c, np.int64)),
    "v_lshl_add_u64": ("u64", "u64 u32 u64", lambda a, b, c: (a << (b & U32(63)).astype(np.uint64)) + c),
    "v_lshlrev_b32": ("b32", "u32 b32", lambda s, a: a << (s & U32(31))),
    "v_lshrrev_b32": ("b32", "u32 b32", lambda s, a: a >> (s & U32(31))),
    "v_ashrrev_i32": ("i32", "u32 i32", lambda s, a: a >> (s & U32(31)).astype(I32)),
    "v_lshlrev_b64": ("b64", "u32 b64", lambda s, a: a << (s & U32(63)).astype(np.uint64)),
    "v_lshrrev_b64": ("b64", "u32 b64", lambda s, a: a >> (s & U32(63)).astype(np.uint64)),
    "v_ashrrev_i64": ("i64", "u32 i64", lambda s, a: a >> (s & U32(63)).astype(np.int64)),
    "v_lshl_add_u32": ("u32", "u32 u32 u32", lambda a, s, c: (a << (s & U32(31))) + c),
    "v_add_lshl_u32": ("u32", "u32 u32 u32", lambda a, b, s: (a + b) << (s & U32(31))),
    "v_lshl_or_b32": ("b32", "b32 u32 b32", lambda a, s, c: (a << (s & U32(31))) | c),
    "v_and_or_b32": ("b32", "b32 b32 b32", lambda a, b, c: (a & b) | c),
    "v_or3_b32": ("b32", "b32 b32 b32", lambda a, b, c: a | b | c),
    "v_xad_u32": ("u32", "u32 u32 u32", lambda a, b, c: (a ^ b) + c),
    "v_add3_u32": ("u32", "u32 u32 u32", lambda a, b, c: a + b + c),
    "v_and_b32": ("b32", "b32 b32", np.bitwise_and),
    "v_or_b32": ("b32", "b32 b32", np.bitwise_or),
    "v_xor_b32": ("b32", "b32 b32", np.bitwise_xor),
    "v_xnor_b32": ("b32", "b32 b32", lambda a, b: ~(a ^ b)),
    "v_not_b32": ("b32", "b32", np.invert),
    "v_bfe_u32": ("u32", "u32 u32 u32", lambda a, o, w: _bfe(a, o, w, False)),
    "v_bfe_i32": ("u32", "u32 u32 u32", lambda a, o, w: _bfe(a, o, w, True)),
    "v_bfi_b32": ("b32", "b32 b32 b32", lambda m, a, b: (m & a) | (~m & b)),
    "v_bfm_b32": ("b32", "u32 u32", lambda w, o: ((U32(1) << (w & U32(31))) - U32(1)) << (o & U32(31))),
    "v_alignbit_b32": ("b32", "b32 b32 u32", lambda a, b, s: (
        ((a.astype(np.uint64) << np.uint64(32)) | b) >> (s & U32(31)).astype(np.uint64)).astype(U32)),
    "v_alignbyte_b32": ("b32", "b32 b32 u32", lambda a, b, s: (
        ((a.astype(np.uint64) << np.uint64(32)) | b) >> (8 * (s & U32(3))).astype(np.uint64)).astype(U32)),
    "v_perm_b32": ("b32", "b32 b32 b32", _perm),
    "v_bcnt_u32_b32": ("u32", "u32 u32", lambda a, b: np.bitwise_count(a).astype(U32) + b),
    "v_mbcnt_lo_u32_b32": ("u32", "u32 u32", _mbcnt(0)),
    "v_mbcnt_hi_u32_b32": ("u32", "u32 u32", _mbcnt(1)),
    "v_ffbh_u32": ("u32", "u32", _ffbh),
    "v_ffbl_b32": ("u32", "u32", _ffbl),
    "v_bfrev_b32": ("u32", "u32", _bfrev),
    # 16-bit integer
    "v_add_u16": ("u16", "u16 u16", np.add),
    "v_sub_u16": ("u16", "u16 u16", np.subtract),
    "v_mul_lo_u16": ("u16", "u16 u16", np.multiply),
    "v_lshlrev_b16": ("b16", "u16 b16", lambda s, a: a << (s & np.uint16(15))),
    "v_lshrrev_b16": ("b16", "u16 b16", lambda s, a: a >> (s & np.uint16(15))),
    "v_ashrrev_i16": ("i16", "u16 i16", lambda s, a: a >> (s & np.uint16(15)).astype(np.int16)),
    # rcp with the integer-division flag: LLVM's udiv/urem expansion refines its result,
    # so the correctly rounded reciprocal is a faithful stand-in
    "v_rcp_iflag_f32": ("f32", "f32", _transcendental("v_rcp_f32")),
    # transcendentals (numerics: correctly rounded float64 function, ISA special values)
    **{name: (name[-3:], name[-3:], _transcendental(name)) for name in nx.TRANSCENDENTALS},
}
for _type in ("f32", "i32", "u32", "f16", "i16", "u16", "f64"):
    _min, _max = _minmax(TYPES[_type])
    VOP[f"v_min_{_type}"] = (_type, f"{_type} {_type}", _min)
    VOP[f"v_max_{_type}"] = (_type, f"{_type} {_type}", _max)
    if _type in ("f32", "i32", "u32"):
        VOP[f"v_min3_{_type}"] = (_type, f"{_type} {_type} {_type}", lambda a, b, c, f=_min: f(f(a, b), c))
        VOP[f"v_max3_{_type}"] = (_type, f"{_type} {_type} {_type}", lambda a, b, c, f=_max: f(f(a, b), c))
VOP["v_med3_i32"] = ("i32", "i32 i32 i32", lambda a, b, c: np.maximum(np.minimum(a, b), np.minimum(np.maximum(a, b), c)))
VOP["v_med3_u32"] = ("u32", "u32 u32 u32", VOP["v_med3_i32"][2])

# Ops whose destination is also their last source (VOP2 mac forms).
# (v_mad_f32 / v_mac_f32 round the product and flush denormals; LLVM does not
# select them with f32 denormals on, so they stay unimplemented.)
TIED = {"v_fmac_f32", "v_fmac_f16"}
# 16-bit results: gfx9 zeroes the other half of the register, except for the
# op_sel-capable VOP3 forms, which keep it (LLVM: GCNSubtarget::zeroesHigh16BitsOfDest).
PRESERVES_HIGH16 = {"v_fma_f16", "v_fmac_f16", "v_mad_f16", "v_mac_f16", "v_mad_u16", "v_mad_i16",
                    "v_div_fixup_f16"}
ENCODINGS = ("_e32", "_e64", "_dpp", "_sdwa")

_COMPARE = {
    "f": lambda a, b: np.zeros(np.broadcast(a, b).shape, bool),
    "t": lambda a, b: np.ones(np.broadcast(a, b).shape, bool),
    "tru": lambda a, b: np.ones(np.broadcast(a, b).shape, bool),
    "lt": np.less, "eq": np.equal, "le": np.less_equal, "gt": np.greater,
    "ge": np.greater_equal, "ne": np.not_equal,
    "lg": lambda a, b: (a < b) | (a > b),
    "o": lambda a, b: ~(np.isnan(a) | np.isnan(b)),
    "u": lambda a, b: np.isnan(a) | np.isnan(b),
    "nge": lambda a, b: ~(a >= b), "nlg": lambda a, b: ~((a < b) | (a > b)),
    "ngt": lambda a, b: ~(a > b), "nle": lambda a, b: ~(a <= b),
    "neq": lambda a, b: ~(a == b), "nlt": lambda a, b: ~(a < b),
    "class": _class,
}


def split_mnemonic(mnemonic: str) -> tuple[str, str]:
    for suffix in ENCODINGS:
        if mnemonic.endswith(suffix):
            return mnemonic[: -len(suffix)], suffix[1:]
    return mnemonic, ""


def op_spec(base: str):
    """(dst types, src types, fn) of a VALU op name, incl. v_cmp/v_cmpx families."""
    if base in VOP:
        return VOP[base]
    parts = base.split("_")  # v_cmp_gt_f32 / v_cmpx_class_f32
    if parts[1] in ("cmp", "cmpx") and len(parts) == 4 and parts[2] in _COMPARE:
        kind = parts[3]
        second = "u32" if parts[2] == "class" else kind
        return "mask", f"{kind} {second}", _COMPARE[parts[2]]
    return None


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
    if ins.modifiers.get("clamp"):
        if dst_types[0] not in ("f32", "f16", "f64"):
            raise UnsupportedInstruction(f"integer clamp on {ins.mnemonic} ({where})")
        fn = _clamped(fn)
    if base.startswith("v_cmpx"):  # the mask goes to sdst and to exec
        fn = _twice(fn)
        writes.append(lambda w, m: w.set_exec(w.exec & mask_to_int(np.broadcast_to(m, (LANES,)))))
    if encoding == "dpp":
        return _dpp(ins, fn, reads, writes)
    return _run(fn, reads, writes)


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

    def run(w):
        results = fn(*[r(w) for r in reads])
        for write, value in zip(writes, results):
            write(w, value)
    return run


def _dpp(ins, fn, reads, writes):
    src, valid, enabled, bound_ctrl = dpp_controls(ins)
    read0, rest = reads[0], reads[1:]
    (write,) = writes

    def run(w):
        source_ok = valid & w.mask[src]
        value = np.broadcast_to(read0(w), (LANES,))[src]
        if bound_ctrl:
            value = np.where(source_ok, value, np.zeros((), value.dtype))
            lanes = enabled
        else:
            lanes = enabled & source_ok
        _write_masked(w, write, fn(value, *[r(w) for r in rest]), lanes)
    return run


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
        "fma": {"f32": _fma32, "f16": _fma16}.get(kind),
        "min": _minmax(dtype)[0] if dtype is not None else None,
        "max": _minmax(dtype)[1] if dtype is not None else None,
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

        def pk_mov(w):
            a, b = np.array(lo[0](w)), np.array(hi[1](w))  # copies: the halves may overlap
            write_lo(w, a)
            write_hi(w, b)
        return pk_mov
    if dtype.itemsize == 4:
        write_lo = vector_writer(_register(dst, 0), dtype, where)
        write_hi = vector_writer(_register(dst, 1), dtype, where)

        def pk32(w):
            a = fn(*[r(w) for r in lo])
            b = fn(*[r(w) for r in hi])
            write_lo(w, a)
            write_hi(w, b)
        return pk32
    write = vector_writer(dst, np.dtype(U32), where)

    def pk16(w):
        a = np.broadcast_to(np.asarray(fn(*[r(w) for r in lo]), dtype), (LANES,))
        b = np.broadcast_to(np.asarray(fn(*[r(w) for r in hi]), dtype), (LANES,))
        write(w, a.view(np.uint16).astype(U32) | (b.view(np.uint16).astype(U32) << U32(16)))
    return pk16


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

    def run(w):
        lane = (w.exec & -w.exec).bit_length() - 1 if w.exec else 0
        write(w, int(np.broadcast_to(read(w), (LANES,))[lane]))
    return run


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
    fmt = nx.fp8_format(ctx.arch, kind)
    where = ins.where()
    if ins.modifiers.get("clamp"):
        raise UnsupportedInstruction(f"clamp on {ins.mnemonic}: fp8 saturation not modelled ({where})")
    operands = [ctx.operand(t, ins) for t in ins.operands]
    dst, srcs = operands[0], operands[1:]
    op_sel = _bits(ins.modifiers.get("op_sel"), len(srcs) + 1)  # sources, then destination
    encoding = split_mnemonic(ins.mnemonic)[1]
    if encoding == "sdwa":
        select = _SEL[ins.modifiers.get("src0_sel", "DWORD")][0]
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
            return lambda w: write(w, nx.cvt_scalef32_f32_fp8(fmt, src[0](w), src[1](w), byte_sel))
        return lambda w: write(w, nx.cvt_f32_fp8(fmt, src[0](w), byte_sel))
    if base in (decode_pk, f"v_cvt_scalef32_pk_f32_{kind}"):
        ctx.vector_row(dst, 2, ins)
        write_lo, write_hi = (vector_writer(_register(dst, i), np.dtype(F32), where) for i in (0, 1))
        if "scalef32" in base:
            def decode_scaled_pair(w):
                value = nx.cvt_scalef32_pk_f32_fp8(fmt, src[0](w), src[1](w), word_sel)
                write_lo(w, value[..., 0])
                write_hi(w, value[..., 1])
            return decode_scaled_pair

        table = fmt.values  # numerics' decode table of the format, indexed by the byte

        def decode_pair(w):  # the two bytes of the selected word
            codes = _lanes(src[0](w)).view(np.uint8)
            low, high = table[codes[2 * word_sel::4]], table[codes[2 * word_sel + 1::4]]
            write_lo(w, low)  # the destination may be the source register
            write_hi(w, high)
        return decode_pair
    if base == f"v_cvt_scalef32_pk_bf16_{kind}":
        write = vector_writer(dst, u32, where)
        return lambda w: write(w, nx.cvt_scalef32_pk_bf16_fp8(fmt, src[0](w), src[1](w), word_sel))
    if base in (f"v_cvt_pk_{kind}_f32", f"v_cvt_scalef32_pk_{kind}_f32"):
        f32 = [vector_reader(op, np.dtype(F32), where) for op in srcs]
        old = vector_reader(dst, u32, where)
        write = vector_writer(dst, u32, where)
        word = op_sel[len(srcs)]
        if "scalef32" in base:
            return lambda w: write(w, nx.cvt_scalef32_pk_fp8_f32(
                fmt, f32[0](w), f32[1](w), f32[2](w), old(w), word))
        return lambda w: write(w, nx.cvt_pk_fp8_f32(fmt, f32[0](w), f32[1](w), old(w), word))
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
