"""The emulator's timing mode (k2back.emu.timing) against its cost tables: small
hand-written kernels reproduce each table value within 10 % (a pointer chase per
latency level, all CUs streaming from HBM, one CU streaming, a flag ping-pong
between XCDs), and a timed launch computes what an untimed one does."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from k2back.emu import Machine
from k2back.emu.testing import handwritten
from k2back.emu.timing_parts import PARTS, part

ARCHS = sorted(PARTS)
LINE = 128
BASE = "\ts_load_dwordx2 s[4:5], s[0:1], 0x0\n\ts_waitcnt lgkmcnt(0)\n"


def timed(arch: str, body: str, buffer: np.ndarray, grid=1, block=64) -> float:
    """modeled_ns of `body` run over `buffer` (its address in s[4:5])."""
    machine = Machine(arch, timing=True)
    kernargs = machine.map(buffer, "buffer").to_bytes(8, "little")
    stats = machine.launch(handwritten(arch, BASE + body), "hand", grid=(grid, 1, 1),
                           block=(block, 1, 1), kernargs=kernargs)
    assert stats.modeled_ns and stats.spans
    return stats.modeled_ns


# ---------------------------------------------------------------- pointer chase

CHAIN = 64  # lines of the chain a warm pass reads
LOAD = {"l1": "", "l2": " sc0", "mall": "", "hbm": ""}  # sc0: past the L1


def chase(arch: str, level: str, steps: int) -> float:
    """A wave follows a chain of line offsets `steps` times, after warming the
    level: the L1 and L2 by a first pass, the Infinity Cache by a first pass and
    an invalidation of the L1 and L2 (buffer_inv sc1); HBM lines are fresh."""
    chain = np.zeros(2 * CHAIN * LINE // 4, np.uint32)
    chain[::LINE // 4] = np.arange(1, 2 * CHAIN + 1, dtype=np.uint32) * LINE  # line i -> line i + 1
    step = "\tglobal_load_dword v2, v2, s[4:5]{}\n\ts_waitcnt vmcnt(0)\n"
    body = "\tv_mov_b32 v2, 0\n"
    if level == "hbm":
        body += f"\tv_mov_b32 v2, {CHAIN * LINE}\n"  # lines no pass touched
    else:
        body += step.format("") * CHAIN + "\tv_mov_b32 v2, 0\n"
        if level == "mall":
            body += "\tbuffer_inv sc1\n"
    body += step.format(LOAD[level]) * steps
    return timed(arch, body, chain)


def step_ns(measure, short: int, long: int) -> float:
    """Time a step adds: the slope between a short and a long run."""
    return (measure(long) - measure(short)) / (long - short)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("level", ["l1", "l2", "mall", "hbm"])
def test_pointer_chase_reproduces_each_latency_level(arch, level):
    p = part(arch)
    want = {"l1": p.ns(p.vl1_hit_cycles), "l2": p.ns(p.l2_hit_cycles),
            "mall": p.mall_hit_ns, "hbm": p.hbm_ns}[level]
    got = step_ns(lambda n: chase(arch, level, n), 8, 40)
    assert got == pytest.approx(want, rel=0.10), f"{p.name} {level}: {got:.1f} ns a step, table {want:.1f}"


# ---------------------------------------------------------------- streaming

IN_FLIGHT = 8  # dwordx4 loads a wave issues before it waits


def stream(arch: str, grid: int, rounds: int, in_flight: int = IN_FLIGHT) -> tuple[float, int]:
    """(modeled ns, bytes): `grid` workgroups of 8 waves read `rounds` x
    `in_flight` x 16 B a lane, every load a fresh contiguous stretch."""
    threads = grid * 512
    stride = threads * 16
    data = np.zeros(rounds * in_flight * stride, np.uint8)
    body = ("\ts_lshl_b32 s6, s2, 13\n"  # workgroup x 512 threads x 16 B
            "\tv_lshlrev_b32 v2, 4, v0\n"
            "\tv_add_u32_e32 v2, s6, v2\n"
            f"\ts_mov_b32 s7, {stride}\n"
            + ("\tglobal_load_dwordx4 v[4:7], v2, s[4:5]\n\tv_add_u32_e32 v2, s7, v2\n" * in_flight
               + "\ts_waitcnt vmcnt(0)\n") * rounds)
    return timed(arch, body, data, grid=grid, block=512), data.nbytes


def stream_rate(arch: str, grid: int, short: int, long: int, in_flight: int = IN_FLIGHT) -> float:
    """Bytes/s the extra rounds of a long run add over a short one."""
    t0, b0 = stream(arch, grid, short, in_flight)
    t1, b1 = stream(arch, grid, long, in_flight)
    return (b1 - b0) / (t1 - t0) * 1e9


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_all_cus_streaming_reproduces_the_achievable_bandwidth(arch):
    p = part(arch)
    got = stream_rate(arch, p.cus, 2, 4)
    assert got == pytest.approx(p.hbm_bytes_per_s, rel=0.10), f"{p.name}: {got / 1e12:.2f} TB/s"


@pytest.mark.parametrize("arch", ARCHS)
def test_one_cu_streams_at_its_own_limit(arch):
    p = part(arch)
    got = stream_rate(arch, 1, 4, 12, in_flight=32)
    want = p.cu_bytes_per_cycle * p.clock_ghz * 1e9
    assert got == pytest.approx(want, rel=0.10), f"{p.name}: {got / 1e9:.0f} GB/s a CU"


def burst(arch: str, loads: int) -> float:
    """One wave issues `loads` dword loads of fresh lines (one line each), then waits."""
    data = np.zeros((loads + 1) * LINE // 4, np.uint32)
    body = "\tv_mov_b32 v2, 0\n" + ("\tglobal_load_dword v3, v2, s[4:5]\n"
                                   f"\tv_add_u32_e32 v2, {LINE}, v2\n") * loads + "\ts_waitcnt vmcnt(0)\n"
    return timed(arch, body, data)


@pytest.mark.parametrize("arch", ARCHS)
def test_a_wave_has_at_most_vmcnts_range_of_loads_in_flight(arch):
    """Up to wave_vm_outstanding loads overlap (more of them cost only their issue:
    a load and an add each); the next ones wait for the oldest: twice the limit
    takes a second HBM latency."""
    p = part(arch)
    most = p.wave_vm_outstanding
    more = most - most // 2
    within = burst(arch, most) - burst(arch, most // 2)
    issue = p.ns(p.issue_cycles["vmem_load"] + p.issue_cycles["valu"])
    assert within == pytest.approx(more * issue, rel=0.10), f"{p.name}: {within:.0f} ns for {more} more loads"
    beyond = burst(arch, 2 * most) - burst(arch, most)
    assert beyond == pytest.approx(p.hbm_ns, rel=0.10), f"{p.name}: {beyond:.0f} ns, table {p.hbm_ns}"


# ---------------------------------------------------------------- hand-off

def ping_pong(arch: str, rounds: int) -> float:
    """Workgroups 0 and 1 (XCDs 0 and 1) pass a counter back and forth `rounds`
    times through flags in two lines, as the kernel's hand-offs do: release
    (buffer_wbl2 sc1), flag store sc1; poll with sc1 loads and s_sleep 1; acquire
    (buffer_inv sc1)."""
    flags = np.zeros(2 * LINE // 4, np.uint32)

    def put(offset: int) -> str:
        return (f"\tbuffer_wbl2 sc1\n\ts_waitcnt vmcnt(0)\n\tv_mov_b32 v6, s6\n"
                f"\tglobal_store_dword v1, v6, s[4:5] offset:{offset} sc1\n")

    def wait(offset: int, label: str) -> str:
        return (f"{label}:\n\tglobal_load_dword v5, v1, s[4:5] offset:{offset} sc1\n"
                f"\ts_waitcnt vmcnt(0)\n\tv_cmp_eq_u32_e32 vcc, s6, v5\n"
                f"\ts_cbranch_vccnz {label}_seen\n\ts_sleep 1\n\ts_branch {label}\n"
                f"{label}_seen:\n\tbuffer_inv sc1\n")

    def loop(label: str, steps: str) -> str:
        return (f"\ts_mov_b32 s6, 1\n{label}:\n{steps}"
                f"\ts_add_u32 s6, s6, 1\n\ts_cmp_le_u32 s6, {rounds}\n\ts_cbranch_scc1 {label}\n"
                "\ts_branch .Ldone\n")

    body = ("\tv_mov_b32 v1, 0\n\ts_cmp_eq_u32 s2, 0\n\ts_cbranch_scc0 .Lpong\n"
            + loop(".Lping", put(0) + wait(LINE, ".Lwait_pong"))
            + ".Lpong:\n" + loop(".Lpong_loop", wait(0, ".Lwait_ping") + put(LINE))
            + ".Ldone:\n\ts_waitcnt vmcnt(0)\n")
    return timed(arch, body, flags, grid=2)


@pytest.mark.parametrize("arch", ARCHS)
def test_ping_pong_between_xcds_reproduces_the_hand_off(arch):
    p = part(arch)
    got = (ping_pong(arch, 12) - ping_pong(arch, 4)) / (2 * 8)
    assert got == pytest.approx(p.handoff_ns, rel=0.10), f"{p.name}: {got:.0f} ns one way"


# ---------------------------------------------------------------- the mechanics


def test_pipe_saturates_at_its_rate_whatever_the_order():
    from k2back.emu.timing import Pipe

    pipe = Pipe(100.0)  # bytes / ns
    starts = np.random.default_rng(0).permutation(100) * 3.0
    finish = max(pipe.transfer(float(s), 1000.0) for s in starts)
    assert finish == pytest.approx(100 * 1000 / 100.0, rel=0.05)
    assert Pipe(100.0).transfer(50.0, 100.0) == pytest.approx(51.0)


@pytest.mark.kernel
@pytest.mark.parametrize("arch", ARCHS)
def test_timed_k2_launch_computes_what_an_untimed_one_does(arch):
    import torch

    from k2back import ops
    from k2back.config import Config
    from k2back.runtime.emu import EmuBackend
    from k2back.testing import make_inputs, run_kernel

    spec, kernel = ops.kernel_for(Config("tiny", 4, 3, 2, arch))
    inputs = make_inputs("tiny", 4, 3, 2, seed=21, arch=arch)
    runs = {}
    for timing in (False, True):
        backend = EmuBackend(timing=timing)
        scratch = backend.new_scratch(spec, torch.device("cpu"))
        runs[timing] = run_kernel(spec, kernel, inputs, scratch, backend)
    (plain, plain_stats), (out, stats) = runs[False], runs[True]
    assert torch.equal(out.view(torch.int16), plain.view(torch.int16))
    assert plain_stats.modeled_ns is None
    assert len(stats.spans) == spec.blocks
    assert stats.modeled_ns == max(end for _, end in stats.spans.values())
    polled = ("scratch",)  # flags: polls differ with the order
    assert ({k: v for k, v in stats.bytes_read.items() if k not in polled}
            == {k: v for k, v in plain_stats.bytes_read.items() if k not in polled})


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("counter", ["s_memtime", "s_memrealtime"])
def test_clock_counters_read_the_modeled_clock(arch, counter):
    """Stamps around 16 HBM loads differ by their modeled time, in the counter's unit."""
    p = part(arch)
    buffer = np.zeros(64 * LINE // 4, np.uint32)
    chase = "\tglobal_load_dword v2, v2, s[4:5]\n\ts_waitcnt vmcnt(0)\n"
    stamp = f"\t{counter} s[{{0}}:{{1}}]\n\ts_waitcnt lgkmcnt(0)\n"
    body = ("\tv_mov_b32 v2, 0\n" + stamp.format(8, 9) + chase * 16 + stamp.format(10, 11)
            + "\ts_sub_u32 s10, s10, s8\n\tv_mov_b32 v3, s10\n\tv_mov_b32 v2, 0\n"
            "\tglobal_store_dword v2, v3, s[4:5]\n")
    timed(arch, body, buffer)
    hz = p.memrealtime_hz if counter == "s_memrealtime" else p.clock_ghz * 1e9
    # the chain reads line 0 (offset 0 -> 0): one HBM miss, then L1 hits
    want = (p.hbm_ns + 15 * p.ns(p.vl1_hit_cycles)) * hz / 1e9
    assert int(buffer[0]) == pytest.approx(want, rel=0.15)


@pytest.mark.parametrize("arch", ARCHS)
def test_instructions_of_no_region_stay_in_the_waves_region(arch):
    """`regions` None (profile: an inlined block, which LLVM may lay out anywhere)
    keeps a wave in the region it last entered; "entry" before any."""
    body = "\ts_nop 0\n\tv_mov_b32_e32 v1, 1\n\ts_nop 0\n\ts_nop 0\n\tv_mov_b32_e32 v2, 2\n\ts_nop 0"
    names = [None, "a", None, None, "b", None, None]  # the last: s_endpgm
    machine = Machine(arch, timing=True, regions=lambda kernel: names[:len(kernel.instructions)])
    stats = machine.launch(handwritten(arch, body), "hand", grid=(1, 1, 1), block=(64, 1, 1),
                           kernargs=bytes(8))
    runs = [(region, start, end) for kind, region, start, end in stats.timeline[(0, 0)] if kind == "run"]
    assert [region for region, _, _ in runs] == ["entry", "a", "b"]
    assert all(a[2] == b[1] for a, b in itertools.pairwise(runs))  # one after the other, no gap
