"""The VALU op table: what each VOP1/VOP2/VOP3/VOPC/VOP3P operation computes.

`VOP[name] = (destination types, source types, fn)`; fn takes the sources as
numpy lanes of those types and returns the destination value(s). The names are
the mnemonic without its encoding suffix (_e32/_e64/_dpp/_sdwa): the
encoding changes only where operands come from, which `valu` decodes.

Float arithmetic is numpy's IEEE f32/f64 with denormals kept (the kernels run
with `.amdhsa_float_denorm_mode_32 3`; launch refuses other modes). fma is
computed in float64 and rounded once to f32: exact product, so it differs from
a fused f32 fma only by double rounding of the sum (rare, <= 1 ulp).
IEEE-mode min/max/med3 and the division macro follow the ISA pseudocode
(see their functions).
"""

from __future__ import annotations

import numpy as np

from . import numerics as nx
from .operands import TYPES
from .state import LANES

U32, I32, F32 = np.uint32, np.int32, np.float32
LANE = np.arange(LANES)


def fma32(a, b, c):
    return (np.multiply(a, b, dtype=np.float64) + c).astype(F32)


def fma16(a, b, c):
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


def lanes(x, dtype=U32):
    x = np.asarray(x, dtype)
    return x if x.ndim else np.full(LANES, x, dtype)


def _perm(a, b, sel):
    """v_perm_b32: selector byte i picks from {src0, src1} (src1 = bytes 0-3), the
    sign of byte 1/3/5/7 (8-11), 0x00 (12) or 0xFF (13 and up)."""
    if np.ndim(sel) == 0:  # the usual case: one selector for the wave
        halves = _PERM_HALVES.get(int(sel))
        if halves is not None:
            return halves(a, b)
    a, b, sel = np.broadcast_arrays(np.asarray(a, U32), np.asarray(b, U32), np.asarray(sel, U32))
    shape = a.shape if a.ndim else (LANES,)
    count = int(np.prod(shape))
    pair = np.empty((count, 2), U32)
    pair[:, 0], pair[:, 1] = np.broadcast_to(b, shape).reshape(-1), np.broadcast_to(a, shape).reshape(-1)
    pool = np.zeros((count, 16), np.uint8)
    pool[:, :8] = pair.view(np.uint8)  # src1 bytes, then src0 bytes
    pool[:, 8:12] = np.where(pool[:, 1:8:2] & 0x80, 0xFF, 0)
    pool[:, 13:] = 0xFF
    picks = np.minimum(np.ascontiguousarray(np.broadcast_to(sel, shape).reshape(-1)).view(np.uint8)
                       .reshape(count, 4), 15)
    return np.ascontiguousarray(pool[np.arange(count)[:, None], picks]).view(U32)[:, 0].reshape(shape)


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


# ---- IEEE-mode float min / max / med3 (CDNA3/CDNA4 ISA pseudocode of V_MIN_F32,
# V_MAX_F32, V_MED3_F32; the kernels run with .amdhsa_ieee_mode 1): a signalling NaN
# operand gives that NaN quieted; else a NaN operand gives the other operand;
# max(+0, -0) = +0 and min(+0, -0) = -0 in either order.

_QUIET_BIT = {2: 1 << 9, 4: 1 << 22, 8: 1 << 51}


def _bits_of(x):
    return x.view(f"u{x.dtype.itemsize}")


def _quieted(x):
    """x with its NaN's quiet bit set (cvtToQuietNAN)."""
    x = np.asarray(x)
    return (_bits_of(x) | _bits_of(x).dtype.type(_QUIET_BIT[x.dtype.itemsize])).view(x.dtype)


def _signalling(x):
    x = np.asarray(x)
    return np.isnan(x) & ((_bits_of(x) & _bits_of(x).dtype.type(_QUIET_BIT[x.dtype.itemsize])) == 0)


def _ieee_pick(a, b, pick_a, zero_pick_a):
    """The V_MIN/V_MAX pseudocode around the comparison `pick_a` (S0 chosen)."""
    a, b = np.broadcast_arrays(np.asarray(a), np.asarray(b))
    opposite_zeros = (a == 0) & (b == 0) & (np.signbit(a) != np.signbit(b))
    out = np.where(opposite_zeros, np.where(zero_pick_a, a, b), np.where(pick_a, a, b))
    out = np.where(np.isnan(b), a, out)
    out = np.where(np.isnan(a), b, out)
    out = np.where(_signalling(b), _quieted(b), out)
    return np.where(_signalling(a), _quieted(a), out)


def ieee_max(a, b):
    fast = np.maximum(a, b)
    if not np.isnan(fast).any():  # numpy's answer but for two zeros: +0 unless both are -0
        if not (fast == 0).any():  # (two zeros give a zero)
            return fast
        both = (np.asarray(a) == 0) & (np.asarray(b) == 0)
        if not both.any():
            return fast
        return np.where(both, np.where(np.signbit(a) & np.signbit(b), -np.abs(fast), np.abs(fast)), fast)
    return _ieee_pick(a, b, np.asarray(a) >= np.asarray(b), ~np.signbit(a))


def ieee_min(a, b):
    fast = np.minimum(a, b)
    if not np.isnan(fast).any():  # numpy's answer but for two zeros: -0 unless both are +0
        if not (fast == 0).any():  # (two zeros give a zero)
            return fast
        both = (np.asarray(a) == 0) & (np.asarray(b) == 0)
        if not both.any():
            return fast
        return np.where(both, np.where(np.signbit(a) | np.signbit(b), -np.abs(fast), np.abs(fast)), fast)
    return _ieee_pick(a, b, np.asarray(a) < np.asarray(b), np.signbit(a))


def _med3(a, b, c):
    """V_MED3_F32: with a NaN operand min3 of the three, else the max of the two
    operands that are not the max3."""
    fast = np.maximum(np.minimum(a, b), np.minimum(np.maximum(a, b), c))
    if not np.isnan(fast).any():  # numpy's median, unless two operands are zeros (signs)
        if not (fast == 0).any():  # (with two zeros the median is a zero)
            return fast
        za, zb, zc = (np.asarray(x) == 0 for x in (a, b, c))
        if not ((za & (zb | zc)) | (zb & zc)).any():
            return fast
    a, b, c = np.broadcast_arrays(np.asarray(a), np.asarray(b), np.asarray(c))
    top = ieee_max(ieee_max(a, b), c)
    median = np.where(top == a, ieee_max(b, c), np.where(top == b, ieee_max(a, c), ieee_max(a, b)))
    any_nan = np.isnan(a) | np.isnan(b) | np.isnan(c)
    return np.where(any_nan, ieee_min(ieee_min(a, b), c), median)


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


# ---- the division macro (ISA pseudocode of V_DIV_SCALE, V_DIV_FMAS, V_DIV_FIXUP):
# LLVM's fdiv is div_scale (denominator, numerator; VCC: post-scaling needed),
# rcp, a Newton-Raphson fma chain, div_fmas (fma; post-scaled where VCC), div_fixup.
# The printed pseudocode (CDNA3/CDNA4 ISA, VOP3A opcodes 478-483) cannot be read
# literally at three places, each of which would make that macro wrong where the
# ISA promises IEEE division; we read them as the macro needs (and as tinygrad's
# hardware-checked emulator corrects the same text, extra/assembly/amd):
#   1. "1.0 / 64'F(S1) == DENORM.f64": 1/S1 is a denormal of S1's own type (an f32
#      reciprocal is never an f64 denormal), the case where V_RCP_F32 would flush.
#   2. that case together with a denormal quotient scales the denominator by 2^-64
#      (the printed +64 overflows: |S1| > 2^126 there) and sets VCC.
#   3. V_DIV_FMAS post-scales by 2^+64 (2^+128) when S2 (the scaled quotient) is
#      large, exponent field > bias, else by 2^-64 (2^-128); the text prints a bare
#      2^32 (2^64), which undoes none of V_DIV_SCALE's scalings.
#   4. V_DIV_FIXUP of a NaN quotient from ordinary operands (the macro overflowed)
#      is the signed OVERFLOW, infinity.

# per float type: (exponent bits, mantissa bits, scaling exponent, exponent gap)
_DIV = {4: (8, 23, 64, 96), 8: (11, 52, 128, 768)}


def _exponent_field(x):
    exponent_bits, mantissa_bits, _, _ = _DIV[x.dtype.itemsize]
    return ((_bits_of(x) >> mantissa_bits) & ((1 << exponent_bits) - 1)).astype(np.int64)


def _denormal(x, dtype=None):
    tiny = np.finfo(dtype or x.dtype).tiny
    return (x != 0) & (np.abs(x) < tiny)


def _ordinary_f32_division(s1, s2):
    """Lanes of V_DIV_SCALE_F32 where no case applies (_div_scale's `ordinary`, on the
    bits: unsigned range tests) or only the first (a zero operand: D = NaN): the
    zero lanes' mask (or False for none); None when another case applies somewhere."""
    b1, b2 = np.asarray(s1).view(U32), np.asarray(s2).view(U32)
    e1, e2 = (b1 >> U32(23)) & U32(0xFF), (b2 >> U32(23)) & U32(0xFF)
    # 1 <= e1 < 253, 24 <= e2 < 255, -124 <= e2 - e1 < 96
    ordinary = ((e1 - U32(1)) < U32(252)) & ((e2 - U32(24)) < U32(231)) & ((e2 - e1 + U32(124)) < U32(220))
    if ordinary.all():
        return False
    zero = ((b1 & U32(0x7FFFFFFF)) == 0) | ((b2 & U32(0x7FFFFFFF)) == 0)
    return zero if (ordinary | zero).all() else None


def _div_scale(s0, s1, s2):
    """V_DIV_SCALE_F32/F64: (scaled S0, VCC), the cases in the pseudocode's order."""
    zero = _ordinary_f32_division(s1, s2) if np.asarray(s0).dtype == F32 else None
    if zero is not None:
        shape = np.broadcast_shapes(np.shape(s0), np.shape(s1), np.shape(s2))
        d = np.where(zero, F32(np.nan), s0) if zero is not False else s0
        return np.array(np.broadcast_to(d, shape)), np.zeros(shape, bool)
    s0, s1, s2 = np.broadcast_arrays(*(np.asarray(x) for x in (s0, s1, s2)))
    dtype = s0.dtype
    exponent_bits, mantissa_bits, scale, gap = _DIV[dtype.itemsize]
    e1, e2 = _exponent_field(s1), _exponent_field(s2)
    top = (1 << exponent_bits) - 1
    # every lane ordinary (both normal, |S1| < 2^(bias-1), the exponents fewer than the
    # gap and than bias-2 apart, S2 not tiny): no case applies, D = S0, no VCC
    ordinary = ((e1 > 0) & (e1 < top - 2) & (e2 > mantissa_bits) & (e2 < top) & (e2 - e1 < gap)
                & (e2 - e1 > 2 - (top >> 1)))
    if ordinary.all():
        return s0.copy(), np.zeros(s0.shape, bool)
    zero = (s2 == 0) | (s1 == 0)  # the first case, D = NaN: e.g. lanes dividing 0
    if (ordinary | zero).all():
        return np.where(zero, np.array(np.nan, dtype), s0), np.zeros(s0.shape, bool)
    with np.errstate(all="ignore"):
        quotient = (s2 / s1).astype(dtype)
        reciprocal_denormal = _denormal(np.float64(1) / s1.astype(np.float64), dtype)
    up, down = np.ldexp(s0, scale).astype(dtype), np.ldexp(s0, -scale).astype(dtype)
    cases = [  # (condition, D, VCC)
        ((s2 == 0) | (s1 == 0), np.full_like(s0, np.nan), False),
        (_exponent_field(s2) - _exponent_field(s1) >= gap, np.where(s0 == s1, up, s0), True),
        (_denormal(s1), up, False),
        (reciprocal_denormal & _denormal(quotient), np.where(s0 == s1, down, s0), True),
        (reciprocal_denormal, down, False),
        (_denormal(quotient), np.where(s0 == s2, up, s0), True),
        (_exponent_field(s2) <= mantissa_bits, up, False),
    ]
    conditions = [c for c, _, _ in cases]
    d = np.select(conditions, [value for _, value, _ in cases], s0)
    vcc = np.select(conditions, [np.full(s0.shape, v) for _, _, v in cases], False)
    return d.astype(dtype), vcc


def _div_fmas(fma):
    def div_fmas(a, b, c, vcc):
        """V_DIV_FMAS: fma, post-scaled where VCC by 2^+-64 (2^+-128 for f64): up if
        the scaled quotient S2 is large, down if small (reading 3 above)."""
        d = fma(a, b, c)
        if not np.any(vcc):
            return d
        c = np.broadcast_to(np.asarray(c, d.dtype), d.shape)
        exponent_bits, _, scale, _ = _DIV[d.dtype.itemsize]
        bias = (1 << (exponent_bits - 1)) - 1
        factor = np.where(_exponent_field(c) > bias, scale, -scale)
        return np.where(vcc, np.ldexp(d, factor).astype(d.dtype), d)
    return div_fmas


_DEFAULT_NAN = {4: np.array(0xFFC00000, U32).view(F32), 8: np.array(0xFFF8000000000000, np.uint64).view(np.float64)}
_UNDERFLOW_GAP = {4: -150, 8: -1075}


def _div_fixup(quotient, denominator, numerator):
    """V_DIV_FIXUP_F32/F64: the special cases of n / d, else the quotient with the
    sign of the division. The pseudocode's UNDERFLOW result (exponent fields more
    than 150 (1075) apart: |n / d| < 2^-150 (2^-1075), below half the least
    subnormal) is taken as zero, the IEEE result there; its OVERFLOW case
    (exponent(d) all ones) is unreachable after the infinity and NaN cases, and a
    NaN quotient is an overflow (reading 4 above)."""
    if np.asarray(quotient).dtype == F32:
        fast = _ordinary_f32_fixup(quotient, denominator, numerator)
        if fast is not None:
            return fast
    q, d, n = np.broadcast_arrays(*(np.asarray(x) for x in (quotient, denominator, numerator)))
    size = q.dtype.itemsize
    negative = np.signbit(d) ^ np.signbit(n)
    underflow = _exponent_field(n) - _exponent_field(d) < _UNDERFLOW_GAP[size]
    if (np.isfinite(d) & np.isfinite(n)).all():  # the cases of finite operands, in order
        inf, zero = np.array(np.inf, q.dtype), np.zeros((), q.dtype)
        magnitude = np.where(d == 0, inf, np.where((n == 0) | underflow, zero,
                                                   np.where(np.isnan(q), inf, np.abs(q))))
        out = np.where(negative, -magnitude, magnitude)
        both_zero = (d == 0) & (n == 0)
        if both_zero.any():
            out = np.where(both_zero, _DEFAULT_NAN[size], out)
        return out.astype(q.dtype)
    cases = [
        (np.isnan(n), _quieted(n)),
        (np.isnan(d), _quieted(d)),
        (((d == 0) & (n == 0)) | (np.isinf(d) & np.isinf(n)), np.full_like(q, _DEFAULT_NAN[size])),
        ((d == 0) | np.isinf(n), np.full_like(q, np.inf)),
        (np.isinf(d) | (n == 0) | underflow, np.zeros_like(q)),
        (np.isnan(q), np.full_like(q, np.inf)),
    ]
    magnitude = np.select([c for c, _ in cases], [v for _, v in cases], np.abs(q))
    signs_apply = ~(np.isnan(n) | np.isnan(d) | cases[2][0])
    return np.where(signs_apply & negative, -magnitude, magnitude).astype(q.dtype)


def _ordinary_f32_fixup(quotient, denominator, numerator):
    """V_DIV_FIXUP_F32 when every lane divides normal numbers into a quotient that
    is not NaN and does not underflow (none of _div_fixup's cases: |q| with the
    sign of the division), or zero by a normal number (a signed zero), on the
    bits; None otherwise."""
    q, d, n = (np.asarray(x).view(U32) for x in (quotient, denominator, numerator))
    ed, en = (d >> U32(23)) & U32(0xFF), (n >> U32(23)) & U32(0xFF)
    magnitude = q & U32(0x7FFFFFFF)
    # normal d and n (fields 1..254), field(n) - field(d) >= -150, q not NaN
    ordinary = ((ed - U32(1)) < U32(254)) & ((en - U32(1)) < U32(254)) & (en + U32(150) >= ed) \
        & (magnitude <= U32(0x7F800000))
    if not ordinary.all():  # lanes dividing zero by a normal number: a signed zero
        zero = (n & U32(0x7FFFFFFF)) == 0
        if not (ordinary | (zero & ((ed - U32(1)) < U32(254)))).all():
            return None
        magnitude = np.where(zero, U32(0), magnitude)
    return (magnitude | ((d ^ n) & U32(0x80000000))).view(F32)


def minmax(dtype):
    if np.dtype(dtype).kind == "f":
        return ieee_min, ieee_max
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
    "v_fma_f32": ("f32", "f32 f32 f32", fma32),
    "v_fmac_f32": ("f32", "f32 f32 f32", fma32),
    "v_ldexp_f32": ("f32", "f32 i32", _ldexp),
    "v_med3_f32": ("f32", "f32 f32 f32", _med3),
    "v_fract_f32": ("f32", "f32", _fract),
    "v_floor_f32": ("f32", "f32", np.floor),
    "v_ceil_f32": ("f32", "f32", np.ceil),
    "v_trunc_f32": ("f32", "f32", np.trunc),
    "v_rndne_f32": ("f32", "f32", np.rint),
    "v_frexp_mant_f32": ("f32", "f32", lambda x: np.frexp(x)[0]),
    "v_frexp_exp_i32_f32": ("i32", "f32", lambda x: np.frexp(x)[1].astype(I32)),
    "v_div_scale_f32": ("f32 mask", "f32 f32 f32", _div_scale),
    "v_div_fmas_f32": ("f32", "f32 f32 f32 mask", _div_fmas(fma32)),
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
    "v_cvt_pk_bf16_f32": ("b32", "f32 f32", nx.cvt_pk_bf16_f32),
    "v_pack_b32_f16": ("b32", "b16 b16", lambda a, b: a.astype(U32) | (b.astype(U32) << U32(16))),
    # f64
    "v_add_f64": ("f64", "f64 f64", np.add),
    "v_mul_f64": ("f64", "f64 f64", np.multiply),
    "v_fma_f64": ("f64", "f64 f64 f64", _fma64),
    "v_ldexp_f64": ("f64", "f64 i32", _ldexp),
    "v_div_scale_f64": ("f64 mask", "f64 f64 f64", _div_scale),
    "v_div_fmas_f64": ("f64", "f64 f64 f64 mask", _div_fmas(_fma64)),
    "v_div_fixup_f64": ("f64", "f64 f64 f64", _div_fixup),
    # f16
    "v_add_f16": ("f16", "f16 f16", np.add),
    "v_sub_f16": ("f16", "f16 f16", np.subtract),
    "v_mul_f16": ("f16", "f16 f16", np.multiply),
    "v_fma_f16": ("f16", "f16 f16 f16", fma16),
    "v_fmac_f16": ("f16", "f16 f16 f16", fma16),
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
    _min, _max = minmax(TYPES[_type])
    VOP[f"v_min_{_type}"] = (_type, f"{_type} {_type}", _min)
    VOP[f"v_max_{_type}"] = (_type, f"{_type} {_type}", _max)
    if _type in ("f32", "i32", "u32"):
        VOP[f"v_min3_{_type}"] = (_type, f"{_type} {_type} {_type}", lambda a, b, c, f=_min: f(f(a, b), c))
        VOP[f"v_max3_{_type}"] = (_type, f"{_type} {_type} {_type}", lambda a, b, c, f=_max: f(f(a, b), c))
VOP["v_med3_i32"] = ("i32", "i32 i32 i32", lambda a, b, c: np.maximum(np.minimum(a, b), np.minimum(np.maximum(a, b), c)))
VOP["v_med3_u32"] = ("u32", "u32 u32 u32", VOP["v_med3_i32"][2])

# Ops reading VCC without naming it (their last source type is `mask`)
IMPLICIT_VCC = {"v_div_fmas_f32", "v_div_fmas_f64"}
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
