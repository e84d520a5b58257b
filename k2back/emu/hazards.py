"""Data-dependency hazards the hardware does not interlock: a kernel must put
enough independent instructions (wait states; `s_nop N` counts N + 1) between
a producer and a consumer, or the consumer reads a stale register.

Sources. The ISA guides' tables of required independent instructions: AMD
Instinct MI300 (CDNA3) ISA §4.5 "Manually Inserted Wait States (NOPs)" Tables
11-12 and §7.5 "Dependency Resolution: Required Independent Instructions" Table
37; the CDNA4 ISA's §4.5 and §7.6 Table 38 (read in markdown transcriptions of
the guides; the PDFs were not reachable here). LLVM's `GCNHazardRecognizer.cpp`
implements them for gfx942 and gfx950 (llvm-project main, 2026:
`checkMAIHazards90A`, `checkMAIVALUHazards`, `checkVALUHazards`,
`checkDPPHazards`, `checkRWLaneHazards`, `checkDivFMasHazards`,
`checkVMEMHazards`, `checkSoftClauseHazards`, `checkPermlaneHazards`; pass
counts from `SISchedule.td`'s gfx942/gfx950 models; which features each arch
has from `GCNSubtarget.h`), and the numbers below are LLVM's: they agree with
the tables where both speak, LLVM is what the code we run was compiled against,
and where LLVM is stricter we follow it (an SGPR a VALU wrote and a VALU then
reads as an explicit operand, a carry-in included: LLVM's VDecCoExec rule waits
2, the table 0 for carry-ins; LLVM counts explicit operands only, so the VCC an
e32/SDWA/DPP encoding implies is not checked). "Passes" is an MFMA's issue
length in 4-cycle passes; every MFMA our kernels use is an XDL op.

| consumer | producer | wait states |
|---|---|---|
| MFMA | VALU writes EXEC | 4 |
| MFMA (any source) | VALU writes the VGPR | 2 |
| MFMA SrcC, the same registers | MFMA wrote them (back-to-back accumulation) | 2 if 2-pass, else 0 |
| MFMA SrcC, overlapping | XDL MFMA wrote them | passes + 1 (+1 gfx950) |
| MFMA SrcA/B/scale | XDL MFMA wrote them | passes + 3 (+1 gfx950 unless 2-pass) |
| VALU/VMEM/DS reads a VGPR | XDL MFMA wrote it | passes + 3 (+1 gfx950 unless 2-pass) |
| VALU/VMEM/DS writes a VGPR | XDL MFMA wrote it (WAW) | passes + 3 (+1 gfx950 unless 2-pass) |
| VALU/VMEM/DS writes a VGPR | XDL MFMA reads it as SrcC (WAR) | 1/3/7/15 for 2/4/8/16 passes |
| non-transcendental VALU reads | transcendental VALU wrote it | 1 |
| VALU touches the register | VALU wrote part of it (SDWA dst_sel, op_sel dst bit) | 1 |
| VALU reads an SGPR as an explicit operand (not e32/SDWA/DPP's implied VCC) | VALU wrote it | 2 |
| v_readlane/v_readfirstlane src0 | VALU wrote the VGPR | 1 |
| v_readlane/v_readfirstlane/v_writelane | VALU writes EXEC | 4 |
| v_readlane/v_writelane lane select | VALU wrote the SGPR | 4 |
| VALU writes a VGPR | store of more than 64 bits reads it as data | 2 |
| DPP reads a VGPR (its old value too) | any instruction wrote it | 2 |
| DPP | VALU writes EXEC | 5 |
| v_div_fmas | VALU writes VCC | 4 |
| VMEM reads an SGPR | VALU wrote it | 5 |
| v_permlane*_swap (gfx950) | VALU wrote a source VGPR / v_cmpx wrote EXEC | 2 / 4 |
| SMEM/VMEM in a soft clause (XNACK on or any) | the clause (its last 5 instructions, 19 with AGPRs: LLVM's look-back) writes a register it reads, or a store follows | 1 (break the clause) |

As LLVM does, a rule looks at the most recent producer of its kind that writes
the register (operand by operand), whatever overwrote it since.

How it is checked, cheaply. At decode every instruction gets its static effects
(registers read and written as bit masks, its kind, passes). For every
consumer the rules are then walked back over *all* control-flow paths up to the
largest wait it may need (≤ 20): LLVM's output is clean on every path, so it
costs nothing at run time. A consumer with a violation on some path is wrapped:
when a wave executes it, the checker replays the wave's actual path (from a
trail of its taken branches, recorded only in kernels that have such a
consumer) and raises `HazardError` naming the rule, both instructions, their
asm lines and the wait states needed and present.
"""

from __future__ import annotations

import collections
import dataclasses
import re
from collections.abc import Callable

from .errors import HazardError
from .operands import parse
from .valu_ops import op_spec, split_mnemonic

VCC_BITS = 0b11 << 106
EXEC_BITS = 0b11 << 126  # exec_lo / exec_hi in the SGPR operand encoding
TRANSCENDENTAL = re.compile(r"v_(exp|log|rcp|rcp_iflag|rsq|sqrt|sin|cos)(_legacy)?_f(16|32|64)$")
WAR_WAIT = {2: 1, 4: 3, 8: 7, 16: 15}  # XDL reads SrcC -> VALU writes it, by passes


# --------------------------------------------------------------------------- MFMA facts


def mfma_passes(mnemonic: str, modifiers: dict) -> int:
    """Issue passes of an MFMA on gfx942/gfx950 (LLVM SISchedule.td): 16x16 forms
    4, 32x32 forms 8; the f8f6f4 forms twice that when an operand is fp8/bf8."""
    shape = re.search(r"_(\d+)x\d+x(\d+)", mnemonic)
    m, k = int(shape[1]), int(shape[2])
    passes = {16: 4, 32: 8, 4: 2}[m]
    if mnemonic.endswith("f8f6f4"):
        fp8 = min(int(modifiers.get("cbsz", "0"), 0), int(modifiers.get("blgp", "0"), 0)) <= 1
        passes *= 2 if fp8 else 1
    elif m == 16 and k < 16:  # the old 16x16x4/x8 shapes are 8-pass
        passes = 8
    return passes


@dataclasses.dataclass(frozen=True)
class Mfma:
    passes: int
    dst: tuple[int, int]  # (first VGPR, count)
    src_c: tuple[int, int] | None  # None: an inline constant


# --------------------------------------------------------------------------- effects


@dataclasses.dataclass(eq=False)
class Effects:
    """What one instruction does that hazards care about. Register sets are bit
    masks over the unified VGPR/AGPR file and over the SGPR operand encoding
    (VCC = 106/107, M0 = 124, EXEC = 126/127); one mask per operand where the
    rules look at operands one by one, as LLVM does."""

    pc: int
    op: str  # the mnemonic
    where: str  # "line N: text"
    kind: str  # valu, mfma, vmem, ds, smem, salu, branch, other
    states: int = 1  # wait states it provides
    vdefs: tuple[int, ...] = ()
    vuses: tuple[int, ...] = ()
    sdefs: int = 0
    suses: tuple[int, ...] = ()
    trans: bool = False
    dpp: bool = False
    forwards: int = 0  # VGPRs written through a dst_sel / op_sel shift
    wide_store: int = 0  # data VGPRs of a store of more than 64 bits
    lane_select: int = 0  # SGPR of v_readlane/v_writelane's lane select
    readlane_src: int = 0  # VGPR v_readlane/v_readfirstlane reads
    rw_lane: bool = False
    permlane: bool = False
    vcmpx: bool = False
    store: bool = False
    mfma: Mfma | None = None
    mfma_c: int = 0  # VGPRs an MFMA reads as SrcC
    mfma_ab: tuple[int, ...] = ()  # its other VGPR sources (A, B, scales)
    vdef: int = 0  # union of vdefs

    @property
    def is_valu(self) -> bool:
        return self.kind in ("valu", "mfma")

    @property
    def lane_masked(self) -> bool:
        """Does nothing under EXEC = 0 (so no hazard can touch it then)?"""
        return self.kind in ("vmem", "ds") or (self.kind == "valu" and not self.rw_lane)


def _union(masks) -> int:
    out = 0
    for m in masks:
        out |= m
    return out


def _masks(tokens, accum_offset, ins) -> tuple[list[int], list[int]]:
    """(VGPR masks, SGPR masks) of the register operands among `tokens`."""
    vgprs, sgprs = [], []
    for token in tokens:
        if token == "off":
            continue
        op = parse(token, accum_offset, ins)
        bits = ((1 << op.count) - 1) << op.index
        if op.file == "v":
            vgprs.append(bits)
        elif op.file == "s":
            sgprs.append(bits)
        elif op.file == "exec":
            sgprs.append(((1 << op.count) - 1) << (126 + op.index))
    return vgprs, sgprs


def effects(ins, pc: int, accum_offset: int) -> Effects:
    """The hazard-relevant effects of one parsed instruction."""
    name, ops = ins.mnemonic, ins.operands
    e = Effects(pc, name, ins.where(), "other")
    if name == "s_nop":
        e.states = int(ops[0], 0) + 1
    elif name.startswith(("s_branch", "s_cbranch")):
        e.kind = "branch"
    elif name.startswith("v_mfma"):
        _mfma_effects(e, ins, accum_offset)
    elif name.startswith("v_"):
        _valu_effects(e, ins, accum_offset)
    elif name.startswith(("s_load", "s_buffer_load", "s_memtime", "s_memrealtime", "s_dcache")):
        e.kind = "smem"
        (_, defs), (_, uses) = _masks(ops[:1], accum_offset, ins), _masks(ops[1:], accum_offset, ins)
        e.sdefs, e.suses = _union(defs), tuple(uses)
    elif name.startswith("s_"):
        e.kind = "salu"
        if "saveexec" in name or (ops and ops[0].startswith("exec")):
            e.sdefs = EXEC_BITS
    elif name.startswith("ds_"):
        returns = name.startswith(("ds_read", "ds_bpermute", "ds_permute", "ds_swizzle")) or "_rtn_" in name
        n = 1 if returns else 0
        e.kind, e.store = "ds", not returns
        e.vdefs = tuple(_masks(ops[:n], accum_offset, ins)[0])
        e.vuses = tuple(_masks(ops[n:], accum_offset, ins)[0])
    else:
        _vmem_effects(e, ins, accum_offset)
    e.vdef = _union(e.vdefs)
    return e


def _mfma_effects(e, ins, accum_offset):
    ops = ins.operands
    dst, _, _, c = (parse(t, accum_offset, ins) for t in ops[:4])
    e.kind = "mfma"
    e.vdefs = tuple(_masks(ops[:1], accum_offset, ins)[0])
    e.vuses = tuple(_masks(ops[1:], accum_offset, ins)[0])
    e.mfma = Mfma(mfma_passes(ins.mnemonic, ins.modifiers), (dst.index, dst.count),
                  (c.index, c.count) if c.file == "v" else None)
    e.mfma_c = ((1 << c.count) - 1) << c.index if c.file == "v" else 0
    e.mfma_ab = tuple(_masks([ops[1], ops[2], *ops[4:]], accum_offset, ins)[0])


# VALU ops that also read their destination: tied (fmac), the other lanes
# (writelane), the other word (fp8 packs), both registers (permlane swaps)
_READS_DESTINATION = ("v_fmac_", "v_writelane_b32", "v_cvt_pk_fp8", "v_cvt_pk_bf8",
                      "v_cvt_scalef32_pk_fp8", "v_cvt_scalef32_pk_bf8", "v_permlane")


def _valu_effects(e, ins, accum_offset):
    ops, mods = ins.operands, ins.modifiers
    base, encoding = split_mnemonic(ins.mnemonic)
    spec = op_spec(base)
    n_defs = 2 if e.op.startswith("v_permlane") else len(spec[0].split()) if spec else 1
    dv, ds = _masks(ops[:n_defs], accum_offset, ins)
    # a VCC operand of a 32-bit encoding (VOP2/VOPC e32, SDWA, DPP: carry-in, mask) is
    # implicit in LLVM's MachineInstr, and the SGPR-read rule looks at explicit uses only
    implicit_vcc = encoding in ("e32", "sdwa", "dpp")
    uv, us = _masks([t for t in ops[n_defs:] if not (implicit_vcc and t == "vcc")], accum_offset, ins)
    e.kind = "valu"
    e.trans = bool(TRANSCENDENTAL.match(base))
    e.dpp = encoding == "dpp"
    e.vcmpx = base.startswith("v_cmpx")
    e.permlane = base.startswith("v_permlane")
    if e.dpp or base.startswith(_READS_DESTINATION):  # DPP keeps the old value in masked lanes
        uv = dv + uv
    if base.startswith("v_div_fmas"):
        us = [*us, VCC_BITS]
    e.vdefs, e.vuses, e.suses = tuple(dv), tuple(uv), tuple(us)
    e.sdefs = _union(ds) | (EXEC_BITS if e.vcmpx else 0)
    if base in ("v_readlane_b32", "v_readfirstlane_b32"):
        e.readlane_src = _masks(ops[1:2], accum_offset, ins)[0][0]
    if base in ("v_readlane_b32", "v_writelane_b32", "v_readfirstlane_b32"):
        e.rw_lane = True
        e.lane_select = _union(_masks(ops[2:3], accum_offset, ins)[1])
    if _forwards_partial_dst(base, encoding, mods, len(ops) - n_defs):
        e.forwards = _union(dv)


def _forwards_partial_dst(base, encoding, mods, sources) -> bool:
    """LLVM getDstSelForwardingOperand: SDWA with dst_sel other than DWORD, or an
    op_sel-capable VOP3 with its destination bit set (for VOP3P that bit is
    op_sel_hi of src0, whose default is 1)."""
    if encoding == "sdwa":
        return mods.get("dst_sel", "DWORD") != "DWORD"
    if base.startswith("v_pk_"):
        hi = mods.get("op_sel_hi")
        return hi is None or hi.strip("[]").split(",")[0] == "1"
    bits = mods.get("op_sel", "").strip("[]").split(",")
    return len(bits) > sources and bits[sources] == "1"


def _vmem_effects(e, ins, accum_offset):
    name, ops, mods = ins.mnemonic, ins.operands, ins.modifiers
    e.kind = "vmem"
    segment, _, rest = name.partition("_")
    op = rest.split("_", 1)[0]
    if op in ("wbl2", "inv", "wbinvl1"):
        return
    e.store = op == "store"
    if segment == "buffer":  # vdata, vaddr, srsrc, soffset
        data, vaddr, rsrc, soffset = ops
        returns = op == "load" or (op == "atomic" and bool(mods.get("sc0") or mods.get("glc")))
        addressed = bool(mods.get("offen") or mods.get("idxen"))
        read_data = [] if op == "load" else [data]
        uv, us = _masks(read_data + ([vaddr] if addressed else []) + [rsrc, soffset], accum_offset, ins)
        dv = _masks([data] if returns else [], accum_offset, ins)[0]
        data_bits = _masks([data], accum_offset, ins)[0][0]
        sgpr_offset = parse(soffset, accum_offset, ins).file == "s"
        if e.store and data_bits.bit_count() > 2 and not sgpr_offset:
            e.wide_store = data_bits
    else:  # global / flat: [vdst,] vaddr, vdata, saddr
        returns = op == "load" or (op == "atomic" and len(ops) == (4 if segment == "global" else 3))
        n = 1 if returns else 0
        dv = _masks(ops[:n], accum_offset, ins)[0]
        uv, us = _masks(ops[n:], accum_offset, ins)
        if e.store and _masks(ops[1:2], accum_offset, ins)[0][0].bit_count() > 2:
            e.wide_store = _masks(ops[1:2], accum_offset, ins)[0][0]
    e.vdefs, e.vuses, e.suses = tuple(dv), tuple(uv), tuple(us)


# --------------------------------------------------------------------------- rules


@dataclasses.dataclass(frozen=True, eq=False)  # rules compare and hash by identity (cheap in path sets)
class Rule:
    """One row of the table: `watch(consumer)` lists the register masks to check
    (one check each); `produces(producer)` the registers an instruction of the
    row's producer kind writes (reads, for WAR), 0 for any other; `wait(producer,
    consumer, gfx950)` the wait states the pair needs."""

    name: str
    watch: Callable[[Effects], list[int]]
    produces: Callable[[Effects], int]
    wait: Callable[[Effects, Effects, bool], int]
    most: int  # the largest wait (how far back a check looks)


def _xdl_write_wait(p: Effects, c: Effects, gfx950: bool) -> int:
    return p.mfma.passes + 3 + int(gfx950 and p.mfma.passes != 2)


def _srcc_wait(p: Effects, c: Effects, gfx950: bool) -> int:
    if p.mfma.dst == c.mfma.src_c:  # the same registers: the MFMA pipeline forwards
        return 2 if p.mfma.passes == 2 else 0
    return p.mfma.passes + 1 + int(gfx950)


def _fixed(n: int):
    return lambda p, c, gfx950: n


def _valu_sgprs(p: Effects) -> int:
    return p.sdefs if p.is_valu else 0


def _legacy_valu_vgprs(p: Effects) -> int:  # LLVM: isVALU && !isMFMA (&& !isDOT)
    return p.vdef if p.kind == "valu" else 0


def _mfma_vgprs(p: Effects) -> int:
    return p.vdef if p.mfma else 0


def _vector(c: Effects) -> bool:
    return c.kind in ("valu", "vmem", "ds")


RULES = (
    Rule("VALU writes EXEC -> MFMA", lambda c: [EXEC_BITS] if c.mfma else [],
         lambda p: p.sdefs if p.kind == "valu" else 0, _fixed(4), 4),
    Rule("VALU writes VGPR -> MFMA reads it", lambda c: list(c.vuses) if c.mfma else [],
         _legacy_valu_vgprs, _fixed(2), 2),
    Rule("MFMA writes VGPR -> MFMA reads it as SrcC", lambda c: [c.mfma_c] if c.mfma else [],
         _mfma_vgprs, _srcc_wait, 18),
    Rule("MFMA writes VGPR -> MFMA reads it as SrcA/SrcB/scale",
         lambda c: list(c.mfma_ab) if c.mfma else [], _mfma_vgprs, _xdl_write_wait, 20),
    Rule("MFMA writes VGPR -> VALU/VMEM/DS reads it", lambda c: list(c.vuses) if _vector(c) else [],
         _mfma_vgprs, _xdl_write_wait, 20),
    Rule("MFMA writes VGPR -> VALU/VMEM/DS writes it (WAW)",
         lambda c: list(c.vdefs) if _vector(c) else [], _mfma_vgprs, _xdl_write_wait, 20),
    Rule("MFMA reads VGPR as SrcC -> VALU/VMEM/DS writes it (WAR)",
         lambda c: list(c.vdefs) if _vector(c) else [], lambda p: p.mfma_c,
         lambda p, c, gfx950: WAR_WAIT[p.mfma.passes], 15),
    Rule("transcendental VALU writes VGPR -> VALU reads it",
         lambda c: [_union(c.vuses)] if c.is_valu and not c.trans else [],
         lambda p: p.vdef if p.trans else 0, _fixed(1), 1),
    Rule("VALU writes part of a VGPR (dst_sel / op_sel) -> VALU uses or writes it",
         lambda c: [_union(c.vuses) | c.vdef] if c.is_valu else [], lambda p: p.forwards, _fixed(1), 1),
    Rule("VALU writes SGPR -> VALU reads it", lambda c: list(c.suses) if c.is_valu else [],
         _valu_sgprs, _fixed(2), 2),
    Rule("VALU writes VGPR -> v_readlane/v_readfirstlane reads it", lambda c: [c.readlane_src],
         lambda p: p.vdef if p.is_valu else 0, _fixed(1), 1),
    Rule("VALU writes EXEC -> v_readlane/v_readfirstlane/v_writelane",
         lambda c: [EXEC_BITS] if c.rw_lane else [], _valu_sgprs, _fixed(4), 4),
    Rule("VALU writes SGPR -> v_readlane/v_writelane lane select", lambda c: [c.lane_select],
         _valu_sgprs, _fixed(4), 4),
    Rule("store of more than 64 bits -> VALU overwrites its data",
         lambda c: list(c.vdefs) if c.is_valu else [], lambda p: p.wide_store, _fixed(2), 2),
    Rule("any write of a VGPR -> DPP reads it", lambda c: list(c.vuses) if c.dpp else [],
         lambda p: p.vdef, _fixed(2), 2),
    Rule("VALU writes EXEC -> DPP", lambda c: [EXEC_BITS] if c.dpp else [], _valu_sgprs, _fixed(5), 5),
    Rule("VALU writes VCC -> v_div_fmas", lambda c: [VCC_BITS] if c.op.startswith("v_div_fmas") else [],
         _valu_sgprs, _fixed(4), 4),
    Rule("VALU writes SGPR -> VMEM reads it", lambda c: list(c.suses) if c.kind == "vmem" else [],
         _valu_sgprs, _fixed(5), 5),
    Rule("VALU writes VGPR -> v_permlane_swap reads it", lambda c: list(c.vuses) if c.permlane else [],
         lambda p: p.vdef if p.is_valu else 0, _fixed(2), 2),
    Rule("v_cmpx writes EXEC -> v_permlane_swap", lambda c: [EXEC_BITS] if c.permlane else [],
         lambda p: EXEC_BITS if p.vcmpx else 0, _fixed(4), 4),
)
WINDOW = max(rule.most for rule in RULES)
CLAUSE_RULE = "soft clause (XNACK replay): an instruction writes a register the clause reads, or a store"


@dataclasses.dataclass(frozen=True)
class Violation:
    rule: str
    producer: Effects
    consumer: Effects
    present: int
    needed: int

    def message(self) -> str:
        return (f"hazard: {self.rule} needs {self.needed} wait state(s) between them, the code "
                f"has {self.present}: {self.producer.where}, then {self.consumer.where}")


# --------------------------------------------------------------------------- analysis


class Program:
    """A kernel's instructions as hazard effects, with its control flow and, per
    instruction, the checks that can fire at all (a check whose registers no
    instruction of the kernel produces for its rule is dropped at decode)."""

    def __init__(self, kernel, arch: str, accum_offset: int):
        self.gfx950 = arch == "gfx950"
        self.xnack = "xnack-" not in kernel.target  # on or "any": LLVM breaks soft clauses
        instructions = kernel.instructions
        self.effects = [effects(ins, pc, accum_offset) for pc, ins in enumerate(instructions)]
        # LLVM looks back over the last 5 instructions (19 when AGPRs are in use)
        # for a soft clause: MaxLookAhead of GCNHazardRecognizer
        agprs = any(e.vdef >> accum_offset for e in self.effects)
        self.clause_look_back = 19 if agprs else 5
        self.before = [0]  # wait states of instructions 0 .. pc-1
        for e in self.effects:
            self.before.append(self.before[-1] + e.states)
        self.branches_into: dict[int, list[int]] = collections.defaultdict(list)
        for pc, ins in enumerate(instructions):
            if self.effects[pc].kind == "branch" and ins.operands and ins.operands[0] in kernel.labels:
                self.branches_into[kernel.labels[ins.operands[0]]].append(pc)
        self.falls_through = [ins.mnemonic not in ("s_branch", "s_endpgm") for ins in instructions]
        # control-flow edges a wave crosses only with EXEC = 0: s_cbranch_execz taken,
        # s_cbranch_execnz not taken
        self.zero_exec_edges = set()
        for target, sources in self.branches_into.items():
            for pc in sources:
                if instructions[pc].mnemonic == "s_cbranch_execz" and target != pc + 1:
                    self.zero_exec_edges.add((pc, target))
                if instructions[pc].mnemonic == "s_cbranch_execnz" and target != pc + 1:
                    self.zero_exec_edges.add((pc, pc + 1))
        # per rule, what each instruction produces for it (looked up, not recomputed, on every path)
        self.made = {rule: [rule.produces(e) for e in self.effects] for rule in RULES}
        produced = [_union(self.made[rule]) for rule in RULES]
        self.checks = [[(rule, mask) for rule, made in zip(RULES, produced)
                        for mask in rule.watch(c) if mask & made] for c in self.effects]
        self._violations: dict[int, list[Violation]] | None = None
        self._predecessors = [list(self.branches_into.get(pc, ())) for pc in range(len(instructions))]
        for pc in range(1, len(instructions)):
            if self.falls_through[pc - 1]:
                self._predecessors[pc].append(pc - 1)

    @property
    def violations(self) -> dict[int, list[Violation]]:
        """pc -> the violations at it on some path (computed once)."""
        if self._violations is None:
            found = {pc: self.violations_any_path(pc) for pc in range(len(self.effects))}
            self._violations = {pc: v for pc, v in found.items() if v}
        return self._violations

    def predecessors(self, pc: int) -> list[int]:
        return self._predecessors[pc]

    def _step(self, c, p, between, checks, found):
        """Resolve the checks producer `p` answers; return those still open."""
        open_checks = []
        made, at = self.made, p.pc
        for rule, mask in checks:
            if made[rule][at] & mask:
                need = rule.wait(p, c, self.gfx950)
                if between < need:
                    found[(rule.name, p.pc, mask)] = Violation(rule.name, p, c, between, need)
            elif between + p.states < rule.most:
                open_checks.append((rule, mask))
        return open_checks

    # every path, at decode ----------------------------------------------------

    def violations_any_path(self, pc: int) -> list[Violation]:
        """The violations at `pc` along any control-flow path into it. A path
        that reaches a lane-masked consumer over an edge taken only with EXEC = 0
        (and no EXEC write since) is harmless: the consumer does nothing there.
        LLVM leaves such paths unguarded (e.g. an s_cbranch_execz past an MFMA)."""
        found: dict[tuple, Violation] = {}
        c = self.effects[pc]
        if self.checks[pc]:
            stack, seen = [(pc, 0, tuple(self.checks[pc]), False)], set()
            masked, zero_exec_edges, effects, step = c.lane_masked, self.zero_exec_edges, self.effects, self._step
            while stack:
                at, between, checks, exec_set = stack.pop()
                for prev in self._predecessors[at]:
                    state = (prev, between, checks, exec_set)
                    if state in seen:
                        continue
                    seen.add(state)
                    if masked and not exec_set and (prev, at) in zero_exec_edges:
                        continue
                    p = effects[prev]
                    rest = step(c, p, between, checks, found)
                    if rest:
                        stack.append((prev, between + p.states, tuple(rest),
                                      exec_set or bool(p.sdefs & EXEC_BITS)))
        if self._clause_applies(c):
            for run in self._clause_runs(pc, c.kind):
                found.update(self._clause_violation(run, c))
        return list(found.values())

    def _clause_runs(self, pc, kind):
        """Per path, the run of consecutive `kind` instructions right before `pc`."""
        runs, stack = [], [(pc, ())]
        while stack:
            at, run = stack.pop()
            preds = [p for p in self.predecessors(at) if self.effects[p].kind == kind
                     and len(run) < self.clause_look_back]
            if not preds:
                runs.append(run)
            stack.extend((p, (self.effects[p], *run)) for p in preds)
        return runs

    # the soft-clause rule (LLVM checkSoftClauseHazards) --------------------------

    def _clause_applies(self, c: Effects) -> bool:
        return self.xnack and c.kind in ("smem", "vmem")

    @staticmethod
    def _clause_violation(run, c) -> dict:
        """LLVM: a clause whose instructions define registers, followed by a store,
        or by an instruction where the defs and uses of the whole clause meet."""
        defs_v, defs_s = _union(e.vdef for e in run), _union(e.sdefs for e in run)
        if not run or not (defs_v or defs_s):
            return {}
        members = (*run, c)
        uses_v = _union(m for e in members for m in e.vuses)
        uses_s = _union(m for e in members for m in e.suses)
        if c.store or (defs_v | c.vdef) & uses_v or (defs_s | c.sdefs) & uses_s:
            return {("clause", run[0].pc): Violation(CLAUSE_RULE, run[0], c, 0, 1)}
        return {}

    # the path one wave took, at run time ------------------------------------------

    def violations_on_path(self, pc: int, trail) -> list[Violation]:
        """The violations at `pc` along the path the wave took (`trail`: its taken
        branches as (from, to), oldest first, starting with (None, 0))."""
        found: dict[tuple, Violation] = {}
        c, checks, between = self.effects[pc], self.checks[pc], 0
        for prev in _history(pc, trail):
            if not checks:
                break
            p = self.effects[prev]
            checks = self._step(c, p, between, checks, found)
            between += p.states
        if self._clause_applies(c):
            run = []
            for prev in _history(pc, trail):
                if self.effects[prev].kind != c.kind or len(run) == self.clause_look_back:
                    break
                run.insert(0, self.effects[prev])
            found.update(self._clause_violation(tuple(run), c))
        return list(found.values())

    def path_key(self, pc: int, trail) -> tuple:
        """The trail entries that decide the history `violations_on_path` reads."""
        used, hi, states = [pc], pc - 1, 0
        for frm, to in reversed(trail):
            used.append((frm, to))
            states += self.before[hi + 1] - self.before[to]
            if frm is None or states > WINDOW:
                break
            hi = frm
        return tuple(used)


def _history(pc, trail):
    """The pcs a wave executed before `pc`, most recent first."""
    hi = pc - 1
    for frm, to in reversed(trail):
        yield from range(hi, to - 1, -1)
        if frm is None:
            return
        hi = frm


# --------------------------------------------------------------------------- run time


TRAIL_LENGTH = WINDOW + 4  # every trail segment holds at least its branch


def instrument(kernel, code: list, arch: str, accum_offset: int) -> list:
    """`code` (one closure per instruction) with the hazard checks this kernel
    needs: none when no path into any instruction violates a rule."""
    program = _program(kernel, arch, accum_offset)
    suspects = program.violations
    if not suspects:
        return code
    trails: dict = {}
    checked = list(code)
    for pc in suspects:
        checked[pc] = _checked(program, pc, code[pc], trails)
    for pc, e in enumerate(program.effects):
        if e.kind == "branch":
            checked[pc] = _recording(pc, code[pc], trails)
    return checked


def _trail(trails, w):
    trail = trails.get(w)
    if trail is None:
        trail = trails[w] = collections.deque([(None, 0)], maxlen=TRAIL_LENGTH)
    return trail


def _recording(pc, run, trails):
    def branch(w):
        signal = run(w)
        if w.pc != pc + 1:
            _trail(trails, w).append((pc, w.pc))
        return signal
    return branch


def _checked(program, pc, run, trails):
    verdicts: dict[tuple, list[Violation]] = {}

    masked = program.effects[pc].lane_masked

    def check(w):
        if masked and not w.exec:  # does nothing: no hazard can touch it
            return run(w)
        trail = _trail(trails, w)
        key = program.path_key(pc, trail)
        found = verdicts.get(key)
        if found is None:
            found = verdicts[key] = program.violations_on_path(pc, trail)
        if found:
            raise HazardError("; ".join(v.message() for v in found) + f" [{w.name}]")
        return run(w)
    return check


_PROGRAMS: dict = {}


def _program(kernel, arch, accum_offset) -> Program:
    """One analysis a kernel text (the kernel tests launch the same code often)."""
    key = (arch, accum_offset, kernel.name, kernel.target, tuple(i.text for i in kernel.instructions),
           tuple(sorted(kernel.labels.items())))
    if key not in _PROGRAMS:
        if len(_PROGRAMS) > 64:
            _PROGRAMS.clear()
        _PROGRAMS[key] = Program(kernel, arch, accum_offset)
    return _PROGRAMS[key]


def find_hazards(kernel, arch: str, accum_offset: int) -> list[Violation]:
    """Every violation on any control-flow path of `kernel` (LLVM guarantees there
    is none in what it emits)."""
    return [v for found in _program(kernel, arch, accum_offset).violations.values() for v in found]
