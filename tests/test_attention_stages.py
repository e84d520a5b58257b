"""Stage-level proofs of the attention half: the split and combine stage
functions, each wrapped in a test kernel whose workgroup b runs task b
(k2back.testing.STAGE_KERNEL), compiled by our pipeline and run in the emulator,
against the reference of record's chunk intermediates and XO."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch

from k2back.codegen import render, targets
from k2back.codegen.plan import plan
from k2back.codegen.plan_attention import (
    CHUNK_KEYS,
    MAX_SHORT_CHUNKS,
    MIN_SPLIT_TASKS,
    plan_attention,
)
from k2back.formats import KV_DATA_BYTES
from k2back.model import GEOMETRIES, HEAD_DIM, MX_BLOCK, NOPE_DIM
from k2back.testing import (
    compare,
    live_chunks,
    make_inputs,
    reference_of,
    run_stage,
    split_regions,
    stage_kernel,
)

SENTINEL = 0xA5  # scratch bytes a stage must leave alone read as this

CASES = [
    # (arch, tp, tokens, ratio, overrides)
    *[(arch, tp, 3, 2, {}) for arch in ("gfx942", "gfx950") for tp in (1, 2, 4, 8)],
    ("gfx942", 4, 1, 0, {}),
    ("gfx950", 1, 2, 1, {}),
    # more chunks than short ones (default_chunk_keys): the largest chunks
    ("gfx942", 1, 24, 2, {}),  # 64-key chunks, 64 heads: gfx942's largest LDS
    ("gfx950", 8, 48, 0, {}),  # 128-key chunks
    ("gfx950", 2, 48, 2, {}),
]
EDGES = [
    ("key_len 0 and 1", {"key_len": torch.tensor([0, 1, 40], dtype=torch.int32)}),
    ("-1 entries", {"minus_one": True}),
    ("a live chunk of -1 only", {"minus_one": "first chunk"}),
    ("sink -inf", {"sink": -math.inf}),
    ("sink +inf", {"sink": math.inf}),
    ("position 0", {"positions": 0}),
]


def _inputs(geometry, tp, tokens, ratio, seed, overrides, arch):
    extra = dict(overrides)
    minus_one = extra.pop("minus_one", False)
    inputs = make_inputs(geometry, tp, tokens, ratio, seed, arch=arch, **extra)
    if minus_one:  # holes in the table, inside key_len
        table = inputs["key_table"].clone()
        table[:, 1::5] = -1
        if minus_one == "first chunk":  # tiny S 3: chunks of 32 keys
            table[:, :32] = -1
        inputs["key_table"] = table
    return inputs


def prepare(arch, tp, tokens, ratio, overrides, seed, geometry, target=None):
    """(spec, inputs, the reference's intermediates, scratch full of
    SENTINEL, live chunks [S, nchunk]); `target`: the arch facts to plan for."""
    spec = plan(geometry, tp, tokens, ratio, arch, target=target)
    inputs = _inputs(geometry, tp, tokens, ratio, seed, overrides, arch)
    scratch = torch.full((spec.scratch_bytes,), SENTINEL, dtype=torch.uint8)
    return spec, inputs, reference_of(spec, inputs), scratch, live_chunks(spec, inputs["key_len"])


def check_split(arch, tp, tokens, ratio, overrides, seed=1, geometry="tiny", target=None):
    spec, inputs, want, scratch, live = prepare(arch, tp, tokens, ratio, overrides, seed,
                                                geometry, target)
    kernel, stats = run_stage("split", spec, inputs, scratch, spec.attention.split_tasks)
    stats_got, part_got = split_regions(spec, scratch)
    # chunks past key_len: never written (combine does not read them)
    dead = stats_got.view(torch.uint8).flatten(2)[~live]
    assert (dead == SENTINEL).all()
    m = torch.where(live[..., None], stats_got[..., 0], -math.inf)
    l_sum = torch.where(live[..., None], stats_got[..., 1], 0.0)
    part = torch.where(live[..., None, None], part_got, torch.zeros((), dtype=torch.bfloat16))
    compare("chunk_max", m, want["chunk_max"])
    compare("chunk_sum", l_sum, want["chunk_sum"])
    compare("chunk_partial", part, want["chunk_partial"])
    return kernel, stats


def check_combine(arch, tp, tokens, ratio, overrides, seed=2, geometry="tiny"):
    spec, inputs, want, scratch, live = prepare(arch, tp, tokens, ratio, overrides, seed,
                                                geometry)
    # the split's hand-off: live chunks from the reference, SENTINEL garbage
    # elsewhere (combine must not read past a token's live chunks)
    stats, part = split_regions(spec, scratch)
    stats[live] = torch.stack([want["chunk_max"], want["chunk_sum"]], -1)[live]
    part[live] = want["chunk_partial"][live]
    kernel, run = run_stage("combine", spec, inputs, scratch, spec.attention.combine_tasks)
    width = spec.attention.heads * HEAD_DIM
    xo = spec.view(scratch, "xo", torch.uint8, (tokens, width))
    codes = spec.view(scratch, "xo_codes", torch.uint8, (tokens, width // MX_BLOCK))
    compare("xo", (xo.clone(), codes.clone()), (want["xo"], want["xo_codes"]))
    return kernel, run


@pytest.mark.kernel
@pytest.mark.parametrize("arch,tp,tokens,ratio,overrides", CASES)
def test_split_matches_reference(arch, tp, tokens, ratio, overrides):
    check_split(arch, tp, tokens, ratio, overrides)


@pytest.mark.kernel
@pytest.mark.parametrize("arch,tp,tokens,ratio,overrides", CASES)
def test_combine_matches_reference(arch, tp, tokens, ratio, overrides):
    check_combine(arch, tp, tokens, ratio, overrides)


@pytest.mark.kernel
@pytest.mark.slow
@pytest.mark.parametrize("arch", ("gfx942", "gfx950"))
def test_v41_flash_stages(arch):
    """The real key table (640 keys: 10 chunks of 64) and head count of TP 4."""
    check_split(arch, 4, 1, 2, {}, geometry="v4.1-flash")
    check_combine(arch, 4, 1, 2, {}, geometry="v4.1-flash")


def small_target(arch: str, blocks: int | None = None, lds_kib: int | None = None):
    """The facts of `arch` with a grid of `blocks` CTAs (few enough for tiny
    tables that a split task runs several chunks of its token, as S = 64 does
    on the real grid) and/or `lds_kib` KiB of LDS."""
    target = targets.arch_info(arch)
    return dataclasses.replace(target, blocks=blocks or target.blocks,
                               lds_budget=1024 * lds_kib if lds_kib else target.lds_budget)


@pytest.mark.kernel
@pytest.mark.parametrize("arch,tp,overrides", [
    ("gfx942", 4, {}),
    ("gfx942", 8, {}),  # half a head tile
    ("gfx950", 1, {}),  # four head tiles resident in LDS
    ("gfx950", 2, {}),
    *[(arch, 4, EDGES[0][1]) for arch in ("gfx942", "gfx950")],  # stops at a dead chunk
])
def test_split_tasks_of_several_chunks(arch, tp, overrides):
    target = small_target(arch, blocks=4)
    a = plan("tiny", tp, 3, 2, arch, target=target).attention
    assert (a.chunks_per_task, a.nchunk, a.split_tasks, a.q_resident) == (2, 2, 3, True)
    check_split(arch, tp, 3, 2, overrides, target=target)


@pytest.mark.kernel
@pytest.mark.slow
@pytest.mark.parametrize("arch", ("gfx942", "gfx950"))
@pytest.mark.parametrize("lds_kib,passes", [(None, None), (37, 4)])
def test_v41_flash_split_tasks_of_several_chunks(arch, lds_kib, passes):
    """10 chunks of 64 keys in tasks of 3 (the last one alone), key_len
    random: tasks stop inside. With 37 KiB of LDS the resident q leaves room
    for a quarter of the raw records: four PV passes."""
    target = small_target(arch, blocks=4, lds_kib=lds_kib)
    a = plan("v4.1-flash", 4, 1, 2, arch, target=target).attention
    assert (a.chunks_per_task, a.nchunk, a.split_tasks) == (3, 10, 4)
    assert passes is None or a.chunk_keys // a.raw_keys == passes
    check_split(arch, 4, 1, 2, {}, geometry="v4.1-flash", target=target)


@pytest.mark.kernel
@pytest.mark.parametrize("arch", ("gfx942", "gfx950"))
@pytest.mark.parametrize("name,overrides", EDGES, ids=[e[0] for e in EDGES])
def test_edge_cases(arch, name, overrides):
    check_split(arch, 4, 3, 2, overrides)
    check_combine(arch, 4, 3, 2, overrides)


@pytest.mark.kernel
@pytest.mark.parametrize("arch", ("gfx942", "gfx950"))
@pytest.mark.parametrize("lds_kib,passes", [(40, 1), (30, 2)])
def test_short_lds_layouts(arch, lds_kib, passes):
    """Layouts for little LDS (as for 128 heads on gfx942): fewer parts than
    waves (the spare waves sit the QK out), and the raw records in two PV
    passes."""
    target = small_target(arch, lds_kib=lds_kib)
    a = plan("tiny", 1, 3, 2, arch, target=target).attention
    assert a.key_tiles * a.key_parts < 8
    assert a.chunk_keys // a.raw_keys == passes
    check_split(arch, 1, 3, 2, {}, target=target)


@pytest.mark.kernel
@pytest.mark.parametrize("arch", ("gfx942", "gfx950"))
def test_negative_zero_key_bytes(arch):
    """OCP -0 (0x80) key bytes are NaN to gfx942's FNUZ converter: they must
    decode to 0. Every zero nope byte of every cache record becomes 0x80 (the
    same value), so a wrong decode poisons the scores."""
    spec = plan("tiny", 4, 3, 2, arch)
    inputs = make_inputs("tiny", 4, 3, 2, 3, arch=arch)
    for cache in ("swa", "comp"):
        pages = inputs[f"{cache}_cache"].clone()
        block = inputs[f"{cache}_block"]
        records = pages[:, :block * KV_DATA_BYTES].view(-1, block, KV_DATA_BYTES)
        nope = records[..., :NOPE_DIM]
        assert (nope == 0).any()
        nope[nope == 0] = 0x80
        inputs[f"{cache}_cache"] = pages
    want = reference_of(spec, inputs)
    scratch = torch.zeros(spec.scratch_bytes, dtype=torch.uint8)
    run_stage("split", spec, inputs, scratch, spec.attention.split_tasks)
    live = live_chunks(spec, inputs["key_len"])
    got = split_regions(spec, scratch)[0][..., 0]
    compare("chunk_max", torch.where(live[..., None], got, -math.inf), want["chunk_max"])


@pytest.mark.kernel
@pytest.mark.parametrize("arch", ("gfx942", "gfx950"))
def test_split_instruction_choice(arch):
    """16-B record loads, MFMA for QK and PV, no scratch, LDS within budget."""
    spec = plan("tiny", 1, 3, 2, arch)
    kernel = stage_kernel("split", spec)
    md = kernel.metadata
    assert md.private_segment_size == 0
    assert 0 < md.group_segment_size <= spec.target.lds_budget
    asm = kernel.asm
    assert "buffer_load_dwordx4" in asm
    qk = "v_mfma_f32_16x16x16_bf16" if arch == "gfx942" else "v_mfma_f32_16x16x32_bf16"
    assert qk in asm and "v_mfma_f32_16x16x16_bf16" in asm
    assert "scratch_" not in asm
    # gfx950 dequantizes a byte pair in one op
    assert ("v_cvt_scalef32_pk_bf16_fp8" in asm) == spec.target.scaled_convert == (arch == "gfx950")
    # the butterflies across rows (the scores' max, the softmax's sums): gfx950 swaps
    # rows in a VALU op, gfx942 goes through LDS
    swaps = "v_permlane16_swap_b32" in asm and "v_permlane32_swap_b32" in asm
    assert swaps == spec.target.permlane_swap == (arch == "gfx950")


def test_kernel_key_covers_the_arch_facts():
    """The arch facts are the spec's: a changed fact is a different spec, key
    and IR (else a cached code object built on the old belief would be reused)."""
    spec = plan("tiny", 4, 3, 2, "gfx950")
    other = plan("tiny", 4, 3, 2, "gfx950",
                 target=dataclasses.replace(spec.target, scaled_convert=False))
    assert render.KernelSource(other).key() != render.KernelSource(spec).key()
    assert render.KernelSource(other).render() != render.KernelSource(spec).render()


# --- the plan ----------------------------------------------------------------

PLANS = [(g, tp, tokens, arch) for g in GEOMETRIES for tp in (1, 2, 4, 8)
         if GEOMETRIES[g].groups % tp == 0 for tokens in (1, 3, 16, 64) for arch in targets.ARCHS]


@pytest.mark.parametrize("geometry,tp,tokens,arch", PLANS)
def test_plan_fits_and_covers(geometry, tp, tokens, arch):
    rank = GEOMETRIES[geometry].rank(tp)
    target = targets.ARCHS[arch]
    a = plan_attention(rank, tokens, 2, target)
    assert a.lds_bytes <= target.lds_budget
    assert a.nchunk * a.chunk_keys >= rank.keys > (a.nchunk - 1) * a.chunk_keys
    assert a.tasks_per_token == math.ceil(a.nchunk / a.chunks_per_task)
    assert a.split_tasks == tokens * a.tasks_per_token
    # chunks shared by a task never lengthen the chain of chunks a CTA runs
    blocks = targets.ARCHS[arch].blocks
    assert (math.ceil(a.split_tasks / blocks) * a.chunks_per_task
            <= math.ceil(tokens * a.nchunk / blocks))
    assert a.combine_tasks * a.combine_heads == tokens * rank.heads
    # a wave a SIMD, a head over as many SIMDs as keep the attention tasks within a
    # quarter of the grid; else a group a task, a wave a head
    shapes = [(4 // w, w) for w in (4, 2, 1)
              if tokens * rank.heads * w // 4 + a.split_tasks <= blocks // 4]
    assert (a.combine_heads, a.combine_waves) == (shapes + [(8, 1)])[0]
    # members 16-B aligned and disjoint, except what the plan says aliases
    # (p and dots over a streamed q tile, dots over p beside a resident q)
    home = "p" if a.q_resident else "q"
    aliases = {home, "p", "dots"}
    spans = sorted((off, off + size, name) for name, (off, size) in a.lds.items()
                   if name not in aliases - {home})
    assert all(off % 16 == 0 for off, _, _ in spans)
    assert all(end <= nxt for (_, end, _), (nxt, _, _) in itertools.pairwise(spans))
    assert all(a.lds[n][0] == a.lds[home][0] for n in aliases)
    assert a.lds["q"][1] >= (16 * a.head_tiles if a.q_resident else 16) * a.q_row
    # the chunk: the smallest that fits LDS while the launch's chunks stay short
    # (within MAX_SHORT_CHUNKS and a quarter of the grid), else as large as LDS
    # allows while MIN_SPLIT_TASKS tasks remain
    def fits_lds(ck):
        try:
            return plan_attention(rank, tokens, 2, target, chunk_keys=ck) is not None
        except ValueError:
            return False
    fitting = [ck for ck in CHUNK_KEYS if fits_lds(ck)]
    short = [ck for ck in fitting if tokens * math.ceil(rank.keys / ck) <= min(MAX_SHORT_CHUNKS, blocks // 4)]
    if short:
        assert a.chunk_keys == short[0]
    else:
        assert a.nchunk * tokens > min(MAX_SHORT_CHUNKS, blocks // 4)
        for ck in (c for c in fitting if c > a.chunk_keys):
            assert tokens * math.ceil(rank.keys / ck) < MIN_SPLIT_TASKS


@pytest.mark.parametrize("tp,arch", [(2, "gfx942"), (4, "gfx942"), (8, "gfx942"),
                                     (1, "gfx950"), (2, "gfx950"), (4, "gfx950")])
def test_large_s_reads_q_once_for_several_chunks(tp, arch):
    """S = 64 on the real grid: more chunks (5 a token) than CTAs to spare,
    so split tasks take several and q is read fewer times than a token has
    chunks."""
    a = plan_attention(GEOMETRIES["v4.1-flash"].rank(tp), 64, 2, targets.ARCHS[arch])
    assert a.q_resident and a.tasks_per_token < a.nchunk


@pytest.mark.parametrize("parts", (1, 2, 4))
def test_part_pieces_cover_the_record_once_and_balance(parts):
    a = plan_attention(GEOMETRIES["tiny"].rank(4), 1, 2, targets.ARCHS["gfx950"],
                       chunk_keys=128 // parts)
    assert a.key_parts == parts
    names = [n for part in a.part_pieces for n in part]
    assert sorted(names) == sorted(n for n, *_ in a.record_pieces)
    # MFMAs a part: 16 dims a lane of a nope piece, 8 of a rope piece
    work = {sum(16 if n[0] == "n" else 8 for n in part) for part in a.part_pieces}
    assert len(work) == 1
    # the QK operands: each piece's dims once, mfma_k a lane an MFMA, by the piece's part
    dims = {n: 0 for n, *_ in a.record_pieces}
    for name, _, _, part, _, _ in a.qk_operands:
        dims[name] += a.mfma_k
        assert a.piece_part[name] == part
    assert dims == {n: 16 if kind == "n" else 8 for n, kind, *_ in a.record_pieces}
    assert sum(a.part_mfmas) == len(a.qk_operands) and len(a.part_mfmas) == parts
    for word, users in enumerate(a.scale_word_parts):
        codes = {f"n{j}" for j in range(4 * word, 4 * word + 4)}
        assert set(users) == {a.piece_part[n] for n in codes if n in a.piece_part}


@pytest.mark.parametrize("kwargs,argument", [
    ({"target": "gfx90a"}, "arch"),
    ({"chunk_keys": 48}, "chunk_keys"),
    ({"chunk_keys": 256}, "chunk_keys"),
    # 128 heads on gfx942: 128-key chunks do not fit its LDS
    ({"chunk_keys": 128, "rank": GEOMETRIES["v4-pro"].rank(1)}, "chunk_keys"),
])
def test_plan_rejects_unsupported(kwargs, argument):
    args = {"rank": GEOMETRIES["tiny"].rank(4), "tokens": 3, "ratio": 2, "target": "gfx942"} | kwargs
    with pytest.raises(ValueError, match=f"^{argument}: "):
        plan_attention(**args | {"target": targets.arch_info(args["target"])})
