"""The numerics options of `Machine` (`k2back.emu.numerics.Options`) against
independent models: MFMA accumulation (sequential fused adds rounded with exact
rational arithmetic; MMA-Sim's CDNA3 blocked model written out per element),
transcendentals one ulp off, FNUZ encodes of negative values that round to zero."""

from __future__ import annotations

import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

from k2back.emu import EmulatorError, Machine
from k2back.emu import numerics as nx
from k2back.emu.mfma import MFMA_FORMS
from k2back.emu.testing import ARCHS, handwritten, rng

F32 = np.float32


# --------------------------------------------------------------------------- models


def nearest_f32(x: Fraction) -> np.float32:
    """x rounded to f32, nearest, ties to even (exact: no double rounding)."""
    guess = F32(float(x))
    candidates = {guess, np.nextafter(guess, F32(np.inf)), np.nextafter(guess, F32(-np.inf))}
    best = min(candidates, key=lambda c: (abs(Fraction(float(c)) - x),
                                          int(np.array(c, F32).view(np.uint32)) & 1))
    return F32(best)


def sequential_model(a, b, c):
    """acc = round_f32(acc + a_k b_k), k in order, every sum exact before rounding."""
    out = np.zeros(c.shape, F32)
    for i in range(a.shape[0]):
        for j in range(b.shape[0]):
            acc = F32(c[i, j])
            for k in range(a.shape[1]):
                acc = nearest_f32(Fraction(float(acc)) + Fraction(float(a[i, k])) * Fraction(float(b[j, k])))
            out[i, j] = acc
    return out


def split(x: float, min_exponent: int) -> tuple[float, int]:
    """(significand, exponent) with 1 <= |significand| < 2, subnormals pinned to
    the format's min exponent, zero as (0, -inf)."""
    if x == 0:
        return 0.0, -(10**6)
    m, e = math.frexp(x)
    m, e = 2 * m, e - 1
    if e < min_exponent:
        m, e = m * 2.0 ** (e - min_exponent), min_exponent
    return m, e


def blocked_model(a, b, c, a_min, b_min, eight_bit):
    """MMA-Sim's CDNA3 matrix-core arithmetic, one output element at a time; the
    min exponents scalars or per element (a scaled MFMA's scale moves them)."""
    group = min(16 if eight_bit else 8, a.shape[1])

    def aligned(terms):  # [(significand, exponent)] -> (sum of truncated terms, top exponent)
        top = max(e for _, e in terms)
        return sum(math.trunc(s * 2.0 ** (24 + e - top)) * 2.0**-24 for s, e in terms), top

    out = np.zeros(c.shape, F32)
    for i in range(a.shape[0]):
        for j in range(b.shape[0]):
            acc = float(c[i, j])
            for g in range(0, a.shape[1], group):
                terms = []
                for k in range(g, g + group):
                    sa, ea = split(float(a[i, k]), a_min if np.isscalar(a_min) else int(a_min[i, k]))
                    sb, eb = split(float(b[j, k]), b_min if np.isscalar(b_min) else int(b_min[j, k]))
                    terms.append((sa * sb, ea + eb))
                if eight_bit:
                    (s0, e0), (s1, e1) = aligned(terms[0::2]), aligned(terms[1::2])
                    top = max(e0, e1)
                    s = (math.floor(s0 * 2.0 ** (24 + e0 - top)) + math.floor(s1 * 2.0 ** (24 + e1 - top))) * 2.0**-24
                else:
                    s, top = aligned(terms)
                sc, ec = split(acc, -126)
                common = max(top, ec)
                s = math.floor(s * 2.0 ** (31 + top - common)) * 2.0**-31
                sc = math.floor(sc * 2.0 ** (24 + ec - common)) * 2.0**-24
                if eight_bit and ec < common - 25:
                    sc = 0.0
                acc = float(F32((s + sc) * 2.0**common))
            out[i, j] = acc
    return out


# --------------------------------------------------------------------------- MFMA


def pack(matrix, dtype):
    """[16, 16 or 32] values -> the A/B registers [64, regs] of a 16x16xK form (SPEC §5)."""
    k = matrix.shape[1]
    per_lane = k // 4
    lanes = np.zeros((64, per_lane), dtype)
    for lane in range(64):
        lanes[lane] = matrix[lane % 16, per_lane * (lane // 16):per_lane * (lane // 16 + 1)]
    return np.ascontiguousarray(lanes).view(np.uint32)


def accumulator_lanes(c):
    lanes = np.zeros((64, 4), F32)
    for lane in range(64):
        for r in range(4):
            lanes[lane, r] = c[4 * (lane // 16) + r, lane % 16]
    return lanes


FORMS = [  # arch, mnemonic, element dtype, K, min exponent, 8-bit
    ("gfx942", "v_mfma_f32_16x16x16_bf16", ml_dtypes.bfloat16, 16, -126, False),
    ("gfx950", "v_mfma_f32_16x16x32_bf16", ml_dtypes.bfloat16, 32, -126, False),
    ("gfx942", "v_mfma_f32_16x16x32_fp8_fp8", ml_dtypes.float8_e4m3fnuz, 32, -7, True),
    ("gfx950", "v_mfma_f32_16x16x32_fp8_fp8", ml_dtypes.float8_e4m3fn, 32, -6, True),
]


def random_operands(seed, dtype, k):
    g = rng(seed)
    scale = np.exp2(g.integers(-6, 6, (16, 1)))  # rows of different magnitudes: cancellation, alignment
    a = (g.standard_normal((16, k)) * scale).astype(dtype)
    b = (g.standard_normal((16, k)) * scale.T.reshape(16, 1)).astype(dtype)
    b[:, ::5] = -b[:, ::5]
    c = (g.standard_normal((16, 16)) * 64).astype(F32)
    return a, b, c


@pytest.mark.parametrize("arch, mnemonic, dtype, k, min_exponent, eight_bit", FORMS)
@pytest.mark.parametrize("mode", ["sequential", "blocked"])
def test_mfma_accumulation_models(arch, mnemonic, dtype, k, min_exponent, eight_bit, mode):
    form = MFMA_FORMS[arch][mnemonic]
    for seed in range(3):
        a, b, c = random_operands(seed, dtype, k)
        got = form(pack(a, dtype), pack(b, dtype), accumulator_lanes(c), accumulate=mode)
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        if mode == "sequential":
            want = sequential_model(a64, b64, c)
        else:
            want = blocked_model(a64, b64, c, min_exponent, min_exponent, eight_bit)
        np.testing.assert_array_equal(got, accumulator_lanes(want))


@pytest.mark.parametrize("mode", ["sequential", "blocked"])
def test_scaled_mfma_accumulation_models(mode):
    """gfx950's scaled 16x16x128 (OCP e4m3 both): the scales multiply each 32-k
    block exactly and move its elements' min exponent; laid out as the CK
    hardware probe shows (tests/test_emu_hardware_truths.py): lane l byte t holds
    row l % 16, k = 64 (t // 16) + 16 (l // 16) + t % 16; scale byte 0 of lane l
    scales row l % 16 over k-block l // 16."""
    form = MFMA_FORMS["gfx950"]["v_mfma_scale_f32_16x16x128_f8f6f4"]
    fmt = ml_dtypes.float8_e4m3fn
    g = rng(21)
    codes = g.integers(0, 256, (2, 16, 128), dtype=np.uint8)
    codes = np.where(np.isfinite(codes.view(fmt).astype(np.float32)), codes, 0).astype(np.uint8)
    blocks = g.integers(120, 135, (2, 16, 4))
    exponent = np.repeat(blocks - 127, 32, axis=2)
    values = codes.view(fmt).astype(np.float64) * np.exp2(exponent)
    lane = np.arange(64)
    byte_k = 64 * (np.arange(32) // 16)[None, :] + 16 * (lane // 16)[:, None] + np.arange(32)[None, :] % 16
    regs = [np.ascontiguousarray(codes[m][lane % 16][np.arange(64)[:, None], byte_k]).view(np.uint32)
            for m in range(2)]
    scales = [blocks[m][lane % 16, lane // 16].astype(np.uint32) for m in range(2)]
    c = (g.standard_normal((16, 16)) * 8).astype(F32)
    got = form(regs[0], regs[1], accumulator_lanes(c), scale_a=scales[0], scale_b=scales[1], accumulate=mode)
    if mode == "sequential":
        want = sequential_model(values[0], values[1], c)
    else:
        want = blocked_model(values[0], values[1], c, -6 + exponent[0], -6 + exponent[1], True)
    np.testing.assert_array_equal(got, accumulator_lanes(want))


def test_the_models_round_differently():
    """2^24 + 1 - 2^24: exact gives 1; sequential rounds 2^24 + 1 to 2^24 first;
    blocked sums the group exactly (aligned to 2^24, 24 fraction bits) and keeps it."""
    form = MFMA_FORMS["gfx942"]["v_mfma_f32_16x16x16_bf16"]
    a = np.zeros((16, 16), ml_dtypes.bfloat16)
    b = np.zeros((16, 16), ml_dtypes.bfloat16)
    a[:, :3] = [2.0**12, 1.0, -(2.0**12)]
    b[:, :3] = [2.0**12, 1.0, 2.0**12]
    c = accumulator_lanes(np.zeros((16, 16), F32))
    got = {mode: form(pack(a, a.dtype), pack(b, b.dtype), c, accumulate=mode)[0, 0]
           for mode in ("exact", "sequential", "blocked")}
    assert got == {"exact": 1.0, "sequential": 0.0, "blocked": 1.0}


MFMA_ASM = """
\tv_mov_b32_e32 v2, 0x3f803f80
\tv_mov_b32_e32 v3, 0x3f803f80
\tv_mov_b32_e32 v4, 0x3f804b80
\tv_mov_b32_e32 v5, 0x3f803f80
\ts_nop 1
\tv_mfma_f32_16x16x16_bf16 v[6:9], v[2:3], v[4:5], 0
\ts_load_dwordx2 s[2:3], s[0:1], 0x0
\tv_lshlrev_b32_e32 v10, 2, v0
\ts_waitcnt lgkmcnt(0)
\ts_nop 7
\tglobal_store_dword v10, v6, s[2:3]"""


@pytest.mark.parametrize("arch", ARCHS)
def test_the_machine_option_reaches_the_mfma(arch):
    """Each lane group holds A = (1, 1, 1, 1) and B = (2^24, 1, 1, 1) in bf16: the
    sixteen products summed exactly round to 2^26 + 16, one by one to 2^26."""
    results = {}
    for mode in ("exact", "sequential"):
        machine = Machine(arch, mfma_accumulate=mode)
        out = np.zeros(64, F32)
        machine.launch(handwritten(arch, MFMA_ASM), "hand",
                       kernargs=machine.map(out).to_bytes(8, "little"))
        results[mode] = out
    products = np.tile([2.0**24, 1, 1, 1], 4)  # 16 k values: every lane group holds the same four
    want_sequential = F32(0)
    for p in products:
        want_sequential = F32(float(want_sequential) + p)
    assert results["exact"][0] == F32(products.sum())
    assert results["sequential"][0] == want_sequential
    assert results["exact"][0] != results["sequential"][0]


# --------------------------------------------------------------------------- transcendentals


def test_one_ulp_off_moves_every_finite_nonzero_result_by_one_ulp():
    x = rng(1).standard_normal(4096).astype(F32)
    exact = nx.TRANSCENDENTALS["v_exp_f32"](x)
    off = nx.Options(transcendental_error_seed=7).transcendental(nx.TRANSCENDENTALS["v_exp_f32"])(x)
    steps = off.view(np.int32).astype(np.int64) - exact.view(np.int32).astype(np.int64)
    assert set(np.unique(steps)) == {-1, 1}  # every result one ulp away, both ways
    assert 0.4 < np.mean(steps == 1) < 0.6
    again = nx.Options(transcendental_error_seed=7).transcendental(nx.TRANSCENDENTALS["v_exp_f32"])(x)
    np.testing.assert_array_equal(off, again)  # the same input errs the same way
    other = nx.Options(transcendental_error_seed=8).transcendental(nx.TRANSCENDENTALS["v_exp_f32"])(x)
    assert np.mean(other != off) > 0.3  # another seed, another pattern
    special = np.array([-np.inf, np.inf, np.nan, -200.0], F32)  # results 0, inf, NaN, 0
    kept = nx.one_ulp_off(special, nx.TRANSCENDENTALS["v_exp_f32"](special), 7)
    np.testing.assert_array_equal(kept, nx.TRANSCENDENTALS["v_exp_f32"](special))


TRANSCENDENTAL_ASM = """
\tv_cvt_f32_u32_e32 v1, v0
\tv_mul_f32_e32 v1, 0x3d800000, v1
\tv_exp_f32_e32 v2, v1
\tv_rcp_f32_e32 v3, v1
\ts_load_dwordx2 s[2:3], s[0:1], 0x0
\tv_lshlrev_b32_e32 v4, 3, v0
\ts_waitcnt lgkmcnt(0)
\tglobal_store_dwordx2 v4, v[2:3], s[2:3]"""


@pytest.mark.parametrize("arch", ARCHS)
def test_the_transcendental_option_reaches_exp_and_rcp(arch):
    outs = {}
    for seed in (None, 3):
        machine = Machine(arch, transcendental_error_seed=seed)
        out = np.zeros((64, 2), F32)
        machine.launch(handwritten(arch, TRANSCENDENTAL_ASM), "hand",
                       kernargs=machine.map(out).to_bytes(8, "little"))
        outs[seed] = out
    x = np.arange(64, dtype=F32) / F32(16)
    np.testing.assert_array_equal(outs[None][:, 0], np.exp2(x.astype(np.float64)).astype(F32))
    steps = np.abs(outs[3].view(np.int32).astype(np.int64) - outs[None].view(np.int32))
    assert (steps[:, 0] == 1).all()  # exp2: every lane one ulp off
    assert (steps[1:, 1] == 1).all() and steps[0, 1] == 0  # rcp(0) = inf stays


# --------------------------------------------------------------------------- FNUZ negative zero


FNUZ_ASM = """
\tv_mov_b32_e32 v1, 0xb0000000
\tv_mov_b32_e32 v2, 0x80000000
\tv_mov_b32_e32 v3, 0x30000000
\tv_cvt_pk_fp8_f32 v4, v1, v2
\tv_cvt_pk_fp8_f32 v4, v3, v1 op_sel:[0,0,1]
\ts_load_dwordx2 s[2:3], s[0:1], 0x0
\tv_lshlrev_b32_e32 v5, 2, v0
\ts_waitcnt lgkmcnt(0)
\tglobal_store_dword v5, v4, s[2:3]"""


@pytest.mark.parametrize("arch, code, want", [
    ("gfx942", 0x00, [0x00, 0x00, 0x00, 0x00]),
    ("gfx942", 0x80, [0x80, 0x80, 0x00, 0x80]),  # -2^-31, -0.0, 2^-31, -2^-31
    ("gfx950", 0x80, [0x80, 0x80, 0x00, 0x80]),  # OCP keeps the sign whatever the option
    ("gfx950", 0x00, [0x80, 0x80, 0x00, 0x80]),
])
def test_fnuz_negative_values_rounding_to_zero(arch, code, want):
    machine = Machine(arch, fnuz_negative_zero=code)
    out = np.zeros(64, np.uint32)
    machine.launch(handwritten(arch, FNUZ_ASM), "hand", kernargs=machine.map(out).to_bytes(8, "little"))
    assert list(out[:1].view(np.uint8)) == want
    reference = {0x00: ml_dtypes.float8_e4m3fnuz}.get(code)
    if arch == "gfx942" and reference is not None:  # ml_dtypes: FNUZ has no -0, so 0x00
        assert np.array([-(2.0**-31)], np.float32).astype(reference).view(np.uint8)[0] == 0


@pytest.mark.parametrize("keywords, named", [
    ({"mfma_accumulate": "pairwise"}, "mfma_accumulate"),
    ({"transcendental_error_seed": -1}, "transcendental_error_seed"),
    ({"fnuz_negative_zero": 0x7F}, "fnuz_negative_zero"),
])
def test_bad_options_are_named(keywords, named):
    with pytest.raises(EmulatorError, match=named):
        Machine("gfx942", **keywords)
