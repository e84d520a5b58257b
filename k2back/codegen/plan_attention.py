"""The attention half of the K2 plan: split (flash-decoding over key chunks) and
combine (chunks + sink -> inverse RoPE -> MXFP8 -> XO).

`plan_attention(rank, tokens, ratio, target) -> AttentionPlan` fixes every number
the split.ll.j2 / combine.ll.j2 templates need; plan.py embeds it in the
KernelSpec, unions `lds` with the GEMV stages' LDS and lays the `scratch`
regions out at 256-B aligned offsets.

Contract notes for plan.py / kernel.ll.j2 (see ARCHITECTURE.md):
- Tasks: split task = t·tasks_per_token + i covers chunks i·CPT ..
  min((i+1)·CPT, nchunk) - 1 of token t (CPT = chunks_per_task, consecutive
  chunks sharing one read of q), combine task = t·(H/CH) + head group (CH =
  combine_heads, 1 to 8 heads over 1 to 4 waves each); a wo_a group's 8 heads are
  8/CH consecutive combine tasks. One split flag a task: combine awaits the
  token's tasks_per_token flags.
- A split task stops at its first chunk that starts at or past key_len[t]
  (returning at once when that is its first) without writing that chunk's
  scratch; combine reads only the chunks below ceil(key_len[t] / CK), so
  those never need to be waited on (waiting on every split flag of the
  token is correct too: the kernel publishes them all).
- Every LDS member is dead when a stage function returns. The split stage
  writes LDS before its first barrier, so kernel.ll.j2 must put an
  `s_barrier` between two stage calls on a CTA (else the next task's first
  LDS write may race a slow wave's last read of the previous one).
- `qk_scale` (kernel argument) is the raw softmax scale (512^-0.5 by
  default); the split stage multiplies it by log2(e) itself.
- Each KV cache must stay below 4 GiB (`swa_bytes`, `comp_bytes` < 2^32):
  buffer offsets are 32-bit; a larger cache would wrap, not fault.
- Global bytes beyond SPEC §6's minimum: each split task rereads its token's
  q (H·1 KiB), each chunk hands over an H·1 KiB partial (the chunk size and
  the chunks a task trade them against parallelism: default_chunk_keys,
  chunks_per_task); every KV
  record is read once (with 4 key parts, 32-key chunks, each scale word
  twice), a table entry once by each wave sharing its key tile (key_parts ·
  4 B a key).
- Scratch regions (element layout, row-major):
    partials  bf16 [S, nchunk, H, 512]   a chunk's bf16(Σ bf16(p)·V) per head
    stats     f32  [S, nchunk, H, 2]     (m_c, l_c): chunk max in log2 units, Σ p
    xo        u8   [S, H·512]            OCP e4m3fn bytes of MXFP8(o), head-major
    xo_codes  u8   [S, H·512/32]         their UE8M0 codes
  split writes partials/stats, combine reads them and writes xo/xo_codes; all
  hand-off stores and loads are device scope (sc1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from k2back.codegen.targets import ArchInfo
from k2back.kv_format import KV_DATA_BYTES, KV_RECORD_BYTES, KV_SCALE_BYTES
from k2back.model import HEAD_DIM, HEADS_PER_GROUP, MX_BLOCK, NOPE_DIM, ROPE_DIM, RankShape

WAVES = 8  # 512 threads a CTA
WAVE = 64
KEY_TILE = 16  # keys of one QK MFMA (A rows) = one wave's share of a chunk
HEAD_TILE = 16  # heads of one MFMA (B columns)

# fp8_ds_mla record as the split stage keeps it raw in LDS: 576 data bytes,
# 8 scale bytes, 8 pad bytes so consecutive keys land 16 banks apart (PV reads
# a dword of 4 keys at a time) and every record stays 16-B aligned.
RAW_STRIDE = KV_DATA_BYTES + KV_SCALE_BYTES + 8
# A q row (one head, bf16) in LDS, padded by 16 B: the 16 lanes reading one
# column of 16 heads hit different banks.
Q_ROW = 2 * HEAD_DIM + 16
P_PAD = 16  # bytes after a head's row of bf16 p
DOTS_TILE = WAVE * 16  # a wave's partial scores of one head tile: f32x4 a lane
# A record as one lane group's 16-B loads take it: (name, kind, index, byte
# offset in the record, byte offset of the same dims in a bf16 q row); kind
# "n": e4m3 nope dims (a code each), "r": bf16 rope dims. Lane group g adds
# 16·g to the record offset, so four groups cover each 64-B piece.
RECORD_PIECES = (
    *((f"n{j}", "n", j, 64 * j, 2 * 64 * j) for j in range(NOPE_DIM // 64)),
    *((f"r{j}", "r", j, NOPE_DIM + 64 * j, 2 * NOPE_DIM + 64 * j)
      for j in range(2 * ROPE_DIM // 64)),
)
# bf16 dims a lane contributes to the QK of one piece: a nope piece's 16 B are
# 16 fp8 dims, a rope piece's 8 bf16 ones
PIECE_DIMS = {"n": 16, "r": 8}


# Chunk sizes the split stage supports: one to eight waves of 16 keys.
CHUNK_KEYS = (32, 64, 128)
# PV passes over a chunk's raw records, as LDS allows: all at once, or halves
# (of at least a key tile); or quarters, to make room for a resident q only:
# for a streamed q they would just buy larger chunks, which overflow the
# registers with 128 heads on gfx942 (v4-pro TP 1: 38 VGPRs spilled)
PV_PASSES = (1, 2)
PV_PASSES_Q_RESIDENT = (1, 2, 4)
# A key tile's record pieces split among the waves that share it (chunks of
# fewer than 128 keys leave 8 / key_tiles waves a tile): each part loads,
# dequantizes and scores its pieces, so every wave works. Balanced in MFMAs
# (a nope piece is 16 dims a lane, a rope piece 8).
PART_PIECES = {
    1: (("n0", "n1", "n2", "n3", "n4", "n5", "n6", "r0", "r1"),),
    2: (("n0", "n1", "n2", "n3"), ("n4", "n5", "n6", "r0", "r1")),
    4: (("n0", "n1"), ("n2", "n3"), ("n4", "n5"), ("n6", "r0", "r1")),
}
# LDS past every stage's members: the kernel's launch tag word (plan.py)
KERNEL_LDS = 16
MAX_CHUNKS = WAVE  # combine reads a token's chunk stats a lane a chunk
MIN_SPLIT_TASKS = 8
# chunks of a launch up to which the smallest chunk size is taken (default_chunk_keys):
# V4.1-Flash TP 4 S 2 rereads q 40 times, +3.3 % of the step's bytes
MAX_SHORT_CHUNKS = 40
SIMDS = 4  # a CU's SIMDs (CDNA3/CDNA4): waves of a CTA beyond 4 share one


@dataclass(frozen=True)
class AttentionPlan:
    """Everything the split and combine templates need, as plain numbers.

    Fields:
      arch, tokens (S), heads (H), keys (key-table width), ratio (0: window only,
        no comp_cache: compressed entries are treated as invalid)
      chunk_keys (CK), nchunk = ceil(keys / CK)
      chunks_per_task (CPT): consecutive chunks of one token a split task
        runs, q read once for all (in LDS, every head tile, when CPT > 1)
      tasks_per_token = ceil(nchunk / CPT)
      split_tasks = S·tasks_per_token, combine_tasks = S·H/combine_heads
      combine_heads, combine_waves: heads a combine task merges, waves a head
        (combine_shape): wave w merges dims of head w // combine_waves
      key_tiles = CK/16, key_parts <= 8/key_tiles (as many as LDS allows for
        the parts' dots): wave w < key_tiles·key_parts scores key tile
        w % key_tiles (keys c·CK + 16·tile ..) over the record pieces
        part_pieces[w // key_tiles]; part 0 sums the parts' dots and does the
        softmax; every wave then does the PV of dims 64w .. 64w+63
      head_tiles = ceil(H/16): QK runs once a head tile, q of one tile in LDS
        (CPT = 1: streamed a tile at a time) or of all (CPT > 1)
      mfma_k: bf16 elements a lane supplies an MFMA (4 on gfx942, 8 on gfx950)
      head_dim, nope_dims, rope_dims: a head's dims, the fp8 ones, the bf16 ones
      kv_data_bytes, kv_scale_bytes: an fp8_ds_mla record's data and scale bytes
      q_row, p_row, raw_stride: LDS bytes of a q row (bf16 + pad), of a
        head's p row (CK·2 + P_PAD) and of a raw record
      record_pieces: (name, kind "n"/"r", index, record byte, q row byte) of
        each 64-B piece
      qk_operands: the QK MFMAs of a key tile, in record order: (piece, kind,
        index, part, o, q row byte): piece `piece`'s o-th mfma_k dims a lane,
        against q row bytes from `q row byte`, run by part `part`
      part_mfmas: QK MFMAs of each part (a chain: its dot is the last one)
      scale_words: 4-byte words of a record's scale bytes
      part_pieces: the pieces each part of a key tile's waves loads
      nope_pieces: the record's 64-B e4m3 pieces n0.. (a code each); wave
        nope_pieces does the PV of the rope dims
      dots_tile: LDS bytes of one head tile's dots of a wave (64 lanes x f32x4)
      lds: member -> (offset, bytes) of the split stage (combine needs none):
        q     one head tile of q (CPT = 1) or all (CPT > 1), bf16 rows of
              Q_ROW bytes
        p     bf16 p, a row of CK·2 + P_PAD bytes a head (aliases a streamed
              q: written after the last QK; beside a resident one)
        raw   raw_keys of the chunk's records as loaded, RAW_STRIDE bytes a
              key: all of them, or a half or quarter (then the PV runs in
              CK / raw_keys passes, the later ones written from the scoring
              waves' registers)
        smax  f32 [key_tiles, 16·head_tiles] per-wave max of each head
        ssum  f32 [key_tiles, 16·head_tiles] per-wave Σ p of each head
        dots  f32 [key_parts - 1, key_tiles, head_tiles, 64 lanes, 4] the
              other parts' partial scores (aliases p: written after the
              last QK, read before p is written)
      lds_bytes: end of the last member
      scratch: region -> bytes (layouts in the module docstring)
    """

    arch: str
    tokens: int
    heads: int
    keys: int
    ratio: int
    chunk_keys: int
    nchunk: int
    chunks_per_task: int
    tasks_per_token: int
    split_tasks: int
    combine_tasks: int
    combine_heads: int
    combine_waves: int
    key_tiles: int
    key_parts: int
    raw_keys: int
    head_tiles: int
    mfma_k: int
    lds: dict[str, tuple[int, int]] = field(hash=False)
    lds_bytes: int
    scratch: dict[str, int] = field(hash=False)
    head_dim: int
    nope_dims: int
    rope_dims: int
    kv_data_bytes: int
    kv_scale_bytes: int
    q_row: int
    p_row: int
    raw_stride: int
    record_pieces: tuple[tuple[str, str, int, int, int], ...]
    part_pieces: tuple[tuple[str, ...], ...]
    qk_operands: tuple[tuple[str, str, int, int, int, int], ...]
    part_mfmas: tuple[int, ...]
    scale_words: int
    nope_pieces: int
    dots_tile: int

    @property
    def piece_part(self) -> dict[str, int]:
        """Record piece -> the part (of a key tile's waves) that loads it."""
        return {name: part for part, names in enumerate(self.part_pieces) for name in names}

    @property
    def scale_word_parts(self) -> tuple[tuple[int, ...], ...]:
        """Per 4-byte word of a record's scale bytes (codes of nope pieces
        4w .. 4w+3): the parts that need it for their dequantization."""
        words = []
        for word in range(self.scale_words):
            codes = {f"n{j}" for j in range(4 * word, 4 * word + 4)}
            words.append(tuple(p for p, names in enumerate(self.part_pieces) if codes & set(names)))
        return tuple(words)

    @property
    def q_resident(self) -> bool:
        """q of every head tile stays in LDS across the task's chunks."""
        return self.chunks_per_task > 1

    @property
    def head_groups(self) -> int:
        return self.heads // self.combine_heads

    @property
    def combine_tasks_per_group(self) -> int:
        """Combine tasks (consecutive flags) that hold one wo_a group's heads."""
        return HEADS_PER_GROUP // self.combine_heads


def _align16(n: int) -> int:
    return -(-n // 16) * 16


def _lds_members(heads_padded: int, chunk_keys: int, parts: int, raw_keys: int,
                 q_resident: bool) -> dict[str, tuple[int, int]]:
    key_tiles = chunk_keys // KEY_TILE
    p_bytes = heads_padded * (2 * chunk_keys + P_PAD)
    dots_bytes = (parts - 1) * key_tiles * heads_padded // HEAD_TILE * DOTS_TILE
    # the parts' dots are dead once part 0 has summed them, before p is written
    p_dots = max(p_bytes, dots_bytes)
    sizes = {
        # a streamed q tile is dead once the last QK has read it: dots and p
        # take its place; a resident q serves the task's next chunk
        "q": heads_padded * Q_ROW if q_resident else max(HEAD_TILE * Q_ROW, p_dots),
        "raw": raw_keys * RAW_STRIDE,
        "smax": 4 * key_tiles * heads_padded,
        "ssum": 4 * key_tiles * heads_padded,
        **({"p": p_dots} if q_resident else {}),
    }
    members, offset = {}, 0
    for name, size in sizes.items():
        members[name] = (offset, size)
        offset += _align16(size)
    home = members["p" if q_resident else "q"][0]
    members["p"] = (home, p_bytes)
    members["dots"] = (home, dots_bytes)
    return members


def _layout(heads: int, chunk_keys: int, target: ArchInfo, q_resident: bool = False):
    """(key_parts, raw_keys, LDS members, bytes) of a chunk size, or None when
    nothing fits: all raw records at once if possible (else the fewest PV
    passes, the later passes' records held in registers through the QK, two
    more barriers a pass), then the most parts whose dots exchange fits LDS
    (fewer parts leave waves idle in the QK)."""
    heads_padded = math.ceil(heads / HEAD_TILE) * HEAD_TILE
    parts_options = sorted((p for p in PART_PIECES if p * chunk_keys <= WAVES * KEY_TILE),
                           reverse=True)
    passes = PV_PASSES_Q_RESIDENT if q_resident else PV_PASSES
    for raw_keys in (chunk_keys // n for n in passes if chunk_keys // n >= KEY_TILE):
        for parts in parts_options:
            lds = _lds_members(heads_padded, chunk_keys, parts, raw_keys, q_resident)
            lds_bytes = max(off + size for off, size in lds.values())
            if _align16(lds_bytes) + KERNEL_LDS <= target.lds_budget:
                return parts, raw_keys, lds, lds_bytes
    return None


def _scratch(tokens: int, nchunk: int, heads: int) -> dict[str, int]:
    return {
        "partials": tokens * nchunk * heads * HEAD_DIM * 2,
        "stats": tokens * nchunk * heads * 2 * 4,
        "xo": tokens * heads * HEAD_DIM,
        "xo_codes": tokens * heads * HEAD_DIM // MX_BLOCK,
    }


def default_chunk_keys(keys: int, heads: int, tokens: int, target: ArchInfo) -> int:
    """The smallest chunk that fits LDS while the launch's chunks (one split
    task each) stay within MAX_SHORT_CHUNKS and a quarter of the grid; past
    that, the largest that fits and still leaves MIN_SPLIT_TASKS split tasks.

    A decode step's split is latency-bound: a chunk's waves score their 16
    keys each in parallel, then every wave runs the PV over all the chunk's
    keys, so a task's time grows with its chunk while the tasks run side by
    side on CTAs of their own. Every chunk rereads the token's q (H·1 KiB
    beyond SPEC §6's minimum) and hands over an H·1 KiB partial: the cap
    keeps those bytes a few percent of a step's weights. Many tokens' chunks
    fill the grid anyway: there, fewer and larger ones."""
    fitting = [ck for ck in CHUNK_KEYS if _layout(heads, ck, target)]
    if not fitting:
        raise ValueError(f"heads: {heads} heads leave no chunk size room in LDS")
    short = min(MAX_SHORT_CHUNKS, target.blocks // SIMDS)
    for ck in fitting:
        if tokens * math.ceil(keys / ck) <= short and math.ceil(keys / ck) <= MAX_CHUNKS:
            return ck
    for ck in reversed(fitting):
        if tokens * math.ceil(keys / ck) >= MIN_SPLIT_TASKS:
            return ck
    return fitting[0]


def chunks_per_task(tokens: int, nchunk: int, heads: int, chunk_keys: int,
                    target: ArchInfo) -> int:
    """Consecutive chunks of one token a split task runs, reading q once.

    Split tasks go round the grid, so a CTA runs ceil(tasks / blocks) of them;
    each streams q (H·1 KiB) and its chunks' KV records. Of the counts whose
    busiest CTA streams the fewest bytes, the largest (fewest q reads): more
    chunks a task then only fill CTAs that would otherwise run a second
    task. One chunk when a resident q does not fit LDS."""
    def busiest(cpt: int) -> int:
        """Bytes the busiest CTA streams: its tasks' q and KV records."""
        tasks = tokens * math.ceil(nchunk / cpt)
        task_bytes = heads * HEAD_DIM * 2 + cpt * chunk_keys * KV_RECORD_BYTES
        return math.ceil(tasks / target.blocks) * task_bytes

    if _layout(heads, chunk_keys, target, q_resident=True) is None:
        return 1
    least = min(map(busiest, range(1, nchunk + 1)))
    return max(c for c in range(1, nchunk + 1) if busiest(c) == least)


def combine_shape(tokens: int, heads: int, split_tasks: int, target: ArchInfo) -> tuple[int, int]:
    """(heads a combine task merges, waves a head): a wave a SIMD (heads x waves
    = SIMDS), so that no two waves of a task share a SIMD's VALU (the combine is
    VALU-bound and on the critical path), a head over as many SIMDs as the grid
    allows while the attention tasks stay within a quarter of it (the extra
    combine tasks come out of the CTAs that stream GEMV weights from launch);
    else a group's HEADS_PER_GROUP a task, a wave a head (two waves a SIMD)."""
    for waves in (SIMDS, SIMDS // 2, 1):
        per_task = SIMDS // waves
        if tokens * heads // per_task + split_tasks <= target.blocks // SIMDS:
            return per_task, waves
    return HEADS_PER_GROUP, 1


def plan_attention(
    rank: RankShape, tokens: int, ratio: int, target: ArchInfo, chunk_keys: int | None = None
) -> AttentionPlan:
    """The split/combine plan of one launch on `target` (targets.arch_info:
    its facts; tokens and ratio checked by config.Config); `chunk_keys`
    overrides the default chunk size (tests use it to get many chunks from
    tiny tables)."""
    heads, keys = rank.heads, rank.keys
    if heads % HEADS_PER_GROUP:
        raise ValueError(f"heads: expected a multiple of {HEADS_PER_GROUP}, got {heads}")
    ck = default_chunk_keys(keys, heads, tokens, target) if chunk_keys is None else chunk_keys
    if ck not in CHUNK_KEYS:
        raise ValueError(f"chunk_keys: expected one of {CHUNK_KEYS}, got {ck!r}")
    nchunk = math.ceil(keys / ck)
    if nchunk > MAX_CHUNKS:
        raise ValueError(
            f"chunk_keys: {ck} splits {keys} keys into {nchunk} chunks, "
            f"combine supports at most {MAX_CHUNKS}"
        )
    layout = _layout(heads, ck, target)
    if layout is None:
        need = max(off + size for off, size in _lds_members(
            math.ceil(heads / HEAD_TILE) * HEAD_TILE, ck, 1,
            max(ck // PV_PASSES[-1], KEY_TILE), False).values())
        raise ValueError(
            f"chunk_keys: {ck} keys with {heads} heads need {need} B of LDS, "
            f"{target.name} has {target.lds_budget}"
        )
    cpt = chunks_per_task(tokens, nchunk, heads, ck, target)
    if cpt > 1:
        layout = _layout(heads, ck, target, q_resident=True)
    key_parts, raw_keys, lds, lds_bytes = layout
    piece_part = {n: part for part, names in enumerate(PART_PIECES[key_parts]) for n in names}
    qk_operands = tuple((name, kind, j, piece_part[name], o, q_at + 2 * target.mfma_k * o)
                        for name, kind, j, _, q_at in RECORD_PIECES
                        for o in range(PIECE_DIMS[kind] // target.mfma_k))
    tasks_per_token = math.ceil(nchunk / cpt)
    combine_heads, combine_waves = combine_shape(tokens, heads, tokens * tasks_per_token, target)
    return AttentionPlan(
        arch=target.name,
        tokens=tokens,
        heads=heads,
        keys=keys,
        ratio=ratio,
        chunk_keys=ck,
        nchunk=nchunk,
        chunks_per_task=cpt,
        tasks_per_token=tasks_per_token,
        split_tasks=tokens * tasks_per_token,
        combine_tasks=tokens * heads // combine_heads,
        combine_heads=combine_heads,
        combine_waves=combine_waves,
        key_tiles=ck // KEY_TILE,
        key_parts=key_parts,
        raw_keys=raw_keys,
        head_tiles=math.ceil(heads / HEAD_TILE),
        mfma_k=target.mfma_k,
        lds=lds,
        lds_bytes=lds_bytes,
        scratch=_scratch(tokens, nchunk, heads),
        head_dim=HEAD_DIM,
        nope_dims=NOPE_DIM,
        rope_dims=ROPE_DIM,
        kv_data_bytes=KV_DATA_BYTES,
        kv_scale_bytes=KV_SCALE_BYTES,
        q_row=Q_ROW,
        p_row=2 * ck + P_PAD,
        raw_stride=RAW_STRIDE,
        record_pieces=RECORD_PIECES,
        part_pieces=PART_PIECES[key_parts],
        qk_operands=qk_operands,
        part_mfmas=tuple(sum(op[3] == part for op in qk_operands) for part in range(key_parts)),
        scale_words=KV_SCALE_BYTES // 4,
        nope_pieces=NOPE_DIM // 64,
        dots_tile=DOTS_TILE,
    )
