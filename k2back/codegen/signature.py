"""The K2 kernel's explicit arguments, in order: the one list the template
renders the signature from and the runtime packs by name (checked against the
code object's metadata, never restated by hand)."""

from __future__ import annotations

from dataclasses import dataclass

GLOBAL_PTR = "ptr addrspace(1)"


@dataclass(frozen=True)
class KernelArg:
    name: str
    llvm_type: str
    attrs: str = ""  # LLVM parameter attributes, e.g. "noalias readonly"

    @property
    def is_pointer(self) -> bool:
        return self.llvm_type.startswith("ptr")

    def param(self) -> str:
        """`<type> <attrs> %<name>` as it stands in a function signature."""
        return " ".join(filter(None, (self.llvm_type, self.attrs, f"%{self.name}")))


def _inputs(*names: str) -> tuple[KernelArg, ...]:
    return tuple(KernelArg(n, GLOBAL_PTR, "noalias readonly") for n in names)


KERNEL_ARGS: tuple[KernelArg, ...] = (
    *_inputs("q", "key_table", "key_len", "positions", "swa_cache", "comp_cache",
             "cos_sin", "sink", "wo_a", "wo_a_scale", "wo_b", "wo_b_scale"),
    KernelArg("out", GLOBAL_PTR, "noalias"),
    # hand-off data and flags: written and read by different workgroups
    KernelArg("scratch", GLOBAL_PTR),
    KernelArg("swa_block", "i32"),
    KernelArg("swa_stride", "i64"),
    KernelArg("swa_bytes", "i64"),
    KernelArg("comp_block", "i32"),
    KernelArg("comp_stride", "i64"),
    KernelArg("comp_bytes", "i64"),
    KernelArg("cos_sin_rows", "i32"),
    KernelArg("qk_scale", "float"),
)


def params() -> str:
    """The parameter list of the kernel and of every stage function."""
    return ", ".join(a.param() for a in KERNEL_ARGS)


def forward() -> str:
    """The argument list a stage call forwards from the kernel's parameters."""
    return ", ".join(f"{a.llvm_type} %{a.name}" for a in KERNEL_ARGS)
