"""Scalar, exec and branch instructions run once over a cohort of waves
(machine.Machine._run_cohort: a closure's `cohort` form, salu.py, memops.py, and
the SGPR-pair mask write of a Batch, operands.vector_writer) against the same
closures run wave by wave: random scalar files, every op of each table, the
edge values; and whole launches with the cohort forms against the same
launches with them taken away (every closure then runs wave by wave): the
same bytes, the same counters."""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest

from k2back.emu import machine as machine_module
from k2back.emu import salu
from k2back.emu.asm import Instruction
from k2back.emu.operands import MASK, parse, scalar_reader, scalar_writer, vector_writer
from k2back.emu.state import LANES, M32, M64, Wave, exec_state, int_to_mask
from k2back.emu.testing import ARCHS, handwritten

EDGES = (0, 1, 31, 32, 33, 63, 64, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF)
EXEC_EDGES = (0, 1, M64, 0x8000000000000000, 0xFFFFFFFF, 0xFFFFFFFF00000000, 0x5555555555555555)


def waves(seed: int, count: int, groups: int = 3) -> list[Wave]:
    """`count` waves of `groups` workgroups with random scalar files (edge values
    mixed in, several waves alike), exec values and SCC."""
    g = random.Random(seed)
    made, owners = [], [SimpleNamespace(exec_epoch=0, cu=object()) for _ in range(groups)]
    for k in range(count):
        w = Wave()
        w.s = [g.choice(EDGES) if g.random() < 0.4 else g.getrandbits(32) for _ in range(128)]
        if made and g.random() < 0.3:  # like its neighbour (waves of a workgroup often are)
            w.s = list(made[-1].s)
        w.exec, w.full, w.mask = exec_state(g.choice(EXEC_EDGES) if g.random() < 0.5 else g.getrandbits(64))
        w.scc, w.pc, w.group = g.randint(0, 1), 7, owners[k * groups // count]
        made.append(w)
    return made


def state(ws) -> list:
    return [(w.s, w.exec, w.full, w.mask.tolist(), w.scc, w.pc) for w in ws]


def copies(ws) -> list[Wave]:
    """Copies of waves `ws`, of copies of their workgroups."""
    made, groups = [], {}
    for w in ws:
        c = Wave()
        c.s, c.exec, c.full, c.mask, c.scc, c.pc = list(w.s), w.exec, w.full, w.mask, w.scc, w.pc
        c.group = groups.setdefault(id(w.group), SimpleNamespace(**vars(w.group)))
        made.append(c)
    return made


CTX = SimpleNamespace(
    operand=lambda token, ins: parse(token, 4, ins),
    scalar_reader=lambda token, bits, ins: scalar_reader(parse(token, 4, ins), bits, ins.where()),
    scalar_writer=lambda token, bits, ins: scalar_writer(parse(token, 4, ins), bits, ins.where()),
    labels={".L": 3}, code_address=0)


def instruction(mnemonic: str, *operands: str) -> Instruction:
    return Instruction(mnemonic, operands, {}, 1, f"{mnemonic} {', '.join(operands)}")


SAVEEXEC_FORMS = [(f"s_{op}_saveexec_b64", d, a) for op in salu.SAVEEXEC
                  for d, a in (("s[4:5]", "vcc"), ("s[8:9]", "s[10:11]"), ("s[6:7]", "s[6:7]"))]


@pytest.mark.parametrize("mnemonic,dst,src", SAVEEXEC_FORMS)
def test_saveexec_over_a_cohort_is_the_saveexec_of_each_wave(mnemonic, dst, src):
    run = salu.decode_sop(instruction(mnemonic, dst, src), CTX)
    for seed in range(6):
        cohort = waves(seed, 40)
        alone = copies(cohort)
        run.cohort(cohort)
        for w in alone:
            run(w)
        assert state(cohort) == state(alone)
        for w in cohort:  # each workgroup's batches read their masks again
            assert w.group.exec_epoch > 0


def test_saveexec_matches_the_isa_on_edge_values():
    """s_and_saveexec_b64: sdst = exec; exec = src & exec; SCC = exec != 0 (an independent model)."""
    run = salu.decode_sop(instruction("s_and_saveexec_b64", "s[4:5]", "vcc"), CTX)
    cohort = waves(9, 49)
    for w, (old, vcc) in zip(cohort, [(a, b) for a in EXEC_EDGES for b in EXEC_EDGES]):
        w.exec, w.full, w.mask = exec_state(old)
        w.s[106], w.s[107] = vcc & M32, vcc >> 32
    run.cohort(cohort)
    for w, (old, vcc) in zip(cohort, [(a, b) for a in EXEC_EDGES for b in EXEC_EDGES]):
        assert (w.s[4] | w.s[5] << 32, w.exec, w.scc) == (old, old & vcc, int(old & vcc != 0))
        assert w.full == (w.exec == M64) and w.mask.tolist() == [bool(w.exec >> i & 1) for i in range(64)]


BRANCHES = ["s_branch", *salu.BRANCH_TESTS]


@pytest.mark.parametrize("mnemonic", BRANCHES)
@pytest.mark.parametrize("mix", ["random", "all", "none"])
def test_a_branch_over_a_cohort_sends_each_wave_where_it_goes_alone(mnemonic, mix):
    run = salu.decode_branch(instruction(mnemonic, ".L"), CTX)
    for seed in range(8):
        cohort = waves(seed, 24)
        if mix != "random":  # all alike: take the first wave's state
            for w in cohort[1:]:
                w.s, w.exec, w.scc = list(cohort[0].s), cohort[0].exec, cohort[0].scc
        for w in cohort[:seed]:  # zero vcc, exec, scc in some
            w.s[106] = w.s[107] = w.exec = w.scc = 0
        alone = copies(cohort)
        to = run.cohort(cohort, 8)  # pcs left behind at 7: as the cohort leaves them
        for w in alone:
            w.pc = 8
            run(w)
        if to is None:
            assert len({w.pc for w in alone}) == 2
        else:
            for w in cohort:
                w.pc = to
        assert state(cohort) == state(alone)


def test_branches_follow_the_isa():
    """Taken: scc0 SCC == 0, scc1 SCC == 1, vccz VCC == 0, vccnz VCC != 0, execz EXEC == 0, ..."""
    model = {"s_branch": lambda w: True, "s_cbranch_scc0": lambda w: w.scc == 0,
             "s_cbranch_scc1": lambda w: w.scc == 1, "s_cbranch_vccz": lambda w: w.s[106] == w.s[107] == 0,
             "s_cbranch_vccnz": lambda w: w.s[106] != 0 or w.s[107] != 0,
             "s_cbranch_execz": lambda w: w.exec == 0, "s_cbranch_execnz": lambda w: w.exec != 0}
    assert set(model) == set(BRANCHES)
    for mnemonic, taken in model.items():
        run = salu.decode_branch(instruction(mnemonic, ".L"), CTX)
        cohort = waves(3, 30)
        for w in cohort[:10]:
            w.s[106] = w.s[107] = w.exec = w.scc = 0
        for w in cohort[10:20]:
            w.s[106], w.s[107] = 0, 0x80000000
        expected = [3 if taken(w) else 8 for w in cohort]
        to = run.cohort(cohort, 8)
        assert [w.pc if to is None else to for w in cohort] == expected


class Lanes:
    """A Batch as the mask writer sees it: its waves."""

    def __init__(self, ws):
        self.waves = ws


@pytest.mark.parametrize("dst", ["vcc", "s[8:9]", "exec"])
@pytest.mark.parametrize("shape", ["rows", "one row", "column", "uniform"])
def test_a_compare_mask_written_over_a_batch_is_each_waves_own(dst, shape):
    write = vector_writer(parse(dst, 4, None), MASK, "test")
    g = np.random.default_rng(5)
    for seed in range(6):
        cohort = waves(seed, 37)
        alone = copies(cohort)
        edge_rows = np.array([int_to_mask(value) for value in EXEC_EDGES])
        m = {"rows": np.concatenate([edge_rows, g.random((30, LANES)) < g.random()]),
             "one row": g.random((1, LANES)) < 0.5, "column": g.random((37, 1)) < 0.5,
             "uniform": np.bool_(seed % 2)}[shape]
        write(Lanes(cohort), m)
        rows = np.broadcast_to(m, (37, LANES))
        for w, row in zip(alone, rows):
            write(w, row)
        assert state(cohort) == state(alone)


def test_the_pair_mask_write_matches_the_isa():
    """VCC = the compare's lanes AND exec, the low 32 lanes in vcc_lo (an independent model)."""
    write = vector_writer(parse("vcc", 4, None), MASK, "test")
    cohort = waves(1, 7)
    m = np.zeros((7, LANES), bool)
    m[0, 0] = m[1, 63] = m[2, 31] = m[3, 32] = True
    m[4:] = True
    write(Lanes(cohort), m)
    for w, row in zip(cohort, m):
        bits = sum(1 << lane for lane in range(LANES) if row[lane] and w.exec >> lane & 1)
        assert (w.s[106], w.s[107]) == (bits & M32, bits >> 32)


# ---------------------------------------------------------------- whole launches

# The idle persistent grid's kernel as LLVM emits it (benchmarks/emu_speed.py IDLE):
# wave 0 of each workgroup marks its workgroup's word.
IDLE_BODY = """
\tv_cmp_eq_u32_e32 vcc, 0, v0
\ts_and_saveexec_b64 s[4:5], vcc
\ts_cbranch_execz .Ldone
\ts_load_dwordx2 s[0:1], s[0:1], 0x0
\ts_ashr_i32 s3, s2, 31
\ts_lshl_b64 s[2:3], s[2:3], 2
\tv_mov_b32_e32 v0, 0
\tv_mov_b32_e32 v1, 1
\ts_waitcnt lgkmcnt(0)
\ts_add_u32 s0, s0, s2
\ts_addc_u32 s1, s1, s3
\tglobal_store_dword v0, v1, s[0:1] sc1
.Ldone:
"""

# Every wave of 6 workgroups loads out's first words through its CU's scalar
# cache; wave 0 of each stores its workgroup's number into them; after a loop of
# SALU and branches on SCC, VCC and exec, waves 0-2 load those words again (the
# scalar caches hold copies older than the stores: stale bytes), and two at an
# offset of their own, and store them.
SCALAR_BODY = """
\ts_load_dwordx2 s[4:5], s[0:1], 0x0
\ts_waitcnt lgkmcnt(0)
\ts_load_dwordx4 s[20:23], s[4:5], 0x0
\tv_lshrrev_b32_e32 v5, 6, v0
\ts_nop 0
\tv_readfirstlane_b32 s12, v5
\tv_cmp_eq_u32_e32 vcc, 0, v0
\ts_and_saveexec_b64 s[6:7], vcc
\ts_cbranch_execz .Lskip
\ts_waitcnt lgkmcnt(0)
\ts_lshl_b32 s13, s2, 4
\ts_add_u32 s13, s13, s12
\tv_mov_b32_e32 v1, s13
\tv_mov_b32_e32 v2, 0
\ts_lshl_b32 s14, s2, 2
\tv_mov_b32_e32 v3, s14
\tglobal_store_dword v3, v1, s[4:5]
\ts_waitcnt vmcnt(0)
.Lskip:
\ts_or_b64 exec, exec, s[6:7]
\ts_mov_b32 s15, 0
\ts_add_u32 s16, s2, 1
.Lloop:
\ts_add_u32 s15, s15, s16
\ts_sub_u32 s16, s16, 1
\ts_cmp_lg_u32 s16, 0
\ts_cbranch_scc1 .Lloop
\tv_cmp_gt_u32_e32 vcc, 3, v5
\ts_cbranch_vccz .Lnone
\ts_waitcnt lgkmcnt(0)
\ts_load_dwordx4 s[8:11], s[4:5], 0x0
\ts_lshl_b32 s18, s12, 2
\ts_load_dwordx2 s[24:25], s[4:5], s18
\ts_waitcnt lgkmcnt(0)
\ts_add_u32 s8, s8, s15
\ts_add_u32 s9, s9, s24
\ts_add_u32 s9, s9, s25
\tv_mov_b32_e32 v1, s8
\tv_mov_b32_e32 v2, s9
\ts_mul_i32 s17, s2, 8
\ts_add_u32 s17, s17, s12
\ts_lshl_b32 s17, s17, 3
\ts_add_u32 s17, s17, 256
\tv_mov_b32_e32 v3, s17
\tglobal_store_dwordx2 v3, v[1:2], s[4:5]
.Lnone:
\ts_waitcnt vmcnt(0) lgkmcnt(0)
"""


def _no_cohorts(monkeypatch):
    """Decode with every closure's cohort form taken away: each runs wave by wave."""
    decode = machine_module.decode

    def plain(ins, ctx):
        run = decode(ins, ctx)
        if getattr(run, "cohort", None) is not None:
            def alone(w):
                return run(w)
            for key, value in vars(run).items():
                if key != "cohort":
                    setattr(alone, key, value)
            return alone
        return run
    monkeypatch.setattr(machine_module, "decode", plain)


def _counters(stats) -> tuple:
    return (stats.wave_instructions, stats.executed, stats.stale_bytes, stats.written_back, stats.polls,
            stats.bytes_read, stats.bytes_written, stats.cache_policy, stats.rounds, stats.barriers)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("order,memory", [("forward", "strict"), ("reverse", "strict"), ("forward", "ideal")])
def test_launches_with_cohort_forms_match_them_run_wave_by_wave(arch, order, memory, monkeypatch):
    results = []
    for cohorts in (True, False):
        if not cohorts:
            _no_cohorts(monkeypatch)
        marks = np.zeros(37, np.int32)
        machine = machine_module.Machine(arch, memory=memory)
        idle = machine.launch(handwritten(arch, IDLE_BODY), "hand", grid=(37,), block=(512,),
                              kernargs=machine.map(marks).to_bytes(8, "little"), order=order)
        out = (np.arange(512, dtype=np.uint32) * 7 + 1) << 8
        machine = machine_module.Machine(arch, memory=memory)
        kernargs = machine.map(out).to_bytes(8, "little")
        scalar = machine.launch(handwritten(arch, SCALAR_BODY), "hand", grid=(6,), block=(256,),
                                kernargs=kernargs, order=order)
        results.append((marks.tolist(), _counters(idle), out.tolist(), _counters(scalar)))
    assert results[0] == results[1]
    marks, _, out, scalar = results[0]
    assert marks == [1] * 37
    assert scalar[2] > 0 or memory == "ideal"  # loads took stale copies: the scalar cache's rules ran
    assert len(set(out[64:64 + 2 * 48])) > 20  # the stores of waves 0-2 reached out
