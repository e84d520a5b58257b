"""The number and memory formats of a launch, on torch tensors (SPEC §1, §4).

Every byte-level fact lives here once: fp8 e4m3 in its two flavours (OCP e4m3fn
in memory, FNUZ in gfx942's converters), UE8M0 scale codes, vLLM's MXFP8 blocks,
bf16 rounding, the fp8_ds_mla KV page and the key-table entry encoding. The
reference, the input generator, the emulator tests and the kernel generator all
read these facts from here.

fp8 conversions go through torch's own float8 dtypes (round to nearest even,
subnormals included); this module adds what vLLM's formats add on top: explicit
saturation, block scales and the gfx942 correspondence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

# formats names every byte-level fact: the torch-free ones from kv_format, re-exported
from k2back.kv_format import (  # noqa: F401
    FP8_CHOICES,
    KEY_FP8_NAMES,
    KV_DATA_BYTES,
    KV_RECORD_BYTES,
    KV_SCALE_BYTES,
    KV_SCALE_GROUP,
    KV_SCALES,
    PAGE_ALIGN,
    VLLM_KEY_FP8,
    check_fp8,
    resolve_key_fp8,
)
from k2back.model import MX_BLOCK, NOPE_DIM

# ---------------------------------------------------------------------------
# fp8 e4m3


@dataclass(frozen=True)
class Fp8Format:
    name: str
    dtype: torch.dtype
    max: float  # largest finite magnitude: encoders saturate to it
    min_normal_exp: int  # exponent of the smallest normal
    mantissa_bits: int = 3

    def ulp(self, magnitude: torch.Tensor) -> torch.Tensor:
        """The format's step at |value| = magnitude (subnormal step below the
        smallest normal)."""
        exp = torch.frexp(magnitude.float()).exponent - 1
        exp = exp.clamp(min=self.min_normal_exp)
        return torch.ldexp(torch.ones_like(magnitude, dtype=torch.float32),
                           exp - self.mantissa_bits)


E4M3FN = Fp8Format("e4m3fn", torch.float8_e4m3fn, 448.0, min_normal_exp=-6)
E4M3FNUZ = Fp8Format("e4m3fnuz", torch.float8_e4m3fnuz, 240.0, min_normal_exp=-7)


def as_bytes(x: torch.Tensor) -> torch.Tensor:
    """A float8 or uint8 tensor's bytes as uint8 (no copy)."""
    if x.dtype == torch.uint8:
        return x
    if x.element_size() != 1:
        raise TypeError(f"expected a 1-byte dtype (uint8 or float8), got {x.dtype}")
    return x.view(torch.uint8)


def fp8_encode(x: torch.Tensor, fmt: Fp8Format) -> torch.Tensor:
    """Round to nearest even, saturating to ±fmt.max; NaN stays NaN. -> uint8."""
    return x.float().clamp(-fmt.max, fmt.max).to(fmt.dtype).view(torch.uint8)


def fp8_decode(b: torch.Tensor, fmt: Fp8Format) -> torch.Tensor:
    """uint8 (or float8) bytes -> fp32 values of format fmt."""
    return as_bytes(b).view(fmt.dtype).float()


def e4m3fn_encode(x: torch.Tensor) -> torch.Tensor:
    return fp8_encode(x, E4M3FN)


def e4m3fn_decode(b: torch.Tensor) -> torch.Tensor:
    return fp8_decode(b, E4M3FN)


def e4m3fnuz_encode(x: torch.Tensor) -> torch.Tensor:
    return fp8_encode(x, E4M3FNUZ)


def e4m3fnuz_decode(b: torch.Tensor) -> torch.Tensor:
    return fp8_decode(b, E4M3FNUZ)


# --- gfx942: OCP bytes in memory, FNUZ converters in hardware (SPEC §4) ----
#
# FNUZ has exponent bias 8 against OCP's 7 and the same bit layout otherwise,
# so a finite OCP byte b is worth exactly twice FNUZ byte b, normals and
# subnormals alike. The exceptions: 0x80 is -0 in OCP but NaN in FNUZ, and
# 0x7F / 0xFF are NaN in OCP but ±240 in FNUZ (writers never produce them:
# they saturate). So gfx942 quantizes x under MXFP8 code c by converting
# x·2^(126 − c) (the halving folded into the power of two) to FNUZ saturating
# at ±224: GFX942_QUANT_FORMAT.
GFX942_DECODE_SCALE = 2.0  # OCP value = FNUZ value of the same byte × 2
GFX942_QUANT_MAX = E4M3FN.max / GFX942_DECODE_SCALE  # 224: FNUZ max that yields OCP 448
GFX942_QUANT_FORMAT = replace(E4M3FNUZ, max=GFX942_QUANT_MAX)
OCP_NEGATIVE_ZERO = 0x80


def e4m3fn_decode_gfx942(b: torch.Tensor) -> torch.Tensor:
    """OCP bytes decoded the way gfx942 must: FNUZ converter, 0x80 -> 0, ×2.
    Equals e4m3fn_decode for every byte but the OCP NaNs 0x7F / 0xFF."""
    b = as_bytes(b)
    v = e4m3fnuz_decode(b) * GFX942_DECODE_SCALE
    return torch.where(b == OCP_NEGATIVE_ZERO, torch.zeros_like(v), v)


def e4m3fn_encode_gfx942(x: torch.Tensor) -> torch.Tensor:
    """OCP bytes produced with gfx942's FNUZ converter: halve, saturate to 224,
    encode FNUZ. Same value as e4m3fn_encode(x) for every non-NaN x; the bytes
    differ only where OCP writes -0 (0x80): FNUZ has no -0 and writes 0x00."""
    return fp8_encode(x.float() / GFX942_DECODE_SCALE, GFX942_QUANT_FORMAT)


# ---------------------------------------------------------------------------
# UE8M0 scales and vLLM's MXFP8

UE8M0_BIAS = 127
UE8M0_MAX_CODE = 254  # 255 is NaN in E8M0; the writers clamp below it
FLT_MIN = 2.0**-126  # the amax floor of both writer rules (vLLM: FLT_MIN)
# The largest e4m3fn mantissa as a fraction of its binade: 448 = 0.875 · 2^9.
_E4M3FN_MAX_FRAC, _E4M3FN_MAX_EXP = 0.875, 9


def _pow2(exponent: torch.Tensor) -> torch.Tensor:
    """2^exponent in fp32, exactly (integer exponents)."""
    return torch.ldexp(torch.ones_like(exponent, dtype=torch.float32), exponent.to(torch.int32))


def ue8m0_scale(code: torch.Tensor) -> torch.Tensor:
    """Code c -> 2^(c − 127) in fp32 (code 0 is the fp32 subnormal 2^-127;
    255 is E8M0's NaN)."""
    c = code.to(torch.int32)
    s = _pow2(c - UE8M0_BIAS)
    return torch.where(c > UE8M0_MAX_CODE, torch.full_like(s, float("nan")), s)


def _nan_to_zero(x: torch.Tensor) -> torch.Tensor:
    return torch.nan_to_num(x, nan=0.0, posinf=math.inf, neginf=-math.inf)


def ue8m0_code(amax: torch.Tensor) -> torch.Tensor:
    """The writers' rule `clamp(ceil(log2(max(amax, FLT_MIN) / 448)) + 127, 0, 254)`
    evaluated exactly (no fp32 log2 or division): with max(amax, FLT_MIN) =
    m·2^e, m in [0.5, 1), and 448 = 0.875·2^9, ceil(log2(.)) = e − 9 + [m > 0.875].
    So the code is the smallest c with amax <= 448·2^(c−127), clamped.
    In fp32 bits (what a kernel computes: no log2, no division), with E the
    biased exponent and M the 23 mantissa bits of max(amax, FLT_MIN):
    code = clamp(E − 8 + [M > 0x600000], 0, 254) for every finite amax.
    amax = +inf gives 254; NaN is treated as 0 (see mx_quantize)."""
    a = _nan_to_zero(amax.float()).clamp(min=FLT_MIN)
    m, e = torch.frexp(a)
    c = e - _E4M3FN_MAX_EXP + (m > _E4M3FN_MAX_FRAC).to(e.dtype) + UE8M0_BIAS
    c = torch.where(torch.isinf(a), torch.full_like(c, UE8M0_MAX_CODE), c)
    return c.clamp(0, UE8M0_MAX_CODE).to(torch.uint8)


def _quantize_blocks(xb: torch.Tensor, dims: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """The MXFP8 rule over blocks spanning `dims` of xb (fp32): codes keep
    those dims as size 1, so they broadcast back over their block."""
    code = ue8m0_code(xb.abs().nan_to_num_(nan=0.0, posinf=math.inf).amax(dim=dims, keepdim=True))
    return e4m3fn_encode(xb * _pow2(UE8M0_BIAS - code.to(torch.int32))), code


def mx_quantize(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's MXFP8 rule over `block` consecutive values of the last dim:
    c = ue8m0_code(amax), x_q = e4m3fn_RNE(clamp(x · 2^(127 − c), −448, 448)).
    Returns (uint8 bytes like x, uint8 codes [..., n / block]).

    Non-finite inputs (outside vLLM's contract; defined so tests can pin them):
    amax ignores NaN (as the GPU's v_max_f32 does), a NaN element encodes as
    e4m3fn NaN (0x7F/0xFF); an inf makes the code 254 and saturates to ±448."""
    n = x.shape[-1]
    if n % block:
        raise ValueError(f"mx_quantize: last dim {n} is not a multiple of {block}")
    b, code = _quantize_blocks(x.float().reshape(*x.shape[:-1], n // block, block), (-1,))
    return b.reshape(x.shape), code[..., 0]


def mx_dequantize(b: torch.Tensor, code: torch.Tensor, block: int) -> torch.Tensor:
    """Inverse of mx_quantize: e4m3fn(byte) · 2^(code − 127), fp32."""
    v = e4m3fn_decode(b)
    return (v.reshape(*code.shape, block) * ue8m0_scale(code)[..., None]).reshape(v.shape)


def mxfp8_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's MXFP8 of activations: 32 values a scale along the last dim."""
    return mx_quantize(x, MX_BLOCK)


def mxfp8_dequantize(b: torch.Tensor, code: torch.Tensor) -> torch.Tensor:
    return mx_dequantize(b, code, MX_BLOCK)


def _weight_tiles(w: torch.Tensor) -> torch.Tensor:
    """[rows, cols] viewed as [rows/32, 32, cols/32, 32] (32×32 blocks)."""
    r, c = w.shape
    if r % MX_BLOCK or c % MX_BLOCK:
        raise ValueError(f"MXFP8 weight: shape {tuple(w.shape)} is not a multiple of "
                         f"{MX_BLOCK}x{MX_BLOCK}")
    return w.reshape(r // MX_BLOCK, MX_BLOCK, c // MX_BLOCK, MX_BLOCK)


def mxfp8_quantize_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8 of a [rows, cols] weight: one code per 32×32 block (vLLM's weight
    format). -> (float8_e4m3fn [rows, cols], uint8 [rows/32, cols/32])."""
    b, code = _quantize_blocks(_weight_tiles(w.float()), (1, 3))
    return b.reshape(w.shape).view(torch.float8_e4m3fn), code[:, 0, :, 0]


def mxfp8_dequantize_weight(w: torch.Tensor, code: torch.Tensor) -> torch.Tensor:
    """A [rows, cols] MXFP8 weight (32×32 blocks) -> fp32."""
    tiles = _weight_tiles(e4m3fn_decode(w))
    return (tiles * ue8m0_scale(code)[:, None, :, None]).reshape(w.shape)


# ---------------------------------------------------------------------------
# bf16


def bf16_round(x: torch.Tensor) -> torch.Tensor:
    """Round to bf16 (nearest even) and back to fp32."""
    return x.to(torch.bfloat16).float()


# ---------------------------------------------------------------------------
# The key caches' fp8 (SPEC §1 "Which fp8 the key bytes are"; the names, "auto"
# and its resolver in k2back.kv_format)

KEY_FP8 = {fmt.name: fmt for fmt in (E4M3FN, E4M3FNUZ)}  # a cache's byte format by name


# ---------------------------------------------------------------------------
# fp8_ds_mla KV pages (vLLM's V4 layout, 584 B a token)

# The record layout (KV_DATA_BYTES, KV_RECORD_BYTES, ...): k2back.kv_format.
KV_AMAX_FLOOR = float(torch.tensor(1e-4, dtype=torch.float32))  # the writers' fmaxf(amax, 1e-4f)
KV_CODE_MAX = 255  # the writers clamp codes to [0, 255] (E8M0's NaN included) ...
KV_CODE_MAX_SANITIZED = 254  # ... but the compressor on gfx950, which stops at 254


@dataclass(frozen=True)
class KvWriter:
    """How a vLLM insert kernel writes a key's nope dims (SPEC §1): with
    x the bf16 key values of a 64-dim block, amax = max |x| ignoring NaN,
    e = ceil(log2(max(amax, 1e-4) / max)), code = clamp(e + 127, 0, code_max),
    byte = fmt_RNE(clamp(x · 2^-e, ±max)).

    Beyond SPEC, from the writers' sources: the clamp is fminf(fmaxf(.)), so
    a NaN x (and an inf one, inf · 2^-inf) is written as -max; an inf amax
    makes e = +inf, every finite x of the block 0 and the code code_max."""

    fmt: Fp8Format
    max: float  # 224 (FNUZ: vLLM's FNUZ pipeline stops there) or 448
    code_max: int = KV_CODE_MAX

    @property
    def max_exponent(self) -> int:
        """max = 0.875 · 2^max_exponent."""
        return int(math.log2(self.max / _E4M3FN_MAX_FRAC))


def kv_writer(fp8: str, code_max: int = KV_CODE_MAX) -> KvWriter:
    """The writer of `fp8` bytes: FNUZ as the C++ insert on gfx942 (max 224),
    OCP as the insert elsewhere and the compressor (max 448; code_max 254 for
    the compressor on gfx950)."""
    fmt = KEY_FP8[fp8]
    return KvWriter(fmt, GFX942_QUANT_MAX if fmt is E4M3FNUZ else E4M3FN.max, code_max)


# arch -> the code clamp of vLLM's compressor there (its SANITIZE_CACHE_NANS on gfx950)
VLLM_COMP_CODE_MAX = {"gfx942": KV_CODE_MAX, "gfx950": KV_CODE_MAX_SANITIZED}


def cache_writers(arch: str | None, swa_fp8: str, comp_fp8: str) -> tuple[KvWriter, KvWriter]:
    """The writers of (swa_cache, comp_cache) as vLLM runs them on `arch`
    (None: no arch-specific code clamp), writing the given formats."""
    return kv_writer(swa_fp8), kv_writer(comp_fp8, VLLM_COMP_CODE_MAX.get(arch, KV_CODE_MAX))


def kv_exponent(amax: torch.Tensor, writer: KvWriter) -> torch.Tensor:
    """e = ceil(log2(max(amax, 1e-4) / writer.max)) exactly (fp32 float; +inf
    for an inf amax; NaN amax counts as 0): with max(amax, 1e-4) = m·2^k,
    m in [0.5, 1), and max = 0.875·2^M, e = k − M + [m > 0.875]."""
    a = _nan_to_zero(amax.float()).clamp(min=KV_AMAX_FLOOR)
    m, k = torch.frexp(a)
    e = (k - writer.max_exponent + (m > _E4M3FN_MAX_FRAC).to(k.dtype)).float()
    return torch.where(torch.isinf(a), a, e)


def kv_quantize(keys: torch.Tensor, writer: KvWriter) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys [..., 512] -> (data bytes [..., 576], codes [..., 7]) as `writer`
    writes them: bf16 values first, then the nope dims by 64-dim blocks, the
    rope dims as bf16."""
    x = bf16_round(keys)
    blocks = x[..., :NOPE_DIM].reshape(*x.shape[:-1], KV_SCALES, KV_SCALE_GROUP)
    e = kv_exponent(_nan_to_zero(blocks.abs()).amax(-1, keepdim=True), writer)
    code = (e + UE8M0_BIAS).clamp(0, writer.code_max).to(torch.uint8)
    inf = torch.isinf(e)
    factor = torch.where(inf, 0.0, _pow2(-torch.where(inf, 0.0, e)))  # exp2f(-e): 0 at e = inf
    scaled = blocks * factor
    scaled = torch.where(torch.isnan(scaled), -writer.max, scaled)  # fminf(fmaxf(NaN, -max), max)
    nope = fp8_encode(scaled, replace(writer.fmt, max=writer.max)).reshape(*x.shape[:-1], NOPE_DIM)
    rope = x[..., NOPE_DIM:].to(torch.bfloat16).contiguous().view(torch.uint8)
    return torch.cat([nope, rope], dim=-1), code[..., 0]


def kv_scale(code: torch.Tensor) -> torch.Tensor:
    """A KV block's factor as vLLM's decoder computes it: exp2(code − 127) in
    fp32 (code 255 gives inf, unlike E8M0's NaN: see ue8m0_scale)."""
    return _pow2(code.to(torch.int32) - UE8M0_BIAS)


def kv_dequantize(data: torch.Tensor, codes: torch.Tensor, fp8: str) -> torch.Tensor:
    """(data [..., 576], codes [..., 7]) of `fp8` bytes -> fp32 keys [..., 512]
    as vLLM's decoder reads them: fp8(byte) · exp2(code − 127) in fp32, rope
    dims as bf16, then every NaN (a NaN byte: OCP 0x7F/0xFF, FNUZ 0x80; 0 ·
    inf under code 255; a NaN rope value) as 0. Exact in bf16 for codes >= 3."""
    v = fp8_decode(data[..., :NOPE_DIM], KEY_FP8[fp8])
    scale = kv_scale(codes).repeat_interleave(KV_SCALE_GROUP, -1)
    rope = data[..., NOPE_DIM:].contiguous().view(torch.bfloat16).float()
    return _nan_to_zero(torch.cat([v * scale, rope], dim=-1))


def page_bytes(block: int, extra_pages_of_576: int = 0) -> int:
    """Smallest legal page size for `block` records (a multiple of 576 B),
    plus extra padding."""
    need = block * KV_RECORD_BYTES
    return (-(-need // PAGE_ALIGN) + extra_pages_of_576) * PAGE_ALIGN


def slot_location(slot: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Slot s lives in page s // block, row s % block."""
    return slot // block, slot % block


def _record_columns(block: int, row: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Byte columns of rows' data and scale codes inside their page."""
    data = row[..., None] * KV_DATA_BYTES + torch.arange(KV_DATA_BYTES, device=row.device)
    scale = (block * KV_DATA_BYTES + row[..., None] * KV_SCALE_BYTES
             + torch.arange(KV_SCALE_BYTES, device=row.device))
    return data, scale


def pack_kv(cache: torch.Tensor, block: int, slots: torch.Tensor, keys: torch.Tensor,
            writer: KvWriter) -> None:
    """Write keys [n, 512] at slots [n] of a uint8 [pages, page_bytes] cache,
    as `writer` does: data, the 7 codes and a pad byte of 0. Page padding is
    left as it is."""
    data, codes = kv_quantize(keys, writer)
    page, row = slot_location(slots.long(), block)
    dcol, scol = _record_columns(block, row)
    cache[page[:, None], dcol] = data
    cache[page[:, None], scol] = torch.cat([codes, torch.zeros_like(codes[:, :1])], dim=-1)


def pack_kv_pages(keys: torch.Tensor, slots: torch.Tensor, block: int, pages: int,
                  writer: KvWriter, page_bytes_: int | None = None,
                  fill: torch.Tensor | None = None) -> torch.Tensor:
    """A fresh uint8 [pages, page_bytes] cache holding keys at slots. Bytes no
    record owns are `fill`'s (default zeros)."""
    nbytes = page_bytes(block) if page_bytes_ is None else page_bytes_
    if nbytes < block * KV_RECORD_BYTES or nbytes % PAGE_ALIGN:
        raise ValueError(f"page_bytes: expected a multiple of {PAGE_ALIGN} >= "
                         f"{block * KV_RECORD_BYTES} for block {block}, got {nbytes}")
    cache = (torch.zeros(pages, nbytes, dtype=torch.uint8) if fill is None
             else fill.reshape(pages, nbytes).clone())
    pack_kv(cache, block, slots, keys, writer)
    return cache


def read_kv(cache: torch.Tensor, block: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Raw records at slots (any shape): (data [..., 576], codes [..., 7])."""
    page, row = slot_location(slots.long(), block)
    dcol, scol = _record_columns(block, row)
    return cache[page[..., None], dcol], cache[page[..., None], scol[..., :KV_SCALES]]


def unpack_kv(cache: torch.Tensor, block: int, slots: torch.Tensor, fp8: str) -> torch.Tensor:
    """Keys at slots (any shape) of a cache of `fp8` bytes -> fp32 [..., 512]."""
    return kv_dequantize(*read_kv(cache, block, slots), fp8)


# ---------------------------------------------------------------------------
# key tables

COMPRESSED_BIT = 1 << 31
SLOT_MASK = COMPRESSED_BIT - 1
NO_KEY = -1


def key_entry(slot: torch.Tensor, compressed: bool | torch.Tensor) -> torch.Tensor:
    """Table entries (int32) for slots: `slot | 1 << 31` for compressed rows."""
    s = slot.to(torch.int64) | (torch.as_tensor(compressed, device=slot.device).to(torch.int64) << 31)
    return torch.where(s >= COMPRESSED_BIT, s - (1 << 32), s).to(torch.int32)


def decode_key_table(table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """int32 entries -> (slot int64, compressed bool, present bool). A compressed
    entry reads as negative int32; -1 (= compressed slot 2^31 − 1) means none."""
    t = table.to(torch.int64)
    present = t != NO_KEY
    return t & SLOT_MASK, (t < 0) & present, present

