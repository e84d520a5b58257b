"""What LLVM's AMDGPU assembly text says about a kernel beside its instructions:
the `.amdhsa_*` directives of its `.amdhsa_kernel` block and the code length the
asm printer reports (`; codeLenInByte = N`, printed with verbose asm).

Shared by codegen (which checks the code object against them) and the emulator
(which sets a launch up from the directives), so it needs nothing beyond the
standard library: `import k2back.emu` must work without LLVM.
"""

from __future__ import annotations

import re


class MetadataError(ValueError):
    """A kernel's metadata, descriptor, directives or code disagree or are missing."""


_KERNEL_BLOCK = re.compile(r"^\s*\.amdhsa_kernel\s+(\S+)\s*$(.*?)^\s*\.end_amdhsa_kernel",
                           re.MULTILINE | re.DOTALL)
_DIRECTIVE = re.compile(r"^\s*\.amdhsa_(\w+)\s+(-?(?:0x[0-9a-fA-F]+|\d+))\s*$", re.MULTILINE)
_CODE_LENGTH = re.compile(r"^;\s*codeLenInByte\s*=\s*(\d+)\s*$", re.MULTILINE)


def parse_directives(asm: str, kernel: str | None = None) -> dict[str, int]:
    """The `.amdhsa_<name> <value>` lines of a kernel's `.amdhsa_kernel` block,
    as {name: value} without the `.amdhsa_` prefix, e.g. {"next_free_vgpr": 24}.

    These say which launch registers the kernel expects (user/system SGPRs,
    workitem-id VGPRs): read them, never assume them. `kernel` may be omitted
    when the asm holds exactly one kernel.
    """
    blocks = {m[1]: m[2] for m in _KERNEL_BLOCK.finditer(asm)}
    if kernel is None and len(blocks) == 1:
        kernel = next(iter(blocks))
    if kernel not in blocks:
        raise MetadataError(f"kernel: expected one of the asm's .amdhsa_kernel blocks "
                            f"{sorted(blocks)}, got {kernel!r}")
    return {name: int(value, 0) for name, value in _DIRECTIVE.findall(blocks[kernel])}


def code_length(asm: str, kernel: str) -> int:
    """Bytes of machine code the asm printer counted for `kernel` (the first
    `; codeLenInByte` after its label: the printer reports each function after it)."""
    label = re.search(rf"^{re.escape(kernel)}:", asm, re.MULTILINE)
    found = _CODE_LENGTH.search(asm, label.end()) if label else None
    if found is None:
        raise MetadataError(f"kernel {kernel!r}: the asm has no `; codeLenInByte` line after "
                            "its label (emit the asm with verbose output)")
    return int(found[1])
