"""The planner: every supported configuration plans within the arch's budgets,
every task of every stage runs on exactly one CTA, scratch regions are aligned
and disjoint, the spec survives JSON; anything unsupported is refused by name."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest

from k2back.codegen.plan import REGION_ALIGN, KernelSpec, plan
from k2back.codegen.targets import ARCHS
from k2back.config import MAX_TOKENS
from k2back.model import GEOMETRIES, MX_BLOCK, TP_DEGREES

CONFIGS = [
    (geo, tp, tokens, ratio, arch)
    for geo, g in GEOMETRIES.items()
    for tp in TP_DEGREES if g.groups % tp == 0
    for tokens in (1, 2, 3, 16, 17, 33, MAX_TOKENS)
    for ratio in (0, 1, 2)
    for arch in sorted(ARCHS)
]


def stage_assignment(spec: KernelSpec, stage: str) -> dict[int, list[int]]:
    """CTA -> its tasks of `stage`, by the rule the kernel template implements."""
    tasks, first, ctas = spec.stage_tasks[stage]
    owned = {}
    for b in range(spec.blocks):
        local = (b - first) % spec.blocks
        owned[b] = [t for t in range(local, tasks, ctas)] if local < ctas else []
    return owned


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(map(str, c)))
def test_supported_configuration(config):
    geo, tp, tokens, ratio, arch = config
    spec = plan(*config)
    info = ARCHS[arch]
    assert (spec.blocks, spec.threads) == (info.blocks, 512)
    tags = {"gfx942": "swafnuz_compocp", "gfx950": "swaocp_compocp"}  # "auto": what vLLM writes
    assert spec.name == (f"k2_back_{geo.replace('.', '').replace('-', '')}_tp{tp}_s{tokens}"
                         f"_r{ratio}_{arch}_{tags[arch]}")

    # LDS: every member inside the allocation, the kernel's word apart from all stages
    assert spec.lds_bytes <= info.lds_budget
    tag = spec.lds_member("kernel", "tag")
    for m in spec.lds:
        assert 0 <= m.offset and m.offset + m.bytes <= spec.lds_bytes
        if m.stage != "kernel":
            assert m.offset + m.bytes <= tag.offset

    # scratch: aligned, disjoint, in order, sized as the stages address them
    ends = 0
    for r in spec.scratch:
        assert r.offset % REGION_ALIGN == 0 and r.offset >= ends
        ends = r.offset + r.bytes
    assert ends <= spec.scratch_bytes
    # X8B: a byte a payload byte, or tagged words (8 B a 4-byte payload, 8 B a code)
    words = spec.wo_b.ll
    assert spec.ll_regions == ({"x8b": "bytes", "x8b_codes": "codes"} if words else {})
    assert spec.region("x8b").bytes == tokens * spec.o_rows * (2 if words else 1)
    assert spec.region("x8b_codes").bytes == tokens * spec.o_rows // MX_BLOCK * (8 if words else 1)
    assert spec.payload_bytes("x8b") == tokens * spec.o_rows
    assert spec.payload_bytes("x8b_codes") == tokens * spec.o_rows // MX_BLOCK
    assert spec.region("epoch_marks").bytes == 4 * spec.blocks
    for stage, flags in (("split", "split_flags"), ("combine", "combine_flags"),
                         ("wo_a", "wo_a_flags")):
        assert spec.region(flags).bytes == 4 * spec.stage_tasks[stage][0]

    # every task once; GEMV k split into whole 64-B steps over the waves
    owners = {stage: stage_assignment(spec, stage) for stage in spec.stage_tasks}
    for stage, owned in owners.items():
        tasks = sorted(t for ts in owned.values() for t in ts)
        assert tasks == list(range(spec.stage_tasks[stage][0])), stage
    for st in (spec.wo_a, spec.wo_b):
        assert st.k_waves * st.k_steps * 64 == st.k and st.k_steps % st.code_steps == 0
        assert max(len(ts) for ts in owners[st.name].values()) == st.per_cta
        assert st.token_tiles == math.ceil(tokens / 16)
        # the x tiles of each 16-token tile: every token below S once, whole steps a batch
        x_tiles = [u for us in st.x_tiles for u in us]
        assert x_tiles == list(range(math.ceil(tokens / st.x_tokens)))
        assert all(16 * tt <= st.x_tokens * u < 16 * (tt + 1)
                   for tt, us in enumerate(st.x_tiles) for u in us)
        assert all(st.k_steps % n == 0 and n % st.code_steps == 0 for n in st.x_steps)
        assert st.red_bytes == st.k_waves * st.row_tiles * 64 * 16
    # wo_b on CTAs without earlier work, when it spreads over part of the grid
    free = spec.blocks - sum(spec.stage_tasks[s][0] for s in ("split", "combine", "wo_a"))
    if spec.wo_b.ctas <= free:
        assert spec.wo_b.batch
        for b, ts in owners["wo_b"].items():
            if ts:
                assert not any(owners[s][b] for s in ("split", "combine", "wo_a")), b

    assert KernelSpec.from_json(spec.to_json()) == spec
    assert hash(KernelSpec.from_json(spec.to_json())) == hash(spec)


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("tokens", (1, 2, 4, 8, 16))
def test_wo_b_weights_stream_once_the_split_is_done(arch, tokens):
    """V4.1-Flash TP 4, decode sizes: every wo_b task on a CTA without combine or
    wo_a work (a split CTA's task ends before wo_b's weights stream: they await
    every split flag), all of a CTA's wo_b weights in flight before its first poll."""
    spec = plan("v4.1-flash", 4, tokens, 2, arch)
    earlier = spec.stage_ctas("combine") | spec.stage_ctas("wo_a")
    assert not spec.stage_ctas("wo_b") & earlier and spec.wo_b.after_split and spec.wo_b.batch


def test_minimum_bytes_matches_spec_example():
    """SPEC §6: V4.1-Flash, TP 4, S = 1 moves about 19.3 MB at least."""
    spec = plan("v4.1-flash", 4, 1, 2, "gfx942")
    assert sum(spec.minimum_bytes(valid_keys=640).values()) == pytest.approx(19.3e6, rel=0.01)


@pytest.mark.parametrize("kwargs, name", [
    ({"geometry": "v5"}, "geometry"),
    ({"tp": 3}, "tp"),
    ({"tp": 16}, "tp"),
    ({"tokens": 0}, "tokens"),
    ({"tokens": MAX_TOKENS + 1}, "tokens"),
    ({"tokens": 2.0}, "tokens"),
    ({"ratio": 3}, "ratio"),
    ({"arch": "gfx90a"}, "arch"),
    ({"swa_fp8": "fnuz"}, "swa_fp8"),
    ({"comp_fp8": None}, "comp_fp8"),
])
def test_unsupported_is_refused_by_name(kwargs, name):
    args = {"geometry": "tiny", "tp": 4, "tokens": 3, "ratio": 2, "arch": "gfx942", **kwargs}
    with pytest.raises(ValueError, match=rf"^{name}\b"):
        plan(**args)


def test_plans_differ_by_every_input():
    base = ("tiny", 4, 3, 2, "gfx942")
    variants = [("v4.1-flash", 4, 3, 2, "gfx942"), ("tiny", 2, 3, 2, "gfx942"),
                ("tiny", 4, 4, 2, "gfx942"), ("tiny", 4, 3, 1, "gfx942"), ("tiny", 4, 3, 2, "gfx950"),
                ("tiny", 4, 3, 2, "gfx942", "e4m3fn"), ("tiny", 4, 3, 2, "gfx942", "auto", "e4m3fnuz")]
    specs = [plan(*c) for c in (base, *variants)]
    assert len({s.name for s in specs}) == len({s.key() for s in specs}) == len(specs)
    assert all(a != b for a, b in itertools.combinations(specs, 2))


@pytest.mark.parametrize("arch, swa, comp, want", [
    ("gfx942", "auto", "auto", ("e4m3fnuz", "e4m3fn")),  # vLLM's C++ insert writes FNUZ there
    ("gfx950", "auto", "auto", ("e4m3fn", "e4m3fn")),
    ("gfx942", "e4m3fn", "auto", ("e4m3fn", "e4m3fn")),
    ("gfx950", "auto", "e4m3fnuz", ("e4m3fn", "e4m3fnuz")),
])
def test_key_formats_resolve_into_the_spec(arch, swa, comp, want):
    """The formats in force are fields of the spec, its name, its JSON and key
    ("auto" resolved: the same kernel as naming the format)."""
    spec = plan("tiny", 4, 3, 2, arch, swa, comp)
    assert (spec.swa_fp8, spec.comp_fp8) == want
    assert spec == plan("tiny", 4, 3, 2, arch, *want)
    tags = {"e4m3fn": "ocp", "e4m3fnuz": "fnuz"}
    assert spec.name.endswith(f"_swa{tags[want[0]]}_comp{tags[want[1]]}")
    assert f"swa_cache {want[0]}, comp_cache {want[1]}" in spec.describe()


def test_plan_takes_its_target_facts():
    """A test plans for its own facts (no patching of targets.ARCHS), which the
    spec carries; facts of another arch are refused by name."""
    small = dataclasses.replace(ARCHS["gfx942"], blocks=4)
    spec = plan("tiny", 4, 3, 2, "gfx942", target=small)
    assert spec.blocks == 4 and spec.target == small and ARCHS["gfx942"].blocks == 304
    assert KernelSpec.from_json(spec.to_json()) == spec
    with pytest.raises(ValueError, match="^target: "):
        plan("tiny", 4, 3, 2, "gfx942", target=ARCHS["gfx950"])


@pytest.mark.parametrize("tokens", [1, 3, 7, 8, 9, 15, 16, 17, 48, MAX_TOKENS])
def test_gemv_epilogue_covers_every_token_of_a_tile_in_whole_waves(tokens):
    # 8 threads a token of a 16-token tile: enough for the tokens a tile holds,
    # whole waves, and no wave more than that (a second wave at S <= 8 is waste)
    needed = 8 * min(tokens, 16)
    for stage in ("wo_a", "wo_b"):
        threads = getattr(plan("tiny", 1, tokens, 2, "gfx942"), stage).ep_threads
        assert threads >= needed and threads % 64 == 0 and threads - needed < 64, (stage, threads)


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("tp", (4, 8))
def test_wo_b_task_is_a_ctas_two_row_tiles_at_decode(arch, tp):
    """V4.1-Flash at S 1: 16-row wo_b tasks would leave most of wo_b's CTAs two each
    behind one flag wait; the plan makes them one task of 32 rows a CTA (the wait's
    activation loads, cross-wave sum and epilogue once). V4-Pro TP 1 at S 64 keeps
    16 rows: two row tiles of its weights would not fit in registers."""
    spec = plan("v4.1-flash", tp, 1, 2, arch)
    assert (spec.wo_b.rows, spec.wo_b.per_cta, spec.wo_b.tasks) == (32, 1, spec.hidden // 32)
    assert plan("v4-pro", 1, 64, 2, arch).wo_b.rows == 16


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("geometry, tp, tokens", [("v4.1-flash", 4, 1), ("v4.1-flash", 8, 1),
                                                  ("v4.1-flash", 4, 48), ("tiny", 4, 3)])
def test_epoch_moves_on_a_cta_whose_work_ends_first(arch, geometry, tp, tokens):
    """The CTA awaiting every epoch mark runs no task when one is idle, else split
    tasks only when one does: at V4.1-Flash TP 4 S 1 wo_b wraps onto CTA 0, whose
    wait would then begin after wo_b's and end a poll round after the last mark."""
    spec = plan(geometry, tp, tokens, 2, arch)
    work = [set() for _ in range(spec.blocks)]
    for stage, (tasks, _, _) in spec.stage_tasks.items():
        for task in range(tasks):
            work[spec.task_cta(stage, task)[0]].add(stage)
    rank = [0 if not w else 1 if w == {"split"} else 2 for w in work]
    assert rank[spec.epoch_cta] == min(rank), (spec.epoch_cta, work[spec.epoch_cta])
