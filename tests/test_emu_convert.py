"""Conversions and transcendentals through compiled code, against ml_dtypes,
torch and float64: every fp8 byte decoded, encodes with ties and subnormals,
gfx950 scaled converts, bf16 rounding, exp2/rcp/division accuracy."""

import ml_dtypes
import numpy as np
import pytest
import torch

from k2back.emu.testing import ARCHS, module, rng, run

# What "fp8"/"bf8" mean in each arch's convert instructions (SPEC §4).
FORMATS = {
    ("gfx942", "fp8"): ml_dtypes.float8_e4m3fnuz, ("gfx942", "bf8"): ml_dtypes.float8_e5m2fnuz,
    ("gfx950", "fp8"): ml_dtypes.float8_e4m3fn, ("gfx950", "bf8"): ml_dtypes.float8_e5m2,
}
ALL_BYTES = np.arange(256, dtype=np.uint8).view(np.uint32)  # 64 lanes x 4 bytes


def decode_kernel(kind: str) -> str:
    sel = "".join(f"""
  %b{i} = call float @llvm.amdgcn.cvt.f32.{kind}(i32 %v, i32 {i})
  %pb{i} = getelementptr float, ptr addrspace(1) %bytes, i32 {i * 64}
  %qb{i} = getelementptr float, ptr addrspace(1) %pb{i}, i32 %tid
  store float %b{i}, ptr addrspace(1) %qb{i}""" for i in range(4))
    pk = "".join(f"""
  %w{i} = call <2 x float> @llvm.amdgcn.cvt.pk.f32.{kind}(i32 %v, i1 {'true' if i else 'false'})
  %pw{i} = getelementptr <2 x float>, ptr addrspace(1) %words, i32 {i * 64}
  %qw{i} = getelementptr <2 x float>, ptr addrspace(1) %pw{i}, i32 %tid
  store <2 x float> %w{i}, ptr addrspace(1) %qw{i}""" for i in range(2))
    return module(f"""
define amdgpu_kernel void @decode(ptr addrspace(1) %src, ptr addrspace(1) %bytes, ptr addrspace(1) %words) #0 {{
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  %ps = getelementptr i32, ptr addrspace(1) %src, i32 %tid
  %v = load i32, ptr addrspace(1) %ps
{sel}
{pk}
  ret void
}}
declare i32 @llvm.amdgcn.workitem.id.x()
declare float @llvm.amdgcn.cvt.f32.{kind}(i32, i32)
declare <2 x float> @llvm.amdgcn.cvt.pk.f32.{kind}(i32, i1)
""")


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kind", ["fp8", "bf8"])
def test_fp8_decode_every_byte(arch, kind):
    bytes_out = np.zeros((4, 64), np.float32)
    words_out = np.zeros((2, 64, 2), np.float32)
    run(decode_kernel(kind), arch, "decode", {"src": ALL_BYTES.copy(), "bytes": bytes_out,
                                              "words": words_out})
    want = np.arange(256, dtype=np.uint8).view(FORMATS[(arch, kind)]).astype(np.float32).reshape(64, 4)
    np.testing.assert_array_equal(bytes_out.T, want)
    np.testing.assert_array_equal(words_out.transpose(1, 0, 2).reshape(64, 4), want)


def encode_kernel(kind: str) -> str:
    return module(f"""
define amdgpu_kernel void @encode(ptr addrspace(1) %x, ptr addrspace(1) %out) #0 {{
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  %px = getelementptr <4 x float>, ptr addrspace(1) %x, i32 %tid
  %v = load <4 x float>, ptr addrspace(1) %px
  %a = extractelement <4 x float> %v, i32 0
  %b = extractelement <4 x float> %v, i32 1
  %c = extractelement <4 x float> %v, i32 2
  %d = extractelement <4 x float> %v, i32 3
  %lo = call i32 @llvm.amdgcn.cvt.pk.{kind}.f32(float %a, float %b, i32 0, i1 false)
  %all = call i32 @llvm.amdgcn.cvt.pk.{kind}.f32(float %c, float %d, i32 %lo, i1 true)
  %po = getelementptr i32, ptr addrspace(1) %out, i32 %tid
  store i32 %all, ptr addrspace(1) %po
  ret void
}}
declare i32 @llvm.amdgcn.workitem.id.x()
declare i32 @llvm.amdgcn.cvt.pk.{kind}.f32(float, float, i32, i1)
""")


def encode_inputs(fmt, count: int, seed: int) -> np.ndarray:
    """Finite values of the format, midpoints between neighbours (ties), random
    values over its exponent range, both signs; all within the finite range."""
    grid = np.unique(np.abs(np.arange(256, dtype=np.uint8).view(fmt).astype(np.float64)))
    grid = grid[np.isfinite(grid)]
    ties = (grid[1:] + grid[:-1]) / 2
    g = rng(seed)
    spread = np.exp2(g.uniform(np.log2(grid[1]) - 2, np.log2(grid[-1]), count))
    values = np.concatenate([grid, ties, spread])
    values = values * np.where(g.random(values.size) < 0.5, -1, 1)
    values = g.permutation(np.resize(values, count)).astype(np.float32)
    return values


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kind", ["fp8", "bf8"])
def test_fp8_encode_rounds_to_nearest_even(arch, kind):
    fmt = FORMATS[(arch, kind)]
    out = np.zeros(64, np.uint32)
    for seed in range(3):
        x = encode_inputs(fmt, 256, seed)
        run(encode_kernel(kind), arch, "encode", {"x": x, "out": out})
        want = x.astype(fmt).view(np.uint8)
        np.testing.assert_array_equal(out.view(np.uint8), want)


SCALED = module("""
define amdgpu_kernel void @scaled(ptr addrspace(1) %src, ptr addrspace(1) %x, float %scale,
                                  ptr addrspace(1) %dec, ptr addrspace(1) %byte2, ptr addrspace(1) %enc) #0 {
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  %ps = getelementptr i32, ptr addrspace(1) %src, i32 %tid
  %v = load i32, ptr addrspace(1) %ps
  %lo = call <2 x float> @llvm.amdgcn.cvt.scalef32.pk.f32.fp8(i32 %v, float %scale, i1 false)
  %hi = call <2 x float> @llvm.amdgcn.cvt.scalef32.pk.f32.fp8(i32 %v, float %scale, i1 true)
  %all = shufflevector <2 x float> %lo, <2 x float> %hi, <4 x i32> <i32 0, i32 1, i32 2, i32 3>
  %pd = getelementptr <4 x float>, ptr addrspace(1) %dec, i32 %tid
  store <4 x float> %all, ptr addrspace(1) %pd
  %b2 = call float @llvm.amdgcn.cvt.scalef32.f32.fp8(i32 %v, float %scale, i32 2)
  %pb = getelementptr float, ptr addrspace(1) %byte2, i32 %tid
  store float %b2, ptr addrspace(1) %pb
  %px = getelementptr <2 x float>, ptr addrspace(1) %x, i32 %tid
  %xv = load <2 x float>, ptr addrspace(1) %px
  %x0 = extractelement <2 x float> %xv, i32 0
  %x1 = extractelement <2 x float> %xv, i32 1
  %e = call <2 x i16> @llvm.amdgcn.cvt.scalef32.pk.fp8.f32(<2 x i16> <i16 -1, i16 -1>, float %x0, float %x1, float %scale, i1 true)
  %pe = getelementptr <2 x i16>, ptr addrspace(1) %enc, i32 %tid
  store <2 x i16> %e, ptr addrspace(1) %pe
  ret void
}
declare i32 @llvm.amdgcn.workitem.id.x()
declare <2 x float> @llvm.amdgcn.cvt.scalef32.pk.f32.fp8(i32, float, i1)
declare float @llvm.amdgcn.cvt.scalef32.f32.fp8(i32, float, i32)
declare <2 x i16> @llvm.amdgcn.cvt.scalef32.pk.fp8.f32(<2 x i16>, float, float, float, i1)
""")


@pytest.mark.parametrize("scale", [2.0**-3, 1.0, 2.0**7, 3.0])  # 3.0: only its exponent counts
def test_gfx950_scaled_converts(scale):
    factor = 2.0 ** np.floor(np.log2(scale))
    dec, byte2 = np.zeros((64, 4), np.float32), np.zeros(64, np.float32)
    enc = np.zeros(64, np.uint32)
    x = (encode_inputs(ml_dtypes.float8_e4m3fn, 128, 7).astype(np.float64) * factor).astype(np.float32)
    run(SCALED, "gfx950", "scaled", {"src": ALL_BYTES.copy(), "x": x, "scale": scale, "dec": dec,
                                     "byte2": byte2, "enc": enc})
    values = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    np.testing.assert_array_equal(dec, (values * factor).astype(np.float32).reshape(64, 4))
    np.testing.assert_array_equal(byte2, dec[:, 2])
    want = (x.astype(np.float64) / factor).astype(ml_dtypes.float8_e4m3fn).view(np.uint8).reshape(64, 2)
    got = enc.view(np.uint8).reshape(64, 4)
    np.testing.assert_array_equal(got[:, 2:], want)  # word 1 written
    np.testing.assert_array_equal(got[:, :2], 0xFF)  # word 0 kept from the old value


MATH = module("""
define amdgpu_kernel void @math(ptr addrspace(1) %x, ptr addrspace(1) %out) #0 {
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  %px = getelementptr float, ptr addrspace(1) %x, i32 %tid
  %v = load float, ptr addrspace(1) %px
  %e = call float @llvm.exp2.f32(float %v)
  %r = call float @llvm.amdgcn.rcp.f32(float %v)
  %d = fdiv float 1.0, %v
  %s = call float @llvm.sqrt.f32(float %v)
  %b = fptrunc float %v to bfloat
  %bi = bitcast bfloat %b to i16
  %bz = zext i16 %bi to i32
  %bf = bitcast i32 %bz to float
  %h = fptrunc float %v to half
  %hf = fpext half %h to float
  %vals = insertelement <8 x float> poison, float %e, i32 0
  %v1 = insertelement <8 x float> %vals, float %r, i32 1
  %v2 = insertelement <8 x float> %v1, float %d, i32 2
  %v3 = insertelement <8 x float> %v2, float %s, i32 3
  %v4 = insertelement <8 x float> %v3, float %bf, i32 4
  %v5 = insertelement <8 x float> %v4, float %hf, i32 5
  %v6 = insertelement <8 x float> %v5, float 0.0, i32 6
  %v7 = insertelement <8 x float> %v6, float 0.0, i32 7
  %po = getelementptr <8 x float>, ptr addrspace(1) %out, i32 %tid
  store <8 x float> %v7, ptr addrspace(1) %po
  ret void
}
declare i32 @llvm.amdgcn.workitem.id.x()
declare float @llvm.exp2.f32(float)
declare float @llvm.amdgcn.rcp.f32(float)
declare float @llvm.sqrt.f32(float)
""")


def ulps(got: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """Distance of f32 results from the correctly rounded f32 of `exact`, in its ulps."""
    want = exact.astype(np.float32)
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    spacing = np.abs(np.spacing(want)).astype(np.float64)
    return np.where(same, 0, np.abs(got.astype(np.float64) - want) / spacing)


@pytest.mark.parametrize("arch", ARCHS)
def test_exp2_rcp_division_sqrt_and_rounding(arch):
    g = rng(9)
    x = np.concatenate([g.uniform(-126, 127, 40), g.standard_normal(16) * 1e-3,
                        [0.0, -0.0, 1.0, 3.0, 1e-40, -150.0, 200.0, np.inf]]).astype(np.float32)
    out = np.zeros((64, 8), np.float32)
    run(MATH, arch, "math", {"x": x, "out": out})
    x64 = x.astype(np.float64)
    with np.errstate(all="ignore"):
        assert ulps(out[:, 0], np.exp2(x64)).max() <= 1
        positive = x > 0
        assert ulps(out[positive, 1], 1 / x64[positive]).max() <= 1
        np.testing.assert_array_equal(out[:, 2], np.float32(1) / x)  # IEEE division, denormals kept
        sqrt_ok = x >= 0
        assert ulps(out[sqrt_ok, 3], np.sqrt(x64[sqrt_ok])).max() <= 1
    want_bf16 = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(out[:, 4].view(np.uint32), want_bf16.astype(np.uint32))
    np.testing.assert_array_equal(out[:, 5], x.astype(np.float16).astype(np.float32))


FLOAT_OPS = module("""
define amdgpu_kernel void @float_ops(ptr addrspace(1) %x, ptr addrspace(1) %out) #0 {
  %lane = call i32 @llvm.amdgcn.workitem.id.x()
  %px = getelementptr <3 x float>, ptr addrspace(1) %x, i32 %lane
  %v = load <3 x float>, ptr addrspace(1) %px
  %a = extractelement <3 x float> %v, i32 0
  %b = extractelement <3 x float> %v, i32 1
  %c = extractelement <3 x float> %v, i32 2
  %r0 = call float @llvm.fma.f32(float %a, float %b, float %c)
  %r1 = call float @llvm.minnum.f32(float %a, float %b)
  %r2 = call float @llvm.maxnum.f32(float %a, float %b)
  %r3 = call float @llvm.floor.f32(float %a)
  %r4 = call float @llvm.ceil.f32(float %a)
  %r5 = call float @llvm.trunc.f32(float %a)
  %r6 = call float @llvm.rint.f32(float %a)
  %i7 = call i32 @llvm.fptosi.sat.i32.f32(float %a)
  %r7 = bitcast i32 %i7 to float
  %i8 = call i32 @llvm.fptoui.sat.i32.f32(float %b)
  %r8 = bitcast i32 %i8 to float
  %lt = fcmp ult float %a, %b
  %r9 = select i1 %lt, float %c, float 2.0
  %na = fneg float %a
  %ab = call float @llvm.fabs.f32(float %b)
  %r10 = fmul float %na, %ab
  %h = fptrunc float %a to half
  %hb = fptrunc float %b to half
  %hs = fadd half %h, %hb
  %r11 = fpext half %hs to float
  %ad = fpext float %a to double
  %bd = fpext float %b to double
  %pd = fmul double %ad, %bd
  %sd = fadd double %pd, 0x3FF0000000000001
  %r12 = fptrunc double %sd to float
  %fr = call { float, i32 } @llvm.frexp.f32.i32(float %c)
  %r13 = extractvalue { float, i32 } %fr, 0
  %e14 = extractvalue { float, i32 } %fr, 1
  %r14 = sitofp i32 %e14 to float
  %r15 = call float @llvm.ldexp.f32.i32(float %c, i32 %i7)
""" + "".join(f"""  %p{i} = getelementptr float, ptr addrspace(1) %out, i32 {i * 64}
  %q{i} = getelementptr float, ptr addrspace(1) %p{i}, i32 %lane
  store float %r{i}, ptr addrspace(1) %q{i}
""" for i in range(16)) + """  ret void
}
declare i32 @llvm.amdgcn.workitem.id.x()
declare float @llvm.fma.f32(float, float, float)
declare float @llvm.minnum.f32(float, float)
declare float @llvm.maxnum.f32(float, float)
declare float @llvm.floor.f32(float)
declare float @llvm.ceil.f32(float)
declare float @llvm.trunc.f32(float)
declare float @llvm.rint.f32(float)
declare i32 @llvm.fptosi.sat.i32.f32(float)
declare i32 @llvm.fptoui.sat.i32.f32(float)
declare float @llvm.fabs.f32(float)
declare { float, i32 } @llvm.frexp.f32.i32(float)
declare float @llvm.ldexp.f32.i32(float, i32)
""")


@pytest.mark.parametrize("arch", ARCHS)
def test_float_ops_against_numpy(arch):
    g = rng(8)
    # <3 x float> occupies 16 bytes in memory: a padded column
    x = (g.standard_normal((64, 4)) * np.exp2(g.integers(-20, 20, (64, 4)))).astype(np.float32)
    x[:8, 0] = [np.nan, np.inf, -np.inf, 3e9, -3e9, 2.5, -2.5, -0.0]
    x[:8, 1] = [1.0, np.nan, 5e9, -1.0, 0.5, np.nan, 1e-42, 0.0]
    x[:4, 2] = [0.0, 1e-40, -np.inf, 3.0]
    out = np.zeros((16, 64), np.float32)
    run(FLOAT_OPS, arch, "float_ops", {"x": x, "out": out})
    a, b, c = x[:, :3].T
    a64, b64, c64 = (v.astype(np.float64) for v in (a, b, c))
    with np.errstate(all="ignore"):
        mant, expo = np.frexp(c)
        want = [
            (a64 * b64 + c64).astype(np.float32), np.fmin(a, b), np.fmax(a, b), np.floor(a),
            np.ceil(a), np.trunc(a), np.rint(a),
            np.where(np.isnan(a), 0, np.clip(np.trunc(a64), -2**31, 2**31 - 1)).astype(np.int32).view(np.float32),
            np.where(np.isnan(b), 0, np.clip(np.trunc(b64), 0, 2**32 - 1)).astype(np.uint32).view(np.float32),
            np.where(~(a >= b), c, np.float32(2)), -a * np.abs(b),
            (a.astype(np.float16) + b.astype(np.float16)).astype(np.float32),
            (a64 * b64 + (1 + 2.0**-52)).astype(np.float32),
            np.where(np.isfinite(c), mant, c).astype(np.float32),
            np.where(np.isfinite(c), expo, 0).astype(np.float32),
            np.ldexp(c64, np.clip(np.nan_to_num(np.trunc(a64)), -1100, 1100).astype(np.int32)).astype(np.float32),
        ]
    for i, expected in enumerate(want):
        np.testing.assert_array_equal(out[i], expected, err_msg=f"result {i}")


PACKED_HALF = module("""
define amdgpu_kernel void @packed_half(ptr addrspace(1) %x, ptr addrspace(1) %out) #0 {
  %lane = call i32 @llvm.amdgcn.workitem.id.x()
  %px = getelementptr <6 x half>, ptr addrspace(1) %x, i32 %lane
  %v = load <6 x half>, ptr addrspace(1) %px, align 4
  %a = shufflevector <6 x half> %v, <6 x half> poison, <2 x i32> <i32 0, i32 1>
  %b = shufflevector <6 x half> %v, <6 x half> poison, <2 x i32> <i32 2, i32 3>
  %c = shufflevector <6 x half> %v, <6 x half> poison, <2 x i32> <i32 4, i32 5>
  %f = call <2 x half> @llvm.fma.v2f16(<2 x half> %a, <2 x half> %b, <2 x half> %c)
  %bs = shufflevector <2 x half> %b, <2 x half> poison, <2 x i32> <i32 1, i32 0>
  %m = fmul <2 x half> %a, %bs
  %s = fadd <2 x half> %m, %c
  %mx = call <2 x half> @llvm.maxnum.v2f16(<2 x half> %f, <2 x half> %s)
  %r = shufflevector <2 x half> %f, <2 x half> %mx, <4 x i32> <i32 0, i32 1, i32 2, i32 3>
  %r2 = shufflevector <2 x half> %m, <2 x half> %s, <4 x i32> <i32 0, i32 1, i32 2, i32 3>
  %all = shufflevector <4 x half> %r, <4 x half> %r2, <8 x i32> <i32 0, i32 1, i32 2, i32 3, i32 4, i32 5, i32 6, i32 7>
  %po = getelementptr <8 x half>, ptr addrspace(1) %out, i32 %lane
  store <8 x half> %all, ptr addrspace(1) %po
  ret void
}
declare i32 @llvm.amdgcn.workitem.id.x()
declare <2 x half> @llvm.fma.v2f16(<2 x half>, <2 x half>, <2 x half>)
declare <2 x half> @llvm.maxnum.v2f16(<2 x half>, <2 x half>)
""")


@pytest.mark.parametrize("arch", ARCHS)
def test_packed_half_arithmetic(arch):
    g = rng(10)
    x = (g.standard_normal((64, 8)) * 4).astype(np.float16)  # <6 x half> occupies 16 bytes
    out = np.zeros((64, 8), np.float16)
    run(PACKED_HALF, arch, "packed_half", {"x": x, "out": out})
    a, b, c = x[:, 0:2], x[:, 2:4], x[:, 4:6]
    f32 = np.float32
    fma = (a.astype(np.float64) * b + c).astype(np.float16)  # exact product, one rounding
    m = (a.astype(f32) * b[:, ::-1].astype(f32)).astype(np.float16)
    s = (m.astype(f32) + c.astype(f32)).astype(np.float16)
    want = np.concatenate([fma, np.fmax(fma, s), m, s], axis=1)
    np.testing.assert_array_equal(out, want)
