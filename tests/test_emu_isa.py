"""Instruction semantics LLVM emits only in some register allocations, checked
on hand-written kernels (the same asm syntax LLVM prints) against numpy."""

import numpy as np
import pytest

from k2back.emu.testing import ARCHS, run_handwritten

LANE = np.arange(64, dtype=np.uint32)
STORE_OUT = """
\ts_load_dwordx2 s[2:3], s[0:1], 0x0
\ts_waitcnt lgkmcnt(0)"""


@pytest.mark.parametrize("arch", ARCHS)
def test_ds_read2_whose_destination_overwrites_its_address(arch):
    body = f"""
\tv_lshlrev_b32_e32 v1, 3, v0
\tv_mov_b32_e32 v2, v0
\tv_add_u32_e32 v3, 0x3e8, v0
\tds_write_b64 v1, v[2:3]
\ts_waitcnt lgkmcnt(0)
\tv_mov_b32_e32 v4, v1
\tds_read2_b64 v[4:7], v4 offset1:1
\tv_lshlrev_b32_e32 v8, 4, v0{STORE_OUT}
\ts_waitcnt lgkmcnt(0)
\tglobal_store_dwordx4 v8, v[4:7], s[2:3]"""
    out = np.zeros((64, 4), np.uint32)
    run_handwritten(arch, body, out, lds_bytes=1024)
    following = np.where(LANE < 63, LANE + 1, 0)
    np.testing.assert_array_equal(out, np.stack([LANE, LANE + 1000, following,
                                                 np.where(LANE < 63, following + 1000, 0)], 1))


@pytest.mark.parametrize("arch", ARCHS)
def test_perm_packed_f32_and_sdwa(arch):
    body = f"""
\tv_mul_u32_u24_e32 v2, 0x1234567, v0
\tv_not_b32_e32 v3, v2
\ts_mov_b32 s4, 0xc040d01
\tv_perm_b32 v9, v2, v3, s4
\ts_mov_b32 s5, 0x1000706
\tv_perm_b32 v17, v2, v3, s5
\tv_cvt_f32_u32_e32 v12, v0
\tv_add_f32_e32 v13, 0.5, v12
\tv_mov_b32_e32 v14, 0x40400000
\tv_mov_b32_e32 v15, -4.0
\tv_pk_mul_f32 v[10:11], v[12:13], v[14:15] op_sel_hi:[1,0]
\tv_add_u32_sdwa v16, v2, v3 dst_sel:WORD_1 dst_unused:UNUSED_PAD src0_sel:BYTE_2 src1_sel:WORD_0
\tv_lshlrev_b32_e32 v8, 4, v0{STORE_OUT}
\tglobal_store_dwordx4 v8, v[9:12], s[2:3]
\tv_lshlrev_b32_e32 v8, 2, v0
\tglobal_store_dword v8, v16, s[2:3] offset:1024
\tglobal_store_dword v8, v17, s[2:3] offset:1280"""
    out = np.zeros(64 * 4 + 128, np.uint32)
    run_handwritten(arch, body, out)
    a = (LANE * 0x234567) & 0xFFFFFFFF  # v_mul_u32_u24 uses the low 24 bits
    b = ~a
    pool = (a.astype(np.uint64) << np.uint64(32)) | b.astype(np.uint64)
    byte = lambda i: ((pool >> np.uint64(8 * i)) & np.uint64(0xFF)).astype(np.uint32)
    want_perm = byte(1) | (0xFF << 8) | (byte(4) << 16)
    words = out[:256].reshape(64, 4)
    np.testing.assert_array_equal(words[:, 0], want_perm)
    f = LANE.astype(np.float32)
    np.testing.assert_array_equal(words[:, 1].view(np.float32), f * np.float32(3))
    np.testing.assert_array_equal(words[:, 2].view(np.float32), (f + np.float32(0.5)) * np.float32(3))
    sdwa = (((a >> 16) & 0xFF) + (b & 0xFFFF)) & 0xFFFF
    np.testing.assert_array_equal(out[256:320], sdwa << 16)
    np.testing.assert_array_equal(out[320:], (a >> 16) | (b << 16) & 0xFFFF0000)  # halves path


@pytest.mark.parametrize("arch", ARCHS)
def test_lds_widths_pairs_and_sub_dword_forms(arch):
    # LDS image built by byte/short/dword/b96/write2st64 stores, then read back by
    # read2st64, b96, u8/i8/u16/i16 and the d16 (half-register) forms.
    body = f"""
\tv_lshlrev_b32_e32 v1, 2, v0
\tv_mul_u32_u24_e32 v2, 0x10101, v0
\tv_xor_b32_e32 v3, 0x80808080, v2
\tds_write2st64_b32 v1, v2, v3 offset1:1
\tv_lshlrev_b32_e32 v4, 4, v0
\tv_add_u32_e32 v5, 0x1000, v4
\tv_mov_b32_e32 v6, v2
\tv_mov_b32_e32 v7, v3
\tv_not_b32_e32 v8, v2
\tds_write_b96 v5, v[6:8]
\tv_add_u32_e32 v9, 0x2000, v0
\tds_write_b8 v9, v3
\tv_lshlrev_b32_e32 v10, 1, v0
\tv_add_u32_e32 v10, 0x2100, v10
\tds_write_b16 v10, v3
\tds_write_b16_d16_hi v10, v2 offset:128
\ts_waitcnt lgkmcnt(0)
\tds_read2st64_b32 v[12:13], v1 offset1:1
\tds_read_b96 v[14:16], v5
\tds_read_u8 v17, v9
\tds_read_i8 v18, v9
\tds_read_u16 v19, v10
\tds_read_i16 v20, v10
\tv_mov_b32_e32 v21, -1
\tds_read_u16_d16_hi v21, v10 offset:128
\tv_mov_b32_e32 v22, -1
\tds_read_u8_d16 v22, v9
\tv_mul_u32_u24_e32 v11, 48, v0{STORE_OUT}
\ts_waitcnt lgkmcnt(0)
\tglobal_store_dwordx4 v11, v[12:15], s[2:3]
\tglobal_store_dwordx4 v11, v[16:19], s[2:3] offset:16
\tglobal_store_dwordx4 v11, v[20:23], s[2:3] offset:32"""
    out = np.zeros((64, 12), np.uint32)
    run_handwritten(arch, body, out, lds_bytes=0x2200)
    a = LANE * 0x10101
    b = a ^ 0x80808080
    low_b = b & 0xFF
    half_b = b & 0xFFFF
    sx = lambda v, bits: (v.astype(np.int64) ^ (1 << (bits - 1))) - (1 << (bits - 1))
    want = np.stack([a, b, a, b, ~a & 0xFFFFFFFF, low_b, sx(low_b, 8) & 0xFFFFFFFF, half_b,
                     sx(half_b, 16) & 0xFFFFFFFF, ((a >> 16) << 16) | 0xFFFF,
                     0xFFFF0000 | low_b], 1).astype(np.uint32)
    np.testing.assert_array_equal(out[:, :11], want)  # column 11 is v23, not written


@pytest.mark.parametrize("arch", ARCHS)
def test_mfma_accumulating_in_agprs(arch):
    # a0..a3 live after the VGPRs (.amdhsa_accum_offset 32): written, accumulated
    # into twice by MFMA, read back (s_nops: the wait states the ISA requires).
    body = f"""
\tv_accvgpr_write_b32 a0, 1.0
\tv_accvgpr_write_b32 a1, 0
\tv_mov_b32_e32 v9, 0x40400000
\tv_accvgpr_write_b32 a2, v9
\tv_accvgpr_mov_b32 a3, a2
\tv_mov_b32_e32 v2, 0x3f803f80
\tv_mov_b32_e32 v3, 0x40003f80
\ts_nop 1
\tv_mfma_f32_16x16x16_bf16 a[0:3], v[2:3], v[2:3], a[0:3]
\tv_mfma_f32_16x16x16_bf16 a[0:3], v[2:3], v[2:3], a[0:3]
\ts_nop 7
\tv_accvgpr_read_b32 v4, a0
\tv_accvgpr_read_b32 v5, a1
\tv_accvgpr_read_b32 v6, a2
\tv_accvgpr_read_b32 v7, a3
\tv_lshlrev_b32_e32 v8, 4, v0{STORE_OUT}
\tglobal_store_dwordx4 v8, v[4:7], s[2:3]"""
    out = np.zeros((64, 4), np.float32)
    run_handwritten(arch, body, out, agprs=4)
    # every lane holds k-values (1, 1, 1, 2) of A and B: each dot product is 4 * (1+1+1+4) = 28
    np.testing.assert_array_equal(out, np.broadcast_to(np.float32([1, 0, 3, 3]) + 2 * 28, (64, 4)))


@pytest.mark.parametrize("arch", ARCHS)
def test_global_d16_hi_loads_and_stores(arch):
    # out[0:64] holds 16-bit values; each lane loads its value into the high half of
    # a register whose low half is 0x1234 (and a sign-extended byte into another),
    # then stores the high half back as a short at out + 256.
    body = f"""{STORE_OUT}
\tv_lshlrev_b32_e32 v1, 1, v0
\tv_mov_b32_e32 v2, 0x1234
\tglobal_load_short_d16_hi v2, v1, s[2:3]
\tv_mov_b32_e32 v3, 0x5678
\tglobal_load_sbyte_d16_hi v3, v1, s[2:3]
\ts_waitcnt vmcnt(0)
\tglobal_store_short_d16_hi v1, v2, s[2:3] offset:256
\tv_lshlrev_b32_e32 v4, 3, v0
\tglobal_store_dwordx2 v4, v[2:3], s[2:3] offset:512"""
    out = np.zeros(512 + 64 * 8, np.uint8)
    halves = (np.arange(64, dtype=np.uint16) * 0x0F03 + 0x80)
    out[:128] = halves.view(np.uint8)
    run_handwritten(arch, body, out)
    np.testing.assert_array_equal(out[256:384].view(np.uint16), halves)
    regs = out[512:].view(np.uint32).reshape(64, 2)
    np.testing.assert_array_equal(regs[:, 0], (halves.astype(np.uint32) << 16) | 0x1234)
    low_byte = (halves & 0xFF).astype(np.int8).astype(np.int16).view(np.uint16).astype(np.uint32)
    np.testing.assert_array_equal(regs[:, 1], (low_byte << 16) | 0x5678)


@pytest.mark.parametrize("arch", ARCHS)
def test_clocks_and_pc_are_deterministic(arch):
    # s_memtime / s_memrealtime count executed wave-instructions; s_getpc_b64 gives
    # the (stand-in) address of the next instruction. (s_nop 1 after the 16-byte
    # store: its data registers may not be rewritten sooner.)
    body = f"""{STORE_OUT}
\ts_memtime s[4:5]
\ts_nop 0
\ts_nop 0
\ts_memrealtime s[6:7]
\ts_waitcnt lgkmcnt(0)
\ts_getpc_b64 s[8:9]
\ts_getpc_b64 s[10:11]
\tv_mov_b32_e32 v1, 0
\tv_mov_b32_e32 v2, s4
\tv_mov_b32_e32 v3, s5
\tv_mov_b32_e32 v4, s6
\tv_mov_b32_e32 v5, s7
\tglobal_store_dwordx4 v1, v[2:5], s[2:3]
\ts_nop 1
\tv_mov_b32_e32 v2, s8
\tv_mov_b32_e32 v3, s9
\tv_mov_b32_e32 v4, s10
\tv_mov_b32_e32 v5, s11
\tglobal_store_dwordx4 v1, v[2:5], s[2:3] offset:16"""
    first, second = np.zeros(4, np.uint64), np.zeros(4, np.uint64)
    run_handwritten(arch, body, first)
    run_handwritten(arch, body, second)
    np.testing.assert_array_equal(first, second)  # the same on every run
    memtime, realtime, pc, next_pc = (int(v) for v in first)
    assert realtime - memtime == 3  # wave-instructions executed in between, itself included
    assert next_pc - pc == 8 and pc % 4 == 0


@pytest.mark.parametrize("arch", ARCHS)
def test_float_modifiers_on_bitwise_operands(arch):
    # LLVM folds fneg/fabs into v_cndmask_b32: the modifiers act on the sign bit.
    # (s_nop 1: gfx94x/95x do not interlock a VALU's VCC write with its next read.)
    body = f"""{STORE_OUT}
\tv_cvt_f32_i32_e32 v1, v0
\tv_sub_f32_e32 v2, 0.5, v1
\tv_and_b32_e32 v3, 1, v0
\tv_cmp_eq_u32_e32 vcc, 0, v3
\ts_nop 1
\tv_cndmask_b32_e64 v4, -v1, |v2|, vcc
\tv_cndmask_b32_e64 v5, -|v2|, 0, vcc
\tv_lshlrev_b32_e32 v6, 3, v0
\tglobal_store_dwordx2 v6, v[4:5], s[2:3]"""
    out = np.zeros((64, 2), np.float32)
    run_handwritten(arch, body, out)
    lane = np.arange(64, dtype=np.float32)
    even = np.arange(64) % 2 == 0
    np.testing.assert_array_equal(out[:, 0], np.where(even, np.abs(0.5 - lane), -lane))
    np.testing.assert_array_equal(out[:, 1], np.where(even, 0, -np.abs(0.5 - lane)))
