"""Realistic launch inputs in vLLM's formats, and calibrated comparison.

`make_inputs` builds every argument of `reference.attention_back` (and of a
launch) for one rank: bf16 queries, fp8_ds_mla KV pages written by the writer's
rule, key tables, positions, V4.1's YaRN cos/sin table, sinks and MXFP8
weights. The full model is generated first and then sliced per rank
(`rank_slice`), so the ranks of one seed are shards of one model and their
`out`s sum to the TP = 1 `out`.

`compare(name, got, want)` is the one acceptance check kernel tests use; its
tolerances (`TOLERANCES`) are derived in the docstring there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Callable

import torch

from k2back import formats as F
from k2back.model import HEAD_DIM, HEADS_PER_GROUP, MX_BLOCK, NOPE_DIM, ROPE_DIM, Rope, geometry

LAUNCH_ARGS = ("q", "key_table", "key_len", "positions", "swa_cache", "swa_block", "comp_cache",
               "comp_block", "cos_sin", "sink", "wo_a", "wo_a_scale", "wo_b", "wo_b_scale",
               "qk_scale")
RATIOS = (0, 1, 2)
BLOCK_SIZES = (32, 64)


# --- rope ------------------------------------------------------------------


def yarn_inv_freq(rope: Rope) -> torch.Tensor:
    """V4.1's YaRN frequencies f_0..31 (float64): DeepSeek's ramp between the
    extrapolated (θ^(-2i/64)) and interpolated (÷ factor) frequencies over the
    dims whose wavelengths fall between β_fast and β_slow rotations of the
    original context."""
    dim = ROPE_DIM
    extra = rope.theta ** -(torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    inter = extra / rope.factor

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(rope.original_max_position / (rotations * 2 * math.pi))
                / (2 * math.log(rope.theta)))

    low = max(math.floor(correction_dim(rope.beta_fast)), 0)
    high = min(math.ceil(correction_dim(rope.beta_slow)), dim - 1)
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / max(high - low, 1e-3)).clamp(0, 1)
    extrapolate = 1.0 - ramp  # 1: keep θ's frequency, 0: interpolate
    return inter * (1 - extrapolate) + extra * extrapolate


def rope_table(rope: Rope, rows: int) -> torch.Tensor:
    """cos_sin fp32 [rows, 64]: row p = cos(p·f_0..31), sin(p·f_0..31) (no mscale)."""
    angles = torch.arange(rows, dtype=torch.float64)[:, None] * yarn_inv_freq(rope)[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=1).float()


def rotate(x: torch.Tensor, cos_sin_rows: torch.Tensor) -> torch.Tensor:
    """Forward GPT-J RoPE of x's last 64 dims (pairs 2i, 2i + 1) with rows
    cos_sin_rows broadcast over x's middle dims (float64 inside)."""
    half = ROPE_DIM // 2
    cos, sin = cos_sin_rows[..., :half].double(), cos_sin_rows[..., half:].double()
    e, o = x[..., NOPE_DIM::2].double(), x[..., NOPE_DIM + 1::2].double()
    rot = torch.stack([e * cos - o * sin, o * cos + e * sin], dim=-1).flatten(-2)
    return torch.cat([x[..., :NOPE_DIM], rot.to(x.dtype)], dim=-1)


# --- generator options -----------------------------------------------------


@dataclass(frozen=True)
class InputOptions:
    """What make_inputs draws, beyond the arguments themselves.

    swa_block / comp_block: records a page holds (None: drawn from 32, 64).
    page_pad: extra 576-B units after a page's scale tail (None: drawn 0..2).
    max_pos: positions are drawn below it; cos_sin has exactly max_pos rows
        (None: 2·(window + top-k·max(ratio, 1)), so tables range from a single
        key (position 0) through full windows and saturated top-k).
    hole_fraction: share of entries inside key_len set to −1 (a top-k may
        return fewer rows than asked).
    stale_tail: fill entries past key_len with earlier valid entries instead
        of −1 (a reused table: they must be ignored).
    key_transform: applied to the fp32 keys before the writer packs them
        (e.g. all nope dims −0.0 to get pages full of 0x80 bytes).
    """

    swa_block: int | None = None
    comp_block: int | None = None
    page_pad: int | None = None
    max_pos: int | None = None
    hole_fraction: float = 0.03
    stale_tail: bool = False
    key_transform: Callable[[torch.Tensor], torch.Tensor] | None = None


OPTION_NAMES = tuple(f.name for f in fields(InputOptions))


class _Draw:
    """A seeded CPU generator with the few distributions the inputs need."""

    def __init__(self, seed: int):
        self.g = torch.Generator().manual_seed(seed)

    def normal(self, *shape) -> torch.Tensor:
        return torch.randn(*shape, generator=self.g)

    def ints(self, low: int, high: int, *shape) -> torch.Tensor:
        return torch.randint(low, high, shape, generator=self.g)

    def int(self, low: int, high: int) -> int:
        return int(self.ints(low, high, 1))

    def perm(self, n: int) -> torch.Tensor:
        return torch.randperm(n, generator=self.g)

    def choice(self, values):
        return values[self.int(0, len(values))]

    def bytes(self, *shape) -> torch.Tensor:
        return torch.randint(0, 256, shape, generator=self.g, dtype=torch.uint8)


# --- the pieces of a launch --------------------------------------------------


def _positions(d: _Draw, tokens: int, max_pos: int, window: int) -> torch.Tensor:
    """Uniform positions plus the edges users hit: 0, a few keys, the last row."""
    pos = d.ints(0, max_pos, tokens)
    edges = [0, d.int(1, max(window // 4, 2)), max_pos - 1]
    for t, p in zip(d.perm(tokens).tolist(), edges[: max(tokens - 1, 0)]):
        pos[t] = p
    return pos


@dataclass
class _Cache:
    """One cache's page allocation, sequence by sequence, then its packing."""

    block: int
    pages_used: int = 0

    def place(self, rows: torch.Tensor) -> torch.Tensor:
        """Slots of a sequence's logical rows: each logical page its own
        physical page (assigned in order here, shuffled at packing)."""
        logical = rows // self.block
        pages, local = torch.unique(logical, return_inverse=True)
        slot = (self.pages_used + local) * self.block + rows % self.block
        self.pages_used += len(pages)
        return slot

    def pack(self, d: _Draw, keys: torch.Tensor, slots: torch.Tensor, page_pad: int):
        spare = 3  # pages no record uses: garbage a wrong address would read
        pages = self.pages_used + spare
        shuffle = d.perm(pages)  # logical allocation order -> scattered pages
        slots = shuffle[slots // self.block] * self.block + slots % self.block
        nbytes = F.page_bytes(self.block, page_pad)
        return F.pack_kv_pages(keys, slots, self.block, pages, nbytes,
                               fill=d.bytes(pages, nbytes)), slots


def _keys(d: _Draw, n: int, channel_gain: torch.Tensor, cos_sin_rows: torch.Tensor):
    """n keys like V4's normalized KV: per-channel gains, rope dims rotated."""
    k = d.normal(n, HEAD_DIM) * channel_gain
    return F.bf16_round(rotate(k, cos_sin_rows))


def _channel_gain(d: _Draw) -> torch.Tensor:
    """The KV norm's learned gains: log-normal, a few outlier channels, and
    quiet channels whose values fall far below their block's max (±0 bytes,
    0x80 included, and fp8 subnormals)."""
    gain = torch.exp(0.5 * d.normal(HEAD_DIM))
    nope = d.perm(NOPE_DIM)
    gain[nope[:6]] *= 4.0
    gain[nope[6:30]] *= 1e-6
    return gain


def _key_tables(d, g, ratio, positions, opts, cos_sin, blocks):
    """Key tables, key_len and the two caches for every token's sequence."""
    tokens, keys = len(positions), g.keys
    table = torch.full((tokens, keys), F.NO_KEY, dtype=torch.int32)
    key_len = torch.zeros(tokens, dtype=torch.int32)
    caches = {"swa": _Cache(blocks["swa"]), "comp": _Cache(blocks["comp"])}
    gain = _channel_gain(d)
    content = {"swa": [], "comp": []}
    for t, p in enumerate(positions.tolist()):
        n_comp = (p + 1) // ratio if ratio else 0
        comp_rows = d.perm(n_comp)[: g.topk] if n_comp else torch.zeros(0, dtype=torch.long)
        win_rows = torch.arange(max(0, p - g.window + 1), p + 1)
        entries = []
        for name, rows, key_pos, compressed in (
            ("comp", comp_rows, comp_rows * ratio + ratio - 1, True),
            ("swa", win_rows, win_rows, False),
        ):
            slots = caches[name].place(rows)
            content[name].append((slots, key_pos))
            entries.append(F.key_entry(slots, compressed))
        row = torch.cat(entries)
        n = len(row)
        holes = torch.rand(n, generator=d.g) < opts.hole_fraction
        table[t, :n] = torch.where(holes, F.NO_KEY, row)
        if opts.stale_tail and n:
            table[t, n:] = row[d.ints(0, n, keys - n)]
        key_len[t] = n
    packed = {}
    for name, cache in caches.items():
        slots = torch.cat([s for s, _ in content[name]])
        key_pos = torch.cat([kp for _, kp in content[name]])
        keys_ = _keys(d, len(slots), gain, cos_sin[key_pos])
        if opts.key_transform is not None:
            keys_ = opts.key_transform(keys_)
        packed[name], physical = cache.pack(d, keys_, slots, opts.page_pad)
        _relocate(table, slots, physical, compressed=name == "comp")
    return table, key_len, packed


def _relocate(table: torch.Tensor, logical: torch.Tensor, physical: torch.Tensor, compressed: bool):
    """Rewrite a cache's table entries from allocation-order slots to the
    shuffled physical slots."""
    slot, comp, present = F.decode_key_table(table)
    mine = present & (comp == compressed)
    if not mine.any():
        return
    lookup = torch.full((int(logical.max()) + 1,), -1, dtype=torch.long)
    lookup[logical] = physical
    table[mine] = F.key_entry(lookup[slot[mine]], compressed)


def _queries(d: _Draw, tokens: int, heads: int, cos_sin_rows: torch.Tensor) -> torch.Tensor:
    """Per-head RMS-normed q with a per-head temperature (peaked and flat
    heads), rope dims rotated at the token's position, bf16."""
    q = d.normal(tokens, heads, HEAD_DIM)
    q = q / q.pow(2).mean(-1, keepdim=True).sqrt()
    temperature = 0.3 + 2.2 * torch.rand(heads, 1, generator=d.g)
    q = q * torch.exp(0.3 * d.normal(HEAD_DIM)) * temperature
    return rotate(q, cos_sin_rows[:, None, :]).to(torch.bfloat16)


def _weight(d: _Draw, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A trained-looking projection (1/√fan-in, per-row gains, sparse outliers),
    MXFP8 with 32×32 blocks."""
    w = d.normal(rows, cols) / math.sqrt(cols) * torch.exp(0.3 * d.normal(rows, 1))
    outliers = torch.rand(rows, cols, generator=d.g) < 1e-3
    w = torch.where(outliers, w * 10.0, w)
    return F.mxfp8_quantize_weight(F.bf16_round(w))


# --- make_inputs -------------------------------------------------------------


def make_inputs(geometry_name, tp: int, tokens: int, ratio: int, seed: int, *, rank: int = 0,
                **overrides) -> dict:
    """Every launch argument of rank `rank` of a TP `tp` model, keyed by
    `attention_back`'s argument names (block sizes as ints, qk_scale a float).

    ratio: 0 = window-only layer (comp_cache None, no compressed entries);
    1, 2 = compression ratio of the compressed cache: a token at position p has
    (p + 1) // ratio compressed rows, of which the top-k (a random subset in
    random order) enter its table before its min(window, p + 1) window rows.

    overrides: an argument name with a tensor (used as is), None, or a number
    (fills that argument's shape and dtype: key_len=0, sink=inf, positions=0);
    or an InputOptions field (swa_block=64, stale_tail=True, ...)."""
    g = geometry(geometry_name)
    g.rank(tp)  # tp must divide the model
    if ratio not in RATIOS:
        raise ValueError(f"ratio: expected one of {RATIOS}, got {ratio!r}")
    unknown = set(overrides) - set(LAUNCH_ARGS) - set(OPTION_NAMES)
    if unknown:
        raise TypeError(f"make_inputs: unknown overrides {sorted(unknown)}; expected launch "
                        f"arguments {LAUNCH_ARGS} or options {OPTION_NAMES}")
    d = _Draw(seed)
    opts = replace(InputOptions(), **{k: v for k, v in overrides.items() if k in OPTION_NAMES})
    opts = replace(
        opts,
        swa_block=opts.swa_block or d.choice(BLOCK_SIZES),
        comp_block=opts.comp_block or d.choice(BLOCK_SIZES),
        page_pad=d.int(0, 3) if opts.page_pad is None else opts.page_pad,
        max_pos=opts.max_pos or 2 * (g.window + g.topk * max(ratio, 1)),
    )
    cos_sin = rope_table(g.rope, opts.max_pos)
    positions = _positions(d, tokens, opts.max_pos, g.window)
    table, key_len, caches = _key_tables(
        d, g, ratio, positions, opts, cos_sin, {"swa": opts.swa_block, "comp": opts.comp_block})
    sink = 3.0 + 2.0 * d.normal(g.heads)
    wo_a, wo_a_scale = _weight(d, g.groups * g.o_rank, g.group_k)
    wo_b, wo_b_scale = _weight(d, g.hidden, g.groups * g.o_rank)
    full = {
        "q": _queries(d, tokens, g.heads, cos_sin[positions]),
        "key_table": table, "key_len": key_len, "positions": positions,
        "swa_cache": caches["swa"], "swa_block": opts.swa_block,
        "comp_cache": caches["comp"] if ratio else None, "comp_block": opts.comp_block,
        "cos_sin": cos_sin, "sink": sink,
        "wo_a": wo_a, "wo_a_scale": wo_a_scale, "wo_b": wo_b, "wo_b_scale": wo_b_scale,
        "qk_scale": g.qk_scale,
    }
    inputs = rank_slice(full, tp, rank)
    for name, value in overrides.items():
        if name in LAUNCH_ARGS:
            inputs[name] = _override(inputs[name], value)
    return inputs


def _override(current, value):
    if value is None or isinstance(value, torch.Tensor) or not isinstance(current, torch.Tensor):
        return value
    return torch.full_like(current, value)


def rank_slice(full: dict, tp: int, rank: int) -> dict:
    """Rank `rank`'s share of full-model inputs: its heads of q and sink, its
    groups' rows of wo_a and columns of wo_b (with their scale blocks); the
    rest is shared."""
    heads = full["q"].shape[1] // tp
    if not 0 <= rank < tp:
        raise ValueError(f"rank: expected 0 <= rank < {tp}, got {rank}")
    rows = full["wo_a"].shape[0] // tp  # this rank's o_rows: groups × o_rank
    h, r = slice(rank * heads, (rank + 1) * heads), slice(rank * rows, (rank + 1) * rows)
    rb = slice(r.start // MX_BLOCK, r.stop // MX_BLOCK)
    assert heads % HEADS_PER_GROUP == 0 and rows % MX_BLOCK == 0
    return {
        **full,
        "q": full["q"][:, h].contiguous(), "sink": full["sink"][h].contiguous(),
        "wo_a": full["wo_a"][r].contiguous(), "wo_a_scale": full["wo_a_scale"][rb].contiguous(),
        "wo_b": full["wo_b"][:, r].contiguous(), "wo_b_scale": full["wo_b_scale"][:, rb].contiguous(),
    }
