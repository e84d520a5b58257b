"""The planner: one launch's configuration -> the KernelSpec every template reads.

`plan(geometry, tp, tokens, ratio, arch, swa_fp8, comp_fp8)` resolves the
model geometry, the rank's share, S tokens, the compression ratio, the target
and the key caches' byte formats ("auto": what vLLM writes there) into plain
numbers: the persistent grid, the four stages' task tables and the CTA each
stage's task 0 runs on, the LDS union, the scratch regions (256-B aligned) and
the kernel's name. Templates take every number from here and restate none.

Stage order and task tables (SPEC §3); CTA b runs tasks (b − first_cta) mod
BLOCKS, + BLOCKS, ... of each stage, in this order:
  split    S·ceil(nchunk/CPT) tasks of CPT chunks        plan_attention
  combine  S·H/CH tasks (task = t·(H/CH) + head group)   plan_attention
  wo_a     G·o_rank/32 tasks of 32 wo_a rows
  wo_b     hidden/rows tasks of 16 or 32 wo_b rows (_wo_b_rows)
The GEMVs' task 0 sits on the CTA after the last attention task, so the CTAs
without attention work stream weights long before their flags (the seed's
reasoning: the weights are most of the bytes a launch moves): wo_a's from
launch in rounds (WOA_WEIGHT_ROUNDS), wo_b's (after_split, on CTAs of their own
and, wrapping around, on the split's: done by then) once every split flag is
set, so that the split's KV gathers, on the critical path, do not queue behind
them (benchmarks/modeled_time.py: 11.65 -> 9.36 us, V4.1-Flash TP 4 S 1 gfx950;
the rounds 8.99 -> 8.35), in rounds too (WOB_WEIGHT_ROUNDS), so that the
combine's loads of the split's partials do not queue behind them. The epoch
moves on a CTA whose work ends first (KernelSpec.epoch_cta).

Build option `timeline` (name suffix `_timeline`, and the key: it is in the
spec): a `timeline` scratch region, one row a CTA of u32 s_memrealtime stamps
(the clock's low 32 bits; timeline.ll.j2). A row holds, stage after stage in
the order above, one record a task the CTA may run (its kth task of the stage,
k = 0, 1, ...), each TASK_STAMPS: the CTA's start (the same in each record: a
record is written whole, in one store at the task's end), the task's end and
the end of its flag wait (split tasks and wo_b's later tasks wait on none, and
a wait polled by several waves is stamped apart: there the record's store
leaves that slot). A CTA's first task begins at its start, a later one where
the previous task ended: the stamps chain.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import typing
from dataclasses import dataclass

from k2back.codegen.plan_attention import KERNEL_LDS, AttentionPlan, plan_attention
from k2back.codegen.targets import ArchInfo, arch_info
from k2back.config import Config
from k2back.kv_format import KV_RECORD_BYTES
from k2back.model import HEAD_DIM, HEADS_PER_GROUP, MX_BLOCK, RankShape
from k2back.model import geometry as model_geometry

WAVE = 64  # lanes of a wave (wave64)
THREADS = 512  # 8 waves of 64: one CTA a CU, all resident
WAVES = THREADS // WAVE
TILE = 16  # MFMA 16x16: weight rows of an A tile, tokens of a B tile
WOA_ROWS = 2 * TILE  # wo_a rows a task: one MXFP8 block of Z columns
STEP_BYTES = 64  # k bytes one 16-B load a lane covers across the 4 lane groups
THREADS_PER_TOKEN = 8  # GEMV epilogue threads a token of a 16-token tile
REGION_ALIGN = 256
FLAG_BYTES = 4
# A tagged word ("LL", NCCL's low-latency protocol; SPEC §3): LL_PAYLOAD bytes of hand-off
# data and the launch's tag in one naturally aligned LL_WORD-byte word, stored and loaded
# as one access at device scope: single-copy atomic (load/store atomic i64 -> one
# *_dwordx2 sc1: LLVM AMDGPUUsage "Memory Model GFX942"; no atomic wider than 64 bits is one
# instruction: AMDGPUISelLowering setMaxAtomicSizeInBitsSupported(64); RCCL's LL lines on
# CDNA keep a flag in each 8-byte half, ROCm/rccl prims_ll.h). A reader that finds this
# launch's tag in a word has its payload: no flag, no release or acquire fence (a
# hand-off's critical path: release 160 + flag poll and its phase + acquire 130 ns less,
# docs/timing-model.md). An MXFP8 code takes a word of its own (payload = the code).
LL_WORD = 8
LL_PAYLOAD = 4
LL_MAX_TOKENS = 8  # X8B in tagged words up to this S (_gemv_stages)
TASK_STAMPS = ("start", "end", "wait")  # a task's record (s_memrealtime ticks, low 32 bits)
STAMP_BYTES = 4
MAX_X_STEPS = 16  # 16-B activation loads a lane holds at once (64 VGPRs)
MAX_BATCH_LOADS = 32  # 16-B weight loads a lane may hold for a CTA's batch of tasks (128 VGPRs)
# wo_a's weights stream from launch, beside the split's KV gathers on the critical path:
# in rounds (each once the last is in), so that fewer weight bytes are queued ahead of
# the gathers at any time; they still arrive long before wo_a's flags. Only on CTAs of
# their own: behind a CTA's attention task the rounds' round trips follow that task
# (V4.1-Flash TP 4 S 48, rounds there -> not: gfx950 16.13 -> 15.59, gfx942 26.07 ->
# 26.72 us, within the model's poll-phase noise)
# (benchmarks/modeled_time.py, V4.1-Flash TP 4 S 1: gfx950 8.99 -> 8.35 us, split end
# 4.13 -> 3.43; gfx942 11.95 -> 11.18; 16 rounds, every load alone, gain no more)
WOA_WEIGHT_ROUNDS = 4
# wo_b's weights (on CTAs of their own: after_split) go out when the split's last flag is
# set, just as the combine, on every XCD, loads the split's partials: all at once, each XCD's
# L2 holds ~1.3 MB of weight requests ahead of those loads. The model books their L2 bytes
# at issue (l2_bytes_per_cycle_per_xcd: 0.68 us of them on MI300X, 0.36 on MI355X;
# docs/timing-model.md), the GPU moves the data at HBM's pace but may queue the requests
# (its order between CUs is undocumented, ibid.): fewer ahead is better either way. In
# rounds a CTA holds a quarter in flight: 160 CTAs x 16 KB = 2.6 MB, still above HBM's
# bandwidth x latency (MI300X 4.0 TB/s x 417 ns = 1.7 MB, MI355X 6.0 x 387 ns = 2.3 MB), so
# the stream keeps HBM as busy and ends about a round trip later, inside its slack before
# wo_a's flags (k2back profile, V4.1-Flash TP 4 S 1, 1 -> 4 rounds: gfx942 combine end
# 5.77 -> 5.47 us, wo_b end 9.24 -> 8.94, modeled 9.38 -> 9.07; gfx950 4.48 -> 4.45,
# 7.28 -> 7.25, 7.28 -> 7.25)
WOB_WEIGHT_ROUNDS = 4


@dataclass(frozen=True)
class Region:
    """A scratch region: `bytes` at `offset` (256-B aligned)."""

    name: str
    offset: int
    bytes: int


@dataclass(frozen=True)
class LdsMember:
    stage: str  # "kernel" members live for the whole launch, stage members overlap
    name: str
    offset: int
    bytes: int


@dataclass(frozen=True)
class GemvMma:
    """How an arch's GEMV reaches the MFMA (templates gemv_<name>.ll.j2)."""

    name: str
    x_tokens: int  # tokens of one B operand tile
    code_steps: int  # 64-B steps one block code of a lane covers


# gfx950: v_mfma_scale_f32_16x16x128_f8f6f4 contracts 128 k (two steps, one
# block code a lane group) with 16 tokens a B tile; gfx942: the FNUZ fp8 MFMA,
# a step's two blocks in two halves of B's columns (8 tokens a tile), scaled in
# fp32 after the MFMA
GEMV_MMA = {"scaled": GemvMma("scaled", x_tokens=TILE, code_steps=2),
            "fp8": GemvMma("fp8", x_tokens=TILE // 2, code_steps=1)}


@dataclass(frozen=True)
class GemvStage:
    """One GEMV stage: `tasks` tasks of `rows` weight rows times the S activation
    rows (fp8 + UE8M0 codes in scratch): the scaled f8f6f4 MFMA on gfx950, the
    FNUZ fp8 MFMA with each product block scaled in fp32 on gfx942 (gemv.ll.j2,
    gemv_scaled.ll.j2, gemv_fp8.ll.j2).

    Wave w < k_waves contracts k bytes [w·k_steps·64, (w+1)·k_steps·64) of every
    row tile: lane (r = ℓ%16, j = ℓ/16) loads 16 B at k = that + 64·i + 16·j of
    weight row r and of token r (step i). Waves >= k_waves see an empty weight
    buffer and contribute nothing; their partial sums are never read.
    """

    name: str
    mma: str  # GEMV_MMA's name: the template of the MFMA loop
    tasks: int
    first_cta: int  # task t runs on CTA (first_cta + t % ctas) % BLOCKS, as its (t // ctas)th
    ctas: int
    batch: bool  # a CTA's tasks' weights all in flight before its first poll
    after_split: bool  # its CTAs await every split flag before they stream weights
    weight_rounds: int  # a task's weight loads go out in this many rounds, each once the last is in
    rows: int  # weight rows a task: rows/16 MFMA row tiles
    k: int  # contraction length = weight row bytes
    k_waves: int
    k_steps: int
    step: int  # k bytes of a step: one 16-B load a lane over the 4 lane groups
    block: int  # k bytes (and rows) of an MXFP8 block: one code
    code_steps: int  # steps one block code of a lane covers: 1 (gfx942 fp8 MFMA), 2 (gfx950 scaled MFMA)
    x_batch: int  # steps of activations a lane holds at once, each token tile (64 VGPRs in all)
    token_tiles: int
    x_tokens: int  # tokens of one B operand tile (x tile)
    x_tiles: tuple[tuple[int, ...], ...]  # the x tiles of each 16-token tile
    x_steps: tuple[int, ...]  # activation steps loaded at once, each 16-token tile
    scale_late: tuple[bool, ...]  # fp8: a step's products scaled one step late, each 16-token tile
    ll: bool  # its activations arrive as tagged words (LL_WORD): read until tagged, no flags awaited
    weight: str  # kernel argument of the fp8 weight and ...
    weight_scale: str  # ... of its UE8M0 codes (one a 32x32 block)
    x: str  # scratch region of the fp8 activation rows and ...
    x_codes: str  # ... of their codes
    x_row: int  # bytes between consecutive tokens' activation rows
    tasks_per_group: int  # task // this = the group whose k activation columns a task reads
    wait_flags: str  # scratch region of the flags of the tasks that write the activations ...
    wait_span: int  # ... each of `wait_span` consecutive columns of a row (of a group's, wo_a) ...
    wait_stride: int  # ... and the flags between one token's and the next's (0: one task, every token)
    red: int  # LDS offset of the cross-wave partial sums: f32 [k_waves][row tiles][64][4]
    red_wave: int  # LDS bytes of one wave's partial sums in red
    ep_threads: int  # threads of the epilogue: 8 a token of a 16-token tile, whole waves

    @property
    def row_tiles(self) -> int:
        return self.rows // TILE

    @property
    def wait_run(self) -> int:
        """Producer tasks whose flags a wave awaits (a token's): those that wrote
        its k share of the activations (gemv.await_share), one where a task's
        columns hold several waves' shares."""
        return max(1, self.k_steps * self.step // self.wait_span)

    @property
    def ep_rows(self) -> int:
        """Rows of the task an epilogue thread finishes (8 threads a token)."""
        return self.rows // THREADS_PER_TOKEN

    @property
    def per_cta(self) -> int:
        return math.ceil(self.tasks / self.ctas)

    @property
    def red_bytes(self) -> int:
        return self.k_waves * self.red_wave

    @property
    def codes(self) -> int:
        """Block codes a lane holds of its wave's k share."""
        return self.k_steps // self.code_steps

    @property
    def code_blocks(self) -> int:
        """Blocks of k between a lane's consecutive codes."""
        return self.code_steps * self.step // self.block


@dataclass(frozen=True)
class KernelSpec:
    """Everything that determines the generated kernel (frozen, hashable, JSON)."""

    geometry: str
    tp: int
    tokens: int
    ratio: int
    arch: str
    swa_fp8: str  # byte format of swa_cache's nope dims: "e4m3fn" or "e4m3fnuz"
    comp_fp8: str  # ... and of comp_cache's
    name: str
    blocks: int
    threads: int
    heads: int
    groups: int
    hidden: int
    o_rank: int
    o_rows: int
    keys: int
    attention: AttentionPlan
    split_first_cta: int
    combine_first_cta: int
    wo_a: GemvStage
    wo_b: GemvStage
    lds: tuple[LdsMember, ...]
    lds_bytes: int
    scratch: tuple[Region, ...]
    scratch_bytes: int
    target: ArchInfo  # the arch's facts the plan and the templates rely on
    timeline: bool = False  # build option: the kernel stamps each task (the `timeline` region)

    def region(self, name: str) -> Region:
        for r in self.scratch:
            if r.name == name:
                return r
        raise KeyError(f"scratch region {name!r} not in {[r.name for r in self.scratch]}")

    def view(self, scratch, name: str, dtype=None, shape=None):
        """Region `name` of a launch's scratch (a uint8 tensor) as a view of
        `dtype` (default: its bytes), flat or of `shape`: writes land in scratch."""
        r = self.region(name)
        view = scratch[r.offset:r.offset + r.bytes]
        view = view if dtype is None else view.view(dtype)
        return view if shape is None else view.view(shape)

    @property
    def ll_words_per_payload(self) -> int:
        """Bytes of tagged words a payload byte takes: word offset = this · payload offset."""
        return LL_WORD // LL_PAYLOAD

    @property
    def ll_regions(self) -> dict[str, str]:
        """The hand-off regions written as tagged words (LL_WORD): name -> "bytes"
        (LL_PAYLOAD activation bytes a word) or "codes" (one MXFP8 code a word)."""
        return {name: kind for st in (self.wo_a, self.wo_b) if st.ll
                for name, kind in ((st.x, "bytes"), (st.x_codes, "codes"))}

    def payload_bytes(self, name: str) -> int:
        """Bytes of hand-off data region `name` holds (its words' payload, if tagged)."""
        kind, size = self.ll_regions.get(name), self.region(name).bytes
        return size if kind is None else size // LL_WORD * (LL_PAYLOAD if kind == "bytes" else 1)

    def payload(self, scratch, name: str):
        """The hand-off data of region `name` as uint8 (a copy if it is tagged words:
        their payloads, a code a word), as the untagged region would hold it."""
        kind = self.ll_regions.get(name)
        if kind is None:
            return self.view(scratch, name)
        words = self.view(scratch, name).reshape(-1, LL_WORD)[:, :LL_PAYLOAD]
        return (words if kind == "bytes" else words[:, :1]).reshape(-1).clone()

    def ll_retag(self, scratch, tag: int) -> None:
        """Give every tagged word in scratch the tag `tag` (a stage kernel standing in for
        a launch whose producer stage ran before: its words carry that launch's tag)."""
        for name in self.ll_regions:
            words = self.view(scratch, name).view(dtype=_int32()).reshape(-1, LL_WORD // 4)
            words[:, 1] = tag

    def lds_member(self, stage: str, name: str) -> LdsMember:
        for m in self.lds:
            if (m.stage, m.name) == (stage, name):
                return m
        raise KeyError(f"LDS member {stage}.{name} not in the plan")

    @property
    def stage_tasks(self) -> dict[str, tuple[int, int, int]]:
        """stage -> (tasks, CTA of task 0, CTAs the tasks spread over), in execution order."""
        a = self.attention
        return {
            "split": (a.split_tasks, self.split_first_cta, self.blocks),
            "combine": (a.combine_tasks, self.combine_first_cta, self.blocks),
            "wo_a": (self.wo_a.tasks, self.wo_a.first_cta, self.wo_a.ctas),
            "wo_b": (self.wo_b.tasks, self.wo_b.first_cta, self.wo_b.ctas),
        }

    def task_cta(self, stage: str, task: int) -> tuple[int, int]:
        """(CTA, nth task of the stage on that CTA) that runs task `task` of `stage`."""
        _, first, spread = self.stage_tasks[stage]
        return (first + task % spread) % self.blocks, task // spread

    @property
    def stamp_rows(self) -> dict[str, tuple[int, int]]:
        """stage -> (slot of its first task record in a CTA's timeline row, task
        records: the most tasks of the stage a CTA runs)."""
        rows, slot = {}, 0
        for stage, (tasks, _, spread) in self.stage_tasks.items():
            rows[stage] = (slot, math.ceil(tasks / spread))
            slot += rows[stage][1] * len(TASK_STAMPS)
        return rows

    @property
    def stamp_row_bytes(self) -> int:
        """Bytes of one CTA's row of the timeline region."""
        return sum(n for _, n in self.stamp_rows.values()) * self.stamp_record_bytes

    @property
    def stamp_record_bytes(self) -> int:
        """Bytes of one task's record: its TASK_STAMPS."""
        return len(TASK_STAMPS) * STAMP_BYTES

    def stamp_at(self, stage: str, kind: str) -> int:
        """Byte offset in a CTA's row of stamp `kind` of the CTA's first task of
        `stage`; its kth task's is k records further."""
        return (self.stamp_rows[stage][0] + TASK_STAMPS.index(kind)) * STAMP_BYTES

    def stage_ctas(self, stage: str) -> set[int]:
        """The CTAs that run tasks of `stage` (task_cta)."""
        return {self.task_cta(stage, task)[0] for task in range(self.stage_tasks[stage][0])}

    @property
    def busy_ctas(self) -> int:
        """CTAs 0 .. busy_ctas - 1 run tasks, the rest none (the stages' task
        tables follow each other from CTA 0)."""
        return min(self.blocks, max(first + min(tasks, spread)
                                    for tasks, first, spread in self.stage_tasks.values()))

    @property
    def epoch_cta(self) -> int:
        """The CTA that awaits every CTA's epoch mark and then moves the epoch on
        (handoff.epoch_end): one whose own work ends first, so that the last mark
        is seen soon after it is written: an idle CTA, else the first that runs
        split tasks only (wo_b may wrap onto the others), else CTA 0."""
        if self.busy_ctas < self.blocks:
            return self.busy_ctas
        later = set().union(*(self.stage_ctas(stage) for stage in self.stage_tasks if stage != "split"))
        return min(self.stage_ctas("split") - later, default=0)

    def minimum_bytes(self, valid_keys: int) -> dict[str, int]:
        """SPEC §6, the bytes a launch must move at least: every weight byte and
        block code once, one KV record per valid (token, key), q, the key table
        (read) and out (written)."""
        weights = self.o_rows * HEAD_DIM * HEADS_PER_GROUP + self.hidden * self.o_rows
        return {
            "weights": weights + weights // (MX_BLOCK * MX_BLOCK),
            "kv": valid_keys * KV_RECORD_BYTES,
            "q": self.tokens * self.heads * HEAD_DIM * 2,
            "key_table": self.tokens * self.keys * 4,
            "out": self.tokens * self.hidden * 2,
        }

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> KernelSpec:
        return _from_data(cls, json.loads(text))

    def key(self) -> str:
        return hashlib.sha256(self.to_json().encode()).hexdigest()

    def describe(self) -> str:
        """A human-readable table: stages, tasks, CTA offsets, LDS and scratch."""
        lines = [
            (f"{self.name}: {self.geometry} TP {self.tp}, S {self.tokens}, ratio {self.ratio}, "
             f"{self.arch}, {self.blocks} x {self.threads}"),
            f"key bytes: swa_cache {self.swa_fp8}, comp_cache {self.comp_fp8}",
            (f"chunk {self.attention.chunk_keys} keys x {self.attention.nchunk}, "
             f"{self.attention.chunks_per_task} a split task"),
            f"{'stage':<8} {'tasks':>6} {'first CTA':>10} {'CTAs':>6}",
        ]
        lines += [f"{s:<8} {n:>6} {c:>10} {k:>6}" for s, (n, c, k) in self.stage_tasks.items()]
        lines.append(f"LDS {self.lds_bytes} B (budget {self.target.lds_budget})")
        lines += [f"  {m.stage:<8} {m.name:<10} @{m.offset:>6} {m.bytes:>7} B" for m in self.lds]
        lines.append(f"scratch {self.scratch_bytes} B")
        lines += [f"  {r.name:<14} @{r.offset:>9} {r.bytes:>9} B" for r in self.scratch]
        return "\n".join(lines)


def _int32():
    import torch  # scratch is a torch tensor (plan imports without torch)

    return torch.int32


def _from_data(tp, data):
    """Rebuild a (nested) frozen dataclass from its asdict() JSON form."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        return tp(**{f.name: _from_data(hints[f.name], data[f.name]) for f in dataclasses.fields(tp)})
    if origin is tuple:
        args = typing.get_args(tp)
        items = args[:1] * len(data) if args[-1:] == (Ellipsis,) else args
        return tuple(_from_data(a, d) for a, d in zip(items, data))
    if origin is dict:
        _, value = typing.get_args(tp)
        return {k: _from_data(value, v) for k, v in data.items()}
    return data


def _align(n: int, to: int = REGION_ALIGN) -> int:
    return -(-n // to) * to


FP8_TAGS = {"e4m3fn": "ocp", "e4m3fnuz": "fnuz"}  # a key format in kernel names


def kernel_name(geometry: str, tp: int, tokens: int, ratio: int, arch: str, swa_fp8: str,
                comp_fp8: str, timeline: bool = False) -> str:
    slug = re.sub(r"[^0-9a-z]", "", geometry.lower())
    return (f"k2_back_{slug}_tp{tp}_s{tokens}_r{ratio}_{arch}"
            f"_swa{FP8_TAGS[swa_fp8]}_comp{FP8_TAGS[comp_fp8]}" + ("_timeline" if timeline else ""))


def _k_split(k: int, code_steps: int) -> tuple[int, int]:
    """(k_waves, k_steps): the most waves (<= 8) splitting k evenly into 64-B
    steps, a multiple of `code_steps` each."""
    steps = k // STEP_BYTES
    waves = max(w for w in range(1, WAVES + 1) if steps % (w * code_steps) == 0)
    return waves, steps // waves


def _wo_b_ctas(tasks: int, free: int, blocks: int, task_bytes: int, task_loads: int,
               token_tiles: int, woa_task_bytes: int) -> int:
    """CTAs wo_b spreads over, from the first CTA after the earlier stages'
    tasks: only the `free` ones (no work but, at most, a split task) when each
    can hold all its tasks' weights in flight (registers) and streams no more
    than a wo_a CTA does (no new long pole); else the whole grid, where a CTA's
    wo_b weights stream after its earlier work."""
    if free > 0:
        per_cta = math.ceil(tasks / free)
        if per_cta * task_bytes <= woa_task_bytes and _batch_fits(per_cta * task_loads, token_tiles):
            return min(free, tasks)
    return min(blocks, tasks)


def _wo_b_rows(hidden: int, k_steps: int, token_tiles: int) -> tuple[int, ...]:
    """wo_b's rows a task, in the planner's order of preference: one row tile (the
    most CTAs), then two (when a task's weights fit in registers at once), which the
    planner takes when CTAs would run two tasks each: one task of both does the flag
    wait's work once (activation loads, cross-wave sum, epilogue)."""
    two = hidden % (2 * TILE) == 0 and _batch_fits(2 * k_steps, token_tiles)
    return (TILE, 2 * TILE) if two else (TILE,)


def _x_batch(k_steps: int, code_steps: int, token_tiles: int, weight_loads: int) -> int:
    """Activation steps loaded at once (for every token tile): the most that
    divide the wave's steps into whole codes, MAX_X_STEPS loads a lane in all
    (half that beside more than MAX_X_STEPS weight loads)."""
    budget = MAX_X_STEPS if weight_loads <= MAX_X_STEPS else MAX_X_STEPS // 2
    most = max(code_steps, budget // token_tiles)
    return max(n for n in range(code_steps, min(k_steps, most) + 1, code_steps)
               if k_steps % n == 0)


def _batch_fits(loads: int, token_tiles: int) -> bool:
    """Whether a CTA's weights (`loads` 16-B loads a lane) may all be in flight
    at once: 128 VGPRs at most, twice the raw bytes when several token tiles
    reuse them (LLVM keeps them converted to bf16 between tiles)."""
    return loads * (2 if token_tiles > 1 else 1) <= MAX_BATCH_LOADS


def _check(name: str, value, expected: str, ok: bool):
    if not ok:
        raise ValueError(f"{name}: expected {expected}, got {value!r}")


def _x_schedule(mma: GemvMma, tokens: int, k_steps: int, x_batch: int):
    """(x tiles, activation steps loaded at once) of each 16-token tile: one x
    tile of 16 tokens; or (fp8, 8 tokens an x tile) the tile's one or two x
    tiles below S, the planner's x_batch loads of a 16-token tile shared by
    them (more spill beside V4-pro's weights)."""
    token_tiles = math.ceil(tokens / TILE)
    per_tile = TILE // mma.x_tokens
    in_s = math.ceil(tokens / mma.x_tokens)
    tiles = tuple(tuple(u for u in range(per_tile * t, per_tile * (t + 1)) if u < in_s)
                  for t in range(token_tiles))
    if per_tile == 1:
        return tiles, (x_batch,) * token_tiles
    steps = tuple(max(d for d in range(1, k_steps + 1)
                      if k_steps % d == 0 and d * len(us) <= max(x_batch, len(us)))
                  for us in tiles)
    return tiles, steps


def _gemv_stage(name: str, mma: GemvMma, tokens: int, tasks: int, first_cta: int, ctas: int,
                batch: bool, rows: int, k: int, x_batch: int, after_split: bool = False,
                weight_rounds: int = 1, ll: bool = False, **operands) -> GemvStage:
    k_waves, k_steps = _k_split(k, mma.code_steps)
    loads = rows // TILE * k_steps
    weight_rounds = max(n for n in range(1, weight_rounds + 1) if loads % n == 0)
    share, span = k_steps * STEP_BYTES, operands["wait_span"]
    _check("plan", name, f"a wave's k share ({share}) and a producer task's columns ({span}) "
           "nested", share % span == 0 or span % share == 0)
    x_tiles, x_steps = _x_schedule(mma, tokens, k_steps, x_batch)
    # one x tile hides no MFMA latency itself: scale its products a step later
    # (two would: and late products would cost 4 VGPRs each)
    scale_late = tuple(mma.name == "fp8" and len(us) == 1 for us in x_tiles)
    return GemvStage(
        name=name, mma=mma.name, tasks=tasks, first_cta=first_cta, ctas=ctas, batch=batch,
        after_split=after_split, weight_rounds=weight_rounds,
        rows=rows, k=k, k_waves=k_waves, k_steps=k_steps, step=STEP_BYTES, block=MX_BLOCK,
        code_steps=mma.code_steps, x_batch=x_batch, token_tiles=math.ceil(tokens / TILE),
        x_tokens=mma.x_tokens, x_tiles=x_tiles, x_steps=x_steps, scale_late=scale_late, ll=ll,
        red=0, red_wave=rows // TILE * 64 * 16, ep_threads=_epilogue_threads(tokens), **operands)


def _epilogue_threads(tokens: int) -> int:
    """Threads of a GEMV epilogue: 8 a token of a 16-token tile, in whole waves — one
    wave while S <= 8, so at decode the other waves skip the reduction (and a timeline
    stamp there is one wave's)."""
    per_wave = WAVE // THREADS_PER_TOKEN
    return THREADS_PER_TOKEN * min(TILE, -(-tokens // per_wave) * per_wave)


def _gemv_stages(geo, rank: RankShape, tokens: int, att: AttentionPlan, blocks: int,
                 mma: GemvMma) -> tuple[GemvStage, GemvStage]:
    """wo_a (tasks of WOA_ROWS rows of a group's wo_a) from the CTA after the
    last attention task, then wo_b (TILE rows of wo_b a task)."""
    token_tiles = math.ceil(tokens / TILE)
    attention_tasks, split_tasks = att.split_tasks + att.combine_tasks, att.split_tasks
    woa_tasks = rank.o_rows // WOA_ROWS
    _, woa_steps = _k_split(geo.group_k, mma.code_steps)
    wo_a = _gemv_stage(
        "wo_a", mma, tokens, woa_tasks, attention_tasks % blocks, min(blocks, woa_tasks),
        batch=False, rows=WOA_ROWS, k=geo.group_k,
        weight_rounds=WOA_WEIGHT_ROUNDS if attention_tasks + woa_tasks <= blocks else 1,
        x_batch=_x_batch(woa_steps, mma.code_steps, token_tiles, WOA_ROWS // TILE * woa_steps),
        weight="wo_a", weight_scale="wo_a_scale", x="xo", x_codes="xo_codes",
        x_row=rank.q_cols, tasks_per_group=geo.o_rank // WOA_ROWS,
        wait_flags="combine_flags", wait_span=geo.group_k // att.combine_tasks_per_group,
        wait_stride=att.head_groups)
    _, wob_steps = _k_split(rank.o_rows, mma.code_steps)
    busy = attention_tasks + woa_tasks
    # free for wo_b: the CTAs after wo_a's, and those of the split tasks (CTAs 0 ..,
    # where wo_b's CTAs wrap around to), done before wo_b's weights stream
    free = blocks - busy + (split_tasks if busy <= blocks else 0)
    for wob_rows in _wo_b_rows(geo.hidden, wob_steps, token_tiles):
        wob_tasks = geo.hidden // wob_rows
        wob_ctas = _wo_b_ctas(wob_tasks, free, blocks, wob_rows * rank.o_rows,
                              wob_rows // TILE * wob_steps, token_tiles, WOA_ROWS * geo.group_k)
        if wob_tasks <= wob_ctas:
            break
    # CTAs of their own (no earlier work) would stream wo_b's weights from launch,
    # in front of the split's KV gathers on the critical path: they start once the
    # split is done (wo_b's flags come two hand-offs later), in rounds (WOB_WEIGHT_ROUNDS)
    wob_loads = wob_rows // TILE * wob_steps
    # X8B in tagged words at decode: while S fits one 8-token x tile and a wave's activation
    # steps are one batch (twice their registers as words: k_steps 16-B loads a lane become
    # 2·k_steps). benchmarks/modeled_time.py, V4.1-Flash TP 4: S 1 gfx942 9.07 -> 8.71 us,
    # gfx950 7.25 -> 6.89; S 2 9.28 -> 8.90, 7.05 -> 6.90; but S 16 14.87 -> 27.29 and
    # 10.08 -> 16.39 (wo_a's span: its stores into the lines 160 CTAs' waves poll; not
    # understood yet): flags from S 9 on
    wob_x_batch = _x_batch(wob_steps, mma.code_steps, token_tiles, wob_loads)
    wo_b = _gemv_stage(
        "wo_b", mma, tokens, wob_tasks, busy % blocks, wob_ctas,
        batch=_batch_fits(math.ceil(wob_tasks / wob_ctas) * wob_loads, token_tiles),
        after_split=wob_ctas <= free,
        weight_rounds=WOB_WEIGHT_ROUNDS if wob_ctas <= free else 1,
        rows=wob_rows, k=rank.o_rows, x_batch=wob_x_batch,
        ll=tokens <= LL_MAX_TOKENS and wob_x_batch == wob_steps, weight="wo_b", weight_scale="wo_b_scale", x="x8b", x_codes="x8b_codes",
        x_row=rank.o_rows, tasks_per_group=wob_tasks, wait_flags="wo_a_flags", wait_span=WOA_ROWS,
        wait_stride=0)
    return wo_a, wo_b


def _lds_union(att: AttentionPlan, gemvs, info: ArchInfo, what: str):
    """(members, bytes): stages run one after another on a CTA, so their
    members overlap (a union); the kernel's own word (the launch's flag tag)
    sits past them all."""
    stage_members = [LdsMember("split", n, o, b) for n, (o, b) in att.lds.items()]
    stage_members += [LdsMember(s.name, "red", s.red, s.red_bytes) for s in gemvs]
    union = _align(max(m.offset + m.bytes for m in stage_members), 16)
    lds = (*stage_members, LdsMember("kernel", "tag", union, KERNEL_LDS))
    lds_bytes = union + KERNEL_LDS
    if lds_bytes > info.lds_budget:
        raise ValueError(f"tokens/tp: {what} needs {lds_bytes} B of LDS, "
                         f"{info.name} has {info.lds_budget}")
    return lds, lds_bytes


def _scratch_regions(att: AttentionPlan, wo_a: GemvStage, wo_b: GemvStage, rank: RankShape,
                     tokens: int, blocks: int) -> tuple[tuple[Region, ...], int]:
    """The scratch regions at 256-B aligned offsets, and the bytes of all. A GEMV's
    activations read as tagged words (GemvStage.ll) take LL_WORD bytes a LL_PAYLOAD
    of them, and a word a code."""
    words = LL_WORD // LL_PAYLOAD if wo_b.ll else 1
    region_bytes = {
        **att.scratch,
        "x8b": tokens * rank.o_rows * words,
        "x8b_codes": tokens * rank.o_rows // MX_BLOCK * (LL_WORD if wo_b.ll else 1),
        # hand-off flags: one word a producer task, value = the launch's tag
        "split_flags": att.split_tasks * FLAG_BYTES,
        "combine_flags": att.combine_tasks * FLAG_BYTES,
        "wo_a_flags": wo_a.tasks * FLAG_BYTES,
        # the epoch word and one mark word a CTA (SPEC §3)
        "epoch": FLAG_BYTES,
        "epoch_marks": blocks * FLAG_BYTES,
    }
    scratch, offset = [], 0
    for name, size in region_bytes.items():
        scratch.append(Region(name, offset, size))
        offset = _align(offset + size)
    return tuple(scratch), offset


def plan(geometry: Config | str, tp: int | None = None, tokens: int | None = None,
         ratio: int | None = None, arch: str | None = None, swa_fp8: str = "auto",
         comp_fp8: str = "auto", *, target: ArchInfo | None = None,
         timeline: bool = False) -> KernelSpec:
    """The KernelSpec of one launch: of a Config, or of the configuration given
    field by field (checked as a Config); the arch's target-ID features do not
    change the plan. `target`: the facts of the arch to plan for (default
    targets.ARCHS[arch]; tests pass their own, e.g. a smaller grid). `timeline`:
    the build that stamps every task into a `timeline` region (module doc)."""
    config = geometry if isinstance(geometry, Config) else Config(
        geometry, tp, tokens, ratio, arch, swa_fp8, comp_fp8)
    geometry, tp, tokens, ratio = config.geometry, config.tp, config.tokens, config.ratio
    arch, (swa_fp8, comp_fp8) = config.processor, config.key_formats()
    geo = model_geometry(geometry)
    rank = RankShape(geo, tp)
    _check("geometry", geo.name, f"hidden a multiple of {TILE} (wo_b tasks), got {geo.hidden}",
           geo.hidden % TILE == 0)
    _check("geometry", geo.name, f"o_rank·groups a multiple of {STEP_BYTES}",
           rank.o_rows % STEP_BYTES == 0)
    info = arch_info(arch) if target is None else target
    _check("target", info.name, f"the facts of arch {arch!r}", info.name == arch)
    att = plan_attention(rank, tokens, ratio, info)
    blocks = info.blocks

    mma = GEMV_MMA["scaled" if info.scaled_mfma else "fp8"]
    wo_a, wo_b = _gemv_stages(geo, rank, tokens, att, blocks, mma)
    lds, lds_bytes = _lds_union(att, (wo_a, wo_b), info, f"{geo.name} TP {tp} S {tokens}")
    scratch, scratch_bytes = _scratch_regions(att, wo_a, wo_b, rank, tokens, blocks)

    spec = KernelSpec(
        geometry=geo.name, tp=tp, tokens=tokens, ratio=ratio, arch=arch,
        swa_fp8=swa_fp8, comp_fp8=comp_fp8,
        name=kernel_name(geo.name, tp, tokens, ratio, arch, swa_fp8, comp_fp8, timeline),
        blocks=blocks, threads=THREADS, heads=rank.heads, groups=rank.groups,
        hidden=geo.hidden, o_rank=geo.o_rank, o_rows=rank.o_rows, keys=rank.keys,
        attention=att, split_first_cta=0, combine_first_cta=att.split_tasks % blocks,
        wo_a=wo_a, wo_b=wo_b, lds=lds, lds_bytes=lds_bytes,
        scratch=scratch, scratch_bytes=scratch_bytes, target=info, timeline=timeline,
    )
    if not timeline:
        return spec
    stamps = Region("timeline", scratch_bytes, blocks * spec.stamp_row_bytes)
    return dataclasses.replace(spec, scratch=(*scratch, stamps),
                               scratch_bytes=_align(stamps.offset + stamps.bytes))
