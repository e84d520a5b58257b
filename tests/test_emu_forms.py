"""Instruction forms the K2 kernel holds that no other unit test ran (issue 9 §6,
tests/test_emu_inventory.py): hand-written kernels in LLVM's asm syntax, each
result against a per-lane model written here from the ISA pseudocode (CDNA3/4
ISA chapter 12 for ALU ops, chapter 9 and 11 for buffer/global and LDS
addressing), not from the emulator's op tables."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

from k2back.emu import Machine
from k2back.emu.testing import ARCHS, handwritten, run_handwritten

LANE = np.arange(64, dtype=np.uint32)
U32 = np.uint32
F32 = np.float32
M32 = 0xFFFFFFFF

PROLOGUE = """
\ts_load_dwordx2 s[2:3], s[0:1], 0x0
\tv_lshlrev_b32_e32 v10, 2, v0
\ts_waitcnt lgkmcnt(0)
\ts_load_dwordx4 s[4:7], s[2:3], 0x800""" + "".join(
    f"\n\tglobal_load_dword v{1 + i}, v10, s[2:3] offset:{256 * i}" for i in range(8)) + """
\ts_waitcnt vmcnt(0) lgkmcnt(0)"""


def store(register: str, slot: int) -> str:
    """global_store_dword of `register` (all lanes) into 256-byte slot `slot` >= 16."""
    return f"""
\tv_add_u32_e32 v11, {256 * slot}, v10
\tglobal_store_dword v11, {register}, s[2:3]"""


def floats(g, n=64):
    """+-[1, 2) x 2^{-1,0,1} with 24-bit mantissas: fma sums stay exact in f64."""
    sign = np.where(g.random(n) < 0.5, -1.0, 1.0)
    return (sign * g.uniform(1, 2, n) * 2.0 ** g.integers(-1, 2, n)).astype(F32)


def inputs(seed: int):
    g = np.random.default_rng(seed)
    a = g.integers(0, 2**32, 64, dtype=np.uint64).astype(U32)
    b = g.integers(0, 2**32, 64, dtype=np.uint64).astype(U32)
    a[:6] = [0, 0, 1, 55, 56, 0xFFFFFFFF]
    b[:6] = [0, 5, 0, 55, 3, 0xFFFFFFFF]
    x, y, z, w, c0, c1 = (floats(g) for _ in range(6))
    s5 = F32(1.5)
    x[:8] = [np.nan, 0.0, -0.0, s5, -s5, np.inf, -np.inf, 1e-40]
    y[:8] = [1.0, np.nan, 0.0, 2.0, np.nan, -np.inf, 3.0, -2.0]
    scalars = np.array([0x92345678, s5.view(U32), 0x40, 0x9], U32)  # s4..s7
    return {"a": a, "b": b, "x": x, "y": y, "z": z, "w": w, "c0": c0, "c1": c1, "s": scalars}


def pack(env) -> np.ndarray:
    out = np.zeros(64 * 48, U32)
    for i, key in enumerate(("a", "b", "x", "y", "z", "w", "c0", "c1")):
        out[64 * i:64 * (i + 1)] = env[key].view(U32)
    out[512:516] = env["s"]
    return out


def mask_bits(mask) -> np.ndarray:
    return np.asarray(mask, bool).astype(U32)


def isa_max(p, q):
    """V_MAX_F32 (IEEE mode): a NaN operand gives the other; +0 > -0."""
    p, q = np.asarray(p, F32), np.asarray(q, F32)
    bigger = np.where(p == q, np.where(np.signbit(p), q, p), np.maximum(p, q))
    return np.where(np.isnan(p), q, np.where(np.isnan(q), p, bigger)).astype(F32)


def signed(v):
    return np.asarray(v, U32).astype(np.int64) - (np.asarray(v, U32).astype(np.int64) >> 31 << 32)


def carry_add(p, q, cin=0):
    total = np.asarray(p, np.uint64) + np.asarray(q, np.uint64) + np.asarray(cin, np.uint64)
    return (total & M32).astype(U32), total >> 32 != 0


# (asm computing results, [(register, model(env) -> u32[64])])
ALU_CASES = {
    "v_add_co_u32_e32 / v_addc_co_u32_e32 (vcc carry)": (
        """
\tv_add_co_u32_e32 v20, vcc, 0x28000, v1
\tv_addc_co_u32_e32 v21, vcc, 0, v2, vcc
\tv_addc_co_u32_e32 v22, vcc, -1, v2, vcc
\tv_cndmask_b32_e64 v23, 0, 1, vcc""",
        [("v20", lambda e: carry_add(e["a"], 0x28000)[0]),
         ("v21", lambda e: carry_add(e["b"], 0, carry_add(e["a"], 0x28000)[1])[0]),
         ("v22", lambda e: carry_add(e["b"], M32, carry_add(e["b"], 0, carry_add(e["a"], 0x28000)[1])[1])[0]),
         ("v23", lambda e: mask_bits(carry_add(e["b"], M32, carry_add(e["b"], 0, carry_add(e["a"], 0x28000)[1])[1])[1]))]),
    "v_addc_co_u32_e64 / v_sub_co_u32_e64 (SGPR-pair carries)": (
        """
\tv_cmp_gt_u32_e64 s[12:13], v1, v2
\tv_addc_co_u32_e64 v20, s[12:13], -8, v2, s[12:13]
\tv_cndmask_b32_e64 v21, 0, 1, s[12:13]
\tv_sub_co_u32_e64 v22, s[14:15], v1, v2
\tv_cndmask_b32_e64 v23, 0, 1, s[14:15]""",
        [("v20", lambda e: carry_add(e["b"], 0xFFFFFFF8, e["a"] > e["b"])[0]),
         ("v21", lambda e: mask_bits(carry_add(e["b"], 0xFFFFFFF8, e["a"] > e["b"])[1])),
         ("v22", lambda e: (e["a"].astype(np.int64) - e["b"]).astype(U32)),
         ("v23", lambda e: mask_bits(e["b"] > e["a"]))]),
    "v_add_lshl_u32 / v_lshl_or_b32 / v_and_or_b32 / v_or3_b32 / v_bfi_b32 / v_subrev_u32_e32": (
        """
\tv_add_lshl_u32 v20, v1, v2, 1
\tv_lshl_or_b32 v21, s4, 12, v2
\tv_and_or_b32 v22, v1, s4, v2
\tv_or3_b32 v23, v1, v2, s4
\tv_bfi_b32 v24, v1, v2, s4
\tv_subrev_u32_e32 v25, v1, v2""",
        [("v20", lambda e: ((e["a"].astype(np.uint64) + e["b"]) << 1 & M32).astype(U32)),
         ("v21", lambda e: (U32(e["s"][0]) << U32(12)) | e["b"]),
         ("v22", lambda e: (e["a"] & e["s"][0]) | e["b"]),
         ("v23", lambda e: e["a"] | e["b"] | e["s"][0]),
         ("v24", lambda e: (e["a"] & e["b"]) | (~e["a"] & e["s"][0])),
         ("v25", lambda e: (e["b"].astype(np.int64) - e["a"]).astype(U32))]),
    "v_add_u32_sdwa src0_sel:BYTE_0..3 with an SGPR src1": (
        "".join(f"\n\tv_add_u32_sdwa v{20 + k}, v1, s4 dst_sel:DWORD dst_unused:UNUSED_PAD "
                f"src0_sel:BYTE_{k} src1_sel:DWORD" for k in range(4)),
        [(f"v{20 + k}", lambda e, k=k: ((e["a"] >> U32(8 * k)) & U32(0xFF)) + e["s"][0]) for k in range(4)]),
    "v_cmp_*_e64 into SGPR pairs, v_cmp_lg_f32_e32": (
        """
\tv_cmp_eq_u64_e64 s[12:13], 0, v[1:2]
\tv_cndmask_b32_e64 v20, 0, 1, s[12:13]
\tv_cmp_ge_u32_e64 s[12:13], v1, v2
\tv_cndmask_b32_e64 v21, 0, 1, s[12:13]
\tv_cmp_gt_u32_e64 s[12:13], s6, v1
\tv_cndmask_b32_e64 v22, 0, 1, s[12:13]
\tv_cmp_le_u32_e64 s[12:13], s6, v1
\tv_cndmask_b32_e64 v23, 0, 1, s[12:13]
\tv_cmp_lt_i32_e64 s[12:13], -1, v1
\tv_cndmask_b32_e64 v24, 0, 1, s[12:13]
\tv_cmp_lt_u32_e64 s[12:13], 55, v1
\tv_cndmask_b32_e64 v25, 0, 1, s[12:13]
\tv_cmp_ne_u32_e64 s[12:13], 1, v1
\tv_cndmask_b32_e64 v26, 0, 1, s[12:13]
\tv_cmp_gt_i32_e64 s[12:13], -1, v2
\tv_cndmask_b32_e64 v27, 0, 1, s[12:13]""",
        [("v20", lambda e: mask_bits((e["a"] == 0) & (e["b"] == 0))),
         ("v21", lambda e: mask_bits(e["a"] >= e["b"])),
         ("v22", lambda e: mask_bits(e["s"][2] > e["a"])),
         ("v23", lambda e: mask_bits(e["s"][2] <= e["a"])),
         ("v24", lambda e: mask_bits(-1 < signed(e["a"]))),
         ("v25", lambda e: mask_bits(55 < e["a"])),
         ("v26", lambda e: mask_bits(e["a"] != 1)),
         ("v27", lambda e: mask_bits(-1 > signed(e["b"])))]),
    "SDWA word/byte selects with SGPR src1 (v_and_b32, v_min_u32), v_pk_add_u16 op_sel_hi:[1,0]": (
        "\n\tv_and_b32_sdwa v20, v1, s4 dst_sel:DWORD dst_unused:UNUSED_PAD src0_sel:WORD_1 src1_sel:DWORD"
        + "".join(f"\n\tv_min_u32_sdwa v{21 + k}, v1, s6 dst_sel:DWORD dst_unused:UNUSED_PAD "
                  f"src0_sel:BYTE_{k} src1_sel:DWORD" for k in range(4))
        + "\n\tv_pk_add_u16 v25, v1, s4 op_sel_hi:[1,0]",
        [("v20", lambda e: (e["a"] >> U32(16)) & e["s"][0]),
         *[(f"v{21 + k}", lambda e, k=k: np.minimum((e["a"] >> U32(8 * k)) & U32(0xFF), e["s"][2]))
           for k in range(4)],
         # op_sel_hi bit 0 of src1: the high half adds src1's low half
         ("v25", lambda e: ((e["a"] & U32(0xFFFF)) + (e["s"][0] & U32(0xFFFF))) & U32(0xFFFF)
          | (((e["a"] >> U32(16)) + (e["s"][0] & U32(0xFFFF))) & U32(0xFFFF)) << U32(16))]),
    "float compares: lg (e32, e64), lt with a constant, neq, u": (
        """
\tv_cmp_lg_f32_e32 vcc, s5, v3
\tv_cndmask_b32_e64 v20, 0, 1, vcc
\tv_cmp_lt_f32_e64 s[12:13], 0, v3
\tv_cndmask_b32_e64 v21, 0, 1, s[12:13]
\tv_cmp_neq_f32_e64 s[12:13], s5, v3
\tv_cndmask_b32_e64 v22, 0, 1, s[12:13]
\tv_cmp_u_f32_e64 s[12:13], v3, v4
\tv_cndmask_b32_e64 v23, 0, 1, s[12:13]
\tv_cmp_lg_f32_e64 s[12:13], v3, v4
\tv_cndmask_b32_e64 v24, 0, 1, s[12:13]""",
        # LG: ordered and unequal; NEQ: !(==) (true on NaN); U: either NaN
        [("v20", lambda e: mask_bits(~np.isnan(e["x"]) & (e["x"] != F32(1.5)))),
         ("v21", lambda e: mask_bits(F32(0) < e["x"])),
         ("v22", lambda e: mask_bits(~(e["x"] == F32(1.5)))),
         ("v23", lambda e: mask_bits(np.isnan(e["x"]) | np.isnan(e["y"]))),
         ("v24", lambda e: mask_bits(~np.isnan(e["x"]) & ~np.isnan(e["y"]) & (e["x"] != e["y"])))]),
    "v_lshrrev_b32_e64 of vcc_lo, v_med3_i32, v_mov_b64_e32": (
        """
\tv_cmp_gt_u32_e32 vcc, v1, v2
\tv_lshrrev_b32_e64 v20, v1, vcc_lo
\tv_med3_i32 v21, v1, 0, v2
\tv_mov_b64_e32 v[22:23], v[1:2]""",
        [("v20", lambda e: U32(int(np.sum(mask_bits(e["a"] > e["b"])[:32].astype(np.uint64) << np.arange(32, dtype=np.uint64)))) >> (e["a"] & U32(31))),
         ("v21", lambda e: np.sort(np.stack([signed(e["a"]), np.zeros(64, np.int64), signed(e["b"])]), 0)[1].astype(U32)),
         ("v22", lambda e: e["a"]), ("v23", lambda e: e["b"])]),
    "v_max3_u32 (unsigned: words with the top bit set are the larger)": (
        """
\tv_max3_u32 v20, v1, v2, v3""",
        [("v20", lambda e: np.maximum(np.maximum(e["a"], e["b"]), e["x"].view(U32)))]),
    "float ops with abs modifiers and e64 forms": (
        """
\tv_add_f32_e64 v20, v3, v4
\tv_mul_f32_e64 v21, v3, v4
\tv_max_f32_e64 v22, |v3|, |v4|
\tv_max3_f32 v23, v5, |v3|, |v4|""",
        [("v20", lambda e: e["x"] + e["y"]),
         ("v21", lambda e: e["x"] * e["y"]),
         ("v22", lambda e: isa_max(np.abs(e["x"]), np.abs(e["y"]))),
         ("v23", lambda e: isa_max(isa_max(e["z"], np.abs(e["x"])), np.abs(e["y"])))]),
    "packed f32: v_pk_add_f32, v_pk_fma_f32 op_sel_hi:[1,0,0] / [1,0,1], v_pk_mul_f32 op_sel_hi:[0,1]": (
        """
\tv_pk_add_f32 v[20:21], v[5:6], v[7:8]
\tv_pk_fma_f32 v[22:23], v[5:6], v[7:8], v[3:4] op_sel_hi:[1,0,0]
\tv_pk_fma_f32 v[24:25], v[5:6], v[7:8], v[3:4] op_sel_hi:[1,0,1]
\tv_pk_mul_f32 v[26:27], v[5:6], v[7:8] op_sel_hi:[0,1]""",
        # op_sel_hi bit 0 for a source: the high result reads that source's low dword
        [("v20", lambda e: e["z"] + e["c0"]),
         ("v21", lambda e: e["w"] + e["c1"]),
         ("v22", lambda e: fma(e["z"], e["c0"], e["x"])),
         ("v23", lambda e: fma(e["w"], e["c0"], e["x"])),
         ("v24", lambda e: fma(e["z"], e["c0"], e["x"])),
         ("v25", lambda e: fma(e["w"], e["c0"], e["y"])),
         ("v26", lambda e: e["z"] * e["c0"]),
         ("v27", lambda e: e["z"] * e["c1"])]),
    "DPP moves: quad_perm:[2,3,0,1], row_ror:8": (
        """
\tv_mov_b32_e32 v20, 0
\tv_mov_b32_e32 v21, 0
\ts_nop 1
\tv_mov_b32_dpp v20, v1 quad_perm:[2,3,0,1] row_mask:0xf bank_mask:0xf
\tv_mov_b32_dpp v21, v1 row_ror:8 row_mask:0xf bank_mask:0xf""",
        [("v20", lambda e: e["a"][LANE & ~U32(3) | (LANE & U32(3)) ^ U32(2)]),
         ("v21", lambda e: e["a"][LANE & ~U32(15) | (LANE + U32(8)) & U32(15)])]),
    "scalar ALU: shifts, lshlN_add, max_i32, mulk, andn2, xor, compares": (
        """
\ts_lshl_b32 s12, s4, 2
\ts_lshr_b32 s13, s4, 4
\ts_lshl1_add_u32 s14, s4, s6
\ts_lshl3_add_u32 s15, s4, s6
\tv_mov_b32_e32 v20, s12
\tv_mov_b32_e32 v21, s13
\tv_mov_b32_e32 v22, s14
\tv_mov_b32_e32 v23, s15
\ts_lshl4_add_u32 s12, s4, s6
\ts_max_i32 s13, s4, 0
\ts_mov_b32 s14, s4
\ts_mulk_i32 s14, 0x130
\ts_andn2_b32 s15, s4, 63
\tv_mov_b32_e32 v24, s12
\tv_mov_b32_e32 v25, s13
\tv_mov_b32_e32 v26, s14
\tv_mov_b32_e32 v27, s15
\ts_xor_b32 s12, s4, 0x80
\ts_cmp_ge_i32 s7, s6
\ts_cselect_b32 s13, 1, 0
\ts_cmp_gt_i32 s7, 2
\ts_cselect_b32 s14, 1, 0
\ts_cmp_gt_u32 s6, 1
\ts_cselect_b32 s15, 1, 0
\tv_mov_b32_e32 v28, s12
\tv_mov_b32_e32 v29, s13
\tv_mov_b32_e32 v30, s14
\tv_mov_b32_e32 v31, s15""",
        [(f"v{20 + i}", (lambda e, f=f: np.full(64, f(*(int(v) for v in e["s"])) & M32, U32)))
         for i, f in enumerate([
             lambda s4, s5, s6, s7: s4 << 2, lambda s4, s5, s6, s7: s4 >> 4,
             lambda s4, s5, s6, s7: (s4 << 1) + s6, lambda s4, s5, s6, s7: (s4 << 3) + s6,
             lambda s4, s5, s6, s7: (s4 << 4) + s6, lambda s4, s5, s6, s7: max(s4 - (s4 >> 31 << 32), 0),
             lambda s4, s5, s6, s7: s4 * 0x130, lambda s4, s5, s6, s7: s4 & ~63,
             lambda s4, s5, s6, s7: s4 ^ 0x80, lambda s4, s5, s6, s7: int(s7 >= s6),
             lambda s4, s5, s6, s7: int(s7 > 2), lambda s4, s5, s6, s7: int(s6 > 1)])]),
    "scalar masks: s_cmpk_* (lt/gt_u32, lg_i32), s_addk_i32, s_cselect_b64, s_and_b64 with vcc, s_or_saveexec_b64": (
        """
\ts_cmpk_lt_u32 s6, 0x200
\ts_cselect_b64 s[12:13], -1, 0
\tv_cndmask_b32_e64 v20, 0, 1, s[12:13]
\ts_cmpk_gt_u32 s6, 0x200
\ts_cselect_b64 s[12:13], -1, 0
\tv_cndmask_b32_e64 v21, 0, 1, s[12:13]
\tv_cmp_gt_u32_e32 vcc, v1, v2
\ts_mov_b32 s14, 0x0f0f0f0f
\ts_mov_b32 s15, 0x00ff00ff
\ts_and_b64 s[12:13], vcc, s[14:15]
\tv_cndmask_b32_e64 v22, 0, 1, s[12:13]
\tv_mov_b32_e32 v23, 0
\ts_mov_b32 s14, 0xffff
\ts_mov_b32 s15, 0
\ts_mov_b64 exec, s[14:15]
\ts_mov_b32 s14, 0xff000000
\ts_mov_b32 s15, 1
\ts_or_saveexec_b64 s[12:13], s[14:15]
\tv_mov_b32_e32 v23, 7
\ts_mov_b64 exec, -1
\tv_mov_b32_e32 v24, s12
\tv_mov_b32_e32 v25, s13
\ts_cmpk_lg_i32 s6, 0x200
\ts_cselect_b32 s12, 1, 0
\ts_movk_i32 s13, 0x200
\ts_cmpk_lg_i32 s13, 0x200
\ts_cselect_b32 s14, 1, 0
\ts_mov_b32 s15, s4
\ts_addk_i32 s15, 0xfff0
\tv_mov_b32_e32 v26, s12
\tv_mov_b32_e32 v27, s14
\tv_mov_b32_e32 v28, s15""",
        [("v20", lambda e: np.full(64, int(e["s"][2] < 0x200), U32)),
         ("v21", lambda e: np.full(64, int(e["s"][2] > 0x200), U32)),
         ("v22", lambda e: mask_bits((e["a"] > e["b"]) & (((0x00ff00ff0f0f0f0f >> LANE.astype(np.uint64)) & 1) == 1))),
         ("v23", lambda e: np.where((LANE < 16) | ((LANE >= 24) & (LANE < 33)), 7, 0).astype(U32)),
         ("v24", lambda e: np.full(64, 0xFFFF, U32)), ("v25", lambda e: np.zeros(64, U32)),
         # s_cmpk_lg_i32: SCC = S0 != sext(simm16); s_addk_i32: S0 += sext(simm16) (0xfff0: -16)
         ("v26", lambda e: np.full(64, int(int(e["s"][2]) != 0x200), U32)),
         ("v27", lambda e: np.zeros(64, U32)),
         ("v28", lambda e: np.full(64, (int(e["s"][0]) - 16) & M32, U32))]),
    "packed f32 with the inline constant 0 (op_sel_hi:[1,0]) and an SGPR pair's low dword": (
        """
\tv_pk_add_f32 v[20:21], v[3:4], 0 op_sel_hi:[1,0]
\tv_pk_mul_f32 v[22:23], s[4:5], v[3:4] op_sel_hi:[0,1]""",
        # 0 is +0.0 in both halves (-0.0 + 0 = +0.0); op_sel_hi bit 0 clear: s4 in both
        [("v20", lambda e: e["x"] + F32(0.0)),
         ("v21", lambda e: e["y"] + F32(0.0)),
         ("v22", lambda e: e["s"][:1].view(F32)[0] * e["x"]),
         ("v23", lambda e: e["s"][:1].view(F32)[0] * e["y"])]),
}


def fma(p, q, r) -> np.ndarray:
    """Single-rounded fma: exact in f64 for `floats` inputs (48-bit products, close exponents)."""
    return (p.astype(np.float64) * q.astype(np.float64) + r.astype(np.float64)).astype(F32)


def with_wait_states(code: str) -> str:
    """The 2 wait states between a VALU's SGPR write and a VALU's explicit read of it
    (k2back.emu.hazards), before every instruction of a case that reads a mask or carry."""
    return re.sub(r"\n\t(v_cndmask_b32_e64|v_addc_co_u32_e64|v_lshrrev_b32_e64)", "\n\ts_nop 1\n\t\\1", code)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("case", list(ALU_CASES))
def test_alu_forms(arch, case):
    code, outputs = ALU_CASES[case]
    code = with_wait_states(code)
    env = inputs(31)
    out = pack(env)
    body = PROLOGUE + code + "".join(store(reg, 16 + i) for i, (reg, _) in enumerate(outputs))
    run_handwritten(arch, body, out)
    for i, (reg, model) in enumerate(outputs):
        got = out[64 * (16 + i):64 * (17 + i)]
        with np.errstate(invalid="ignore"):
            want = np.asarray(model(env))
        if want.dtype == F32:  # any NaN for a NaN (the ISA does not fix its payload here)
            same = (got == want.view(U32)) | (np.isnan(got.view(F32)) & np.isnan(want))
        else:
            same = got == want.astype(U32)
        bad = np.flatnonzero(~same)
        want = want.view(U32) if want.dtype == F32 else want.astype(U32)
        assert bad.size == 0, f"{reg} lanes {bad[:8].tolist()}: got {got[bad[:4]]}, want {want[bad[:4]]}"


def test_gfx950_cvt_scalef32_pk_bf16_fp8():
    """V_CVT_SCALEF32_PK_BF16_FP8: two OCP e4m3 bytes (op_sel[0]: of the high word)
    times 2^exponent(S1), each rounded to bf16, low result in the low half."""
    env = inputs(32)
    out = pack(env)
    scale = F32(0.75)  # exponent -1
    out[64 * 7:64 * 8] = np.full(64, scale, F32).view(U32)  # v8
    out[64 * 0:64 * 1] = (LANE * 4) | ((LANE * 4 + 1) << 8) | ((LANE * 4 + 2) << 16) | ((LANE * 4 + 3) << 24)
    body = PROLOGUE + """
\tv_cvt_scalef32_pk_bf16_fp8 v20, v1, v8
\tv_cvt_scalef32_pk_bf16_fp8 v21, v1, v8 op_sel:[1,0,0]""" + store("v20", 16) + store("v21", 17)
    run_handwritten("gfx950", body, out)
    codes = (LANE[:, None] * 4 + np.arange(4)).astype(np.uint8)
    values = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float64) * 0.5
    want = values.astype(ml_dtypes.bfloat16).view(np.uint16)
    got = np.stack([out[64 * 16:64 * 17], out[64 * 17:64 * 18]], 1).view(np.uint16).reshape(64, 4)
    nan = np.isnan(values)  # codes 0x7f, 0xff: any bf16 NaN
    np.testing.assert_array_equal(got[~nan], want[~nan])
    assert np.all(np.isnan(got[nan].view(ml_dtypes.bfloat16).astype(np.float32)))


# --------------------------------------------------------------------------- memory forms

# ---- batching (machine.Machine._run_turn, state.Batch): the waves of a workgroup at
# one instruction run it once over [waves, 64] lanes; each form above must leave the
# bits it leaves wave by wave (a trace turns batching off), with data differing
# between the waves.

WAVES, INPUT_DWORDS = 8, 1024
THREADS = 64 * WAVES


def wave_prologue() -> str:
    """v1..v8 and s4..s7 loaded as PROLOGUE does, each thread its own dwords."""
    loads = "".join(f"\n\tglobal_load_dword v{1 + i}, v10, s[2:3] offset:{256 * i}" for i in range(8))
    return ("\n\ts_load_dwordx2 s[2:3], s[0:1], 0x0\n\tv_lshlrev_b32_e32 v10, 2, v0"
            "\n\ts_waitcnt lgkmcnt(0)\n\ts_load_dwordx4 s[4:7], s[2:3], 0x800" + loads
            + "\n\ts_waitcnt vmcnt(0) lgkmcnt(0)")


def wave_store(register: str, slot: int) -> str:
    """Thread t's `register` into dword INPUT_DWORDS + THREADS * slot + t."""
    return (f"\n\tv_add_u32_e32 v11, {4 * (INPUT_DWORDS + THREADS * slot)}, v10"
            f"\n\tglobal_store_dword v11, {register}, s[2:3]")


def wave_inputs(seed: int) -> np.ndarray:
    """Random bits, ordinary floats and specials, different in every wave."""
    g = np.random.default_rng(seed)
    bits = g.integers(0, 2**32, INPUT_DWORDS, dtype=np.uint64).astype(np.uint32)
    specials = np.array([np.nan, 0.0, -0.0, np.inf, -np.inf, 1e-40, 1.0, -2.0], np.float32).view(np.uint32)
    pick = g.random(INPUT_DWORDS)
    values = np.where(pick < 0.5, floats(g, INPUT_DWORDS).view(np.uint32), bits)
    return np.where(pick > 0.9, g.choice(specials, INPUT_DWORDS), values).astype(np.uint32)


def launch_waves(arch: str, body: str, words: int, batched: bool):
    out = np.zeros(words, np.uint32)
    out[:INPUT_DWORDS] = wave_inputs(5)
    machine = Machine(arch, trace=None if batched else (lambda w, ins: None))
    kernargs = machine.map(out).to_bytes(8, "little")
    stats = machine.launch(handwritten(arch, body), "hand", block=(THREADS,), kernargs=kernargs)
    return out, stats


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("case", list(ALU_CASES))
def test_batched_alu_forms_match_wave_by_wave(arch, case):
    code, outputs = ALU_CASES[case]
    code = with_wait_states(code)
    body = wave_prologue() + code + "".join(wave_store(reg, i) for i, (reg, _) in enumerate(outputs))
    words = INPUT_DWORDS + THREADS * len(outputs)
    batched, stats = launch_waves(arch, body, words, batched=True)
    alone, alone_stats = launch_waves(arch, body, words, batched=False)
    assert stats.batched > 0 and alone_stats.batched == 0
    bad = np.flatnonzero(batched != alone)
    assert bad.size == 0, (f"dwords {bad[:8].tolist()} (slot, thread) "
                           f"{[divmod(int(d) - INPUT_DWORDS, THREADS) for d in bad[:4]]}: "
                           f"batched {batched[bad[:4]]}, wave by wave {alone[bad[:4]]}")


# fp8 converts (and gfx950's scaled ones): decode, encode into a word of the old value,
# an SGPR and a VGPR scale.
CONVERT_FORMS = """
\tv_cvt_pk_f32_fp8_e32 v[20:21], v1
\tv_cvt_pk_f32_bf8_sdwa v[22:23], v2 src0_sel:WORD_1
\tv_cvt_f32_fp8_sdwa v24, v3 src0_sel:BYTE_2
\tv_mov_b32_e32 v25, v1
\tv_cvt_pk_fp8_f32 v25, v4, v5
\tv_cvt_pk_bf8_f32 v25, v6, v7 op_sel:[0,0,1]"""
SCALED_FORMS = """
\tv_cvt_scalef32_pk_bf16_fp8 v26, v1, v8
\tv_cvt_scalef32_pk_bf16_bf8 v27, v2, s5 op_sel:[1,0,0]
\tv_cvt_scalef32_pk_f32_fp8 v[28:29], v3, v8
\tv_cvt_scalef32_f32_bf8 v30, v4, s5 op_sel:[1,1,0]"""


@pytest.mark.parametrize("arch", ARCHS)
def test_batched_fp8_converts_match_wave_by_wave(arch):
    outputs = [f"v{i}" for i in range(20, 26 if arch == "gfx942" else 31)]
    code = CONVERT_FORMS + (SCALED_FORMS if arch == "gfx950" else "")
    body = wave_prologue() + code + "".join(wave_store(reg, i) for i, reg in enumerate(outputs))
    words = INPUT_DWORDS + THREADS * len(outputs)
    batched, stats = launch_waves(arch, body, words, batched=True)
    alone, _ = launch_waves(arch, body, words, batched=False)
    assert stats.batched >= WAVES * len(code.strip().splitlines())
    bad = np.flatnonzero(batched != alone)
    assert bad.size == 0, (f"(slot, thread) {[divmod(int(d) - INPUT_DWORDS, THREADS) for d in bad[:4]]}: "
                           f"batched {batched[bad[:4]]}, wave by wave {alone[bad[:4]]}")


NUM_RECORDS = 8136  # bytes the V# admits: lane 63's x4 load at offset 64 keeps 2 of its dwords


def buffer_model(image: np.ndarray, offsets, width: int, instruction_offset: int = 0):
    """MUBUF raw load (stride 0, offen): each dword (each byte for ubyte) of the access
    is in range iff offset + its end <= num_records; out of range reads 0."""
    rows = []
    for lane_offset in offsets:
        start = int(lane_offset) + instruction_offset
        if width == 1:
            rows.append([image[start] if start + 1 <= NUM_RECORDS else 0])
        else:
            rows.append([int(image[start + 4 * j:start + 4 * j + 4].view(U32)[0])
                         if start + 4 * j + 4 <= NUM_RECORDS else 0 for j in range(width // 4)])
    return np.array(rows, np.uint64).astype(U32)


LOADS = [  # (asm, result registers, voffset register, voffset per lane, width, instruction offset)
    ("buffer_load_dword v20, v12, s[8:11], 0 offen", "v20", 4, 4, 0),
    ("buffer_load_dwordx2 v[20:21], v12, s[8:11], 0 offen sc1", "v[20:21]", 8, 8, 0),
    ("buffer_load_dwordx4 v[20:23], v12, s[8:11], 0 offen nt", "v[20:23]", 128, 16, 0),
    ("buffer_load_dwordx4 v[20:23], v12, s[8:11], 0 offen offset:64 nt", "v[20:23]", 128, 16, 64),
    ("buffer_load_dwordx4 v[20:23], v12, s[8:11], 0 offen offset:64 sc1", "v[20:23]", 128, 16, 64),
    ("buffer_load_dwordx4 v[20:23], v12, s[8:11], 0 offen sc1", "v[20:23]", 16, 16, 0),
    # lanes 51.. wholly out of range, none partly (the loads take whole lanes then)
    ("buffer_load_dwordx4 v[20:23], v12, s[8:11], 0 offen sc0 sc1", "v[20:23]", 160, 16, 0),
    ("buffer_load_dwordx2 v[20:21], v12, s[8:11], 0 offen offset:8", "v[20:21]", 136, 8, 8),
    ("buffer_load_dwordx2 v[20:21], v12, s[8:11], 0 offen", "v[20:21]", 24, 8, 0),
    ("buffer_load_ubyte v20, v12, s[8:11], 0 offen offset:2 sc1", "v20", 3, 1, 2),
    ("buffer_load_ubyte v20, v12, s[8:11], 0 offen sc1", "v20", 127, 1, 0),
]
RSRC = """
\ts_mov_b32 s8, s2
\ts_and_b32 s9, s3, 0xffff
\ts_mov_b32 s10, {records}
\ts_mov_b32 s11, 0x20000"""


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("load", LOADS, ids=[load[0] for load in LOADS])
def test_buffer_load_forms(arch, load):
    asm, result, stride, width, offset = load
    g = np.random.default_rng(33)
    out = np.zeros(4096, U32)
    out[:2048] = g.integers(0, 2**32, 2048, dtype=np.uint64).astype(U32)
    words = max(width // 4, 1)
    body = f"""
\ts_load_dwordx2 s[2:3], s[0:1], 0x0
\tv_mul_u32_u24_e32 v12, {stride}, v0
\tv_lshlrev_b32_e32 v13, 4, v0
\tv_add_u32_e32 v13, 0x2000, v13
\ts_waitcnt lgkmcnt(0)""" + RSRC.format(records=NUM_RECORDS) + f"""
\t{asm}
\ts_waitcnt vmcnt(0)
\tglobal_store_dwordx{words if words > 1 else ''} v13, {result}, s[2:3]""".replace("dwordx ", "dword ")
    run_handwritten(arch, body, out)
    image = out[:2048].copy().view(np.uint8)
    want = buffer_model(image, LANE * stride, width, offset)
    got = out[2048:2048 + 256].reshape(64, 4)[:, :want.shape[1]]
    np.testing.assert_array_equal(got, want)


def test_buffer_store_forms():
    """MUBUF raw stores (offen, offset, sc1): bytes, shorts, dwords, x2, x4 at per-lane offsets."""
    out = np.zeros(4096, U32)
    stores = [  # (asm, voffset stride, bytes written, instruction offset)
        ("buffer_store_byte v20, v12, s[8:11], 0 offen sc1", 1, 1, 0),
        ("buffer_store_dword v20, v12, s[8:11], 0 offen", 4, 4, 256),
        ("buffer_store_dword v20, v12, s[8:11], 0 offen sc1", 4, 4, 512),
        ("buffer_store_dwordx2 v[20:21], v12, s[8:11], 0 offen sc1", 8, 8, 768),
        ("buffer_store_dwordx4 v[20:23], v12, s[8:11], 0 offen offset:16 sc1", 16, 16, 1280),
        ("buffer_store_dwordx4 v[20:23], v12, s[8:11], 0 offen sc1", 16, 16, 2560),
        ("buffer_store_short v20, v12, s[8:11], 0 offen sc1", 2, 2, 3584),
        ("buffer_store_dwordx2 v[20:21], v12, s[8:11], 0 offen", 8, 8, 3840),
    ]
    body = """
\ts_load_dwordx2 s[2:3], s[0:1], 0x0
\tv_mul_u32_u24_e32 v20, 0x1010101, v0
\tv_xor_b32_e32 v21, 0x55555555, v20
\tv_not_b32_e32 v22, v20
\tv_add_u32_e32 v23, 0x77, v20
\ts_waitcnt lgkmcnt(0)""" + RSRC.format(records=16384)
    for asm, stride, _, base in stores:
        plain = asm.replace(" offset:16", "")
        extra = 16 if "offset:16" in asm else 0
        body += f"""
\tv_mul_u32_u24_e32 v12, {stride}, v0
\tv_add_u32_e32 v12, {base + 4096 - extra}, v12
\t{plain if not extra else asm}"""
    run_handwritten("gfx942", body, out)
    first = LANE * 0x10101  # v_mul_u32_u24 multiplies the low 24 bits
    data = np.stack([first, first ^ 0x55555555, ~first, first + 0x77], 1).astype(U32)
    image = np.zeros(16384, np.uint8)
    for _, stride, size, base in stores:
        for lane in range(64):
            start = 4096 + base + lane * stride
            image[start:start + size] = data[lane].view(np.uint8)[:size]
    np.testing.assert_array_equal(out.view(np.uint8)[4096:], image[4096:])


def global_address(stride: int) -> str:
    """Asm: s[2:3] the kernarg's buffer, v10 the lane's byte offset (`stride` bytes a
    lane), v[4:5] their sum (a global address)."""
    return f"""
\ts_load_dwordx2 s[2:3], s[0:1], 0x0
\tv_lshlrev_b32_e32 v10, {stride.bit_length() - 1}, v0
\ts_waitcnt lgkmcnt(0)
\tv_mov_b32_e32 v5, s3
\tv_add_co_u32_e32 v4, vcc, s2, v10
\tv_addc_co_u32_e32 v5, vcc, 0, v5, vcc"""


def test_global_and_scalar_load_forms_with_offsets():
    """global_load_dword with a 64-bit VGPR address and offset (sc1), global_store_dword
    with an SGPR base and offset (sc1), s_load_dword{,x2,x4} with an SGPR soffset and
    an immediate offset (address = base + soffset + offset)."""
    g = np.random.default_rng(34)
    out = np.zeros(4096, U32)
    out[:1024] = g.integers(0, 2**32, 1024, dtype=np.uint64).astype(U32)
    body = global_address(4) + """
\tglobal_load_dword v20, v[4:5], off offset:3328 sc1
\ts_mov_b32 s4, 0x40
\ts_load_dword s12, s[2:3], s4 offset:0x0
\ts_load_dwordx2 s[6:7], s[2:3], s4 offset:0x10
\ts_load_dwordx4 s[8:11], s[2:3], s4 offset:0x20
\ts_waitcnt vmcnt(0) lgkmcnt(0)
\tv_add_u32_e32 v11, 0x1000, v10
\tglobal_store_dword v11, v20, s[2:3] offset:256 sc1
\tv_mov_b32_e32 v21, s12
\tv_mov_b32_e32 v22, s6
\tv_mov_b32_e32 v23, s7
\tv_mov_b32_e32 v24, s8
\tv_mov_b32_e32 v25, s11
\tv_add_u32_e32 v11, 0x2000, v10""" + "".join(
        f"\n\tglobal_store_dword v11, v{21 + i}, s[2:3] offset:{256 * i}" for i in range(5))
    run_handwritten("gfx942", body, out)
    np.testing.assert_array_equal(out[1024 + 64:1024 + 128], out[832:896])  # 3328 bytes = word 832
    word = lambda byte: out[byte // 4]
    for i, byte in enumerate([0x40, 0x50, 0x54, 0x60, 0x6C]):
        np.testing.assert_array_equal(out[2048 + 64 * i:2048 + 64 * (i + 1)], np.full(64, word(byte)))


@pytest.mark.parametrize("arch", ARCHS)
def test_global_dwordx2_agent_forms_and_s_nor_b64(arch):
    """The tagged-word hand-off's forms (plan.LL_WORD): global_load_dwordx2 with a 64-bit
    VGPR address, with and without an offset (sc1), global_store_dwordx2 with an SGPR
    base, with and without an offset (sc1); and s_nor_b64 (~(a | b), both halves)."""
    g = np.random.default_rng(35)
    out = np.zeros(4096, U32)
    out[:1024] = g.integers(0, 2**32, 1024, dtype=np.uint64).astype(U32)
    a, b = (int(x) for x in g.integers(0, 2**64, 2, dtype=np.uint64))
    body = global_address(8) + f"""
\tglobal_load_dwordx2 v[20:21], v[4:5], off sc1
\tglobal_load_dwordx2 v[22:23], v[4:5], off offset:1024 sc1
\ts_mov_b32 s6, {a & M32:#x}
\ts_mov_b32 s7, {a >> 32:#x}
\ts_mov_b32 s8, {b & M32:#x}
\ts_mov_b32 s9, {b >> 32:#x}
\ts_nor_b64 s[10:11], s[6:7], s[8:9]
\ts_waitcnt vmcnt(0)
\tv_add_u32_e32 v11, 0x2000, v10
\tglobal_store_dwordx2 v11, v[20:21], s[2:3] sc1
\tglobal_store_dwordx2 v11, v[22:23], s[2:3] offset:512 sc1
\tv_mov_b32_e32 v24, s10
\tv_mov_b32_e32 v25, s11
\tv_add_u32_e32 v12, 0x3000, v10
\tglobal_store_dwordx2 v12, v[24:25], s[2:3]"""
    source = out.copy()
    run_handwritten(arch, body, out)
    np.testing.assert_array_equal(out[2048:2176], source[:128])  # 8 bytes a lane from byte 0
    np.testing.assert_array_equal(out[2176:2304], source[256:384])  # from byte 1024, to 0x2200
    nor = ~(a | b) & (2**64 - 1)
    expect = np.tile(np.array([nor & M32, nor >> 32], U32), 64)
    np.testing.assert_array_equal(out[3072:3200], expect)


def lds_model(writes, reads, lds_bytes):
    """Apply DS writes [(per-lane byte addresses [64, n], data [64, n] u32)] then read
    [(addresses [64, n], bytes per element)] back from a byte image."""
    image = np.zeros(lds_bytes, np.uint8)
    for addresses, data in writes:
        for lane in range(64):
            for address, value in zip(addresses[lane], data[lane]):
                image[address:address + 4] = np.array([value], U32).view(np.uint8)
    out = []
    for addresses, size in reads:
        rows = []
        for lane in range(64):
            row = []
            for address in addresses[lane]:
                chunk = image[address:address + size]
                row.append(int(chunk[0]) if size == 1 else int(chunk.view(U32)[0]))
            rows.append(row)
        out.append(np.array(rows, np.uint64).astype(U32))
    return out


def test_lds_forms():
    """DS reads and writes with offset, offset0/offset1 (dword, qword and st64 units),
    b32/b64/b128 and u8, against a byte image of LDS."""
    lds = 65536
    body = """
\ts_load_dwordx2 s[2:3], s[0:1], 0x0
\tv_lshlrev_b32_e32 v10, 2, v0
\tv_lshlrev_b32_e32 v12, 4, v0
\tv_mul_u32_u24_e32 v20, 0x10001, v0
\tv_xor_b32_e32 v21, 0xa5a5a5a5, v20
\tv_not_b32_e32 v22, v20
\tv_add_u32_e32 v23, 0x3333, v20
\tds_write_b128 v12, v[20:23]""" + "".join(
        f"\n\tds_write_b128 v12, v[20:23] offset:{1024 * k}" for k in range(1, 16)) + """
\tv_lshlrev_b32_e32 v13, 3, v0
\tds_write_b64 v13, v[22:23] offset:2048
\tds_write_b32 v10, v23 offset:2560
\tv_add_u32_e32 v14, 0x1000, v10
\tds_write2_b32 v14, v20, v21 offset0:128 offset1:192
\tv_add_u32_e32 v14, 0x2000, v10
\tds_write2_b32 v14, v22, v23 offset1:64
\ts_waitcnt lgkmcnt(0)
\tds_read2_b32 v[24:25], v10 offset0:40 offset1:188
\tds_read2_b64 v[26:29], v13 offset0:56 offset1:130
\ts_waitcnt lgkmcnt(0)""" + "".join(
        f"\n\tv_add_u32_e32 v11, {256 * (8 + i)}, v10\n\tglobal_store_dword v11, v{24 + i}, s[2:3]"
        for i in range(6)) + """
\tds_read2_b64 v[24:27], v13 offset1:2
\tds_read2st64_b32 v[28:29], v10 offset0:2 offset1:5
\ts_waitcnt lgkmcnt(0)""" + "".join(
        f"\n\tv_add_u32_e32 v11, {256 * (14 + i)}, v10\n\tglobal_store_dword v11, v{24 + i}, s[2:3]"
        for i in range(6)) + """
\tds_read2st64_b64 v[24:27], v13 offset0:4 offset1:6
\tds_read2st64_b64 v[28:31], v13 offset1:2
\ts_waitcnt lgkmcnt(0)""" + "".join(
        f"\n\tv_add_u32_e32 v11, {256 * (20 + i)}, v10\n\tglobal_store_dword v11, v{24 + i}, s[2:3]"
        for i in range(8)) + """
\tds_read_b128 v[24:27], v12
\tds_read_b128 v[28:31], v12 offset:768
\ts_waitcnt lgkmcnt(0)""" + "".join(
        f"\n\tv_add_u32_e32 v11, {256 * (28 + i)}, v10\n\tglobal_store_dword v11, v{24 + i}, s[2:3]"
        for i in range(8)) + """
\tds_read_b64 v[24:25], v13
\tds_read_b64 v[26:27], v13 offset:2048
\tds_read_u8 v28, v0 offset:1027
\tds_read_u8 v29, v12 offset:5
\ts_waitcnt lgkmcnt(0)""" + "".join(
        f"\n\tv_add_u32_e32 v11, {256 * (36 + i)}, v10\n\tglobal_store_dword v11, v{24 + i}, s[2:3]"
        for i in range(6))
    out = np.zeros(64 * 44, U32)
    run_handwritten("gfx942", body, out, lds_bytes=lds)
    lane = LANE.astype(np.int64)[:, None]
    data = np.stack([LANE * 0x10001, (LANE * 0x10001) ^ 0xA5A5A5A5, ~(LANE * 0x10001),
                     LANE * 0x10001 + 0x3333], 1).astype(U32)
    writes = [(lane * 16 + 1024 * k + np.arange(0, 16, 4), data) for k in range(16)] + [  # 0..16K first
        (lane * 8 + 2048 + np.arange(0, 8, 4), data[:, 2:4]),
        (lane * 4 + 2560, data[:, 3:4]),
        (np.concatenate([lane * 4 + 0x1000 + 512, lane * 4 + 0x1000 + 768], 1), data[:, 0:2]),
        (np.concatenate([lane * 4 + 0x2000, lane * 4 + 0x2000 + 256], 1), data[:, 2:4]),
    ]
    dword_pair = lambda base, units, o0, o1, size: np.concatenate(
        [base + o0 * units + np.arange(0, size, 4), base + o1 * units + np.arange(0, size, 4)], 1)
    reads = [
        (dword_pair(lane * 4, 4, 40, 188, 4), 4),
        (dword_pair(lane * 8, 8, 56, 130, 8), 4),
        (dword_pair(lane * 8, 8, 0, 2, 8), 4),
        (dword_pair(lane * 4, 256, 2, 5, 4), 4),
        (dword_pair(lane * 8, 512, 4, 6, 8), 4),
        (dword_pair(lane * 8, 512, 0, 2, 8), 4),
        (lane * 16 + np.arange(0, 16, 4), 4),
        (lane * 16 + 768 + np.arange(0, 16, 4), 4),
        (lane * 8 + np.arange(0, 8, 4), 4),
        (lane * 8 + 2048 + np.arange(0, 8, 4), 4),
        (lane + 1027, 1),
        (lane * 16 + 5, 1),
    ]
    got = lds_model(writes, reads, lds)
    slots = [8, 10, 14, 18, 20, 24, 28, 32, 36, 38, 40, 41]
    for (index, want), slot in zip(enumerate(got), slots):
        for column in range(want.shape[1]):
            np.testing.assert_array_equal(out[64 * (slot + column):64 * (slot + column + 1)], want[:, column],
                                          err_msg=f"read {index}, element {column}")


def test_lds_byte_forms():
    """ds_write_b8 with an offset stores a register's low byte; ds_read_i8 with an
    offset sign-extends the byte it reads."""
    body = """
\ts_load_dwordx2 s[2:3], s[0:1], 0x0
\tv_lshlrev_b32_e32 v10, 2, v0
\tv_mul_u32_u24_e32 v20, 0x1357, v0
\tv_mov_b32_e32 v21, 0
\tds_write_b32 v10, v21 offset:8192
\tds_write_b8 v10, v20 offset:8193
\ts_waitcnt lgkmcnt(0)
\tds_read_i8 v22, v10 offset:8193
\tds_read_i8 v23, v0 offset:8193
\ts_waitcnt lgkmcnt(0)
\tglobal_store_dword v10, v22, s[2:3]
\tglobal_store_dword v10, v23, s[2:3] offset:256"""
    out = np.zeros(128, U32)
    run_handwritten("gfx942", body, out, lds_bytes=16384)
    written = (LANE * 0x1357) & 0xFF
    image = np.zeros(256, np.uint8)
    image[LANE * 4 + 1] = written
    sign_extend = lambda b: (b.astype(np.int64) ^ 0x80) - 0x80
    np.testing.assert_array_equal(out[:64], sign_extend(written).astype(U32))
    np.testing.assert_array_equal(out[64:], sign_extend(image[LANE + 1].astype(U32)).astype(U32))


# --------------------------------------------------------------------------- branches


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("s4,lanes", [(3, 0), (9, 10), (9, 64)])
def test_branch_forms(arch, s4, lanes):
    """s_cbranch_scc0 (taken iff !(s4 > 5)), s_cbranch_vccz (taken iff vcc == 0),
    s_cbranch_execnz after s_and_saveexec_b64 (taken iff some lane is left),
    s_branch over an instruction; each path leaves a bit."""
    body = f"""
\ts_load_dwordx2 s[2:3], s[0:1], 0x0
\tv_lshlrev_b32_e32 v10, 2, v0
\tv_mov_b32_e32 v20, 0
\ts_mov_b32 s4, {s4}
\ts_cmp_gt_u32 s4, 5
\ts_cbranch_scc0 .LBB0_1
\tv_or_b32_e32 v20, 1, v20
.LBB0_1:
\tv_cmp_gt_u32_e32 vcc, {lanes}, v0
\ts_cbranch_vccz .LBB0_2
\tv_or_b32_e32 v20, 2, v20
.LBB0_2:
\ts_and_saveexec_b64 s[12:13], vcc
\ts_cbranch_execnz .LBB0_3
\tv_or_b32_e32 v20, 4, v20
.LBB0_3:
\tv_or_b32_e32 v20, 8, v20
\ts_or_b64 exec, exec, s[12:13]
\ts_branch .LBB0_4
\tv_or_b32_e32 v20, 16, v20
.LBB0_4:
\ts_waitcnt lgkmcnt(0)
\tglobal_store_dword v10, v20, s[2:3]"""
    out = np.zeros(64, U32)
    run_handwritten(arch, body, out)
    active = LANE < lanes
    want = (s4 > 5) * 1 + (lanes > 0) * 2 + np.where(lanes == 0, 4, 0) + np.where(active | (lanes == 0), 8, 0)
    # with no lane left, execnz falls through: bit 4 in no lane (exec is 0) and bit 8 likewise
    if lanes == 0:
        want = np.full(64, (s4 > 5) * 1, U32)
    np.testing.assert_array_equal(out, np.asarray(want, U32))


# DPP moves and adds, v_readfirstlane and 16-bit (packed) ops under exec masks that differ per wave (wave
# 7's is empty: its readfirstlane reads lane 0): once per batch, each wave its lanes.
PER_WAVE_EXEC = """
\tv_and_b32_e32 v12, 63, v0
\tv_lshrrev_b32_e32 v13, 6, v0
\tv_mul_u32_u24_e32 v14, 9, v13
\tv_mov_b32_e32 v20, 0
\tv_mov_b32_e32 v21, 0
\tv_mov_b32_e32 v22, 0
\tv_mov_b32_e32 v23, 0
\tv_mov_b32_e32 v24, 0
\tv_mov_b32_e32 v25, 0
\tv_mov_b32_e32 v26, 0
\tv_mov_b32_e32 v27, 0
\tv_cmp_lt_u32_e32 vcc, v14, v12
\ts_and_saveexec_b64 s[20:21], vcc
\ts_nop 4
\tv_mov_b32_dpp v20, v1 row_shr:1 row_mask:0xa bank_mask:0xf bound_ctrl:1
\tv_mov_b32_dpp v21, v2 row_bcast:15 row_mask:0xf bank_mask:0xf
\tv_add_f32_dpp v22, v3, v4 quad_perm:[1,0,3,2] row_mask:0xf bank_mask:0x5
\tv_readfirstlane_b32 s10, v5
\tv_pk_add_u16 v24, v1, v2 op_sel:[1,0] op_sel_hi:[1,0]
\tv_pk_fma_f16 v25, v3, v4, v6 op_sel_hi:[0,1,1]
\tv_cvt_f32_f16_e32 v26, v1
\tv_add_u16_e32 v27, v1, v2
\ts_or_b64 exec, exec, s[20:21]
\ts_nop 1
\tv_mov_b32_e32 v23, s10"""


@pytest.mark.parametrize("arch", ARCHS)
def test_batched_dpp_readfirstlane_and_pk16_under_per_wave_exec(arch):
    outputs = ("v20", "v21", "v22", "v23", "v24", "v25", "v26", "v27")
    body = wave_prologue() + PER_WAVE_EXEC + "".join(wave_store(reg, i) for i, reg in enumerate(outputs))
    words = INPUT_DWORDS + THREADS * len(outputs)
    batched, stats = launch_waves(arch, body, words, batched=True)
    alone, _ = launch_waves(arch, body, words, batched=False)
    assert stats.batched >= 4 * WAVES
    bad = np.flatnonzero(batched != alone)
    assert bad.size == 0, (f"(slot, thread) {[divmod(int(d) - INPUT_DWORDS, THREADS) for d in bad[:4]]}: "
                           f"batched {batched[bad[:4]]}, wave by wave {alone[bad[:4]]}")
    t, wave = np.arange(THREADS), np.arange(WAVES)
    v5 = batched[256 + t]  # wave_prologue: v(1 + i) of thread t is input dword 64 * i + t
    first = np.where(wave < 7, 9 * wave + 1, 0)  # the first active lane (wave 7: none, lane 0)
    got = batched[INPUT_DWORDS + THREADS * 3:INPUT_DWORDS + THREADS * 4].reshape(8, 64)
    np.testing.assert_array_equal(got, np.repeat(v5.reshape(8, 64)[np.arange(8), first][:, None], 64, 1))


# the GEMV epilogue's amax butterfly (arch.dpp_fmax): the DPP move folded into the max,
# no old value (bound_ctrl:1; these controls read a lane of the row for every lane)
DPP_MAX_FORMS = """
\ts_nop 1
\tv_max_f32_dpp v20, v3, v3 quad_perm:[1,0,3,2] row_mask:0xf bank_mask:0xf bound_ctrl:1
\tv_max_f32_dpp v21, v4, v3 quad_perm:[2,3,0,1] row_mask:0xf bank_mask:0xf bound_ctrl:1
\tv_mov_b32_dpp v22, v1 row_half_mirror row_mask:0xf bank_mask:0xf bound_ctrl:1"""


@pytest.mark.parametrize("arch", ARCHS)
def test_dpp_max_forms(arch):
    """DPP on src0 (ISA 'Data-parallel processing'): lane l reads src0 of lane
    quad_perm[l % 4] of its quad, or of lane 7 - l % 8 of its half row (row_half_mirror)."""
    env = inputs(33)
    out = pack(env)
    outputs = ("v20", "v21", "v22")
    run_handwritten(arch, PROLOGUE + DPP_MAX_FORMS + "".join(store(r, 16 + i) for i, r in enumerate(outputs)), out)
    quad = LANE & ~U32(3)
    want = {"v20": isa_max(env["x"][quad | (LANE & U32(3)) ^ U32(1)], env["x"]).view(U32),
            "v21": isa_max(env["y"][quad | (LANE & U32(3)) ^ U32(2)], env["x"]).view(U32),
            "v22": env["a"][(LANE & ~U32(7)) | (U32(7) - (LANE & U32(7)))]}
    for i, reg in enumerate(outputs):
        got = out[64 * (16 + i):64 * (17 + i)]
        np.testing.assert_array_equal(got, want[reg], err_msg=reg)
    words = INPUT_DWORDS + THREADS * len(outputs)
    body = wave_prologue() + DPP_MAX_FORMS + "".join(wave_store(r, i) for i, r in enumerate(outputs))
    batched, stats = launch_waves(arch, body, words, batched=True)
    alone, _ = launch_waves(arch, body, words, batched=False)
    assert stats.batched > 0
    np.testing.assert_array_equal(batched, alone)
