"""One decode step of vLLM's DeepSeek-V4.1 ROCm path, as vLLM holds it: the
metadata `k2back.vllm.key_table` reads and the two paged caches it points
into, drawn at random with the cases a deployment meets.

- several requests, some with two tokens in the step (MTP / DSpark drafts);
  each request's block tables point at shuffled physical pages;
- positions at 0 and 1, around the window (W - 1, W, W + 1), around top-k ·
  ratio (the top-k saturates), and uniform;
- padded rows (slot -1) at the end and one in the middle, their window rows
  left stale as vLLM's builder leaves them (it writes only their length 0);
- top-k rows as the indexer writes them: a random subset of the token's
  compressed rows in random order, -1 holes, -1 past the rows that exist
  (some rows carry stale local rows there instead: they must be ignored).

`window_rows` and `compressed_rows` give, per token, the slots vLLM's decoder
walks (its ragged form): the window, then the compressed rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from k2back import formats as F
from k2back.model import HEAD_DIM, geometry


@dataclass
class Step:
    positions: torch.Tensor  # int64 [T]
    slot_mapping: torch.Tensor  # int64 [T], -1 = padded row
    swa_indices: torch.Tensor  # int32 [T, 1, W]
    swa_lens: torch.Tensor  # int32 [T]
    topk_indices: torch.Tensor | None  # int32 [T, topk], local compressed rows
    comp_block_table: torch.Tensor | None  # int32 [requests, pages]
    token_to_req: torch.Tensor  # int32 [T]
    swa_cache: torch.Tensor  # uint8 [pages, page_bytes]
    swa_block: int
    comp_cache: torch.Tensor | None
    comp_block: int
    ratio: int

    def metadata(self) -> dict:
        """key_table's arguments by name."""
        return {name: getattr(self, name) for name in (
            "positions", "slot_mapping", "swa_indices", "swa_lens", "topk_indices",
            "comp_block_table", "token_to_req", "comp_block", "ratio")}


class _Pages:
    """A paged cache's pool: each request's logical pages on shuffled physical ones."""

    def __init__(self, g: torch.Generator, block: int, pages_per_request: list[int]):
        self.block = block
        self.pages = sum(pages_per_request) + 2  # 2 pages nobody owns
        physical = torch.randperm(self.pages, generator=g)
        width = max(pages_per_request)
        self.table = torch.zeros((len(pages_per_request), width), dtype=torch.int32)
        at = 0
        for r, n in enumerate(pages_per_request):
            self.table[r, :n] = physical[at:at + n].to(torch.int32)
            at += n

    def slot(self, request: int, row: int) -> int:
        return int(self.table[request, row // self.block]) * self.block + row % self.block

    def cache(self, g: torch.Generator, pad: int, writer: F.KvWriter) -> torch.Tensor:
        """Every record of every page a random bf16 key as `writer` writes it;
        padding random bytes."""
        slots = torch.arange(self.pages * self.block)
        keys = F.bf16_round(torch.randn(len(slots), HEAD_DIM, generator=g))
        nbytes = F.page_bytes(self.block, pad)
        fill = torch.randint(0, 256, (self.pages, nbytes), generator=g, dtype=torch.uint8)
        return F.pack_kv_pages(keys, slots, self.block, self.pages, writer, page_bytes_=nbytes,
                               fill=fill)


def _last_positions(g: torch.Generator, geo, ratio: int, requests: int, max_pos: int) -> list[int]:
    """Each request's last position: one near 0, one around the window, one
    around the top-k's saturation (top-k · ratio), then uniform."""
    w, saturate = geo.window, geo.topk * max(ratio, 1)
    edges = ((0, 1), (w - 1, w, w + 1), (saturate - 1, saturate, saturate + 3))
    chosen = [group[int(torch.randint(0, len(group), (1,), generator=g))] for group in edges]
    chosen += [int(p) for p in torch.randint(0, max_pos, (max(requests - 3, 0),), generator=g)]
    return [chosen[int(i)] for i in torch.randperm(len(chosen), generator=g)[:requests]]


def draw_step(geometry_name: str, ratio: int, seed: int, *, requests: int = 4,
              max_pos: int | None = None, padded: int = 2, block_sizes=(16, 32),
              comp_block_sizes=(4, 8, 16), arch: str = "gfx950") -> Step:
    """A step whose caches hold the bytes vLLM's writers write on `arch`."""
    geo = geometry(geometry_name)
    swa_writer, comp_writer = F.cache_writers(arch, *F.resolve_key_fp8(arch))
    g = torch.Generator().manual_seed(seed)
    pick = lambda values: values[int(torch.randint(0, len(values), (1,), generator=g))]
    max_pos = max_pos or 2 * (geo.window + geo.topk * max(ratio, 1))
    swa_block, comp_block = pick(block_sizes), pick(comp_block_sizes)
    last = _last_positions(g, geo, ratio, requests, max_pos)
    # (request, position) of each live token: one or two tokens a request
    tokens = []
    for r, p in enumerate(last):
        first = p - int(torch.randint(0, 2, (1,), generator=g)) if p > 0 else p
        tokens += [(r, q) for q in range(first, p + 1)]
    middle = int(torch.randint(0, len(tokens) + 1, (1,), generator=g))
    rows = tokens[:middle] + [None] + tokens[middle:] + [None] * (padded - 1)
    swa = _Pages(g, swa_block, [p // swa_block + 1 for p in last])
    n_comp = [(p + 1) // ratio if ratio else 0 for p in last]
    comp = _Pages(g, comp_block, [max(n, 1) // comp_block + 1 for n in n_comp]) if ratio else None

    T, W = len(rows), geo.window
    stale = torch.randint(-1, 1 << 20, (T, 1, W), generator=g, dtype=torch.int32)
    step = Step(
        positions=torch.zeros(T, dtype=torch.int64),
        slot_mapping=torch.full((T,), -1, dtype=torch.int64),
        swa_indices=stale,
        swa_lens=torch.randint(1, W + 1, (T,), generator=g, dtype=torch.int32),  # stale too
        topk_indices=(torch.randint(-1, 1 << 20, (T, geo.topk), generator=g, dtype=torch.int32)
                      if ratio else None),
        comp_block_table=comp.table if ratio else None,
        token_to_req=torch.zeros(T, dtype=torch.int32),
        swa_cache=swa.cache(g, pick((0, 1)), swa_writer), swa_block=swa_block,
        comp_cache=comp.cache(g, pick((0, 1)), comp_writer) if ratio else None, comp_block=comp_block,
        ratio=ratio)
    for t, row in enumerate(rows):
        if row is None:  # a padded row: slot -1, everything else stale
            continue
        r, p = row
        step.positions[t], step.token_to_req[t] = p, r
        step.slot_mapping[t] = swa.slot(r, p)
        start = max(p - W + 1, 0)
        step.swa_lens[t] = p + 1 - start
        step.swa_indices[t, 0] = -1
        for i, q in enumerate(range(start, p + 1)):
            step.swa_indices[t, 0, i] = swa.slot(r, q)
        if ratio:
            _indexer_row(g, step.topk_indices[t], (p + 1) // ratio)
    return step


def _indexer_row(g: torch.Generator, row: torch.Tensor, n_comp: int) -> None:
    """The indexer's top-k of n_comp compressed rows: a random subset in random
    order, -1 holes, -1 past them (or, for some rows, stale local rows)."""
    topk = row.shape[0]
    chosen = torch.randperm(n_comp, generator=g)[:topk].to(torch.int32)
    holes = torch.rand(len(chosen), generator=g) < 0.05
    chosen[holes] = -1
    row[:len(chosen)] = chosen
    if torch.rand(1, generator=g) < 0.7:
        row[len(chosen):] = -1


def window_rows(step: Step, t: int, window: int) -> list[int]:
    """The window slots vLLM's decoder reads for token t (its ragged form)."""
    if step.slot_mapping[t] < 0:
        return []
    n = min(int(step.swa_lens[t]), window)
    return [int(s) for s in step.swa_indices[t, 0, :n] if s >= 0]


def compressed_rows(step: Step, t: int, topk: int) -> list[int]:
    """The compressed-cache slots vLLM's decoder reads for token t: the top-k's
    first min((pos + 1) // ratio, topk) entries that are not -1, through the
    request's block table."""
    if not step.ratio or step.slot_mapping[t] < 0:
        return []
    ntopk = min((int(step.positions[t]) + 1) // step.ratio, topk)
    request, cb = int(step.token_to_req[t]), step.comp_block
    return [int(step.comp_block_table[request, int(row) // cb]) * cb + int(row) % cb
            for row in step.topk_indices[t, :ntopk] if row >= 0]
