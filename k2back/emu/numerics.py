"""The arithmetic of gfx942/gfx950 conversion and transcendental instructions.

Pure numpy, no emulator state: every function takes the source operands of a
whole wave (arrays over lanes) and returns the destination values; the emulator
core does the register plumbing (exec masks, SDWA/op_sel decoding, AGPRs).

Facts modelled, and where they come from:

* fp8 formats. gfx942 converts the FNUZ formats (e4m3 bias 8, e5m2 bias 16;
  0x80 is the only NaN, no infinities, no -0); gfx950 the OCP ones (e4m3fn:
  S.1111.111 is NaN, no infinities; e5m2: IEEE-like with infinities) — SPEC §4,
  CDNA3 / CDNA4 ISA. `fp8_format(arch, kind)` is the one table.
* fp8 encode (`v_cvt_pk_{fp8,bf8}_f32`, `v_cvt_scalef32_pk_*`): round to
  nearest even with an unbounded exponent, then anything past the largest
  finite value becomes the format's overflow code — NaN for e4m3 (0x80 FNUZ,
  S.1111.111 OCP) and bf8 FNUZ, ±inf for OCP e5m2. The hardware does *not*
  saturate: ROCm's hip_fp8 saturating casts clamp with v_med3_f32 *before* the
  convert, and rocm-systems#9556 measures 448+18 -> 0x7f (NaN) on gfx950 and the
  same overflow-to-NaN on gfx942's FNUZ encodings. The VOP3 clamp bit on these
  converts has no documented fp8 meaning we could confirm, so the encoders take
  no clamp argument: the emulator must refuse an instruction that sets it.
  NaN payloads follow the sign of the input (S.1111.111 / S.11111.10), as
  ml_dtypes does; real hardware may pick another NaN encoding.
* gfx950 scaled converts use only the exponent field of the f32 scale operand
  (CDNA4 ISA: ``scale = 32'U(exponent(S1.f32))``), i.e. the factor
  2^(field − 127); decode multiplies by it, encode divides by it before
  rounding. Field 255 (an inf/NaN scale) is the E8M0 NaN and yields NaN.
  Scaled decodes round the exact product to f32 once (denormal results kept).
* Transcendentals are modelled as the correctly rounded result of the float64
  function (the hardware is within ~1 ulp: AMDGPUUsage, "Hardware provides 1ULP
  accuracy for float"), with the ISA's special values (log2(±0) = −inf,
  log2(x<0) = NaN, rsq(−0) = −inf, ...). Denormals: `denormals` is the MODE
  register's setting for the operand type (our kernels enable f32 denormals,
  `.amdhsa_float_denorm_mode_32 3`). v_exp_f32 and v_log_f32 flush regardless
  (AMDGPUUsage: the float instruction "does not natively support denormal
  inputs"; LLVM rescales around both when denormals are enabled), v_rcp_f32 too
  (LLVM's IEEE fdiv lowering rescales around it for the same reason). This
  denormal model is the least certain part of this module.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

ARCHS = ("gfx942", "gfx950")


# --------------------------------------------------------------------------- formats


class Specials(enum.Enum):
    """How a small float format spends its special encodings."""

    FNUZ = "fnuz"  # sign bit alone (0x80) is the only NaN; no infinities, no -0
    FN = "fn"  # all-ones magnitude is NaN; no infinities (OCP e4m3fn)
    IEEE = "ieee"  # all-ones exponent: ±inf (mantissa 0) and NaN (OCP e5m2)
    FINITE = "finite"  # every code is a number (OCP MX fp6 / fp4)


# (format, code, magnitude code) -> (is NaN, is ±inf), per convention
_SPECIAL_CODES = {
    Specials.FNUZ: lambda f, code, mag: (code == f.sign_bit, False),
    Specials.FN: lambda f, code, mag: (mag == f.sign_bit - 1, False),
    Specials.IEEE: lambda f, code, mag: (mag > f.inf_code, mag == f.inf_code),
    Specials.FINITE: lambda f, code, mag: (False, False),
}


@dataclass(frozen=True)
class MiniFloat:
    """A sign-magnitude float format of at most 8 bits, with its decode table."""

    name: str
    exponent_bits: int
    mantissa_bits: int
    bias: int
    specials: Specials
    negative_zero: int = 0  # FNUZ only: the code a negative value rounding to zero gets
    values: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "values", self._decode_table())

    @property
    def bits(self) -> int:
        return 1 + self.exponent_bits + self.mantissa_bits

    @property
    def sign_bit(self) -> int:
        return 1 << (self.bits - 1)

    @property
    def inf_code(self) -> int:
        """The all-ones exponent with a zero mantissa (an infinity only for IEEE)."""
        return ((1 << self.exponent_bits) - 1) << self.mantissa_bits

    @property
    def max_finite_code(self) -> int:
        """The largest positive finite code (codes 0 .. it have increasing values)."""
        return int(np.flatnonzero(np.isfinite(self.values[: self.sign_bit]))[-1])

    def magnitude(self, codes: np.ndarray) -> np.ndarray:
        """Value of magnitude codes by the bit formula alone (no specials)."""
        codes = np.asarray(codes, dtype=np.int64)
        exponent = codes >> self.mantissa_bits
        fraction = (codes & ((1 << self.mantissa_bits) - 1)) / float(1 << self.mantissa_bits)
        subnormal = fraction * 2.0 ** (1 - self.bias)
        normal = (1.0 + fraction) * np.exp2(exponent - self.bias)
        return np.where(exponent == 0, subnormal, normal)

    def _decode_table(self) -> np.ndarray:
        codes = np.arange(1 << self.bits)
        magnitude_codes = codes & (self.sign_bit - 1)
        values = self.magnitude(magnitude_codes)
        values = np.where(codes & self.sign_bit, -values, values)
        nan, inf = _SPECIAL_CODES[self.specials](self, codes, magnitude_codes)
        values = np.where(inf, np.copysign(np.inf, values), values)
        return np.where(nan, np.nan, values).astype(np.float32)


E4M3FNUZ = MiniFloat("e4m3fnuz", 4, 3, 8, Specials.FNUZ)
E5M2FNUZ = MiniFloat("e5m2fnuz", 5, 2, 16, Specials.FNUZ)
E4M3FN = MiniFloat("e4m3fn", 4, 3, 7, Specials.FN)
E5M2 = MiniFloat("e5m2", 5, 2, 15, Specials.IEEE)
E2M3 = MiniFloat("e2m3", 2, 3, 1, Specials.FINITE)  # MX fp6
E3M2 = MiniFloat("e3m2", 3, 2, 3, Specials.FINITE)  # MX bf6
E2M1 = MiniFloat("e2m1", 2, 1, 1, Specials.FINITE)  # MX fp4

# What `fp8` and `bf8` mean in an instruction's name, per target (SPEC §4).
FP8_FORMATS: dict[tuple[str, str], MiniFloat] = {
    ("gfx942", "fp8"): E4M3FNUZ,
    ("gfx942", "bf8"): E5M2FNUZ,
    ("gfx950", "fp8"): E4M3FN,
    ("gfx950", "bf8"): E5M2,
}


def fp8_format(arch: str, kind: str) -> MiniFloat:
    """The format `kind` ('fp8' or 'bf8') stands for in `arch`'s instructions."""
    try:
        return FP8_FORMATS[(arch, kind)]
    except KeyError:
        raise ValueError(
            f"fp8_format: expected arch in {ARCHS} and kind in ('fp8', 'bf8'), "
            f"got arch={arch!r}, kind={kind!r}"
        ) from None


# --------------------------------------------------------------------------- encode


def _round_to_codes(fmt: MiniFloat, bits: np.ndarray) -> np.ndarray:
    """The rounding rule, applied by searching the f32 bit patterns of midpoints.

    Magnitude codes 0 .. max_finite_code + 1 have increasing values; the last is
    the first code past the largest finite value, which is exactly the overflow
    result of every fp8 format (NaN 0x7F for e4m3fn, NaN 0x80 for FNUZ — the sign
    bit alone, so the sign cannot change it — and inf 0x7C for e5m2), so rounding
    to nearest even onto these codes with an unbounded exponent is the whole rule.
    Non-negative f32 bit patterns sort like their values.
    """
    overflow = fmt.max_finite_code + 1
    values = fmt.magnitude(np.arange(overflow + 1))
    midpoints = ((values[1:] + values[:-1]) / 2).astype(np.float32).view(np.uint32)
    magnitude = bits & np.uint32(0x7FFFFFFF)
    code = np.searchsorted(midpoints, magnitude, side="left")
    tie = midpoints[np.minimum(code, len(midpoints) - 1)] == magnitude
    code += tie & (code % 2 == 1)  # a tie goes to the even code
    quiet_nan = overflow + 2 if fmt.specials is Specials.IEEE else overflow
    code = np.where(magnitude > np.uint32(0x7F800000), quiet_nan, code)
    signed = np.where(bits >> np.uint32(31), code | fmt.sign_bit, code)
    if fmt.specials is Specials.FNUZ:  # no negative zero: 0x00, or 0x80 (NaN) if so asked
        signed = np.where(code == 0, np.where(bits >> np.uint32(31), fmt.negative_zero, 0), signed)
    return signed.astype(np.uint8)


@dataclass(frozen=True)
class _Encoder:
    """`_round_to_codes` as one table lookup. Midpoints of neighbouring fp8 values
    have at most mantissa_bits + 1 fraction bits, so an f32's code depends only on
    its bits above `shift` and on whether any bit below is set."""

    shift: int
    table: np.ndarray  # uint8, indexed by (bits >> shift) << 1 | (low bits != 0)

    @classmethod
    def of(cls, fmt: MiniFloat) -> _Encoder:
        shift = 23 - (fmt.mantissa_bits + 1)
        index = np.arange(2 << (32 - shift), dtype=np.uint64)
        representatives = ((index >> np.uint64(1)) << np.uint64(shift)) | (index & np.uint64(1))
        return cls(shift, _round_to_codes(fmt, representatives.astype(np.uint32)))

    def __call__(self, x: np.ndarray) -> np.ndarray:
        bits = _f32(x).view(np.uint32)
        low_set = (bits & np.uint32((1 << self.shift) - 1)) != 0
        return self.table[((bits >> np.uint32(self.shift)) << np.uint32(1)) | low_set]


@functools.cache
def _encoder(fmt: MiniFloat) -> _Encoder:
    return _Encoder.of(fmt)


def encode(fmt: MiniFloat, x: np.ndarray) -> np.ndarray:
    """Round f32 values to `fmt` codes (uint8) as the hardware converts do."""
    return _encoder(fmt)(x)


def decode(fmt: MiniFloat, codes: np.ndarray) -> np.ndarray:
    """f32 values of `fmt` codes (any integer array)."""
    return fmt.values[np.asarray(codes) & ((1 << fmt.bits) - 1)]


# --------------------------------------------------------------------------- bytes, words


def _f32(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


def _byte(src: np.ndarray, index: int) -> np.ndarray:
    return (np.asarray(src, dtype=np.uint32) >> np.uint32(8 * index)) & np.uint32(0xFF)


def _check_select(name: str, value: int, limit: int) -> None:
    if value not in range(limit):
        raise ValueError(f"{name}: expected 0..{limit - 1}, got {value!r}")


def _insert_word(old: np.ndarray, word: np.ndarray, word_sel: int) -> np.ndarray:
    """`old` with its 16-bit half `word_sel` replaced by `word` (the other half kept)."""
    _check_select("word_sel", word_sel, 2)
    shift = np.uint32(16 * word_sel)
    keep = np.uint32(0xFFFF0000 if word_sel == 0 else 0x0000FFFF)
    return (np.asarray(old, dtype=np.uint32) & keep) | (word.astype(np.uint32) << shift)


def _word_bytes(src: np.ndarray, word_sel: int) -> np.ndarray:
    """The two bytes of 16-bit word `word_sel` of each dword, [lanes, 2] uint8."""
    _check_select("word_sel", word_sel, 2)
    word = (np.asarray(src, dtype=np.uint32) >> np.uint32(16 * word_sel)).astype("<u2")
    return word[..., None].view(np.uint8)


def _encode_pair(fmt: MiniFloat, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Two f32 arrays -> one 16-bit word of codes each, `low` in the low byte."""
    # an operand may be one value for every lane (an SGPR or an inline constant)
    codes = encode(fmt, np.stack(np.broadcast_arrays(_f32(low), _f32(high)), axis=-1))
    return codes.view("<u2")[..., 0]


# --------------------------------------------------------------------------- fp8 converts


def cvt_f32_fp8(fmt: MiniFloat, src: np.ndarray, byte_sel: int = 0) -> np.ndarray:
    """v_cvt_f32_{fp8,bf8}: byte `byte_sel` of each lane's dword -> f32."""
    _check_select("byte_sel", byte_sel, 4)
    return decode(fmt, _byte(src, byte_sel))


def cvt_pk_f32_fp8(fmt: MiniFloat, src: np.ndarray, word_sel: int = 0) -> np.ndarray:
    """v_cvt_pk_f32_{fp8,bf8}: the two bytes of word `word_sel` -> f32 [lanes, 2]."""
    return decode(fmt, _word_bytes(src, word_sel))


def cvt_pk_fp8_f32(
    fmt: MiniFloat, src0: np.ndarray, src1: np.ndarray, old: np.ndarray, word_sel: int = 0
) -> np.ndarray:
    """v_cvt_pk_{fp8,bf8}_f32: src0 -> low byte, src1 -> high byte of word `word_sel`
    of the destination; the other word keeps `old` (op_sel[3] selects the word)."""
    return _insert_word(old, _encode_pair(fmt, src0, src1), word_sel)


# --------------------------------------------------------------------------- gfx950 scaled


def scale_factor(scale: np.ndarray) -> np.ndarray:
    """2^(exponent field − 127) of each f32 scale operand (float64); NaN for field 255."""
    bits = np.asarray(scale, dtype=np.float32).view(np.uint32)
    exponent = (bits >> np.uint32(23)) & np.uint32(0xFF)
    return np.where(exponent == 0xFF, np.nan, np.exp2(exponent.astype(np.float64) - 127.0))


def cvt_scalef32_f32_fp8(
    fmt: MiniFloat, src: np.ndarray, scale: np.ndarray, byte_sel: int = 0
) -> np.ndarray:
    """v_cvt_scalef32_f32_{fp8,bf8}: byte `byte_sel` decoded times the scale."""
    _check_select("byte_sel", byte_sel, 4)
    return _f32(decode(fmt, _byte(src, byte_sel)) * scale_factor(scale))


def cvt_scalef32_pk_f32_fp8(
    fmt: MiniFloat, src: np.ndarray, scale: np.ndarray, word_sel: int = 0
) -> np.ndarray:
    """v_cvt_scalef32_pk_f32_{fp8,bf8}: two bytes of word `word_sel` times the scale,
    f32 [lanes, 2]."""
    factor = scale_factor(scale)[..., None]
    return _f32(cvt_pk_f32_fp8(fmt, src, word_sel) * factor)


@functools.cache
def _scaled_halves(fmt: MiniFloat, to_bits) -> tuple[np.ndarray, np.ndarray]:
    """Every (scale exponent field, code) -> the 16-bit float of code times the scale,
    as uint32 tables indexed by field << 8 | code: (in the low half, in the high half).
    Built with cvt_scalef32_pk_f32_fp8's arithmetic, so a lookup is that bit for bit."""
    fields = np.arange(256, dtype=np.uint32)
    factor = scale_factor((fields << np.uint32(23)).view(np.float32))
    with np.errstate(over="ignore"):  # large scales overflow to infinity, as one product would
        low = to_bits(_f32(decode(fmt, np.arange(256))[None, :] * factor[:, None])).astype(np.uint32)
    return low.reshape(-1), low.reshape(-1) << np.uint32(16)


def _scaled_pk_halves(fmt, src, scale, word_sel, to_bits) -> np.ndarray:
    """Two bytes times the scale, as two 16-bit floats (low half from the low byte)."""
    _check_select("word_sel", word_sel, 2)
    low, high = _scaled_halves(fmt, to_bits)
    field = (np.asarray(scale, dtype=np.float32).view(np.uint32) >> np.uint32(15)) & np.uint32(0xFF00)
    word = np.asarray(src, dtype=np.uint32) >> np.uint32(16 * word_sel)
    return low[field | (word & np.uint32(0xFF))] | high[field | ((word >> np.uint32(8)) & np.uint32(0xFF))]


def cvt_scalef32_pk_bf16_fp8(fmt: MiniFloat, src, scale, word_sel: int = 0) -> np.ndarray:
    """v_cvt_scalef32_pk_bf16_{fp8,bf8}: two scaled bytes as packed bf16 (RNE)."""
    return _scaled_pk_halves(fmt, src, scale, word_sel, f32_to_bf16)


def cvt_scalef32_pk_f16_fp8(fmt: MiniFloat, src, scale, word_sel: int = 0) -> np.ndarray:
    """v_cvt_scalef32_pk_f16_{fp8,bf8}: two scaled bytes as packed f16 (RNE)."""
    return _scaled_pk_halves(fmt, src, scale, word_sel, f32_to_f16)


def cvt_scalef32_pk_fp8_f32(
    fmt: MiniFloat,
    src0: np.ndarray,
    src1: np.ndarray,
    scale: np.ndarray,
    old: np.ndarray,
    word_sel: int = 0,
) -> np.ndarray:
    """v_cvt_scalef32_pk_{fp8,bf8}_f32: like cvt_pk_fp8_f32 after dividing by the scale."""
    # x / 2^e is exact in f64; rounding it to f32 changes nothing an fp8 can tell:
    # only results past the f32 range (still an overflow) or deep in its
    # denormals (still zero) are rounded.
    factor = scale_factor(scale)
    with np.errstate(over="ignore", under="ignore"):
        low, high = ((_f32(src) / factor).astype(np.float32) for src in (src0, src1))
    return _insert_word(old, _encode_pair(fmt, low, high), word_sel)


def cvt_scalef32_pk_fp8_bf16(fmt: MiniFloat, src, scale, old, word_sel: int = 0) -> np.ndarray:
    """v_cvt_scalef32_pk_{fp8,bf8}_bf16: the two bf16 of `src` (low half first)."""
    return cvt_scalef32_pk_fp8_f32(
        fmt, bf16_to_f32(src), bf16_to_f32(_high(src)), scale, old, word_sel
    )


def cvt_scalef32_pk_fp8_f16(fmt: MiniFloat, src, scale, old, word_sel: int = 0) -> np.ndarray:
    """v_cvt_scalef32_pk_{fp8,bf8}_f16: the two f16 of `src` (low half first)."""
    return cvt_scalef32_pk_fp8_f32(
        fmt, f16_to_f32(src), f16_to_f32(_high(src)), scale, old, word_sel
    )


def _high(src) -> np.ndarray:
    return np.asarray(src, dtype=np.uint32) >> np.uint32(16)


# --------------------------------------------------------------------------- bf16, f16


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """bf16 bit patterns (any unsigned array, low 16 bits used) -> f32."""
    return ((np.asarray(bits).astype(np.uint32) & np.uint32(0xFFFF)) << np.uint32(16)).view(
        np.float32
    )


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """f32 -> bf16 bit patterns (uint16), round to nearest even; NaN stays a quiet NaN."""
    return _bf16_bits(_f32(x).view(np.uint32)).astype(np.uint16)


def _bf16_bits(bits: np.ndarray) -> np.ndarray:
    """f32 bit patterns -> bf16 bit patterns (in uint32), as f32_to_bf16."""
    high = bits >> np.uint32(16)
    rounded = (bits + np.uint32(0x7FFF) + (high & np.uint32(1))) >> np.uint32(16)
    nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    if nan.any():
        return np.where(nan, high | np.uint32(0x40), rounded)
    return rounded


def pack_halves(halves: np.ndarray) -> np.ndarray:
    """[..., 2] 16-bit patterns -> one dword each, element 0 in the low half."""
    halves = np.asarray(halves).astype(np.uint32)
    return halves[..., 0] | (halves[..., 1] << np.uint32(16))


def cvt_pk_bf16_f32(src0: np.ndarray, src1: np.ndarray) -> np.ndarray:
    """v_cvt_pk_bf16_f32 (gfx950): src0 -> low bf16, src1 -> high bf16, RNE."""
    low, high = (_bf16_bits(_f32(x).view(np.uint32)) for x in (src0, src1))
    return low | (high << np.uint32(16))


def f16_to_f32(bits: np.ndarray) -> np.ndarray:
    """f16 bit patterns (low 16 bits used) -> f32 (exact)."""
    return np.asarray(bits).astype(np.uint16).view(np.float16).astype(np.float32)


def f32_to_f16(x: np.ndarray) -> np.ndarray:
    """f32 -> f16 bit patterns (uint16), round to nearest even, denormals kept."""
    with np.errstate(over="ignore"):
        return _f32(x).astype(np.float16).view(np.uint16)


# --------------------------------------------------------------------------- transcendentals


@dataclass(frozen=True)
class Transcendental:
    """One v_{exp,log,rcp,rsq,sqrt}_{f32,f16}: the exact function, rounded once."""

    function: Callable[[np.ndarray], np.ndarray]  # float64 -> float64, ISA special values
    dtype: type
    flushes_inputs: bool = False  # denormal inputs read as ±0 whatever the mode
    flushes_outputs: bool = False  # denormal results written as ±0 whatever the mode

    def __call__(self, x: np.ndarray, denormals: bool = True) -> np.ndarray:
        x = np.asarray(x, dtype=self.dtype)
        if self.flushes_inputs or not denormals:
            x = _flush_denormals(x)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
            y = self.function(x.astype(np.float64)).astype(self.dtype)
        if self.flushes_outputs or not denormals:
            y = _flush_denormals(y)
        return y


def _flush_denormals(x: np.ndarray) -> np.ndarray:
    tiny = np.abs(x) < np.finfo(x.dtype).tiny
    return np.where(tiny, np.copysign(np.zeros_like(x), x), x)


def _rsq(x: np.ndarray) -> np.ndarray:
    return 1.0 / np.sqrt(x)  # rsq(-0) = 1/-0 = -inf, as the ISA specifies


def _rcp(x: np.ndarray) -> np.ndarray:
    return 1.0 / x


def _log2(x: np.ndarray) -> np.ndarray:
    return np.log2(np.abs(x)) * np.where(x < 0, np.nan, 1.0)  # log2(-0) = -inf, not NaN


_FUNCTIONS = {"exp": np.exp2, "log": _log2, "rcp": _rcp, "rsq": _rsq, "sqrt": np.sqrt}
# Per-instruction denormal behaviour that ignores the MODE register (module docstring).
_NATIVE_FLUSH = {"v_exp_f32": (False, True), "v_log_f32": (True, False), "v_rcp_f32": (True, True)}

TRANSCENDENTALS: dict[str, Transcendental] = {
    f"v_{op}_{suffix}": Transcendental(
        fn, dtype, *_NATIVE_FLUSH.get(f"v_{op}_{suffix}", (False, False))
    )
    for op, fn in _FUNCTIONS.items()
    for suffix, dtype in (("f32", np.float32), ("f16", np.float16))
}


# --------------------------------------------------------------------------- options


def one_ulp_off(x: np.ndarray, y: np.ndarray, seed: int) -> np.ndarray:
    """`y` (results of an operation on `x`) moved one ulp up or down, the direction
    a hash of `x`'s bits and `seed`: the same input always errs the same way, as
    hardware does. Zeros, infinities and NaNs stay."""
    bits = np.asarray(x).view(f"u{np.asarray(x).dtype.itemsize}").astype(np.uint32)
    h = bits ^ np.uint32((seed * 0x85EBCA77) & 0xFFFFFFFF)
    for multiplier in (0x7FEB352D, 0x846CA68B):
        h = (h ^ (h >> np.uint32(16))) * np.uint32(multiplier)
    up = (h >> np.uint32(31)).astype(bool)
    moved = np.nextafter(y, np.where(up, np.inf, -np.inf).astype(y.dtype))
    return np.where(np.isfinite(y) & (y != 0), moved, y)


@dataclass(frozen=True)
class Options:
    """Where the hardware leaves a choice of results, the emulator takes one
    (`Machine(arch, mfma_accumulate=..., transcendental_error_seed=...,
    fnuz_negative_zero=...)`); each choice is one the ISA allows or our sources
    could not rule out, and a kernel must be right under all of them.

    mfma_accumulate: how MFMA sums its products (`accumulate.MODES`).
    transcendental_error_seed: None = transcendentals correctly rounded; a seed =
        every finite non-zero result one ulp off (the ISA promises 1 ulp), up or
        down by a hash of the input and the seed.
    fnuz_negative_zero: the code gfx942's FNUZ encoders give a negative value
        that rounds to zero: 0x00, or 0x80 (which FNUZ reads as NaN). Unverified on
        hardware, so both are modelled.
    """

    mfma_accumulate: str = "exact"
    transcendental_error_seed: int | None = None
    fnuz_negative_zero: int = 0x00

    def __post_init__(self):
        from k2back.emu.accumulate import MODES

        if self.mfma_accumulate not in MODES:
            raise ValueError(f"mfma_accumulate: expected one of {MODES}, got {self.mfma_accumulate!r}")
        seed = self.transcendental_error_seed
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or seed < 0):
            raise ValueError(f"transcendental_error_seed: expected None or an int >= 0, got {seed!r}")
        if self.fnuz_negative_zero not in (0x00, 0x80):
            raise ValueError(f"fnuz_negative_zero: expected 0x00 or 0x80, got {self.fnuz_negative_zero!r}")

    def encoder_format(self, fmt: MiniFloat) -> MiniFloat:
        """`fmt` as the encoders of this machine round (FNUZ negative zeros)."""
        if fmt.specials is Specials.FNUZ and self.fnuz_negative_zero:
            return dataclasses.replace(fmt, negative_zero=self.fnuz_negative_zero)
        return fmt

    def transcendental(self, fn: Callable[[np.ndarray], np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
        """`fn` (a v_exp/log/rcp/rsq/sqrt model) with this machine's error."""
        seed = self.transcendental_error_seed
        if seed is None:
            return fn
        return lambda x: one_ulp_off(x, fn(x), seed)
