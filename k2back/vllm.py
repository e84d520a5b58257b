"""vLLM's DeepSeek-V4.1 decode state -> k2back: the key table from vLLM's
metadata, and one callable in place of a layer's decode attention + `_o_proj`.

`key_table(...)` turns the metadata a decode step already holds (SPEC §1,
"Where the inputs come from in vLLM") into the kernel's `key_table` /
`key_len`, with the rule vLLM's own ROCm mono decode path uses (its K1
`stage_kt`, and `keylist.launch` on the index layers): per token t

    live     = slot_mapping[t] >= 0                 (a padded row has no keys)
    ntopk    = min((positions[t] + 1) // ratio, topk)  if live and ratio else 0
    nswa     = swa_lens[t]                           if live else 0
    entry k  = comp slot of topk_indices[t, k] | 1 << 31   k < ntopk (-1 stays -1)
               swa_indices[t, 0, k - ntopk]                 ntopk <= k < ntopk + nswa
               -1                                           after
    key_len  = ntopk + nswa
    comp slot of a local row l = comp_block_table[token_to_req[t], l // comp_block]
                                 * comp_block + l % comp_block

Only torch ops on device tensors, fixed shapes, no value read on the host:
safe under CUDA/HIP graph capture and `torch.compile(fullgraph=True)`; with
`out=` the results land in persistent buffers. Two guards keep hostile
metadata inside the tensors it indexes (where vLLM's Triton kernel would read
past them): `swa_lens` is clamped to 0..window, so a token never claims more
than its own row, and block-table lookups are clamped to the table. A slot
beyond a cache is harmless to the kernel: its buffer resources carry the
caches' real sizes, and a read past them returns zeros.

`DecodeBack` holds what a vLLM `DeepseekV4Attention` holds (sink, the layer's
cos/sin cache, the MXFP8 `wo_a` / `wo_b`, the two caches) and runs one decode
step from q and the step's metadata to the rank's `wo_b` partial; vLLM still
all-reduces it over TP, as after `_o_proj` today.

What this relies on in vLLM (read in vllm-project/vllm; commits per file):
- vllm/models/deepseek_v41/amd/mono/keylist.py @ 2d52951b, fd7da163 and
  mono/attention/front.py `stage_kt` @ ced9930d: the table layout and the rule
  above (ntopk from the position, -1 holes kept, padded rows empty).
- vllm/v1/attention/backends/mla/sparse_swa.py @ 03dc5649
  (`_compute_swa_indices_and_lens_kernel`) and
  vllm/models/deepseek_v41/amd/swa_decode_meta.py @ 2d52951b:
  `decode_swa_indices` int32 [T, 1, window], oldest first, -1 padded;
  `decode_swa_lens` = the window length (0 for an invalid token, whose row is
  not rewritten: only the first swa_lens entries are read here).
- vllm/models/deepseek_v41/amd/rocm.py @ 0a743a13
  (`compute_global_topk_ragged_indices_and_indptr`, `_o_proj`,
  `prepare_attn_preshuffle`): local top-k rows through the compressed block
  table with `block_size // compress_ratio` records a page; `_o_proj` =
  inverse RoPE + wo_a + wo_b with the TP all-reduce; `wo_a` / `wo_b` block
  scales in `weight_scale_inv`, and `wo_b.weight` shuffled in place when aiter
  is on.
- vllm/models/deepseek_v41/attention.py @ 02ee13be: `attn_sink` fp32
  [padded_heads] (= the rank's heads on ROCm), `rotary_emb.cos_sin_cache`,
  `swa_cache_layer.kv_cache` / `.block_size`, `_compressed_kv_cache()`,
  `compress_ratio` in (0, 1, 2), `topk_indices_buffer` [max_tokens, topk].
"""

from __future__ import annotations

import torch

from k2back import formats as F
from k2back import model
from k2back.config import RATIOS
from k2back.validate import RULES, TensorRule, check_block, check_tensor, fail

# vLLM's decode metadata, by the names of `key_table`'s arguments ("S" = the
# step's tokens T; strided views are fine: only torch reads them).
METADATA: dict[str, TensorRule] = {
    "positions": TensorRule((torch.int64,), ("S",), contiguous=False),
    "slot_mapping": TensorRule((torch.int64,), ("S",), contiguous=False),
    "swa_indices": TensorRule((torch.int32,), lambda rank: ("S", 1, rank.geometry.window),
                              contiguous=False),
    "swa_lens": TensorRule((torch.int32,), ("S",), contiguous=False),
    "token_to_req": TensorRule((torch.int32,), ("S",), contiguous=False),
    "topk_indices": TensorRule((torch.int32,), lambda rank: ("S", rank.geometry.topk),
                               contiguous=False),
    "comp_block_table": TensorRule((torch.int32,), (None, None), contiguous=False),
}
COMPRESSED_ONLY = ("topk_indices", "comp_block_table", "token_to_req")  # unused at ratio 0
NONE_IF_WINDOW_ONLY = ("topk_indices", "comp_block_table")
OUTPUTS = ("key_table", "key_len")  # the kernel's own rules (validate.RULES)
INT32_WRAP = 1 << 32  # bit 31 set = a negative int32


def _check_metadata(g: model.Geometry, args: dict, ratio: int, comp_block, out) -> None:
    if isinstance(ratio, bool) or ratio not in RATIOS:
        fail(ValueError, "ratio", f"one of {RATIOS}", repr(ratio))
    positions = args["positions"]
    if not isinstance(positions, torch.Tensor) or positions.dim() != 1:
        fail(TypeError, "positions", "an int64 tensor [T]", type(positions).__name__)
    rank, tokens, device = g.rank(1), positions.shape[0], positions.device  # no TP in a table
    for name, rule in METADATA.items():
        given = args[name]
        if ratio == 0 and name in COMPRESSED_ONLY:
            if given is None:
                continue
            if name in NONE_IF_WINDOW_ONLY:
                fail(ValueError, name, "None on a window-only layer (ratio 0)", "a tensor")
        elif given is None:
            fail(ValueError, name, f"a tensor on a layer with compressed keys (ratio {ratio})",
                  "None")
        check_tensor(name, given, rule, rank, tokens, device)
    if ratio:
        check_block("comp_block", comp_block)
        if 0 in args["comp_block_table"].shape:
            fail(ValueError, "comp_block_table", "at least one request and one page",
                  f"shape {tuple(args['comp_block_table'].shape)}")
    if out is not None:
        if not isinstance(out, (tuple, list)) or len(out) != len(OUTPUTS):
            fail(TypeError, "out", f"a pair {OUTPUTS}", type(out).__name__)
        for name, tensor in zip(OUTPUTS, out):
            check_tensor(f"out[{name}]", tensor, RULES[name], rank, tokens, device)


def key_table(positions, slot_mapping, swa_indices, swa_lens, topk_indices, comp_block_table,
              token_to_req, comp_block, ratio, *, geometry: str = model.DEFAULT_GEOMETRY,
              out=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(key_table int32 [T, KEYS], key_len int32 [T]) from vLLM's decode
    metadata of T tokens (module doc): `positions` int64 [T], `slot_mapping`
    int64 [T], `swa_indices` int32 [T, 1, window] (`decode_swa_indices`),
    `swa_lens` int32 [T], `topk_indices` int32 [T, topk] (local compressed
    rows: `topk_indices_buffer[:T]`), `comp_block_table` int32 [requests,
    pages] (the compressed cache's), `token_to_req` int32 [T], `comp_block`
    the compressed records a page, `ratio` the layer's compress ratio
    (`topk_indices` and `comp_block_table` None at 0). KEYS = the geometry's
    topk + window; the window and top-k widths must be the geometry's.
    out: (key_table, key_len) to write into (persistent buffers); else new."""
    g = model.geometry(geometry)
    args = {"positions": positions, "slot_mapping": slot_mapping, "swa_indices": swa_indices,
            "swa_lens": swa_lens, "token_to_req": token_to_req, "topk_indices": topk_indices,
            "comp_block_table": comp_block_table}
    _check_metadata(g, args, ratio, comp_block, out)
    tokens, device = positions.shape[0], positions.device
    if out is None:
        out = (torch.empty((tokens, g.keys), dtype=torch.int32, device=device),
               torch.empty(tokens, dtype=torch.int32, device=device))
    table, length = out
    column = torch.arange(g.keys, device=device)
    live = slot_mapping >= 0
    nswa = torch.where(live, swa_lens.long().clamp(0, g.window), 0)
    if ratio:
        ntopk = torch.where(live, ((positions + 1) // ratio).clamp(0, g.topk), 0)
    else:
        ntopk = torch.zeros_like(nswa)
    torch.add(ntopk, nswa, out=length)
    # the window part: entry k - ntopk of the token's window row
    window_at = (column - ntopk[:, None]).clamp(0, g.window - 1)
    entries = torch.where(column < (ntopk + nswa)[:, None],
                          swa_indices.reshape(tokens, g.window).long().gather(1, window_at),
                          F.NO_KEY)
    if ratio:
        compressed = _compressed_entries(g, topk_indices, comp_block_table, token_to_req,
                                         comp_block)
        entries = torch.where(column < ntopk[:, None], compressed, entries)
    table.copy_(entries)
    return table, length


def _compressed_entries(g: model.Geometry, topk_indices, block_table, token_to_req,
                        comp_block: int) -> torch.Tensor:
    """[T, KEYS] int64: each local top-k row's slot in the compressed cache as
    a table entry (`slot | 1 << 31`, as a negative int32), -1 where the row is
    -1; columns past the top-k are -1 (only the window follows)."""
    local = torch.nn.functional.pad(topk_indices.long(), (0, g.window), value=F.NO_KEY)
    row = local.clamp(min=0)
    request = token_to_req.long().clamp(0, block_table.shape[0] - 1)[:, None]
    page = block_table[request, (row // comp_block).clamp(max=block_table.shape[1] - 1)]
    slot = page.long() * comp_block + row % comp_block
    return torch.where(local >= 0, (slot | F.COMPRESSED_BIT) - INT32_WRAP, F.NO_KEY)


class DecodeBack:
    """The back half of one vLLM `DeepseekV4Attention` layer on one TP rank
    for decode steps: `back(q, positions, slot_mapping, swa_indices, swa_lens,
    topk_indices, comp_block_table, token_to_req)` -> the rank's `wo_b`
    partial bf16 [T, hidden] (README "From vLLM").

    The tensors are the layer's, as vLLM holds them: `attn_sink` fp32 (the
    rank's heads, or the model's: then sliced at tp_rank), the layer's
    `rotary_emb.cos_sin_cache`, `wo_a` / `wo_b` e4m3fn with their UE8M0 block
    scales (`weight_scale_inv`; uint8 or float8_e8m0fnu; the rank's shards, or
    the model's: then sliced at tp_rank), the window cache and, on a layer of
    ratio 1 or 2, the compressed cache ([pages, page_bytes] or vLLM's
    [pages, block, 584] view) with their records a page.
    swa_fp8 / comp_fp8: each cache's key bytes, "auto" (what vLLM writes on the
    arch), "e4m3fn" or "e4m3fnuz" (AttentionBack's).
    The key table lives in persistent buffers of max_tokens rows (graph capture)."""

    def __init__(self, *, attn_sink, cos_sin_cache, wo_a, wo_a_scale, wo_b, wo_b_scale,
                 tp_rank: int, tp_size: int, ratio: int, swa_cache, swa_block: int,
                 comp_cache=None, comp_block: int = 0, geometry: str = model.DEFAULT_GEOMETRY,
                 arch: str = "auto", backend: str = "auto", max_tokens: int = 64,
                 qk_scale: float | None = None, swa_fp8: str = "auto", comp_fp8: str = "auto"):
        from k2back.api import AttentionBack  # the kernel side: key_table alone needs only torch

        self.geometry = model.geometry(geometry)
        rank = self.geometry.rank(tp_size)
        if isinstance(tp_rank, bool) or not isinstance(tp_rank, int) or not 0 <= tp_rank < tp_size:
            fail(ValueError, "tp_rank", f"an int in 0..{tp_size - 1}", repr(tp_rank))
        self.attention = AttentionBack(geometry, tp=tp_size, ratio=ratio, arch=arch,
                                       max_tokens=max_tokens, backend=backend,
                                       swa_fp8=swa_fp8, comp_fp8=comp_fp8)
        self.ratio, self.qk_scale = ratio, qk_scale
        shards = _shards(rank)
        self.weights = {name: _rank_share(tensor, *shards[name], rank.tp, tp_rank)
                        for name, tensor in (("sink", attn_sink), ("wo_a", wo_a),
                                             ("wo_a_scale", _codes(wo_a_scale)), ("wo_b", wo_b),
                                             ("wo_b_scale", _codes(wo_b_scale)))}
        self.caches = {"swa_cache": _pages(swa_cache), "swa_block": swa_block,
                       "comp_cache": _pages(comp_cache), "comp_block": comp_block}
        self.cos_sin = cos_sin_cache
        if not isinstance(swa_cache, torch.Tensor):
            fail(TypeError, "swa_cache", "a uint8 tensor of pages", type(swa_cache).__name__)
        device = swa_cache.device
        self.key_table = torch.full((max_tokens, rank.keys), F.NO_KEY, dtype=torch.int32,
                                    device=device)
        self.key_len = torch.zeros(max_tokens, dtype=torch.int32, device=device)

    def __call__(self, q, positions, slot_mapping, swa_indices, swa_lens, topk_indices=None,
                 comp_block_table=None, token_to_req=None, *, out=None) -> torch.Tensor:
        tokens = q.shape[0] if isinstance(q, torch.Tensor) and q.dim() else 0
        if not 1 <= tokens <= self.key_table.shape[0]:
            fail(ValueError, "q", f"1..{self.key_table.shape[0]} tokens (max_tokens)", tokens)
        if not isinstance(positions, torch.Tensor) or tuple(positions.shape) != (tokens,):
            fail(ValueError, "positions", f"shape ({tokens},) (q's tokens)",
                  tuple(getattr(positions, "shape", ())))
        table, length = key_table(
            positions, slot_mapping, swa_indices, swa_lens, topk_indices, comp_block_table,
            token_to_req, self.caches["comp_block"], self.ratio, geometry=self.geometry.name,
            out=(self.key_table[:tokens], self.key_len[:tokens]))
        return self.attention(q, table, length, positions, cos_sin=self.cos_sin, **self.caches,
                              **self.weights, out=out, qk_scale=self.qk_scale)


def _shards(rank: model.RankShape) -> dict[str, tuple[int, int]]:
    """(dim, the rank's length along it) of every per-rank tensor: its heads of
    the sink, its groups' rows of wo_a and columns of wo_b (and their 32-wide
    scale blocks)."""
    rows = rank.o_rows
    return {"sink": (0, rank.heads), "wo_a": (0, rows), "wo_a_scale": (0, rows // model.MX_BLOCK),
            "wo_b": (1, rows), "wo_b_scale": (1, rows // model.MX_BLOCK)}


def _rank_share(tensor, dim: int, length: int, tp: int, tp_rank: int):
    """The rank's slice of a full-model tensor (length · tp along dim); a
    tensor of any other size is passed on as given (the launch checks it)."""
    full = tp > 1 and isinstance(tensor, torch.Tensor) and tensor.dim() > dim \
        and tensor.shape[dim] == tp * length
    return tensor.narrow(dim, tp_rank * length, length).contiguous() if full else tensor


def _codes(scale):
    """UE8M0 block scales as the kernel reads them: uint8 codes (torch's
    float8_e8m0fnu holds the same bytes)."""
    if isinstance(scale, torch.Tensor) and scale.dtype == torch.float8_e8m0fnu:
        return scale.view(torch.uint8)
    return scale


def _pages(cache):
    """vLLM's [pages, block, 584] cache view -> [pages, page_bytes] (its own
    `kv_cache.view(pages, -1)`: the page stride is kept)."""
    if isinstance(cache, torch.Tensor) and cache.dim() == 3:
        return cache.view(cache.shape[0], -1)
    return cache
