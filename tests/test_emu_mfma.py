"""GEMMs through every MFMA form we use, compiled from `llvm.amdgcn.mfma.*`
calls: one wave accumulates a 16x16 tile over K in a loop; operands are packed
here per SPEC §5 with explicit per-lane loops and the result compared with a
float64 numpy matmul of the decoded inputs."""

import ml_dtypes
import numpy as np
import pytest
import torch

from k2back.emu import Machine
from k2back.emu.testing import ARCHS, module, rng, run

LANES = 64


def spec_k(lane: int, t: int, per_lane: int) -> int:
    """SPEC §5: element t of lane l is k = per_lane * (l // 16) + t within a k-block."""
    return per_lane * (lane // 16) + t


def f8f6f4_8bit_k(lane: int, t: int, per_lane: int) -> int:
    """gfx950 f8f6f4 8-bit operands: lane groups take turns in runs of 16 k
    (k = 64 (t // 16) + 16 (l // 16) + t % 16; AMD's CDNA4 matrix-core examples)."""
    return 64 * (t // 16) + 16 * (lane // 16) + t % 16


def pack_operand(matrix: np.ndarray, per_lane: int, bits: int, k_of=spec_k) -> np.ndarray:
    """[16, K] codes (row i of A, or column i of B) -> uint32 [K / (4 per_lane), 64, regs]:
    lane l of k-block kb holds row l % 16 and, as element t, k = kb*4*per_lane + k_of(l, t)."""
    depth = matrix.shape[1]
    block = 4 * per_lane
    regs = per_lane * bits // 32
    out = np.zeros((depth // block, LANES, regs), np.uint32)
    for kb in range(depth // block):
        for lane in range(LANES):
            word = 0
            for t in range(per_lane):
                code = int(matrix[lane % 16, kb * block + k_of(lane, t, per_lane)])
                word |= code << (bits * t)
            for r in range(regs):
                out[kb, lane, r] = (word >> (32 * r)) & 0xFFFFFFFF
    return out


def unpack_result(lanes: np.ndarray) -> np.ndarray:
    """f32 [64, 4] accumulators -> D [16, 16]: lane l, reg r = row 4*(l // 16) + r, column l % 16."""
    d = np.zeros((16, 16), np.float32)
    for lane in range(LANES):
        for r in range(4):
            d[4 * (lane // 16) + r, lane % 16] = lanes[lane, r]
    return d


def gemm_kernel(call: str, a_type: str, b_type: str, scaled: bool) -> str:
    scale_loads = """
  %psa = getelementptr i32, ptr addrspace(1) %sa, i32 %idx
  %sav = load i32, ptr addrspace(1) %psa
  %psb = getelementptr i32, ptr addrspace(1) %sb, i32 %idx
  %sbv = load i32, ptr addrspace(1) %psb""" if scaled else ""
    return module(f"""
define amdgpu_kernel void @gemm(ptr addrspace(1) %a, ptr addrspace(1) %b, ptr addrspace(1) %sa,
                                ptr addrspace(1) %sb, ptr addrspace(1) %out, i32 %blocks) #0 {{
entry:
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  br label %loop
loop:
  %kb = phi i32 [ 0, %entry ], [ %kb1, %loop ]
  %acc = phi <4 x float> [ zeroinitializer, %entry ], [ %acc1, %loop ]
  %base = mul i32 %kb, 64
  %idx = add i32 %base, %tid
  %pa = getelementptr {a_type}, ptr addrspace(1) %a, i32 %idx
  %av = load {a_type}, ptr addrspace(1) %pa
  %pb = getelementptr {b_type}, ptr addrspace(1) %b, i32 %idx
  %bv = load {b_type}, ptr addrspace(1) %pb{scale_loads}
  %acc1 = {call}
  %kb1 = add i32 %kb, 1
  %more = icmp ult i32 %kb1, %blocks
  br i1 %more, label %loop, label %exit
exit:
  %po = getelementptr <4 x float>, ptr addrspace(1) %out, i32 %tid
  store <4 x float> %acc1, ptr addrspace(1) %po
  ret void
}}
declare i32 @llvm.amdgcn.workitem.id.x()
""")


def random_codes(g, fmt, shape):
    """Random codes of a ml_dtypes format, finite only."""
    codes = g.integers(0, 256, shape, dtype=np.uint8)
    values = codes.view(fmt).astype(np.float32)
    return np.where(np.isfinite(values), codes, 0).astype(np.uint8)


def decode(codes, fmt):
    return codes.view(fmt).astype(np.float64)


def run_gemm(arch, ir, a_codes, b_codes, per_lane, bits, scales=None, k_of=spec_k):
    a = pack_operand(a_codes, per_lane, bits, k_of)
    b = pack_operand(b_codes.T, per_lane, bits, k_of)  # B's lanes hold its columns
    sa, sb = scales if scales is not None else (np.zeros((len(a), 64), np.uint32),) * 2
    out = np.zeros((64, 4), np.float32)
    stats = run(ir, arch, "gemm", {"a": a, "b": b, "sa": sa, "sb": sb, "out": out,
                                   "blocks": len(a)})
    assert stats.instructions["mfma"] == len(a)
    return unpack_result(out)


def assert_gemm_close(got, a_values, b_values):
    """Within f32 rounding of the per-block accumulation: a few ulps of sum |a||b|."""
    want = a_values @ b_values
    bound = 8 * 2.0**-24 * (np.abs(a_values) @ np.abs(b_values)) + 1e-30
    excess = np.abs(got - want) / bound
    assert excess.max() <= 1, f"max error {excess.max():.2f} x the f32 accumulation bound"


def bf16_case(g, k):
    a = torch.from_numpy(g.standard_normal((16, k)).astype(np.float32)).to(torch.bfloat16)
    b = torch.from_numpy(g.standard_normal((k, 16)).astype(np.float32)).to(torch.bfloat16)
    codes = [t.view(torch.int16).numpy().view(np.uint16) for t in (a, b)]
    return codes, (a.double().numpy(), b.double().numpy())


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_bf16_16x16x16(arch):
    (a, b), values = bf16_case(rng(10), 64)
    call = ("call <4 x float> @llvm.amdgcn.mfma.f32.16x16x16bf16.1k(<4 x i16> %av, <4 x i16> %bv, "
            "<4 x float> %acc, i32 0, i32 0, i32 0)\n"
            "declare <4 x float> @llvm.amdgcn.mfma.f32.16x16x16bf16.1k(<4 x i16>, <4 x i16>, <4 x float>, i32, i32, i32)")
    ir = gemm_kernel(call.split("\n")[0], "<4 x i16>", "<4 x i16>", False) + call.split("\n")[1]
    assert_gemm_close(run_gemm(arch, ir, a, b, 4, 16), *values)


def test_gfx950_bf16_16x16x32():
    (a, b), values = bf16_case(rng(11), 96)
    call = "call <4 x float> @llvm.amdgcn.mfma.f32.16x16x32.bf16(<8 x bfloat> %av, <8 x bfloat> %bv, <4 x float> %acc, i32 0, i32 0, i32 0)"
    decl = "declare <4 x float> @llvm.amdgcn.mfma.f32.16x16x32.bf16(<8 x bfloat>, <8 x bfloat>, <4 x float>, i32, i32, i32)"
    ir = gemm_kernel(call, "<8 x bfloat>", "<8 x bfloat>", False) + decl
    assert_gemm_close(run_gemm("gfx950", ir, a, b, 8, 16), *values)


FP8 = {"gfx942": {"fp8": ml_dtypes.float8_e4m3fnuz, "bf8": ml_dtypes.float8_e5m2fnuz},
       "gfx950": {"fp8": ml_dtypes.float8_e4m3fn, "bf8": ml_dtypes.float8_e5m2}}


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
@pytest.mark.parametrize("kinds", [("fp8", "fp8"), ("bf8", "fp8"), ("fp8", "bf8"), ("bf8", "bf8")])
def test_fp8_16x16x32_in_each_arch_format(arch, kinds):
    g = rng(12)
    fa, fb = (FP8[arch][k] for k in kinds)
    a, b = random_codes(g, fa, (16, 64)), random_codes(g, fb, (64, 16))
    name = f"llvm.amdgcn.mfma.f32.16x16x32.{kinds[0]}.{kinds[1]}"
    call = f"call <4 x float> @{name}(i64 %av, i64 %bv, <4 x float> %acc, i32 0, i32 0, i32 0)"
    decl = f"declare <4 x float> @{name}(i64, i64, <4 x float>, i32, i32, i32)"
    ir = gemm_kernel(call, "i64", "i64", False) + decl
    assert_gemm_close(run_gemm(arch, ir, a, b, 8, 8), decode(a, fa), decode(b, fb))


# cbsz/blgp format codes of the f8f6f4 forms and their ml_dtypes / element bits
F8F6F4 = {0: (ml_dtypes.float8_e4m3fn, 8), 1: (ml_dtypes.float8_e5m2, 8),
          4: (ml_dtypes.float4_e2m1fn, 4)}


@pytest.mark.parametrize("formats", [(0, 0), (1, 0), (4, 4)])
@pytest.mark.parametrize("selects", [(0, 0), (2, 1), (3, 3)])
def test_gfx950_scaled_16x16x128_f8f6f4(formats, selects):
    g = rng(13)
    (fa, bits_a), (fb, bits_b) = F8F6F4[formats[0]], F8F6F4[formats[1]]
    k = 256
    a = random_codes(g, fa, (16, k)) if bits_a == 8 else g.integers(0, 16, (16, k), dtype=np.uint8)
    b = random_codes(g, fb, (k, 16)) if bits_b == 8 else g.integers(0, 16, (k, 16), dtype=np.uint8)
    # one E8M0 code per row (A) / column (B) and 32-k block, in the lane of that row
    # (column) whose group is the block (l // 16); the other scale bytes random
    code_a = g.integers(120, 135, (16, k // 32))
    code_b = g.integers(120, 135, (k // 32, 16))
    regs = k // 128
    sa = g.integers(0, 2**32, (regs, 64), dtype=np.uint64).astype(np.uint32)
    sb = g.integers(0, 2**32, (regs, 64), dtype=np.uint64).astype(np.uint32)
    for kb in range(regs):
        for lane in range(64):
            group = kb * 4 + lane // 16
            for regs_, sel, code in ((sa, selects[0], code_a[lane % 16, group]),
                                     (sb, selects[1], code_b[group, lane % 16])):
                word = int(regs_[kb, lane]) & ~(0xFF << (8 * sel))
                regs_[kb, lane] = word | (int(code) << (8 * sel))
    types = {8: "<8 x i32>", 4: "<4 x i32>"}
    ta, tb = types[bits_a], types[bits_b]
    suffix = f"v{ta[1]}i32.v{tb[1]}i32"
    name = f"llvm.amdgcn.mfma.scale.f32.16x16x128.f8f6f4.{suffix}"
    call = (f"call <4 x float> @{name}({ta} %av, {tb} %bv, <4 x float> %acc, i32 {formats[0]}, "
            f"i32 {formats[1]}, i32 {selects[0]}, i32 %sav, i32 {selects[1]}, i32 %sbv)")
    decl = f"declare <4 x float> @{name}({ta}, {tb}, <4 x float>, i32, i32, i32, i32, i32, i32)"
    ir = gemm_kernel(call, ta, tb, True) + decl
    a_values = decode(a, fa) * np.exp2(np.repeat(code_a, 32, axis=1) - 127.0)
    b_values = decode(b, fb) * np.exp2(np.repeat(code_b, 32, axis=0) - 127.0)
    layout = f8f6f4_8bit_k if bits_a == 8 else spec_k
    got = run_gemm("gfx950", ir, a, b, 32, bits_a, scales=(sa, sb), k_of=layout)
    assert_gemm_close(got, a_values, b_values)


# ---- batching: the waves of a workgroup at one MFMA run it once (state.Batch); the
# bits must be those of wave by wave (a trace turns batching off), under each model.

THREADS = 512

MFMA = module("""
define amdgpu_kernel void @mfma(ptr addrspace(1) %a, ptr addrspace(1) %b, ptr addrspace(1) %out) #0 {
entry:
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  br label %loop
loop:
  %kb = phi i32 [ 0, %entry ], [ %kb1, %loop ]
  %acc = phi <4 x float> [ zeroinitializer, %entry ], [ %acc3, %loop ]
  %base = mul i32 %kb, 512
  %idx = add i32 %base, %tid
  %pa = getelementptr <4 x i16>, ptr addrspace(1) %a, i32 %idx
  %av = load <4 x i16>, ptr addrspace(1) %pa
  %pb = getelementptr i64, ptr addrspace(1) %b, i32 %idx
  %bv = load i64, ptr addrspace(1) %pb
  %acc1 = call <4 x float> @llvm.amdgcn.mfma.f32.16x16x16bf16.1k(<4 x i16> %av, <4 x i16> %av, <4 x float> %acc, i32 0, i32 0, i32 0)
  %acc2 = call <4 x float> @llvm.amdgcn.mfma.f32.16x16x32.fp8.fp8(i64 %bv, i64 %bv, <4 x float> %acc1, i32 0, i32 0, i32 0)
  %acc3 = call <4 x float> @llvm.amdgcn.mfma.f32.16x16x16bf16.1k(<4 x i16> %av, <4 x i16> %av, <4 x float> %acc2, i32 0, i32 0, i32 0)
  %kb1 = add i32 %kb, 1
  %more = icmp ult i32 %kb1, 4
  br i1 %more, label %loop, label %exit
exit:
  %po = getelementptr <4 x float>, ptr addrspace(1) %out, i32 %tid
  store <4 x float> %acc3, ptr addrspace(1) %po
  ret void
}
declare i32 @llvm.amdgcn.workitem.id.x()
declare <4 x float> @llvm.amdgcn.mfma.f32.16x16x16bf16.1k(<4 x i16>, <4 x i16>, <4 x float>, i32, i32, i32)
declare <4 x float> @llvm.amdgcn.mfma.f32.16x16x32.fp8.fp8(i64, i64, <4 x float>, i32, i32, i32)
""")


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("accumulate", ["exact", "blocked"])
def test_batched_mfma_matches_wave_by_wave(arch, accumulate):
    g = np.random.default_rng(9)
    a = g.integers(0, 2**16, 4 * THREADS * 4, dtype=np.int64).astype(np.uint16)
    a[(a & 0x7F80) == 0x7F80] = 0x3F80  # finite bf16 (exact sums need no NaN)
    b = g.integers(0, 2**8, 4 * THREADS * 8, dtype=np.int64).astype(np.uint8)
    outs = []
    for batched in (True, False):
        out = np.zeros(THREADS * 4, np.float32)
        machine = Machine(arch, mfma_accumulate=accumulate, trace=None if batched else (lambda w, ins: None))
        stats = run(MFMA, arch, "mfma", {"a": a.copy(), "b": b.copy(), "out": out}, grid=(2,),
                    block=(THREADS,), machine=machine)
        assert (stats.instructions["mfma"] == 2 * 8 * 4 * 3) and (stats.batched > 0) == batched
        outs.append(out.view(np.uint32))
    assert np.array_equal(*outs), np.flatnonzero(outs[0] != outs[1])[:8]


def edge_floats(g, shape) -> np.ndarray:
    """f32 values with the edges mixed in: NaN, +-inf, -0, denormals, the largest finite."""
    values = g.standard_normal(shape).astype(np.float32) * np.float32(2.0) ** g.integers(-20, 20, shape)
    edges = np.array([np.nan, np.inf, -np.inf, -0.0, 1e-45, -3e-39, 3.4e38], np.float32)
    pick = g.random(shape) < 0.1
    values[pick] = g.choice(edges, int(pick.sum()))
    return values


def edge_scales(g, shape) -> np.ndarray:
    """uint32 scale registers whose E8M0 bytes include 0 (2^-127), 254 and 0xFF (NaN)."""
    raw = g.integers(0, 2**32, shape, dtype=np.uint64).astype(np.uint32).view(np.uint8)
    pick = g.random(raw.shape) < 0.2
    raw[pick] = g.choice(np.array([0, 1, 126, 127, 128, 254, 255], np.uint8), int(pick.sum()))
    return raw.view(np.uint32)


@pytest.mark.parametrize("accumulate", ["exact", "sequential", "blocked"])
def test_scaled_mfma_on_registers_is_the_lane_major_form(accumulate):
    """The gfx950 scaled f8f6f4 MFMA on register-major operands, one wave or a batch of
    waves (MfmaForm.on_registers, what the emulator runs for 8-bit formats), against
    the form on lane-major operands wave by wave, bit for bit: random codes (NaN and
    inf ones included), E8M0 scales with 0, 254 and NaN bytes, C with NaN, inf, -0,
    denormals."""
    from k2back.emu.mfma import mfma_form

    g = rng(31)
    waves = 3
    for mnemonic in ("v_mfma_scale_f32_16x16x128_f8f6f4", "v_mfma_scale_f32_32x32x64_f8f6f4"):
        form = mfma_form("gfx950", mnemonic)
        for cbsz, blgp in ((0, 0), (1, 0), (0, 1), (1, 1)):
            for a_byte, b_byte in ((0, 0), (1, 3), (2, 2)):
                a = g.integers(0, 2**32, (waves, 8, LANES), dtype=np.uint64).astype(np.uint32)
                b = g.integers(0, 2**32, (waves, 8, LANES), dtype=np.uint64).astype(np.uint32)
                c = edge_floats(g, (waves, form.c_regs, LANES))
                if accumulate != "exact":  # the other models are not made for NaN/inf operands
                    a &= np.uint32(0x3F3F3F3F)
                    b &= np.uint32(0x3F3F3F3F)
                    c[~np.isfinite(c)] = 1.0
                sa, sb = edge_scales(g, (waves, LANES)), edge_scales(g, (waves, LANES))
                if accumulate != "exact":
                    sa = sa & np.uint32(0x7F7F7F7F)
                    sb = sb & np.uint32(0x7F7F7F7F)
                with np.errstate(all="ignore"):
                    got = form.on_registers(a.reshape(waves, -1), b.reshape(waves, -1), c.reshape(waves, -1),
                                            accumulate, cbsz=cbsz, blgp=blgp, scales=(sa, a_byte, sb, b_byte))
                    for w in range(waves):
                        want = form(a[w].T, b[w].T, c[w].T, cbsz=cbsz, blgp=blgp, scale_a=sa[w],
                                    scale_b=sb[w], scale_a_byte=a_byte, scale_b_byte=b_byte,
                                    accumulate=accumulate)
                        one = form.on_registers(a[w].reshape(-1), b[w].reshape(-1), c[w].reshape(-1),
                                                accumulate, cbsz=cbsz, blgp=blgp,
                                                scales=(sa[w], a_byte, sb[w], b_byte))
                        want_bits = want.T.reshape(-1).view(np.uint32)
                        assert np.array_equal(got[w].view(np.uint32), want_bits), (mnemonic, cbsz, blgp, w)
                        assert np.array_equal(one.view(np.uint32), want_bits), (mnemonic, cbsz, blgp, w)
