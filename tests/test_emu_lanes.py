"""Cross-lane data movement through compiled code: DPP, ds_swizzle, ds_bpermute,
readlane/readfirstlane, mbcnt and the gfx950 permlane swaps.

Expected values come from lane maps written here from the ISA's descriptions
(rows of 16 lanes, quads of 4), independently of the emulator's tables."""

import numpy as np
import pytest

from k2back.emu.testing import ARCHS, module, run

LANE = np.arange(64)
SOURCE = LANE * 5 + 1  # every lane's value names its lane

# dpp_ctrl encodings (AMDGPU DPP control values of llvm.amdgcn.update.dpp)
DPP_CASES = {  # name: (dpp_ctrl, row_mask, bank_mask, bound_ctrl)
    "quad_perm_1032": (0xB1, 0xF, 0xF, False),
    "quad_perm_3300": (0x0F, 0xF, 0xF, False),
    "row_shl_1": (0x101, 0xF, 0xF, False),
    "row_shl_1_bound": (0x101, 0xF, 0xF, True),
    "row_shr_3": (0x113, 0xF, 0xF, False),
    "row_ror_4": (0x124, 0xF, 0xF, False),
    "wave_shl_1": (0x130, 0xF, 0xF, True),
    "wave_rol_1": (0x134, 0xF, 0xF, False),
    "wave_shr_1": (0x138, 0xF, 0xF, True),
    "wave_ror_1": (0x13C, 0xF, 0xF, False),
    "row_mirror": (0x140, 0xF, 0xF, False),
    "row_half_mirror": (0x141, 0xF, 0xF, False),
    "row_bcast_15": (0x142, 0xA, 0xF, False),
    "row_bcast_31": (0x143, 0xC, 0xF, False),
    "row_mask_5": (0xB1, 0x5, 0xF, False),
    "bank_mask_6": (0x111, 0xF, 0x6, False),
}


def dpp_expected(ctrl, row_mask, bank_mask, bound_ctrl, old=-1):
    row, within = LANE // 16, LANE % 16
    valid = np.ones(64, bool)
    if ctrl < 0x100:
        source = (LANE & ~3) | ((ctrl >> (2 * (LANE & 3))) & 3)
    elif 0x101 <= ctrl <= 0x10F:
        n = ctrl - 0x100
        source, valid = LANE + n, within + n < 16
    elif 0x111 <= ctrl <= 0x11F:
        n = ctrl - 0x110
        source, valid = LANE - n, within >= n
    elif 0x121 <= ctrl <= 0x12F:
        source = row * 16 + (within - (ctrl - 0x120)) % 16
    elif ctrl == 0x130:
        source, valid = LANE + 1, LANE < 63
    elif ctrl == 0x134:
        source = (LANE + 1) % 64
    elif ctrl == 0x138:
        source, valid = LANE - 1, LANE > 0
    elif ctrl == 0x13C:
        source = (LANE - 1) % 64
    elif ctrl == 0x140:
        source = row * 16 + 15 - within
    elif ctrl == 0x141:
        source = row * 16 + (within // 8) * 8 + 7 - within % 8
    elif ctrl == 0x142:
        source, valid = row * 16 - 1, row >= 1
    elif ctrl == 0x143:
        source, valid = np.full(64, 31), row >= 2
    value = SOURCE[np.clip(source, 0, 63)]
    if bound_ctrl:
        value = np.where(valid, value, 0)
    written = ((row_mask >> row) & 1).astype(bool) & ((bank_mask >> (within // 4)) & 1).astype(bool)
    written &= valid | bound_ctrl
    return np.where(written, value, old)


def _store(index, value):
    return f"""
  %o{index} = getelementptr i32, ptr addrspace(1) %out, i32 {index * 64}
  %p{index} = getelementptr i32, ptr addrspace(1) %o{index}, i32 %tid
  store i32 {value}, ptr addrspace(1) %p{index}"""


def dpp_kernel() -> str:
    body = []
    for i, (ctrl, rows, banks, bound) in enumerate(DPP_CASES.values()):
        body.append(f"  %d{i} = call i32 @llvm.amdgcn.update.dpp.i32(i32 -1, i32 %src, i32 {ctrl}, "
                    f"i32 {rows}, i32 {banks}, i1 {'true' if bound else 'false'})")
        body.append(_store(i, f"%d{i}"))
    return module(f"""
define amdgpu_kernel void @dpp(ptr addrspace(1) %out) #0 {{
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  %v = mul i32 %tid, 5
  %src = add i32 %v, 1
{chr(10).join(body)}
  ret void
}}
declare i32 @llvm.amdgcn.workitem.id.x()
declare i32 @llvm.amdgcn.update.dpp.i32(i32, i32, i32, i32, i32, i1)
""")


@pytest.mark.parametrize("arch", ARCHS)
def test_update_dpp_controls_masks_and_bound_ctrl(arch):
    out = np.zeros((len(DPP_CASES), 64), np.int32)
    run(dpp_kernel(), arch, "dpp", {"out": out})
    for row, (name, case) in zip(out, DPP_CASES.items()):
        np.testing.assert_array_equal(row, dpp_expected(*case), err_msg=name)


# ds_swizzle offsets: bitmask mode (and/or/xor over lane bits 0-4 within 32) and quad mode.
SWIZZLES = {"xor_1": 0x041F, "xor_16_swap": 0x401F, "broadcast_lane_5_of_8": 0x00B8,
            "quad_2301": 0x8000 | (2 | 3 << 2 | 0 << 4 | 1 << 6), "reverse_8": 0x1C1F}


def swizzle_expected(offset):
    if offset & 0x8000:
        source = (LANE & ~3) | ((offset >> (2 * (LANE & 3))) & 3)
    else:
        and_mask, or_mask, xor_mask = offset & 31, (offset >> 5) & 31, (offset >> 10) & 31
        source = (LANE & 32) | (((LANE & and_mask) | or_mask) ^ xor_mask)
    return SOURCE[source]


SHUFFLES = module(f"""
define amdgpu_kernel void @shuffles(ptr addrspace(1) %out) #0 {{
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  %v = mul i32 %tid, 5
  %src = add i32 %v, 1
{chr(10).join(f"  %s{i} = call i32 @llvm.amdgcn.ds.swizzle(i32 %src, i32 {off})" + _store(i, f"%s{i}")
              for i, off in enumerate(SWIZZLES.values()))}
  %t7 = mul i32 %tid, 7
  %t73 = add i32 %t7, 3
  %from = urem i32 %t73, 64
  %addr = shl i32 %from, 2
  %bp = call i32 @llvm.amdgcn.ds.bpermute(i32 %addr, i32 %src)
{_store(5, "%bp")}
  %rl = call i32 @llvm.amdgcn.readlane.i32(i32 %src, i32 13)
{_store(6, "%rl")}
  %lo = call i32 @llvm.amdgcn.mbcnt.lo(i32 -1, i32 0)
  %id = call i32 @llvm.amdgcn.mbcnt.hi(i32 -1, i32 %lo)
  %idsq = mul i32 %id, %id
{_store(7, "%idsq")}
  %late = icmp uge i32 %tid, 37
  br i1 %late, label %divergent, label %done
divergent:
  %first = call i32 @llvm.amdgcn.readfirstlane.i32(i32 %src)
{_store(8, "%first")}
  br label %done
done:
  ret void
}}
declare i32 @llvm.amdgcn.workitem.id.x()
declare i32 @llvm.amdgcn.ds.swizzle(i32, i32)
declare i32 @llvm.amdgcn.ds.bpermute(i32, i32)
declare i32 @llvm.amdgcn.readlane.i32(i32, i32)
declare i32 @llvm.amdgcn.readfirstlane.i32(i32)
declare i32 @llvm.amdgcn.mbcnt.lo(i32, i32)
declare i32 @llvm.amdgcn.mbcnt.hi(i32, i32)
""")


@pytest.mark.parametrize("arch", ARCHS)
def test_swizzle_bpermute_readlane_mbcnt(arch):
    out = np.full((9, 64), -7, np.int32)
    run(SHUFFLES, arch, "shuffles", {"out": out})
    for row, (name, offset) in zip(out, SWIZZLES.items()):
        np.testing.assert_array_equal(row, swizzle_expected(offset), err_msg=name)
    np.testing.assert_array_equal(out[5], SOURCE[(LANE * 7 + 3) % 64])
    np.testing.assert_array_equal(out[6], SOURCE[13])
    np.testing.assert_array_equal(out[7], LANE * LANE)
    np.testing.assert_array_equal(out[8], np.where(LANE >= 37, SOURCE[37], -7))


PERMLANE_SWAP = module("""
define amdgpu_kernel void @swaps(ptr addrspace(1) %out) #0 {
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  %v = mul i32 %tid, 5
  %src = add i32 %v, 1
  %other = sub i32 1000, %tid
  %s16 = call {i32, i32} @llvm.amdgcn.permlane16.swap(i32 %src, i32 %other, i1 false, i1 false)
  %s32 = call {i32, i32} @llvm.amdgcn.permlane32.swap(i32 %src, i32 %other, i1 false, i1 false)
  %a = extractvalue {i32, i32} %s16, 0
  %b = extractvalue {i32, i32} %s16, 1
  %c = extractvalue {i32, i32} %s32, 0
  %d = extractvalue {i32, i32} %s32, 1
""" + _store(0, "%a") + _store(1, "%b") + _store(2, "%c") + _store(3, "%d") + """
  ret void
}
declare i32 @llvm.amdgcn.workitem.id.x()
declare {i32, i32} @llvm.amdgcn.permlane16.swap(i32, i32, i1, i1)
declare {i32, i32} @llvm.amdgcn.permlane32.swap(i32, i32, i1, i1)
""")


def test_gfx950_permlane_swaps():
    out = np.zeros((4, 64), np.int32)
    run(PERMLANE_SWAP, "gfx950", "swaps", {"out": out})
    first, second = SOURCE.copy(), 1000 - LANE
    row = LANE // 16
    # permlane16: odd rows of the first operand <-> even rows of the second
    swap16_first = np.where(row % 2 == 1, second[LANE - 16], first)
    swap16_second = np.where(row % 2 == 0, first[np.minimum(LANE + 16, 63)], second)
    # permlane32: rows 2-3 of the first <-> rows 0-1 of the second
    swap32_first = np.where(row >= 2, second[LANE - 32], first)
    swap32_second = np.where(row < 2, first[np.minimum(LANE + 32, 63)], second)
    for got, want in zip(out, (swap16_first, swap16_second, swap32_first, swap32_second)):
        np.testing.assert_array_equal(got, want)
