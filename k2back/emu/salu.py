"""Scalar ALU (SOP1/SOP2/SOPC/SOPK) and branches (SOPP s_branch / s_cbranch_*).

Each SALU entry is `(dst_bits, src_bits, fn)`; `fn(*sources, scc)` returns
`(result, scc)` on Python ints, `scc=None` when the op leaves SCC alone.
"""

from __future__ import annotations

import operator

from .errors import UnsupportedInstruction
from .operands import sgpr_or_constant
from .state import M32, M64, exec_state


def sx(value: int, bits: int) -> int:
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >> (bits - 1) else value


def _nz(result: int, bits: int) -> tuple[int, int]:
    result &= (1 << bits) - 1
    return result, int(result != 0)


def _bfe(value: int, spec: int, bits: int, signed: bool) -> tuple[int, int]:
    offset, width = spec & (bits - 1), (spec >> 16) & 0x7F
    field = (value >> offset) & ((1 << width) - 1) if width else 0
    if signed and width:
        field = sx(field, width)
    return _nz(field, bits)


def _ff1(value: int, bits: int) -> int:
    value &= (1 << bits) - 1
    return (value & -value).bit_length() - 1 if value else M32


def _flbit(value: int, bits: int) -> int:
    value &= (1 << bits) - 1
    return bits - value.bit_length() if value else M32


def _logic(bits: int) -> dict:
    m = (1 << bits) - 1
    return {
        "and": lambda a, b, c: _nz(a & b, bits), "or": lambda a, b, c: _nz(a | b, bits),
        "xor": lambda a, b, c: _nz(a ^ b, bits), "andn2": lambda a, b, c: _nz(a & ~b, bits),
        "orn2": lambda a, b, c: _nz(a | (~b & m), bits), "nand": lambda a, b, c: _nz(~(a & b), bits),
        "nor": lambda a, b, c: _nz(~(a | b), bits), "xnor": lambda a, b, c: _nz(~(a ^ b), bits),
    }


def _shift_add(n: int):
    """s_lshl<n>_add_u32: (a << n) + b; SCC = the 64-bit sum does not fit 32 bits."""
    def shift_add(a, b, c):
        total = (a << n) + b
        return total & M32, int(total > M32)
    return shift_add


def _signed_overflow(total: int) -> tuple[int, int]:
    return total & M32, int(not -(1 << 31) <= total < (1 << 31))


SOP: dict[str, tuple] = {
    # moves and selects
    "s_mov_b32": (32, (32,), lambda a, c: (a, None)),
    "s_mov_b64": (64, (64,), lambda a, c: (a, None)),
    "s_movk_i32": (32, (32,), lambda a, c: (sx(a, 16) & M32, None)),
    "s_cmov_b32": (32, (32, 32), lambda d, a, c: (a if c else d, None)),
    "s_cmov_b64": (64, (64, 64), lambda d, a, c: (a if c else d, None)),
    "s_cselect_b32": (32, (32, 32), lambda a, b, c: (a if c else b, None)),
    "s_cselect_b64": (64, (64, 64), lambda a, b, c: (a if c else b, None)),
    # arithmetic
    "s_add_u32": (32, (32, 32), lambda a, b, c: ((a + b) & M32, int(a + b > M32))),
    "s_addc_u32": (32, (32, 32), lambda a, b, c: ((a + b + c) & M32, int(a + b + c > M32))),
    "s_sub_u32": (32, (32, 32), lambda a, b, c: ((a - b) & M32, int(b > a))),
    "s_subb_u32": (32, (32, 32), lambda a, b, c: ((a - b - c) & M32, int(b + c > a))),
    "s_add_i32": (32, (32, 32), lambda a, b, c: _signed_overflow(sx(a, 32) + sx(b, 32))),
    "s_sub_i32": (32, (32, 32), lambda a, b, c: _signed_overflow(sx(a, 32) - sx(b, 32))),
    "s_addk_i32": (32, (32, 32), lambda d, k, c: _signed_overflow(sx(d, 32) + sx(k, 16))),
    "s_mul_i32": (32, (32, 32), lambda a, b, c: ((a * b) & M32, None)),
    "s_mulk_i32": (32, (32, 32), lambda d, k, c: ((d * sx(k, 16)) & M32, None)),
    "s_mul_hi_u32": (32, (32, 32), lambda a, b, c: ((a * b) >> 32, None)),
    "s_mul_hi_i32": (32, (32, 32), lambda a, b, c: ((sx(a, 32) * sx(b, 32)) >> 32 & M32, None)),
    "s_abs_i32": (32, (32,), lambda a, c: _nz(abs(sx(a, 32)), 32)),
    "s_absdiff_i32": (32, (32, 32), lambda a, b, c: _nz(abs(sx(a, 32) - sx(b, 32)), 32)),
    "s_min_i32": (32, (32, 32), lambda a, b, c: (a, 1) if sx(a, 32) < sx(b, 32) else (b, 0)),
    "s_max_i32": (32, (32, 32), lambda a, b, c: (a, 1) if sx(a, 32) > sx(b, 32) else (b, 0)),
    "s_min_u32": (32, (32, 32), lambda a, b, c: (a, 1) if a < b else (b, 0)),
    "s_max_u32": (32, (32, 32), lambda a, b, c: (a, 1) if a > b else (b, 0)),
    **{f"s_lshl{n}_add_u32": (32, (32, 32), _shift_add(n)) for n in (1, 2, 3, 4)},
    # shifts and bit fields
    "s_lshl_b32": (32, (32, 32), lambda a, b, c: _nz(a << (b & 31), 32)),
    "s_lshl_b64": (64, (64, 32), lambda a, b, c: _nz(a << (b & 63), 64)),
    "s_lshr_b32": (32, (32, 32), lambda a, b, c: _nz(a >> (b & 31), 32)),
    "s_lshr_b64": (64, (64, 32), lambda a, b, c: _nz(a >> (b & 63), 64)),
    "s_ashr_i32": (32, (32, 32), lambda a, b, c: _nz(sx(a, 32) >> (b & 31), 32)),
    "s_ashr_i64": (64, (64, 32), lambda a, b, c: _nz(sx(a, 64) >> (b & 63), 64)),
    "s_bfm_b32": (32, (32, 32), lambda a, b, c: ((((1 << (a & 31)) - 1) << (b & 31)) & M32, None)),
    "s_bfm_b64": (64, (32, 32), lambda a, b, c: ((((1 << (a & 63)) - 1) << (b & 63)) & M64, None)),
    "s_bfe_u32": (32, (32, 32), lambda a, b, c: _bfe(a, b, 32, False)),
    "s_bfe_i32": (32, (32, 32), lambda a, b, c: _bfe(a, b, 32, True)),
    "s_bfe_u64": (64, (64, 32), lambda a, b, c: _bfe(a, b, 64, False)),
    "s_bfe_i64": (64, (64, 32), lambda a, b, c: _bfe(a, b, 64, True)),
    "s_sext_i32_i8": (32, (32,), lambda a, c: (sx(a, 8) & M32, None)),
    "s_sext_i32_i16": (32, (32,), lambda a, c: (sx(a, 16) & M32, None)),
    "s_not_b32": (32, (32,), lambda a, c: _nz(~a, 32)),
    "s_not_b64": (64, (64,), lambda a, c: _nz(~a, 64)),
    "s_brev_b32": (32, (32,), lambda a, c: (int(f"{a:032b}"[::-1], 2), None)),
    "s_bcnt1_i32_b32": (32, (32,), lambda a, c: _nz(a.bit_count(), 32)),
    "s_bcnt1_i32_b64": (32, (64,), lambda a, c: _nz(a.bit_count(), 32)),
    "s_bcnt0_i32_b32": (32, (32,), lambda a, c: _nz(32 - a.bit_count(), 32)),
    "s_ff1_i32_b32": (32, (32,), lambda a, c: (_ff1(a, 32), None)),
    "s_ff1_i32_b64": (32, (64,), lambda a, c: (_ff1(a, 64), None)),
    "s_flbit_i32_b32": (32, (32,), lambda a, c: (_flbit(a, 32), None)),
    "s_flbit_i32_b64": (32, (64,), lambda a, c: (_flbit(a, 64), None)),
    "s_bitset0_b32": (32, (32, 32), lambda d, a, c: (d & ~(1 << (a & 31)) & M32, None)),
    "s_bitset1_b32": (32, (32, 32), lambda d, a, c: (d | (1 << (a & 31)), None)),
    "s_pack_ll_b32_b16": (32, (32, 32), lambda a, b, c: ((a & 0xFFFF) | (b & 0xFFFF) << 16, None)),
    "s_pack_lh_b32_b16": (32, (32, 32), lambda a, b, c: ((a & 0xFFFF) | (b & 0xFFFF0000), None)),
    "s_pack_hh_b32_b16": (32, (32, 32), lambda a, b, c: ((a >> 16) | (b & 0xFFFF0000), None)),
    **{f"s_{name}_b32": (32, (32, 32), fn) for name, fn in _logic(32).items()},
    **{f"s_{name}_b64": (64, (64, 64), fn) for name, fn in _logic(64).items()},
}
# SOPK forms whose first operand is both destination and source.
READS_DESTINATION = {"s_cmov_b32", "s_cmov_b64", "s_addk_i32", "s_mulk_i32", "s_bitset0_b32",
                     "s_bitset1_b32"}

# Saveexec: sdst = exec; exec = op(src, exec); SCC = exec != 0.
SAVEEXEC = {
    "and": lambda s, e: s & e, "or": lambda s, e: s | e, "xor": lambda s, e: s ^ e,
    "andn2": lambda s, e: s & ~e, "orn2": lambda s, e: s | ~e, "nand": lambda s, e: ~(s & e),
    "nor": lambda s, e: ~(s | e), "xnor": lambda s, e: ~(s ^ e),
    "andn1": lambda s, e: ~s & e, "orn1": lambda s, e: ~s | e,
}

_COMPARE = {
    "eq": lambda a, b: a == b, "lg": lambda a, b: a != b, "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b, "lt": lambda a, b: a < b, "le": lambda a, b: a <= b,
}


def decode_sop(ins, ctx):
    name = ins.mnemonic
    if name.endswith(("_saveexec_b64", "_wrexec_b64")):
        return _saveexec(ins, ctx)
    if name.startswith(("s_cmp_", "s_cmpk_", "s_bitcmp")):
        return _compare(ins, ctx)
    if name == "s_getpc_b64":
        write = ctx.scalar_writer(ins.operands[0], 64, ins)
        # The pc is byte-addressed; instructions are placed 8 bytes apart (a stand-in
        # address that is deterministic, not the encoded size).
        return lambda w: write(w, ctx.code_address + 8 * w.pc)
    spec = SOP.get(name)
    if spec is None:
        raise UnsupportedInstruction(f"{name} not implemented ({ins.where()})")
    dst_bits, src_bits, fn = spec
    dst = ins.operands[0]
    srcs = ins.operands[1:]
    if name in READS_DESTINATION:
        srcs = (dst, *srcs)
    if len(srcs) != len(src_bits):
        raise UnsupportedInstruction(f"{name}: expected {len(src_bits)} sources ({ins.where()})")
    reads = [ctx.scalar_reader(t, b, ins) for t, b in zip(srcs, src_bits)]
    write = ctx.scalar_writer(dst, dst_bits, ins)
    direct = _direct(fn, [sgpr_or_constant(ctx.operand(t, ins), b) for t, b in zip(srcs, src_bits)],
                     sgpr_or_constant(ctx.operand(dst, ins), dst_bits)[0])
    if direct is not None:
        return direct

    if len(reads) == 1:
        (read0,) = reads

        def run1(w):
            value, scc = fn(read0(w), w.scc)
            write(w, value)
            if scc is not None:
                w.scc = scc
        return run1
    read0, read1 = reads

    def run2(w):
        value, scc = fn(read0(w), read1(w), w.scc)
        write(w, value)
        if scc is not None:
            w.scc = scc
    return run2


def _direct(fn, sources, d):
    """The run of the common forms — a 32-bit SGPR destination `d`, sources that
    are 32-bit SGPRs or constants ((SGPR, None) or (None, bits): operands.
    sgpr_or_constant) — on the wave's SGPR list itself, with no operand closure
    calls (SALU runs wave by wave: these calls were half its cost). None for
    other forms."""
    if d is None or any(i is None and k is None for i, k in sources):
        return None
    form = "".join("s" if i is not None else "k" for i, _ in sources)
    (i, a), *rest = sources
    j, b = rest[0] if rest else (None, None)
    if form == "s":
        def run(w):
            s = w.s
            value, scc = fn(s[i], w.scc)
            s[d] = value & M32
            if scc is not None:
                w.scc = scc
    elif form == "k":
        def run(w):
            value, scc = fn(a, w.scc)
            w.s[d] = value & M32
            if scc is not None:
                w.scc = scc
    elif form == "ss":
        def run(w):
            s = w.s
            value, scc = fn(s[i], s[j], w.scc)
            s[d] = value & M32
            if scc is not None:
                w.scc = scc
    elif form == "sk":
        def run(w):
            s = w.s
            value, scc = fn(s[i], b, w.scc)
            s[d] = value & M32
            if scc is not None:
                w.scc = scc
    else:
        return None
    return run


def _saveexec(ins, ctx):
    op = ins.mnemonic[2:].split("_")[0]
    combine = SAVEEXEC.get(op)
    if combine is None:
        raise UnsupportedInstruction(f"{ins.mnemonic} not implemented ({ins.where()})")
    write = ctx.scalar_writer(ins.operands[0], 64, ins)
    read = ctx.scalar_reader(ins.operands[1], 64, ins)
    wrexec = ins.mnemonic.endswith("_wrexec_b64")
    d, a = (ctx.operand(t, ins) for t in ins.operands[:2])
    if not wrexec and d.file == a.file == "s" and not (d.neg or d.abs or a.neg or a.abs):
        d, a = d.index, a.index

        def pairs(w):  # the common form (s_and_saveexec_b64 s[4:5], vcc) on the SGPR list itself
            s, old = w.s, w.exec
            w.set_exec(combine(s[a] | s[a + 1] << 32, old))
            s[d], s[d + 1] = old & M32, old >> 32
            w.scc = int(w.exec != 0)

        def pairs_over(waves):
            """`pairs` of each of a cohort's waves, in order: each distinct (source,
            exec) combined once, the exec state (Wave.set_exec's) stored wave by
            wave, each workgroup's exec_epoch moved on once a run of its waves."""
            states, group = {}, None
            for w in waves:
                s, old = w.s, w.exec
                key = (s[a], s[a + 1], old)
                state = states.get(key)
                if state is None:
                    value, full, mask = exec_state(combine(key[0] | key[1] << 32, old))
                    state = states[key] = (value, full, mask, int(value != 0))
                s[d], s[d + 1] = old & M32, old >> 32
                w.exec, w.full, w.mask, w.scc = state
                if w.group is not group:
                    group = w.group
                    group.exec_epoch += 1
        pairs.cohort = pairs_over
        return pairs

    def run(w):
        old = w.exec
        w.set_exec(combine(read(w), old))
        write(w, w.exec if wrexec else old)
        w.scc = int(w.exec != 0)
    return run


def _compare(ins, ctx):
    parts = ins.mnemonic.split("_")  # s_cmp_eq_u32 / s_cmpk_lg_i32 / s_bitcmp1_b32
    if parts[1].startswith("bitcmp"):
        want, bits = int(parts[1][-1]), int(parts[2][1:])
        read, bit = (ctx.scalar_reader(t, b, ins) for t, b in zip(ins.operands, (bits, 32)))

        def bitcmp(w):
            w.scc = int(((read(w) >> (bit(w) & (bits - 1))) & 1) == want)
        return bitcmp
    relation, kind = _COMPARE.get(parts[2]), parts[3]
    if relation is None:
        raise UnsupportedInstruction(f"{ins.mnemonic} not implemented ({ins.where()})")
    bits = int(kind[1:])
    signed = kind[0] == "i"
    immediate = parts[1] == "cmpk"
    a = ctx.scalar_reader(ins.operands[0], bits, ins)
    b = ctx.scalar_reader(ins.operands[1], bits, ins)
    if immediate:  # SOPK: a 16-bit immediate, sign- or zero-extended by the type
        constant = b(None)
        constant = sx(constant, 16) & M32 if signed else constant & 0xFFFF
        b = lambda w: constant
    if signed:
        def cmp_signed(w):
            w.scc = int(relation(sx(a(w), bits), sx(b(w), bits)))
        return cmp_signed

    def cmp_unsigned(w):
        w.scc = int(relation(a(w), b(w)))
    return cmp_unsigned


# ---------------------------------------------------------------- program control (SOPP)

# s_cbranch_*: (what it tests, taken when that is zero); s_branch: always taken
BRANCH_TESTS = {
    "s_cbranch_scc0": ("scc", True), "s_cbranch_scc1": ("scc", False),
    "s_cbranch_vccz": ("vcc", True), "s_cbranch_vccnz": ("vcc", False),
    "s_cbranch_execz": ("exec", True), "s_cbranch_execnz": ("exec", False),
}


def _vcc(w) -> int:
    return w.s[106] | w.s[107]


# what a branch tests, of a wave (SCC is 0 or 1: s_cbranch_scc1 tests it nonzero)
BRANCH_KEYS = {"scc": operator.attrgetter("scc"), "vcc": _vcc, "exec": operator.attrgetter("exec")}


def decode_branch(ins, ctx):
    target = ctx.labels.get(ins.operands[0]) if ins.operands else None
    if target is None:
        raise UnsupportedInstruction(f"branch target {ins.operands} unknown ({ins.where()})")
    if ins.mnemonic == "s_branch":
        def jump(w):
            w.pc = target

        def jump_over(waves, after):
            return target
        jump.cohort = jump_over
        return jump
    test, when_zero = BRANCH_TESTS[ins.mnemonic]
    key = BRANCH_KEYS[test]

    def branch(w):
        if (key(w) == 0) == when_zero:
            w.pc = target

    def branch_over(waves, after):
        """The branch for a cohort's waves (their pcs left behind, as at `after`):
        the pc they all go to, or None when they part (then each wave's pc is set)."""
        values = list(map(key, waves))
        zeros = values.count(0)
        if zeros == len(values) or not zeros:
            return target if bool(zeros) == when_zero else after
        for w, value in zip(waves, values):
            w.pc = target if (value == 0) == when_zero else after
        return None
    branch.cohort = branch_over
    return branch
