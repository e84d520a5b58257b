"""The hazard checker (k2back.emu.hazards) against the wait states of the CDNA3 /
CDNA4 tables as LLVM's GCNHazardRecognizer implements them: for every rule a
hand-written producer/consumer pair with one wait state too few raises naming
the rule and both asm lines, and with exactly enough runs; the check follows the
path a wave takes; LLVM's output for the K2 kernels is clean on every path."""

from __future__ import annotations

import numpy as np
import pytest

from k2back.codegen.compiler import compile as compile_source
from k2back.codegen.plan import plan
from k2back.codegen.render import KernelSource
from k2back.emu import HazardError, Machine
from k2back.emu import asm as asm_text
from k2back.emu.hazards import RULES, find_hazards
from k2back.emu.testing import ARCHS, handwritten

MFMA = "v_mfma_f32_16x16x16_bf16"  # 4 passes on both archs (XDL)
SETUP = """
\tv_mov_b32_e32 v1, 1.0
\tv_mov_b32_e32 v2, 0x3f803f80
\tv_mov_b32_e32 v3, 0x3f803f80
\tv_mov_b32_e32 v9, v0
\ts_load_dwordx2 s[2:3], s[0:1], 0x0
\ts_waitcnt lgkmcnt(0)
\ts_nop 7
\ts_nop 7
\ts_nop 7"""

# rule, (producer, consumer), wait states needed on gfx942, gfx950
CASES = {
    "VALU EXEC -> MFMA": ("VALU writes EXEC -> MFMA", "v_cmpx_eq_u32_e32 vcc, v0, v0",
                          f"{MFMA} v[4:7], v[2:3], v[2:3], 0", 4, 4),
    "VALU VGPR -> MFMA": ("VALU writes VGPR -> MFMA reads it", "v_mov_b32_e32 v3, 0x3f803f80",
                          f"{MFMA} v[4:7], v[2:3], v[2:3], 0", 2, 2),
    "MFMA -> MFMA SrcC overlapping": (
        "MFMA writes VGPR -> MFMA reads it as SrcC", f"{MFMA} v[4:7], v[2:3], v[2:3], 0",
        f"{MFMA} v[10:13], v[2:3], v[2:3], v[6:9]", 5, 6),
    "MFMA -> MFMA SrcA": ("MFMA writes VGPR -> MFMA reads it as SrcA/SrcB/scale",
                          f"{MFMA} v[4:7], v[2:3], v[2:3], 0",
                          f"{MFMA} v[10:13], v[4:5], v[2:3], 0", 7, 8),
    "MFMA -> VALU read": ("MFMA writes VGPR -> VALU/VMEM/DS reads it",
                          f"{MFMA} v[4:7], v[2:3], v[2:3], 0", "v_mov_b32_e32 v8, v5", 7, 8),
    "MFMA -> store data": ("MFMA writes VGPR -> VALU/VMEM/DS reads it",
                           f"{MFMA} v[4:7], v[2:3], v[2:3], 0",
                           "global_store_dword v9, v6, s[2:3]", 7, 8),
    "MFMA -> VALU write": ("MFMA writes VGPR -> VALU/VMEM/DS writes it (WAW)",
                           f"{MFMA} v[4:7], v[2:3], v[2:3], 0", "v_mov_b32_e32 v5, 0", 7, 8),
    "MFMA SrcC -> VALU write": ("MFMA reads VGPR as SrcC -> VALU/VMEM/DS writes it (WAR)",
                                f"{MFMA} v[10:13], v[2:3], v[2:3], v[4:7]",
                                "v_mov_b32_e32 v5, 0", 3, 3),
    "transcendental -> VALU": ("transcendental VALU writes VGPR -> VALU reads it",
                               "v_exp_f32_e32 v4, v1", "v_add_f32_e32 v5, v4, v4", 1, 1),
    "SDWA word -> VALU": ("VALU writes part of a VGPR (dst_sel / op_sel) -> VALU uses or writes it",
                          ("v_add_u32_sdwa v4, v1, v1 dst_sel:WORD_1 dst_unused:UNUSED_PAD "
                           "src0_sel:DWORD src1_sel:DWORD"), "v_add_u32_e32 v5, v4, v1", 1, 1),
    "op_sel word -> VALU": ("VALU writes part of a VGPR (dst_sel / op_sel) -> VALU uses or writes it",
                            "v_cvt_pk_fp8_f32 v4, v1, v1 op_sel:[0,0,1]", "v_mov_b32_e32 v5, v4",
                            1, 1),
    "VALU SGPR -> VALU": ("VALU writes SGPR -> VALU reads it", "v_cmp_eq_u32_e64 s[4:5], v0, v0",
                          "v_cndmask_b32_e64 v4, 0, 1, s[4:5]", 2, 2),
    "VALU VGPR -> readlane": ("VALU writes VGPR -> v_readlane/v_readfirstlane reads it",
                              "v_mov_b32_e32 v4, v0", "v_readfirstlane_b32 s4, v4", 1, 1),
    "VALU EXEC -> readlane": ("VALU writes EXEC -> v_readlane/v_readfirstlane/v_writelane",
                              "v_cmpx_eq_u32_e32 vcc, v0, v0", "v_readfirstlane_b32 s4, v9", 4, 4),
    "VALU SGPR -> lane select": ("VALU writes SGPR -> v_readlane/v_writelane lane select",
                                 "v_readfirstlane_b32 s6, v0", "v_writelane_b32 v4, 7, s6", 4, 4),
    "wide store -> VALU": ("store of more than 64 bits -> VALU overwrites its data",
                           "global_store_dwordx4 v9, v[4:7], s[2:3]", "v_mov_b32_e32 v5, 0", 2, 2),
    "VALU -> DPP": ("any write of a VGPR -> DPP reads it", "v_mov_b32_e32 v4, v0",
                    "v_mov_b32_dpp v5, v4 quad_perm:[1,0,3,2] row_mask:0xf bank_mask:0xf", 2, 2),
    "load -> DPP old": ("any write of a VGPR -> DPP reads it", "v_add_u32_e32 v5, 1, v0",
                        "v_mov_b32_dpp v5, v9 row_ror:8 row_mask:0xf bank_mask:0x3", 2, 2),
    "VALU EXEC -> DPP": ("VALU writes EXEC -> DPP", "v_cmpx_eq_u32_e32 vcc, v0, v0",
                         "v_mov_b32_dpp v5, v9 quad_perm:[1,0,3,2] row_mask:0xf bank_mask:0xf",
                         5, 5),
    "VALU VCC -> div_fmas": ("VALU writes VCC -> v_div_fmas", "v_div_scale_f32 v4, vcc, v1, v1, v1",
                             "v_div_fmas_f32 v5, v1, v1, v1", 4, 4),
    "VALU SGPR -> VMEM": ("VALU writes SGPR -> VMEM reads it", "v_readfirstlane_b32 s2, v10",
                          "global_load_dword v4, v9, s[2:3]", 5, 5),
}


def hazard_body(producer: str, consumer: str, states: int) -> str:
    """SETUP, then the pair with `states` wait states between them (as s_nops)."""
    gap = []
    while states > 0:
        gap.append(f"\ts_nop {min(states, 8) - 1}")
        states -= min(states, 8)
    return "\n".join([SETUP, "\tv_mov_b32_e32 v10, s2", "\ts_nop 1", f"\t{producer}", *gap,
                      f"\t{consumer}", "\ts_nop 7", "\ts_nop 7", "\ts_nop 7"])


def launch(arch, body, target=None):
    asm = handwritten(arch, body)
    if target is not None:
        asm = asm.replace(f'amdhsa--{arch}"', f'amdhsa--{target}"')
    machine = Machine(arch)
    out = np.zeros(64, np.uint32)
    machine.launch(asm, "hand", kernargs=machine.map(out).to_bytes(8, "little"))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("case", CASES)
def test_one_wait_state_short_raises_and_enough_runs(arch, case):
    rule, producer, consumer, gfx942, gfx950 = CASES[case]
    need = {"gfx942": gfx942, "gfx950": gfx950}[arch]
    launch(arch, hazard_body(producer, consumer, need))
    with pytest.raises(HazardError) as raised:
        launch(arch, hazard_body(producer, consumer, need - 1))
    message = str(raised.value)
    assert rule in message and f"needs {need} wait state" in message
    assert f"has {need - 1}" in message
    assert producer.split()[0] in message and consumer.split()[0] in message


def test_every_rule_has_a_case():
    covered = {case[0] for case in CASES.values()}
    gfx950_only = {"VALU writes VGPR -> v_permlane_swap reads it", "v_cmpx writes EXEC -> v_permlane_swap"}
    assert {rule.name for rule in RULES} - covered == gfx950_only


@pytest.mark.parametrize("producer, need", [("v_mov_b32_e32 v4, v0", 2),
                                            ("v_cmpx_eq_u32_e32 vcc, v0, v0", 4)])
def test_permlane_swap_hazards_gfx950(producer, need):
    consumer = "v_permlane32_swap_b32 v4, v5"
    launch("gfx950", hazard_body(producer, consumer, need))
    with pytest.raises(HazardError, match="v_permlane_swap"):
        launch("gfx950", hazard_body(producer, consumer, need - 1))


@pytest.mark.parametrize("arch", ARCHS)
def test_accumulating_into_the_same_registers_needs_no_wait(arch):
    mfma = f"{MFMA} v[4:7], v[2:3], v[2:3], v[4:7]"
    launch(arch, hazard_body(f"{MFMA} v[4:7], v[2:3], v[2:3], 0", mfma, 0))


SOFT_CLAUSE = """
\ts_load_dwordx2 s[4:5], s[0:1], 0x0
\ts_load_dwordx2 s[0:1], s[0:1], 0x0
\ts_waitcnt lgkmcnt(0)"""


@pytest.mark.parametrize("arch", ARCHS)
def test_soft_clause_writing_what_it_reads_only_with_xnack(arch):
    """With XNACK on or "any" a clause of SMEM loads may be replayed: the second
    load overwrites the base the first reads. With xnack- it is fine; an
    instruction between the loads ends the clause."""
    with pytest.raises(HazardError, match="soft clause"):
        launch(arch, SOFT_CLAUSE)
    launch(arch, SOFT_CLAUSE, target=f"{arch}:xnack-")
    launch(arch, SOFT_CLAUSE.replace("0x0\n", "0x0\n\ts_nop 0\n", 1))


BRANCHY = """
\ts_cmp_eq_u32 s{reg}, 0
\tv_mov_b32_e32 v4, v0
\ts_cbranch_scc1 .Lskip
\ts_nop 1
.Lskip:
\tv_mov_b32_dpp v5, v4 quad_perm:[1,0,3,2] row_mask:0xf bank_mask:0xf"""


@pytest.mark.parametrize("arch", ARCHS)
def test_the_check_follows_the_path_the_wave_took(arch):
    """The s_nop sits on one path into the DPP: the wave that skips it (s4 = 0 on
    the branch taken) raises, the one that falls through (s4 != 0) runs."""
    launch(arch, "\ts_mov_b32 s4, 1" + BRANCHY.format(reg=4))
    with pytest.raises(HazardError, match=r"any write of a VGPR -> DPP.* has 1: line \d+: v_mov_b32_e32"):
        launch(arch, "\ts_mov_b32 s4, 0" + BRANCHY.format(reg=4))


LOOP = f"""
\ts_mov_b32 s4, 3
.Lloop:
\tv_mov_b32_e32 v8, v{{read}}
\t{MFMA} v[4:7], v[2:3], v[2:3], 0
\ts_sub_u32 s4, s4, 1
\ts_cmp_lg_u32 s4, 0
\ts_cbranch_scc1 .Lloop
\ts_nop 7
\ts_nop 7"""


@pytest.mark.parametrize("arch", ARCHS)
def test_a_loop_back_edge_carries_the_mfma_result_to_the_top(arch):
    """On the second trip the VALU at the loop head reads v5 four instructions
    after the MFMA at the bottom wrote it: too soon. Reading v8 (not written by
    the MFMA) is fine."""
    launch(arch, SETUP + LOOP.format(read=8))
    with pytest.raises(HazardError, match="MFMA writes VGPR -> VALU/VMEM/DS reads it needs"):
        launch(arch, SETUP + LOOP.format(read=5))


@pytest.mark.kernel
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("tp, tokens, ratio", [(1, 16, 2), (8, 1, 0), (4, 64, 1)])
def test_llvm_output_for_the_k2_kernel_is_clean_on_every_path(arch, tp, tokens, ratio):
    kernel = compile_source(KernelSource(plan("tiny", tp, tokens, ratio, arch)))
    parsed = asm_text.parse_kernel(kernel.asm, kernel.name)
    assert any(ins.mnemonic == "s_nop" for ins in parsed.instructions)  # LLVM did insert some
    assert find_hazards(parsed, arch, parsed.directive("accum_offset")) == []


EXEC_ZERO = """
\ts_mov_b64 exec, 0
\tv_mov_b32_e32 v4, v0
\ts_cbranch_{branch} .Lz
\ts_nop 1
.Lz:
\tv_mov_b32_dpp v5, v4 quad_perm:[1,0,3,2] row_mask:0xf bank_mask:0xf
\ts_mov_b64 exec, -1"""


@pytest.mark.parametrize("arch", ARCHS)
def test_a_path_taken_only_with_exec_zero_is_harmless(arch):
    """s_cbranch_execz is taken only when no lane is active, and then the DPP
    move right after its target writes nothing: no hazard on that path (LLVM
    leaves such paths unguarded). The same layout behind an SCC branch is one."""
    def hazards(branch):
        kernel = asm_text.parse_kernel(handwritten(arch, EXEC_ZERO.format(branch=branch)), "hand")
        return find_hazards(kernel, arch, 32)
    assert hazards("execz") == []
    assert [v.rule for v in hazards("scc0")] == ["any write of a VGPR -> DPP reads it"]
    launch(arch, EXEC_ZERO.format(branch="execz"))
