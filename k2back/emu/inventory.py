"""The instruction forms a kernel's asm holds: mnemonic (with its encoding suffix)
plus the modifiers that change what it computes, counted over the static text.

A static listing covers every instruction the emulator can execute for that
kernel (it runs the asm text, nothing else), so the inventory of a set of
kernels is a superset of what any launch executes. Used by the coverage test
(tests/test_emu_inventory.py: every form maps to a unit test against an
independent model) and `k2back selftest`."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from .asm import parse_kernel

# Modifiers whose value selects what the instruction computes: kept with the value.
VALUED = frozenset({
    "op_sel", "op_sel_hi", "neg_lo", "neg_hi", "cbsz", "abid", "blgp",
    "quad_perm", "row_shl", "row_shr", "row_ror", "row_bcast", "wave_shl", "wave_shr",
    "wave_rol", "wave_ror", "row_mask", "bank_mask", "dst_sel", "dst_unused",
    "src0_sel", "src1_sel", "mul", "div",
})
# Modifiers whose value is data (an address offset, a count): kept by name only.
NAMED = frozenset({"offset", "offset0", "offset1", "format"})


def _operand_marks(operands: tuple[str, ...]) -> list[str]:
    marks = []
    for index, operand in enumerate(operands):
        if operand.startswith("-") and not operand[1:2].isdigit():  # not a negative constant
            marks.append(f"neg(op{index})")
            operand = operand[1:]
        if operand.startswith(("|", "abs(")):
            marks.append(f"abs(op{index})")
    return marks


def form(instruction) -> str:
    """The form of one parsed instruction (k2back.emu.asm.Instruction)."""
    parts = [instruction.mnemonic]
    for key, value in sorted(instruction.modifiers.items()):
        if value is True:
            parts.append(key)
        elif key in VALUED:
            parts.append(f"{key}:{value}")
        elif key in NAMED:
            parts.append(key)
        else:
            parts.append(f"{key}:{value}")
    return " ".join(parts + _operand_marks(instruction.operands))


def forms(asm: str, name: str) -> Counter:
    """Form -> number of occurrences in kernel `name` of `asm`."""
    kernel = parse_kernel(asm, name)
    return Counter(form(instruction) for instruction in kernel.instructions)


def inventory(kernels: Iterable[tuple[str, str]]) -> Counter:
    """Summed over (asm, name) pairs."""
    total = Counter()
    for asm, name in kernels:
        total.update(forms(asm, name))
    return total
