"""Decoder corners against the ISA pseudocode (CDNA3/CDNA4 ISA guides, chapter 12:
V_PK_MOV_B32, V_MAX_F32 / V_MIN_F32 / V_MAX3 / V_MIN3 / V_MED3_F32, V_DIV_SCALE_F32
and the division macro, V_CVT_F32_FP8 / V_CVT_PK_F32_FP8 under SDWA, the scaled
MFMA's scale byte selects), each model written out per lane from the pseudocode."""

from __future__ import annotations

import math
import struct

import ml_dtypes
import numpy as np
import pytest

from k2back.emu import Machine, UnsupportedInstruction
from k2back.emu.testing import ARCHS, handwritten, module, run, run_handwritten

LANE = np.arange(64, dtype=np.uint32)
F32 = np.float32
PROLOGUE = """
\ts_load_dwordx2 s[2:3], s[0:1], 0x0
\tv_lshlrev_b32_e32 v10, 2, v0
\ts_waitcnt lgkmcnt(0)
\tglobal_load_dword v1, v10, s[2:3]
\tglobal_load_dword v2, v10, s[2:3] offset:256
\tglobal_load_dword v3, v10, s[2:3] offset:512
\ts_waitcnt vmcnt(0)"""


def store(*registers: str, first_slot: int = 3) -> str:
    """Store each register's lanes into 256-byte slot first_slot, first_slot + 1, ..."""
    return "".join(f"\n\tglobal_store_dword v10, {r}, s[2:3] offset:{256 * (first_slot + i)}"
                   for i, r in enumerate(registers))


def bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def from_bits(b: int) -> float:
    return struct.unpack("<f", struct.pack("<I", b & 0xFFFFFFFF))[0]


SNAN, QNAN = 0x7F800001, 0x7FC00000


# --------------------------------------------------------------------------- v_pk_mov_b32


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("op_sel, op_sel_hi", [("[0,1]", None), ("[1,0]", None), ("[1,1]", "[0,0]"),
                                               ("[0,0]", "[1,0]")])
def test_pk_mov_b32_op_sel(arch, op_sel, op_sel_hi):
    """D[31:0] = S0 dword OPSEL[0]; D[63:32] = S1 dword OPSEL[1]: op_sel_hi plays no part."""
    modifiers = f" op_sel:{op_sel}" + (f" op_sel_hi:{op_sel_hi}" if op_sel_hi else "")
    body = f"""
\tv_add_u32_e32 v2, 0, v0
\tv_add_u32_e32 v3, 1000, v0
\tv_add_u32_e32 v4, 2000, v0
\tv_add_u32_e32 v5, 3000, v0
\tv_pk_mov_b32 v[6:7], v[2:3], v[4:5]{modifiers}
\ts_load_dwordx2 s[2:3], s[0:1], 0x0
\tv_lshlrev_b32_e32 v10, 3, v0
\ts_waitcnt lgkmcnt(0)
\tglobal_store_dwordx2 v10, v[6:7], s[2:3]"""
    out = np.zeros((64, 2), np.uint32)
    run_handwritten(arch, body, out)
    sel = [int(c) for c in op_sel.strip("[]").split(",")]
    src0, src1 = (LANE, LANE + 1000), (LANE + 2000, LANE + 3000)
    np.testing.assert_array_equal(out[:, 0], src0[sel[0]])
    np.testing.assert_array_equal(out[:, 1], src1[sel[1]])


# --------------------------------------------------------------------------- min / max / med3


def isa_pick(a: float, b: float, ab: int, bb: int, maximum: bool) -> int:
    """V_MAX_F32 / V_MIN_F32, IEEE mode, on bit patterns: a signalling NaN quieted,
    a quiet NaN gives the other operand, +0 > -0."""
    for x, bits in ((a, ab), (b, bb)):
        if math.isnan(x) and not bits & 0x400000:
            return bits | 0x400000
    if math.isnan(a):
        return bb
    if math.isnan(b):
        return ab
    if a == 0 and b == 0 and ab != bb:
        positive, negative = (ab, bb) if ab == 0 else (bb, ab)
        return positive if maximum else negative
    return ab if (a >= b if maximum else a < b) else bb


def isa_max(a: float, b: float, ab: int, bb: int) -> int:
    return isa_pick(a, b, ab, bb, maximum=True)


def isa_min(a: float, b: float, ab: int, bb: int) -> int:
    return isa_pick(a, b, ab, bb, maximum=False)


def on_bits(fn, *patterns: int) -> int:
    return fn(*(from_bits(p) for p in patterns), *patterns)


def isa_med3(pa: int, pb: int, pc: int) -> int:
    def mx(x, y):
        return on_bits(isa_max, x, y)

    def mn(x, y):
        return on_bits(isa_min, x, y)
    a, b, c = (from_bits(p) for p in (pa, pb, pc))
    if math.isnan(a) or math.isnan(b) or math.isnan(c):
        return mn(mn(pa, pb), pc)
    top = from_bits(mx(mx(pa, pb), pc))
    if top == a:
        return mx(pb, pc)
    if top == b:
        return mx(pa, pc)
    return mx(pa, pb)


CORNER_VALUES = [0x00000000, 0x80000000, QNAN, SNAN, 0xFFC00001, bits(1.0), bits(-1.0), bits(2.5),
                 0x7F800000, 0xFF800000, 0x00000001, 0x80000001]


@pytest.mark.parametrize("arch", ARCHS)
def test_min_max_med3_on_signed_zeros_and_nans(arch):
    g = np.random.default_rng(5)
    triples = np.array([[a, b, c] for a in CORNER_VALUES for b in CORNER_VALUES[:6] for c in CORNER_VALUES[:4]],
                       np.uint32)
    triples = triples[g.permutation(len(triples))[:192]]
    for chunk in triples.reshape(3, 64, 3):
        out = np.zeros(64 * 8, np.uint32)
        out[:192] = chunk.T.reshape(-1)
        body = PROLOGUE + """
\tv_max_f32_e32 v4, v1, v2
\tv_min_f32_e32 v5, v1, v2
\tv_med3_f32 v6, v1, v2, v3
\tv_max3_f32 v7, v1, v2, v3
\tv_min3_f32 v8, v1, v2, v3""" + store("v4", "v5", "v6", "v7", "v8")
        run_handwritten(arch, body, out)
        got = out[192:].reshape(5, 64)
        for lane, (a, b, c) in enumerate(chunk.tolist()):
            want = [on_bits(isa_max, a, b), on_bits(isa_min, a, b), isa_med3(a, b, c),
                    on_bits(isa_max, on_bits(isa_max, a, b), c), on_bits(isa_min, on_bits(isa_min, a, b), c)]
            assert got[:, lane].tolist() == want, f"lane {lane}: {a:#x} {b:#x} {c:#x}"


# --------------------------------------------------------------------------- division


def exponent(x: float) -> int:
    return (bits(x) >> 23) & 0xFF


def is_denormal(x: float) -> bool:
    return x != 0 and abs(x) < 2.0**-126


def isa_div_scale(s0: float, s1: float, s2: float) -> tuple[float, int]:
    """V_DIV_SCALE_F32 as the pseudocode reads, lane by lane: (D, VCC), with
    readings 1 and 2 of k2back.emu.valu_ops (1/S1 an f32 denormal; then the
    denominator scaled down)."""
    with np.errstate(over="ignore"):
        quotient = float(F32(s2) / F32(s1)) if s1 != 0 else math.inf
    reciprocal_denormal = s1 != 0 and is_denormal(1.0 / s1)
    if s2 == 0 or s1 == 0:
        return math.nan, 0
    if exponent(s2) - exponent(s1) >= 96:
        return (math.ldexp(s0, 64) if s0 == s1 else s0), 1
    if is_denormal(s1):
        return math.ldexp(s0, 64), 0
    if reciprocal_denormal and is_denormal(quotient):
        return (math.ldexp(s0, -64) if s0 == s1 else s0), 1
    if reciprocal_denormal:
        return math.ldexp(s0, -64), 0
    if is_denormal(quotient):
        return (math.ldexp(s0, 64) if s0 == s2 else s0), 1
    if exponent(s2) <= 23:
        return math.ldexp(s0, 64), 0
    return s0, 0


DIV_SCALE_CASES = [  # (S0, S1, S2): every branch of the pseudocode, both sides of the macro
    (3.0, 2.0, 3.0), (2.0, 2.0, 3.0), (1.0, 0.0, 1.0), (1.0, 1.0, 0.0),
    (2.0**-10, 2.0**-10, 2.0**100), (2.0**100, 2.0**-10, 2.0**100),
    (1e-40, 1e-40, 1.0), (1.0, 1e-40, 1.0),
    (2.0**-120, 2.0**10, 2.0**-120), (2.0**10, 2.0**10, 2.0**-120),
    (2.0**-110, 1.0, 2.0**-110), (-5.5, -0.75, 1.25),
    (2.0**127, 2.0**127, 1.5), (1.5, 2.0**127, 1.5), (2.0**127, 2.0**127, 2.0**30),
]


@pytest.mark.parametrize("arch", ARCHS)
def test_div_scale_sets_vcc_as_the_pseudocode_says(arch):
    cases = (DIV_SCALE_CASES * 6)[:64]
    out = np.zeros(64 * 6, np.float32)
    for slot in range(3):
        out[64 * slot:64 * (slot + 1)] = [case[slot] for case in cases]
    body = PROLOGUE + """
\tv_div_scale_f32 v4, vcc, v1, v2, v3
\ts_nop 1
\tv_cndmask_b32_e64 v5, 0, 1, vcc""" + store("v4", "v5")
    run_handwritten(arch, body, out)
    for lane, case in enumerate(cases):
        d, vcc = isa_div_scale(*(float(F32(x)) for x in case))
        got = out[192 + lane]
        assert (math.isnan(d) and np.isnan(got)) or got == F32(d), f"{case}: D {got} != {d}"
        assert out[256 + lane].view(np.uint32) == vcc, f"{case}: VCC"


FDIV = module("""
define amdgpu_kernel void @fdiv(ptr addrspace(1) %n, ptr addrspace(1) %d, ptr addrspace(1) %out) #0 {
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  %pn = getelementptr float, ptr addrspace(1) %n, i32 %tid
  %pd = getelementptr float, ptr addrspace(1) %d, i32 %tid
  %a = load float, ptr addrspace(1) %pn
  %b = load float, ptr addrspace(1) %pd
  %q = fdiv float %a, %b
  %po = getelementptr float, ptr addrspace(1) %out, i32 %tid
  store float %q, ptr addrspace(1) %po
  ret void
}
declare i32 @llvm.amdgcn.workitem.id.x()
""")


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("rcp_error_seed", [None, 11])
def test_llvm_division_is_exact_across_the_exponent_range(arch, rcp_error_seed):
    """fdiv (div_scale, rcp, Newton-Raphson fmas, div_fmas, div_fixup) gives the
    IEEE quotient for quotients near overflow and in the subnormals (VCC set,
    post-scaled), subnormal operands and special values, also with v_rcp_f32
    one ulp off (the ISA's promise)."""
    g = np.random.default_rng(8)
    exponents = np.concatenate([g.integers(-126, 128, 48), [127, 126, -126, -125, 100, -100, 60, -60,
                                                           0, 1, -1, 2, 30, -30, 64, -64]])
    n = (g.uniform(1, 2, 64) * np.exp2(exponents) * np.where(g.random(64) < 0.5, -1, 1)).astype(F32)
    d = (g.uniform(1, 2, 64) * np.exp2(g.permutation(exponents))).astype(F32)
    n[:6] = [1e-40, 3.0, 0.0, np.inf, 1.0, -0.0]
    d[:6] = [3.0, 1e-40, 5.0, 2.0, np.inf, 7.0]
    out = np.zeros(64, F32)
    machine = Machine(arch, transcendental_error_seed=rcp_error_seed)
    run(FDIV, arch, "fdiv", {"n": n, "d": d, "out": out}, machine=machine)
    with np.errstate(all="ignore"):
        want = n / d
    np.testing.assert_array_equal(out, want)


# --------------------------------------------------------------------------- fp8 converts under SDWA

FP8 = {"gfx942": ml_dtypes.float8_e4m3fnuz, "gfx950": ml_dtypes.float8_e4m3fn}


@pytest.mark.parametrize("arch", ARCHS)
def test_fp8_convert_selects(arch):
    """V_CVT_F32_FP8: SDWA src0_sel picks BYTE_0..3; V_CVT_PK_F32_FP8: WORD_1 the high
    word. The bytes are a lane's id and three neighbours (every code appears)."""
    words = (LANE * 4) | ((LANE * 4 + 1) << 8) | ((LANE * 4 + 2) << 16) | ((LANE * 4 + 3) << 24)
    out = np.zeros(64 * 9, np.uint32)
    out[:64] = words
    body = PROLOGUE + """
\tv_cvt_f32_fp8_sdwa v4, v1 src0_sel:BYTE_0
\tv_cvt_f32_fp8_sdwa v5, v1 src0_sel:BYTE_1
\tv_cvt_f32_fp8_sdwa v6, v1 src0_sel:BYTE_2
\tv_cvt_f32_fp8_sdwa v7, v1 src0_sel:BYTE_3
\tv_cvt_pk_f32_fp8_sdwa v[8:9], v1 src0_sel:WORD_1
\tv_cvt_pk_f32_fp8_e32 v[12:13], v1""" + store("v4", "v5", "v6", "v7", "v8", "v9", "v12", "v13",
                                                  first_slot=1)
    run_handwritten(arch, body, out)
    got = out[64:].reshape(8, 64).view(np.float32)
    codes = words.view(np.uint8).reshape(64, 4)
    values = codes.view(FP8[arch]).astype(np.float32)
    want = np.stack([values[:, 0], values[:, 1], values[:, 2], values[:, 3],
                     values[:, 2], values[:, 3], values[:, 0], values[:, 1]])
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("instruction", ["v_cvt_f32_fp8_sdwa v4, v1 src0_sel:WORD_1",
                                         "v_cvt_pk_f32_fp8_sdwa v[4:5], v1 src0_sel:BYTE_1"])
def test_fp8_convert_selects_the_isa_does_not_allow_are_refused(arch, instruction):
    with pytest.raises(UnsupportedInstruction, match=instruction.split()[-1]):
        run_handwritten(arch, f"\n\t{instruction}", np.zeros(64, np.uint32))


# --------------------------------------------------------------------------- scaled MFMA scales

SCALED_MFMA = """
\tv_mov_b32_e32 v20, 0x8281807f
\tv_mov_b32_e32 v21, 0x7f837f7f
""" + "".join(f"\tv_mov_b32_e32 v{r}, 0x38383838\n" for r in range(4, 20)) + """\ts_nop 1
\tv_mfma_scale_f32_16x16x128_f8f6f4 v[22:25], v[4:11], v[12:19], 0, {scale_a}, v21 {modifiers}
\ts_nop 7
\ts_nop 7
\ts_load_dwordx2 s[2:3], s[0:1], 0x0
\tv_lshlrev_b32_e32 v10, 2, v0
\ts_waitcnt lgkmcnt(0)
\tglobal_store_dword v10, v22, s[2:3]"""


@pytest.mark.parametrize("modifiers, byte_a, byte_b", [
    ("op_sel:[1,0,0]", 3, 2),  # op_sel_hi omitted: its VOP3P default is 1
    ("op_sel:[1,0,0] op_sel_hi:[0,0,0]", 1, 0),
    ("op_sel_hi:[1,0,0]", 2, 0),
    ("", 2, 2),
])
def test_scaled_mfma_scale_byte_select(modifiers, byte_a, byte_b):
    """All-ones e4m3 operands (0x38) over K = 128: D = 128 · 2^(a - 127) · 2^(b - 127)
    where a, b are byte op_sel[i] + 2 op_sel_hi[i] of each lane's scale VGPR."""
    out = np.zeros(64, np.float32)
    run_handwritten("gfx950", SCALED_MFMA.format(scale_a="v20", modifiers=modifiers), out)
    scale_a, scale_b = [0x7F, 0x80, 0x81, 0x82], [0x7F, 0x7F, 0x83, 0x7F]
    np.testing.assert_array_equal(out, 128.0 * 2.0 ** (scale_a[byte_a] - 127 + scale_b[byte_b] - 127))


def test_scaled_mfma_refuses_a_scale_that_is_not_a_vgpr():
    asm = handwritten("gfx950", SCALED_MFMA.format(scale_a="s20", modifiers=""))
    machine = Machine("gfx950")
    with pytest.raises(UnsupportedInstruction, match="scale operand 's20' is not a VGPR"):
        machine.launch(asm, "hand", kernargs=machine.map(np.zeros(64, np.float32)).to_bytes(8, "little"))
