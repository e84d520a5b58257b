"""The reference of record (SPEC §2) and a float64 oracle, on torch tensors.

`attention_back` is what every kernel is proven against. It follows SPEC §2
step by step: fp32 sums, bf16 roundings exactly where SPEC states them and
nowhere else, base-2 logits, chunks of `chunk_keys` consecutive table entries.
It is vectorized over tokens, heads, chunks and keys, device-agnostic (all work
happens on q's device).

Where the key formats enter: `gather_keys` decodes each cache with its own
byte format (`swa_fp8`, `comp_fp8`: "e4m3fn" or "e4m3fnuz", never "auto": the
reference knows no arch) through formats.kv_dequantize, which reads as vLLM's
decoder does: fp8(byte) · exp2(code − 127) in fp32, then every NaN (a NaN
byte, 0 · inf under code 255, a NaN rope value) as 0. Nothing after the keys
depends on the formats.

SPEC leaves a kernel free to order its fp32 sums (and a few equivalent fp32
formulations). `SumOrder` exposes those freedoms, so tolerances are calibrated
from the spread between two orders instead of guessed (testing.py).

`attention_back_f64` is the looser oracle: the same mathematics in float64 with
no activation quantization (no bf16 or fp8 rounding of q·K, p, partials, o, Z);
keys and weights are dequantized exactly as in the reference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from k2back.formats import (
    bf16_round,
    decode_key_table,
    mxfp8_dequantize,
    mxfp8_dequantize_weight,
    mxfp8_quantize,
    unpack_kv,
)
from k2back.model import HEAD_DIM, HEADS_PER_GROUP, NOPE_DIM, ROPE_DIM

LOG2E = math.log2(math.e)


@dataclass(frozen=True)
class SumOrder:
    """The fp32 freedoms SPEC §2 leaves an implementation.

    reverse: keys of a chunk, chunks in the combine and GEMV k-blocks are
        summed last to first.
    k_block: dot products (q·K over 512 dims, the wo_a / wo_b GEMVs) are fp32
        sums of k_block-long partial dots (a kernel's MFMA k-steps / split-k);
        0 = one matmul.
    folded: `qk_scale·log2(e)` folded into one fp32 constant, `/ L` as
        `· (1/L)`, and the inverse RoPE's `e·cos + o·sin` rounded once (fma).
    exp2_ulp: every other exp2 result one ulp off, as the hardware's
        v_exp_f32 (accurate to 1 ulp) may be.
    """

    reverse: bool = False
    k_block: int = 0
    folded: bool = False
    exp2_ulp: bool = False


NATURAL = SumOrder()
ALTERNATE = SumOrder(reverse=True, k_block=16, folded=True, exp2_ulp=True)


# --- building blocks ---------------------------------------------------------


def _matmul(a: torch.Tensor, b: torch.Tensor, order: SumOrder) -> torch.Tensor:
    """a [..., M, K] @ b [..., K, N] in fp32, summed over K in `order`."""
    if not order.k_block:
        return a @ b
    blocks = range(0, a.shape[-1], order.k_block)
    acc = None
    for k0 in reversed(blocks) if order.reverse else blocks:
        part = a[..., k0:k0 + order.k_block] @ b[..., k0:k0 + order.k_block, :]
        acc = part if acc is None else acc + part
    return acc


def _exp2(x: torch.Tensor, order: SumOrder) -> torch.Tensor:
    r = torch.exp2(x)
    if not order.exp2_ulp:
        return r
    odd = (torch.arange(r.numel(), device=r.device) % 2 == 1).reshape(r.shape)
    return torch.where(odd & (r > 0) & torch.isfinite(r), torch.nextafter(r, torch.full_like(r, math.inf)), r)


def _flip_keys(x: torch.Tensor, order: SumOrder, dim: int) -> torch.Tensor:
    return x.flip(dim) if order.reverse else x


def gather_keys(key_table, key_len, swa_cache, swa_block, comp_cache, comp_block, *,
                swa_fp8: str, comp_fp8: str):
    """Dequantized keys [S, KEYS, 512] (fp32, zero where not valid) and the
    validity mask [S, KEYS]: valid iff index < key_len and entry != -1.
    Entries with bit 31 set read comp_cache (bytes of format comp_fp8),
    others swa_cache (swa_fp8)."""
    slot, compressed, present = decode_key_table(key_table)
    index = torch.arange(key_table.shape[1], device=key_table.device)
    valid = present & (index < key_len[:, None].long())
    keys = torch.zeros(*key_table.shape, HEAD_DIM, device=key_table.device)
    for cache, block, fp8, mask in ((swa_cache, swa_block, swa_fp8, valid & ~compressed),
                                    (comp_cache, comp_block, comp_fp8, valid & compressed)):
        if not mask.any():
            continue
        if cache is None:
            raise ValueError("key_table: compressed entries (bit 31) in use but comp_cache "
                             "is None (a window-only layer has no compressed rows)")
        keys[mask] = unpack_kv(cache, block, slot[mask], fp8)
    return keys, valid


def inverse_rope(o: torch.Tensor, cos_sin: torch.Tensor, positions: torch.Tensor,
                 order: SumOrder = NATURAL) -> torch.Tensor:
    """o [S, H, 512]: dims 448 + 2i, 449 + 2i = (e, o) -> (e·cos_i + o·sin_i,
    o·cos_i − e·sin_i) at positions[t] (GPT-J pairs); nope dims unchanged."""
    half = ROPE_DIM // 2
    row = cos_sin[positions.long()]
    cos, sin = row[:, None, :half], row[:, None, half:]
    e, od = o[..., NOPE_DIM::2], o[..., NOPE_DIM + 1::2]
    if order.folded:  # each output rounded once, as an fma chain would (nearly) do
        e64, o64, c64, s64 = (t.double() for t in (e, od, cos, sin))
        e2, o2 = (e64 * c64 + o64 * s64).float(), (o64 * c64 - e64 * s64).float()
    else:
        e2, o2 = e * cos + od * sin, od * cos - e * sin
    rope = torch.stack([e2, o2], dim=-1).flatten(-2)
    return torch.cat([o[..., :NOPE_DIM], rope], dim=-1)


def _chunked(x: torch.Tensor, chunk_keys: int, fill) -> torch.Tensor:
    """[S, KEYS, ...] -> [S, nchunk, CK, ...], the tail padded with fill."""
    s, keys = x.shape[:2]
    nchunk = -(-keys // chunk_keys)
    pad = x.new_full((s, nchunk * chunk_keys - keys, *x.shape[2:]), fill)
    return torch.cat([x, pad], dim=1).reshape(s, nchunk, chunk_keys, *x.shape[2:])


# --- SPEC §2 -----------------------------------------------------------------


def split_stage(q, keys, valid, chunk_keys: int, qk_scale: float, order: SumOrder):
    """Steps 1-2: per (token, chunk, head) the max m_c, sum l_c and bf16
    partial over the chunk's valid keys; scores [S, H, KEYS] (base 2)."""
    k = _chunked(keys, chunk_keys, 0.0)  # [S, C, CK, 512]
    ok = _chunked(valid, chunk_keys, False)  # [S, C, CK]
    k, ok = _flip_keys(k, order, 2), _flip_keys(ok, order, 2)
    dots = _matmul(bf16_round(q.float())[:, None], k.transpose(-1, -2), order)  # [S, C, H, CK]
    # s = dot · qk_scale · log2(e): two fp32 products, or one folded constant
    factors = (qk_scale * LOG2E,) if order.folded else (qk_scale, LOG2E)
    for factor in factors:
        dots = dots * torch.tensor(factor, dtype=torch.float32, device=dots.device)
    s = dots.masked_fill(~ok[:, :, None, :], -math.inf)
    live = ok.any(-1)[:, :, None]  # a chunk with no valid key is skipped
    m = torch.where(live, s.amax(-1), -math.inf)
    p = torch.where(ok[:, :, None, :], _exp2(s - m[..., None], order), 0.0)
    l_sum = p.sum(-1)
    partial = bf16_round(_matmul(bf16_round(p), k, order))  # [S, C, H, 512]
    scores = _flip_keys(s, order, 3).permute(0, 2, 1, 3).flatten(2)[..., : keys.shape[1]]
    return m, l_sum, partial, scores


def combine_stage(m, l_sum, partial, sink, order: SumOrder):
    """Step 3: the chunks merged with the sink -> o (bf16 values), M, L."""
    sigma = sink.float() * LOG2E
    big_m = torch.maximum(m.amax(1), sigma)  # [S, H]
    chunks = range(m.shape[1])
    total = _exp2(sigma - big_m, order)
    acc = torch.zeros_like(partial[:, 0])
    for c in reversed(chunks) if order.reverse else chunks:
        w = torch.where(m[:, c] > -math.inf, _exp2(m[:, c] - big_m, order), 0.0)
        total = total + l_sum[:, c] * w
        acc = acc + partial[:, c] * w[..., None]
    o = acc * (1.0 / total)[..., None] if order.folded else acc / total[..., None]
    # o = 0 where no key and no sink weigh in (L = 0) or the sink takes it all
    dead = ~(total > 0) | torch.isposinf(sigma)[None, :]
    return torch.where(dead[..., None], 0.0, bf16_round(o)), big_m, total


def attention_back(q, key_table, key_len, positions, swa_cache, swa_block, comp_cache,
                   comp_block, cos_sin, sink, wo_a, wo_a_scale, wo_b, wo_b_scale, *,
                   swa_fp8, comp_fp8, chunk_keys, qk_scale=None, intermediates=False,
                   order=NATURAL):
    """SPEC §2 on one rank's launch arguments (shapes as SPEC §1), the caches'
    bytes read as swa_fp8 / comp_fp8 ("e4m3fn" or "e4m3fnuz").

    Returns `out` (bf16 [S, hidden]) or, with intermediates, a dict of
      out, o (bf16 [S, H, 512], before RoPE), y (fp32, after inverse RoPE),
      xo / xo_codes (uint8 [S, H·512] / [S, H·16]), z (bf16 [S, G·o_rank]),
      x8b / x8b_codes (uint8 [S, G·o_rank] / [S, G·o_rank/32]),
      scores (fp32 [S, H, KEYS], base 2, −inf where not valid), valid [S, KEYS],
      chunk_max / chunk_sum (fp32 [S, nchunk, H]; −inf / 0 for skipped chunks),
      chunk_partial (bf16 [S, nchunk, H, 512]; 0 for skipped chunks),
      row_max M / row_sum L (fp32 [S, H], the sink included).
    Chunk tensors are laid out [token, chunk, head] as a kernel publishes them."""
    if chunk_keys <= 0:
        raise ValueError(f"chunk_keys: expected a positive int, got {chunk_keys!r}")
    qk_scale = HEAD_DIM**-0.5 if qk_scale is None else qk_scale
    s, heads = q.shape[:2]
    keys, valid = gather_keys(key_table, key_len, swa_cache, swa_block, comp_cache, comp_block,
                              swa_fp8=swa_fp8, comp_fp8=comp_fp8)
    m, l_sum, partial, scores = split_stage(q, keys, valid, chunk_keys, qk_scale, order)
    o, big_m, total = combine_stage(m, l_sum, partial, sink, order)
    y = inverse_rope(o, cos_sin, positions, order)
    xo, xo_codes = mxfp8_quantize(y.reshape(s, heads * HEAD_DIM))

    groups = heads // HEADS_PER_GROUP
    wa = mxfp8_dequantize_weight(wo_a, wo_a_scale)
    wa = wa.reshape(groups, -1, wa.shape[1])  # [G, o_rank, 4096]
    xg = mxfp8_dequantize(xo, xo_codes).reshape(s, groups, -1).transpose(0, 1)  # [G, S, 4096]
    z = bf16_round(_matmul(xg, wa.transpose(1, 2), order)).transpose(0, 1).reshape(s, -1)
    x8b, x8b_codes = mxfp8_quantize(z)
    wb = mxfp8_dequantize_weight(wo_b, wo_b_scale)
    out = _matmul(mxfp8_dequantize(x8b, x8b_codes), wb.T, order).to(torch.bfloat16)
    if not intermediates:
        return out
    return {
        "out": out, "o": o.to(torch.bfloat16), "y": y, "xo": xo, "xo_codes": xo_codes,
        "z": z.to(torch.bfloat16), "x8b": x8b, "x8b_codes": x8b_codes,
        "scores": scores, "valid": valid, "chunk_max": m, "chunk_sum": l_sum,
        "chunk_partial": partial.to(torch.bfloat16), "row_max": big_m, "row_sum": total,
    }


def _keys_one_by_one(key_table, key_len, swa_cache, swa_block, comp_cache, comp_block,
                     swa_fp8, comp_fp8):
    """The key-table rules walked entry by entry in Python (independent of
    gather_keys): float64 keys [S, KEYS, 512], valid mask."""
    s, width = key_table.shape
    keys = torch.zeros(s, width, HEAD_DIM, dtype=torch.float64)
    valid = torch.zeros(s, width, dtype=torch.bool)
    for t, row in enumerate(key_table.tolist()):
        for k, entry in enumerate(row[: int(key_len[t])]):
            if entry == -1:
                continue
            cache, block, fp8 = ((comp_cache, comp_block, comp_fp8) if entry < 0
                                 else (swa_cache, swa_block, swa_fp8))
            slot = torch.tensor([entry & 0x7FFFFFFF])
            keys[t, k] = unpack_kv(cache, block, slot, fp8)[0].double()
            valid[t, k] = True
    return keys, valid


def _inverse_rope_complex(y: torch.Tensor, cos_sin: torch.Tensor, positions) -> torch.Tensor:
    """Inverse GPT-J RoPE as a complex product: (e + i·o) · conj(cos + i·sin)."""
    half = ROPE_DIM // 2
    pairs = torch.view_as_complex(y[..., NOPE_DIM:].reshape(*y.shape[:-1], half, 2).contiguous())
    row = cos_sin[positions.long()].double()
    rot = torch.complex(row[:, :half], -row[:, half:])[:, None, :]
    return torch.cat([y[..., :NOPE_DIM], torch.view_as_real(pairs * rot).flatten(-2)], dim=-1)


def attention_back_f64(q, key_table, key_len, positions, swa_cache, swa_block, comp_cache,
                       comp_block, cos_sin, sink, wo_a, wo_a_scale, wo_b, wo_b_scale, *,
                       swa_fp8, comp_fp8, qk_scale=None, intermediates=False, **_ignored):
    """The float64 oracle: softmax over [valid logits, sink], inverse RoPE,
    wo_a per group, wo_b; no bf16 or fp8 rounding of activations (keys and
    weights dequantized exactly; cos_sin taken as given). Written apart from
    attention_back (own key-table walk, natural-log softmax, complex RoPE,
    einsum GEMVs) so that it checks the reference's semantics too. Chunking
    does not exist here (`chunk_keys` and `order` are accepted and ignored).
    CPU. Returns out (float64 [S, hidden]) or a dict with out, o, y, z."""
    qk_scale = HEAD_DIM**-0.5 if qk_scale is None else qk_scale
    s, heads = q.shape[:2]
    keys, valid = _keys_one_by_one(key_table, key_len, swa_cache, swa_block, comp_cache,
                                   comp_block, swa_fp8, comp_fp8)
    logits = torch.einsum("thd,tkd->thk", q.double(), keys) * qk_scale
    logits = logits.masked_fill(~valid[:, None, :], -math.inf)
    with_sink = torch.cat([logits, sink.double()[None, :, None].expand(s, heads, 1)], dim=-1)
    p = torch.softmax(with_sink, dim=-1)[..., :-1]
    # NaN exactly where SPEC defines o = 0: nothing to weigh, or an infinite sink
    o = torch.nan_to_num(torch.einsum("thk,tkd->thd", p, keys), nan=0.0)
    y = _inverse_rope_complex(o, cos_sin, positions)
    wa = mxfp8_dequantize_weight(wo_a, wo_a_scale).double()
    wa = wa.reshape(heads // HEADS_PER_GROUP, -1, wa.shape[1])  # [G, o_rank, 8·512]
    z = torch.einsum("tgk,grk->tgr", y.reshape(s, wa.shape[0], -1), wa).reshape(s, -1)
    out = torch.einsum("tk,nk->tn", z, mxfp8_dequantize_weight(wo_b, wo_b_scale).double())
    return {"out": out, "o": o, "y": y, "z": z} if intermediates else out
