"""k2back.formats against independent implementations: ml_dtypes for the fp8
formats, Python integer/float arithmetic loops for UE8M0 / MXFP8 / pages."""

from __future__ import annotations

import math
import struct

import ml_dtypes
import numpy as np
import pytest
import torch

from k2back import formats as F

ML = {"e4m3fn": ml_dtypes.float8_e4m3fn, "e4m3fnuz": ml_dtypes.float8_e4m3fnuz}
FMT = {"e4m3fn": F.E4M3FN, "e4m3fnuz": F.E4M3FNUZ}
ALL_BYTES = np.arange(256, dtype=np.uint8)


def ml_decode(name: str) -> np.ndarray:
    return ALL_BYTES.view(ML[name]).astype(np.float32)


def same_values(got: np.ndarray, want: np.ndarray) -> bool:
    """Equal including NaN positions and the sign of zero."""
    both_nan = np.isnan(got) & np.isnan(want)
    equal = (got == want) & (np.signbit(got) == np.signbit(want))
    return bool(np.all(both_nan | equal))


@pytest.mark.parametrize("name", FMT)
def test_every_byte_decodes_like_ml_dtypes(name):
    got = F.fp8_decode(torch.from_numpy(ALL_BYTES), FMT[name]).numpy()
    assert same_values(got, ml_decode(name))


def edge_values(name: str) -> np.ndarray:
    """Every representable value, the midpoints between neighbours (ties), one
    fp32 ulp either side of them, beyond-max values, subnormal-range values,
    ±0, ±inf and NaN."""
    v = np.unique(ml_decode(name)[np.isfinite(ml_decode(name))])
    mids = ((v[1:].astype(np.float64) + v[:-1]) / 2).astype(np.float32)
    near = np.concatenate([np.nextafter(mids, np.float32(np.inf)),
                           np.nextafter(mids, np.float32(-np.inf))])
    vmax = FMT[name].max
    special = np.array([vmax * 1.03, vmax * 1.07, vmax * 1.0625, 1e6, 3e38, np.inf, -np.inf,
                        np.nan, 0.0, -0.0, 2.0**-11, -(2.0**-11), 2.0**-12, 1e-30, -1e-30],
                       dtype=np.float32)
    return np.concatenate([v, mids, near, special, -special])


def random_values(seed: int) -> np.ndarray:
    g = np.random.default_rng(seed)
    return (g.standard_normal(20000) * np.exp2(g.uniform(-14, 10, 20000))).astype(np.float32)


@pytest.mark.parametrize("name", FMT)
@pytest.mark.parametrize("source", ["edges", "random"])
def test_encode_rounds_and_saturates_like_ml_dtypes(name, source):
    x = edge_values(name) if source == "edges" else random_values(7)
    vmax = FMT[name].max
    # ml_dtypes rounds to nearest even but does not saturate: clip first
    # (np.clip keeps NaN), which is the rule SPEC states.
    want = np.clip(x, -vmax, vmax).astype(ML[name]).view(np.uint8)
    got = F.fp8_encode(torch.from_numpy(x), FMT[name]).numpy()
    if name == "e4m3fnuz":
        assert np.array_equal(got, want)
    else:  # NaN sign bits may differ; values must match exactly otherwise
        nan = np.isnan(x)
        assert np.array_equal(got[~nan], want[~nan])
        assert np.all(np.isnan(F.e4m3fn_decode(torch.from_numpy(got[nan])).numpy()))


def test_saturation_is_to_the_format_max():
    x = torch.tensor([449.0, 464.0, 480.0, 1e9, float("inf"), -1e9, -float("inf")])
    assert F.e4m3fn_decode(F.e4m3fn_encode(x)).tolist() == [448.0] * 5 + [-448.0] * 2
    assert F.e4m3fnuz_decode(F.e4m3fnuz_encode(x)).tolist() == [240.0] * 5 + [-240.0] * 2


def test_float8_tensors_are_read_as_bytes():
    b = torch.randint(0, 256, (64,), dtype=torch.uint8)
    assert same_values(F.e4m3fn_decode(b.view(torch.float8_e4m3fn)).numpy(),
                       F.e4m3fn_decode(b).numpy())
    with pytest.raises(TypeError, match="1-byte"):
        F.as_bytes(torch.zeros(3))


# --- gfx942 (SPEC §4) -------------------------------------------------------

OCP_NAN_BYTES = {0x7F, 0xFF}


def test_ocp_byte_is_twice_fnuz_byte():
    ocp, fnuz = ml_decode("e4m3fn"), ml_decode("e4m3fnuz")
    for b in range(256):
        if b in OCP_NAN_BYTES or b == F.OCP_NEGATIVE_ZERO:
            continue
        assert ocp[b] == fnuz[b] * F.GFX942_DECODE_SCALE, hex(b)
    assert np.isnan(fnuz[F.OCP_NEGATIVE_ZERO])  # why gfx942 needs the fix-up


def test_gfx942_decode_matches_ocp_on_every_finite_byte():
    got = F.e4m3fn_decode_gfx942(torch.from_numpy(ALL_BYTES)).numpy()
    want = ml_decode("e4m3fn")
    keep = np.array([b not in OCP_NAN_BYTES for b in range(256)])
    assert np.all(got[keep] == want[keep])  # -0 and +0 compare equal: 0x80 -> 0
    assert got[F.OCP_NEGATIVE_ZERO] == 0.0


@pytest.mark.parametrize("source", ["edges", "random"])
def test_gfx942_encode_gives_ocp_values(source):
    x = edge_values("e4m3fn") if source == "edges" else random_values(11)
    x = x[~np.isnan(x)]
    got = F.e4m3fn_encode_gfx942(torch.from_numpy(x)).numpy()
    want = np.clip(x, -448, 448).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    differ = got != want
    # the only byte difference: OCP's -0 (0x80) comes out as +0 (0x00)
    assert np.all(want[differ] == F.OCP_NEGATIVE_ZERO) and np.all(got[differ] == 0)
    assert F.GFX942_QUANT_MAX == 224.0


# --- UE8M0 and MXFP8 --------------------------------------------------------


def test_ue8m0_scale_every_code():
    got = F.ue8m0_scale(torch.arange(256, dtype=torch.int32).to(torch.uint8)).numpy()
    want = np.array([math.ldexp(1.0, c - 127) for c in range(255)], dtype=np.float32)
    assert np.array_equal(got[:255], want)
    assert np.isnan(got[255])


def loop_code(amax: float) -> int:
    """The writers' rule, literally: the smallest c with amax <= 448·2^(c−127)
    (= ceil(log2(max(amax, FLT_MIN)/448)) + 127), clamped to [0, 254]."""
    if math.isnan(amax):
        amax = 0.0
    a = max(amax, 2.0**-126)
    if math.isinf(a):
        return 254
    c = -400
    while 448.0 * math.ldexp(1.0, c - 127) < a:  # exact in float64
        c += 1
    return min(max(c, 0), 254)


def test_ue8m0_code_matches_the_rule_at_its_boundaries():
    g = np.random.default_rng(3)
    bounds = np.array([448.0 * 2.0**k for k in range(-140, 120)], dtype=np.float64)
    bounds = bounds[(bounds < 3e38) & (bounds > 1e-45)].astype(np.float32)
    amax = np.concatenate([
        bounds, np.nextafter(bounds, np.float32(np.inf)), np.nextafter(bounds, np.float32(0)),
        np.abs(g.standard_normal(2000) * np.exp2(g.uniform(-140, 126, 2000))).astype(np.float32),
        np.array([0.0, 1e-45, 2.0**-126, np.inf, np.nan, 3.4e38], dtype=np.float32),
    ])
    got = F.ue8m0_code(torch.from_numpy(amax)).numpy()
    want = np.array([loop_code(float(a)) for a in amax])
    bad = np.nonzero(got != want)[0]
    assert bad.size == 0, [(float(amax[i]), int(got[i]), int(want[i])) for i in bad[:5]]


def loop_mx_quantize(block: np.ndarray) -> tuple[np.ndarray, int]:
    """One block by the documented rule, element by element."""
    finite_abs = [abs(float(v)) for v in block if not math.isnan(v)]
    c = loop_code(max(finite_abs, default=0.0))
    scale = math.ldexp(1.0, 127 - c)
    q = [min(max(float(v) * scale, -448.0), 448.0) if not math.isnan(v) else math.nan
         for v in block]
    return np.array(q).astype(ml_dtypes.float8_e4m3fn).view(np.uint8), c


def mx_blocks(seed: int) -> np.ndarray:
    """[blocks, 32]: realistic, all-zero, tiny, huge, mixed-range, inf, NaN."""
    g = np.random.default_rng(seed)
    blocks = [g.standard_normal(32) * 10.0 ** g.uniform(-3, 3) for _ in range(40)]
    blocks += [np.zeros(32), -np.zeros(32), np.full(32, 1e-42), g.standard_normal(32) * 1e-40,
               g.standard_normal(32) * 1e37, np.full(32, 448.0), np.full(32, 448.0 * 1.0001)]
    mixed = g.standard_normal(32)
    mixed[::3] *= 1e-6  # values far below the block max: subnormals and ±0
    blocks.append(mixed)
    for special in (np.inf, -np.inf, np.nan):
        b = g.standard_normal(32)
        b[5] = special
        blocks.append(b)
    blocks.append(np.full(32, np.nan))
    return np.stack(blocks).astype(np.float32)


def test_mxfp8_quantize_matches_per_block_loop():
    x = mx_blocks(5)
    bytes_, codes = F.mxfp8_quantize(torch.from_numpy(x.reshape(-1, 64)))
    bytes_, codes = bytes_.reshape(-1, 32).numpy(), codes.reshape(-1).numpy()
    for i, block in enumerate(x):
        want_b, want_c = loop_mx_quantize(block)
        assert codes[i] == want_c, (i, block)
        nan = np.isnan(block)
        assert np.array_equal(bytes_[i][~nan], want_b[~nan]), (i, block)
        assert np.all(np.isin(bytes_[i][nan], list(OCP_NAN_BYTES)))


def test_mxfp8_dequantize_matches_loop():
    g = np.random.default_rng(9)
    b = g.integers(0, 256, (6, 64)).astype(np.uint8)
    c = g.integers(0, 255, (6, 2)).astype(np.uint8)
    got = F.mxfp8_dequantize(torch.from_numpy(b), torch.from_numpy(c)).numpy()
    dec = ml_decode("e4m3fn")
    with np.errstate(over="ignore"):  # big codes overflow to inf, as in fp32
        want = np.array([[float(dec[b[r, k]]) * math.ldexp(1.0, int(c[r, k // 32]) - 127)
                          for k in range(64)] for r in range(6)], dtype=np.float32)
    assert same_values(got, want)


def test_mxfp8_weight_blocks_are_32x32():
    g = np.random.default_rng(4)
    w = (g.standard_normal((64, 96)) * np.exp2(g.integers(-8, 4, (64, 96)))).astype(np.float32)
    wq, codes = F.mxfp8_quantize_weight(torch.from_numpy(w))
    assert wq.dtype == torch.float8_e4m3fn and codes.shape == (2, 3)
    wq = wq.view(torch.uint8).numpy()
    for br in range(2):
        for bc in range(3):
            tile = w[32 * br:32 * br + 32, 32 * bc:32 * bc + 32]
            want_b, want_c = loop_mx_quantize(tile.reshape(-1))
            assert codes[br, bc] == want_c
            assert np.array_equal(wq[32 * br:32 * br + 32, 32 * bc:32 * bc + 32].reshape(-1), want_b)
    deq = F.mxfp8_dequantize_weight(torch.from_numpy(wq), codes).numpy()
    scale = np.exp2(codes.numpy().astype(np.float64) - 127).repeat(32, 0).repeat(32, 1)
    assert np.array_equal(deq, (ml_decode("e4m3fn")[wq] * scale).astype(np.float32))


def test_bf16_round_is_torchs_nearest_even():
    x = torch.from_numpy(random_values(2))
    tie = torch.tensor([1.0 + 2**-8, 1.0 + 3 * 2**-8])  # halfway: to even
    assert F.bf16_round(tie).tolist() == [1.0, 1.0 + 2**-6]
    bits = x.view(torch.int32).to(torch.int64)
    # round-half-even on the top 16 bits, by integer arithmetic
    lsb = (bits >> 16) & 1
    want = (((bits + 0x7FFF + lsb) >> 16) << 16).to(torch.int32).view(torch.float32)
    assert torch.equal(F.bf16_round(x), want)


# --- fp8_ds_mla pages: the writers (SPEC §1) -----------------------------


def realistic_keys(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(n, 512, generator=g) * torch.exp(torch.randn(512, generator=g))
    k[:, torch.randperm(448, generator=g)[:40]] *= 1e-7  # quiet channels: ±0 bytes
    return k


def edge_keys() -> torch.Tensor:
    """Keys whose blocks meet every corner of the writers' rule: all zeros,
    amax at the 1e-4 floor and below it, amax on a binade boundary of both
    rules (1.75 · 2^j) and one bf16 step either side, subnormal-range values
    under a large amax, NaN and ±inf elements, the largest bf16."""
    k = realistic_keys(10, 5)
    k[0, :64] = 0.0
    k[0, 64:128] = 1e-4
    k[0, 128:192] *= 1e-9
    k[1, :64] = torch.linspace(-1.75, 1.75, 64) * 8  # amax 14 = 1.75 · 2^3
    k[1, 64:128] = torch.linspace(-1, 1, 64) * 1.7578125 * 8  # one bf16 step above
    k[1, 128:192] = torch.linspace(-1, 1, 64) * 1.7421875 * 8  # one below
    k[2, :64] = 2.0**-12
    k[2, 0] = 200.0  # values 2^-20 of the block max: fp8 subnormals or 0
    k[3, 3], k[3, 70], k[3, 140] = float("nan"), float("inf"), -float("inf")
    k[4, :64] = 3.3895313892515355e38  # bf16's largest
    return k


def loop_kv_record(key: np.ndarray, fp8: str, code_max: int) -> tuple[np.ndarray, list[int]]:
    """One record's nope bytes and codes by the writer's rule, element by
    element: Python floats and ml_dtypes' rounding (independent of k2back)."""
    x = np.asarray(key, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)
    vmax = 224.0 if fp8 == "e4m3fnuz" else 448.0
    data, codes = [], []
    for b in range(7):
        block = x[64 * b:64 * b + 64]
        amax = max([abs(v) for v in block if not math.isnan(v)], default=0.0)
        e = math.inf if math.isinf(amax) else math.ceil(math.log2(max(amax, 1e-4) / vmax))
        codes.append(int(min(max(e + 127, 0), code_max)))
        scale = 0.0 if math.isinf(e) else 2.0**-e
        for v in block:
            scaled = float(v) * scale
            scaled = -vmax if math.isnan(scaled) else min(max(scaled, -vmax), vmax)
            data.append(np.array(scaled, np.float32).astype(ML[fp8]).view(np.uint8))
    return np.array(data, np.uint8), codes


@pytest.mark.parametrize("fp8, code_max", [("e4m3fnuz", 255), ("e4m3fn", 255), ("e4m3fn", 254)])
def test_kv_writer_rule_against_a_loop(fp8, code_max):
    keys = torch.cat([edge_keys(), realistic_keys(30, 6)])
    data, codes = F.kv_quantize(keys, F.kv_writer(fp8, code_max))
    for i, key in enumerate(keys.numpy()):
        want_data, want_codes = loop_kv_record(key, fp8, code_max)
        assert np.array_equal(data[i, :448].numpy(), want_data), i
        assert codes[i].tolist() == want_codes, i
        rope = key[448:].astype(ml_dtypes.bfloat16).view(np.uint8)
        assert np.array_equal(data[i, 448:].numpy(), rope)
    # the corners the rule has: floor, boundary, the inf block (code_max, all
    # but the ∓max byte 0), NaN written as -max
    assert codes[0, :2].tolist() == [106, 106] if fp8 == "e4m3fnuz" else [105, 105]
    assert codes[1, 0] + 1 == codes[1, 1] == codes[1, 2] + 1  # ceil at the boundary
    assert codes[3, 1] == code_max and (data[3, 64:128] & 0x7F != 0).sum() == 1
    assert data[3, 3] == 0xFE  # NaN -> fminf(fmaxf(NaN, -max), max) = -max


def test_fnuz_records_are_ocp_records_one_code_up():
    """SPEC §1: FNUZ with max 224 writes the OCP bytes of the same keys (but
    -0, which FNUZ has not) with every code one higher; same values."""
    keys = realistic_keys(40, 3)
    ocp, ocp_codes = F.kv_quantize(keys, F.kv_writer("e4m3fn"))
    fnuz, fnuz_codes = F.kv_quantize(keys, F.kv_writer("e4m3fnuz"))
    assert torch.equal(fnuz_codes.int(), ocp_codes.int() + 1)
    differ = ocp != fnuz
    assert (ocp[differ] == F.OCP_NEGATIVE_ZERO).all() and (fnuz[differ] == 0).all()
    assert differ.any()
    assert torch.equal(F.kv_dequantize(ocp, ocp_codes, "e4m3fn"),
                       F.kv_dequantize(fnuz, fnuz_codes, "e4m3fnuz"))


@pytest.mark.parametrize("fp8", ["e4m3fn", "e4m3fnuz"])
def test_kv_decode_every_byte_and_code(fp8):
    """vLLM's decoder: fp8(byte) · exp2(code − 127) in fp32, every NaN 0 (NaN
    bytes; 0 · inf under code 255); ±inf kept. Rope NaNs are 0 too."""
    byte = torch.arange(256, dtype=torch.uint8).repeat(2)[:448].reshape(1, 448)
    rope = torch.tensor([0x7FC0, 0xFFC1, 0x3F80, 0x7F80] * 16, dtype=torch.int32)
    data = torch.cat([byte, rope.to(torch.int16).view(torch.uint8)[None]], dim=1)
    ml = ml_decode(fp8)
    for code in (0, 1, 105, 127, 200, 254, 255):
        codes = torch.full((1, 7), code, dtype=torch.uint8)
        got = F.kv_dequantize(data, codes, fp8)[0].numpy()
        with np.errstate(invalid="ignore", over="ignore"):
            want = (ml[byte[0].numpy()].astype(np.float32) * np.float32(2.0**(code - 127)))
        want = np.where(np.isnan(want), 0.0, want)
        assert same_values(got[:448], want.astype(np.float32)), code
        assert got[448:452].tolist() == [0.0, 0.0, 1.0, math.inf]


@pytest.mark.parametrize("block", [32, 64])
@pytest.mark.parametrize("extra", [0, 3])
@pytest.mark.parametrize("fp8", ["e4m3fn", "e4m3fnuz"])
def test_pages_round_trip_at_slot_addresses(block, extra, fp8):
    nbytes = F.page_bytes(block, extra)
    assert nbytes % 576 == 0 and nbytes >= block * 584
    pages, n = 5, 70
    keys = realistic_keys(n, block + extra)
    slots = torch.randperm(pages * block)[:n]
    # a strided view (row stride beyond the page) over garbage, as a cache
    # carved out of a bigger allocation would be
    backing = torch.randint(0, 256, (pages, nbytes + 576), dtype=torch.uint8)
    before = backing.clone()
    cache = backing[:, :nbytes]
    F.pack_kv(cache, block, slots, keys, F.kv_writer(fp8))
    # every record byte at its address computed by hand
    touched = torch.zeros_like(backing, dtype=torch.bool)
    for i, s in enumerate(slots.tolist()):
        page, row = s // block, s % block
        data = backing[page, row * 576: row * 576 + 576]
        scales = backing[page, block * 576 + row * 8: block * 576 + row * 8 + 8]
        touched[page, row * 576: row * 576 + 576] = True
        touched[page, block * 576 + row * 8: block * 576 + row * 8 + 8] = True
        nope, codes = loop_kv_record(keys[i].numpy(), fp8, 255)
        assert np.array_equal(data[:448].numpy(), nope)
        assert scales.tolist() == codes + [0]  # the pad byte: 0, as both writers write it
        rope = keys[i, 448:].numpy().astype(ml_dtypes.bfloat16).view(np.uint8)
        assert np.array_equal(data[448:].numpy(), rope)
    assert torch.equal(backing[~touched], before[~touched])  # page padding kept
    got = F.unpack_kv(cache, block, slots.reshape(7, 10), fp8).reshape(n, 512)
    data, codes = F.read_kv(cache, block, slots)
    scales = torch.repeat_interleave(F.kv_scale(codes), 64, -1)
    assert torch.equal(got[:, :448], F.fp8_decode(data[:, :448], FMT[fp8]) * scales)
    assert torch.equal(got[:, 448:], F.bf16_round(keys[:, 448:]))
    assert (got - keys).norm() / keys.norm() < 0.05  # e4m3: 3 mantissa bits


def test_page_bytes_must_be_legal():
    with pytest.raises(ValueError, match="page_bytes"):
        F.pack_kv_pages(realistic_keys(1, 0), torch.tensor([0]), 32, 1, F.kv_writer("e4m3fn"),
                        page_bytes_=32 * 584)


@pytest.mark.parametrize("arch, want", [("gfx942", ("e4m3fnuz", "e4m3fn")),
                                        ("gfx950", ("e4m3fn", "e4m3fn"))])
def test_auto_is_what_vllm_writes(arch, want):
    assert F.resolve_key_fp8(arch) == want
    assert F.resolve_key_fp8(arch, "e4m3fn", "e4m3fnuz") == ("e4m3fn", "e4m3fnuz")
    assert F.resolve_key_fp8(None, "e4m3fnuz", "e4m3fn") == ("e4m3fnuz", "e4m3fn")


@pytest.mark.parametrize("args, name", [(("gfx942", "ocp"), "swa_fp8"),
                                        (("gfx950", "auto", None), "comp_fp8"),
                                        ((None, "auto"), "swa_fp8")])
def test_resolve_key_fp8_names_the_argument(args, name):
    with pytest.raises(ValueError, match=f"^{name}: "):
        F.resolve_key_fp8(*args)


def test_slot_location():
    page, row = F.slot_location(torch.tensor([0, 31, 32, 95, 1000]), 32)
    assert page.tolist() == [0, 0, 1, 2, 31] and row.tolist() == [0, 31, 0, 31, 8]


def test_key_table_entries():
    slots = torch.tensor([0, 1, 12345, 2**31 - 2])
    comp = torch.tensor([True, False, True, True])
    t = F.key_entry(slots, comp)
    want = [struct.unpack("<i", struct.pack("<I", s | (1 << 31) if c else s))[0]
            for s, c in zip(slots.tolist(), comp.tolist())]
    assert t.dtype == torch.int32 and t.tolist() == want
    s, c, present = F.decode_key_table(torch.cat([t, torch.tensor([-1], dtype=torch.int32)]))
    assert s[:4].tolist() == slots.tolist() and c.tolist() == comp.tolist() + [False]
    assert present.tolist() == [True] * 4 + [False]


def test_ue8m0_code_from_fp32_bits():
    """The bit-level form the kernels use (see ue8m0_code) agrees on finite amax."""
    g = np.random.default_rng(8)
    bounds = np.array([448.0 * 2.0**k for k in range(-140, 118)])
    bounds = bounds[bounds > 1e-45].astype(np.float32)
    amax = np.concatenate([
        bounds, np.nextafter(bounds, np.float32(np.inf)), np.nextafter(bounds, np.float32(0)),
        np.abs(g.standard_normal(5000) * np.exp2(g.uniform(-149, 127, 5000))).astype(np.float32),
        np.array([0.0, 1e-45, 2.0**-126, 3.4e38], dtype=np.float32)])
    bits = np.maximum(amax, np.float32(2.0**-126)).view(np.uint32).astype(np.int64)
    code = np.clip((bits >> 23) - 8 + ((bits & 0x7FFFFF) > 0x600000), 0, 254)
    assert np.array_equal(F.ue8m0_code(torch.from_numpy(amax)).numpy(), code)


def test_gfx942_mxfp8_quantize_by_folded_scale():
    """x·2^(126 − c) through FNUZ saturating at 224 gives the OCP values of
    vLLM's rule (bytes equal but −0, which FNUZ writes as +0)."""
    x = torch.from_numpy(mx_blocks(12)[:-4])  # finite blocks
    want_b, code = F.mxfp8_quantize(x)
    folded = x * torch.ldexp(torch.ones(code.shape), 126 - code.int()).repeat_interleave(32, -1)
    got_b = F.fp8_encode(folded, F.GFX942_QUANT_FORMAT)
    assert torch.equal(F.e4m3fn_decode_gfx942(got_b), F.e4m3fn_decode(want_b))
    differ = got_b != want_b
    assert (want_b[differ] == F.OCP_NEGATIVE_ZERO).all() and (got_b[differ] == 0).all()


def test_the_key_fp8_names_are_the_formats_names():
    """kv_format names the key caches' fp8 formats without torch; each name is a
    format here, and every format is named there, in the same order."""
    assert tuple(F.KEY_FP8) == F.KEY_FP8_NAMES
    assert all(F.KEY_FP8[name].name == name for name in F.KEY_FP8_NAMES)
