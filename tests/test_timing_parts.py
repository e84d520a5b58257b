"""The timing model's cost tables (k2back.emu.timing_parts) against what they
must agree with: the MFMAs our kernels emit, the emulator's instruction
classes, the published peak rates, the ISA's and the profiler's own examples,
each other (latency and bandwidth levels in order, a hand-off no faster than
its parts), and the table in docs/timing-model.md."""

from __future__ import annotations

import functools
import pathlib
import re

import pytest

from k2back.codegen.compiler import compile as compile_source
from k2back.codegen.plan import plan
from k2back.codegen.render import KernelSource
from k2back.codegen.targets import ARCHS
from k2back.emu.machine import DISPATCH
from k2back.emu.timing_parts import PARTS, SIMD_LANES, WAVE_LANES, mfma_shape, part

DOC = pathlib.Path(__file__).parents[1] / "docs" / "timing-model.md"
ARCH_IDS = sorted(PARTS)


@functools.cache
def kernel_mfmas(arch: str) -> set[tuple[str, int, int]]:
    """(mnemonic, cbsz, blgp) of every MFMA in the tiny K2 kernel (all four stages)."""
    asm = compile_source(KernelSource(plan("tiny", 1, 1, 2, arch))).asm
    found = set()
    for line in re.findall(r"^\s*(v_mfma\w*[^\n]*)", asm, re.MULTILINE):
        mods = dict(re.findall(r"(cbsz|blgp):(\d+)", line))
        found.add((line.split()[0], int(mods.get("cbsz", 0)), int(mods.get("blgp", 0))))
    return found


@pytest.mark.parametrize("arch", ARCH_IDS)
def test_every_mfma_the_kernel_emits_has_a_cost(arch):
    p = part(arch)
    mfmas = kernel_mfmas(arch)
    assert mfmas, f"no MFMA in the {arch} kernel: the asm pattern is stale"
    for mnemonic, cbsz, blgp in mfmas:
        assert mnemonic in p.mfma, f"{p.name}: no cost for {mnemonic}"
        assert p.mfma_cycles(mnemonic, cbsz, blgp) >= 4 * 2, mnemonic  # at least 2 passes


@pytest.mark.parametrize("arch", ARCH_IDS)
def test_mfma_cycles_reach_but_never_pass_the_published_peak(arch):
    p = part(arch)
    rates = {}
    for mnemonic, cost in p.mfma.items():
        m, n, k, element = mfma_shape(mnemonic)
        for cycles, kind in ((cost.cycles, element), (cost.f6f4_cycles, "f6f4")):
            if cycles:
                rate = 2 * m * n * k * p.simds_per_cu / cycles  # flops / CU / cycle
                assert rate <= p.matrix_flops_per_cu_cycle[kind], (mnemonic, rate)
                rates[kind] = max(rates.get(kind, 0), rate)
    assert rates == dict(p.matrix_flops_per_cu_cycle)


def test_the_scaled_mfma_costs_twice_as_much_with_an_8bit_operand():
    p = part("gfx950")
    mnemonic = "v_mfma_scale_f32_16x16x128_f8f6f4"
    assert p.mfma_cycles(mnemonic) == 2 * p.mfma_cycles(mnemonic, cbsz=4, blgp=2)
    assert p.mfma_cycles(mnemonic, cbsz=4, blgp=1) == p.mfma_cycles(mnemonic)


@pytest.mark.parametrize("arch", ARCH_IDS)
def test_every_emulator_instruction_class_has_an_issue_cost(arch):
    classes = {cls for _, cls, _ in DISPATCH}
    assert classes <= set(part(arch).issue_cycles), classes - set(part(arch).issue_cycles)


@pytest.mark.parametrize("arch", ARCH_IDS)
def test_units_and_geometry(arch):
    p = part(arch)
    assert p.cus == p.xcds * p.cus_per_xcd == ARCHS[arch].blocks
    assert 1.0 < p.clock_ghz < 3.0
    assert p.ns(p.cycles(417.0)) == pytest.approx(417.0)
    assert p.issue_cycles["valu"] == WAVE_LANES // SIMD_LANES
    assert p.valu_cycles("v_exp_f32_e32") == 4 * p.valu_cycles("v_add_f32_e32")
    assert p.valu_cycles("v_pk_fma_f32") == p.issue_cycles["valu"]
    for line in (p.vl1_line_bytes, p.l2_line_bytes, p.sl1_line_bytes, p.mall_line_bytes):
        assert line & (line - 1) == 0
    # s_memrealtime must resolve a cross-XCD hand-off (the timeline stamps rely on it)
    assert 1e9 / p.memrealtime_hz < p.handoff_ns / 10


@pytest.mark.parametrize("arch", ARCH_IDS)
def test_latency_levels_are_ordered(arch):
    p = part(arch)
    on_die = [p.ns(c) for c in (p.vl1_hit_cycles, p.l2_hit_cycles)]
    assert p.lds_latency_cycles < p.vl1_hit_cycles and p.sl1_hit_cycles < p.vl1_hit_cycles
    assert on_die + [p.mall_hit_ns, p.hbm_ns] == sorted(on_die + [p.mall_hit_ns, p.hbm_ns])
    assert p.ns(p.sl1_hit_cycles + p.sl1_miss_extra_cycles) < p.mall_hit_ns
    assert max(p.release_fence_ns, p.acquire_fence_ns) < p.handoff_ns < p.graph_node_ns
    assert p.graph_node_ns < p.launch_ns


@pytest.mark.parametrize("arch", ARCH_IDS)
def test_a_handoff_costs_about_its_parts(arch):
    """Release (write back), the consumer's poll missing to memory, acquire: the
    hand-off figure (Kog) and the parts (Kog fences, mt4g latency) are independent."""
    p = part(arch)
    parts = p.release_fence_ns + p.hbm_ns + p.acquire_fence_ns
    assert 0.7 < parts / p.handoff_ns < 1.4


@pytest.mark.parametrize("arch", ARCH_IDS)
def test_bandwidth_levels_are_ordered(arch):
    p = part(arch)
    hz = p.clock_ghz * 1e9
    assert 0.6 < p.hbm_bytes_per_s / p.hbm_peak_bytes_per_s < 0.95
    l2 = p.l2_bytes_per_cycle_per_xcd * p.xcds * hz
    assert p.hbm_bytes_per_s < l2 < p.cu_bytes_per_cycle * p.cus * hz
    assert p.l2_bytes_per_cycle_per_xcd <= 16 * 128  # 16 channels of 128 B/clk (rocprof)
    # one CU cannot stream HBM alone, all of them can
    assert p.cu_bytes_per_cycle * hz < p.hbm_bytes_per_s < p.cu_bytes_per_cycle * p.cus * hz


def test_lds_port_cycles_match_the_profilers_examples():
    """rocprofiler-compute, "Local data share": a 64-wide store of 4 B a lane takes
    8 cycles, of 16 B a lane 20 cycles; a wave gets 64 B a cycle back."""
    p = part("gfx942")
    assert (p.lds_cycles(4, write=True), p.lds_cycles(16, write=True)) == (8, 20)
    assert (p.lds_cycles(4, write=False), p.lds_cycles(16, write=False)) == (4, 16)
    assert part("gfx950").lds_cycles(16, write=False) == 8  # doubled read bandwidth


@pytest.mark.parametrize("arch", ARCH_IDS)
def test_sleep_is_within_the_isas_bounds(arch):
    """S_SLEEP n: (64 * n + 1..64) clocks."""
    p = part(arch)
    for n in (1, 2, 10):
        assert 64 * n + 1 <= p.sleep_cycles(n) <= 64 * n + 64
    assert p.nop_cycles(0) == p.issue_cycles["nop"]


def test_unknown_arch_is_refused_by_name():
    with pytest.raises(ValueError, match="arch: expected one of"):
        part("gfx90a")


def _doc_rows():
    """(name, MI300X cell, MI355X cell) of every table row whose first cell is `code`."""
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and re.fullmatch(r"`\w+`", cells[0]):
            yield cells[0].strip("`"), cells[1], cells[2]


def _cell_value(p, name):
    """What the doc's cell for `name` must say about part p: a number, or text."""
    if name in p.mfma:
        cost = p.mfma[name]
        return f"{cost.cycles} / {cost.f6f4_cycles}" if cost.f6f4_cycles else str(cost.cycles)
    for table in (p.issue_cycles, p.valu_slow, p.matrix_flops_per_cu_cycle):
        if name in table:
            return table[name]
    if name in type(p).__dataclass_fields__:
        return getattr(p, name)
    return "—"


def test_the_doc_table_says_what_the_module_says():
    rows = list(_doc_rows())
    for name, *cells in rows:
        for p, cell in zip((part("gfx942"), part("gfx950")), cells):
            want = _cell_value(p, name)
            if isinstance(want, str):
                assert cell == want, (name, p.name, cell, want)
            else:
                assert float(cell) == pytest.approx(want), (name, p.name, cell)
    every = set()
    for p in PARTS.values():
        every |= {n for n in type(p).__dataclass_fields__ if not hasattr(getattr(p, n), "keys")}
        every |= set(p.issue_cycles) | set(p.valu_slow) | set(p.mfma)
        every |= set(p.matrix_flops_per_cu_cycle)
    every -= {"name", "arch"}
    assert every <= {name for name, *_ in rows}, every - {name for name, *_ in rows}
