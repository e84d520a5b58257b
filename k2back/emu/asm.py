"""Read the assembly text LLVM emits for one amdgcn kernel.

Only what the emulator needs: the kernel's instructions (mnemonic, operands,
modifiers, source line), its labels, and its `.amdhsa_*` directives.
"""

from __future__ import annotations

import dataclasses
import functools
import re

from k2back.amdhsa import MetadataError, parse_directives

from .errors import AsmError

# Words that stand alone after the operands (cache policy, addressing, DPP, clamp).
FLAG_MODIFIERS = frozenset(
    ["sc0", "sc1", "nt", "glc", "slc", "dlc", "offen", "idxen", "lds", "gds", "clamp", "row_mirror", "row_half_mirror", "addr64", "tfe", "lwe", "d16"]
)
_LABEL = re.compile(r"^([.\w$]+):")
_TARGET = re.compile(r'^\s*\.amdgcn_target\s+"amdgcn-amd-amdhsa--([^"]*)"', re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class Instruction:
    mnemonic: str
    operands: tuple[str, ...]
    modifiers: dict
    line: int  # 1-based line in the asm text
    text: str

    def where(self) -> str:
        return f"line {self.line}: {self.text}"


@dataclasses.dataclass(frozen=True)
class Kernel:
    name: str
    instructions: tuple[Instruction, ...]
    labels: dict  # label -> index of the instruction that follows it
    directives: dict  # 'next_free_vgpr' (.amdhsa_ prefix dropped) -> int
    target: str = ""  # the .amdgcn_target ID, e.g. "gfx942:xnack-" ("" when absent)

    def directive(self, name: str, default: int | None = None) -> int:
        value = self.directives.get(name, default)
        if value is None:
            raise AsmError(f"kernel {self.name!r}: directive .amdhsa_{name} missing from the asm")
        return value


def split_top_level(text: str) -> list[str]:
    """Split at commas and blanks that are outside (), [] and quotes."""
    tokens, depth, quoted, current = [], 0, False, []
    for ch in text:
        if ch == '"':
            quoted = not quoted
        elif not quoted and ch in "([":
            depth += 1
        elif not quoted and ch in ")]":
            depth -= 1
        if not quoted and depth == 0 and ch in ", \t":
            if current:
                tokens.append("".join(current))
            current = []
        else:
            current.append(ch)
    if current:
        tokens.append("".join(current))
    return tokens


def parse_instruction(text: str, line: int) -> Instruction:
    mnemonic, _, rest = text.partition(" ")
    operands, modifiers = [], {}
    for token in split_top_level(rest):
        key, colon, value = token.partition(":")
        if token in FLAG_MODIFIERS:
            modifiers[token] = True
        elif colon and re.fullmatch(r"[a-z_0-9]+", key) and not key[0].isdigit():
            modifiers[key] = value
        else:
            operands.append(token)
    return Instruction(mnemonic, tuple(operands), modifiers, line, text)


def _strip(line: str) -> str:
    return line.split(";", 1)[0].strip()


@functools.lru_cache(maxsize=16)
def parse_kernel(asm: str, name: str) -> Kernel:
    """The instructions between `name:` and the end of its function, and its
    directives (parsed once a text: tests launch the same code object often)."""
    lines = asm.splitlines()
    try:
        start = next(i for i, raw in enumerate(lines) if _strip(raw) == f"{name}:")
    except StopIteration:
        raise AsmError(f"kernel_name: no label {name!r} in the asm text") from None
    instructions, labels = [], {}
    for number, raw in enumerate(lines[start + 1 :], start + 2):
        text = _strip(raw)
        if not text:
            continue
        label = _LABEL.match(text)
        if label:
            if label.group(1).startswith(".Lfunc_end"):
                break
            labels[label.group(1)] = len(instructions)
            continue
        if text.startswith("."):
            if text.startswith((".section", ".end_amdhsa_kernel")) and instructions:
                break
            continue
        instructions.append(parse_instruction(text, number))
    try:
        directives = parse_directives(asm, name)
    except MetadataError as error:
        raise AsmError(f"kernel_name: {error}") from None
    target = _TARGET.search(asm)
    return Kernel(name, tuple(instructions), labels, directives, target[1] if target else "")
