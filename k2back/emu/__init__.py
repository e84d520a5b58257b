"""A wave-level emulator of gfx942/gfx950 machine code (SPEC §7).

    m = Machine("gfx942")                 # or "gfx950"
    x = m.map(array, name="x")            # device address; kernel writes land in `array`
    stats = m.launch(asm, "kernel", grid=(n, 1, 1), block=(512, 1, 1), kernargs=packed,
                     dynamic_lds=0, order="forward")

Input is the assembly text LLVM prints (`k2back.codegen.llvm.emit_assembly`): the
kernel's instructions between its label and `.Lfunc_end`, and its `.amdhsa_*`
directives, which alone decide the launch registers (user SGPRs: kernarg /
dispatch / queue pointers, kernarg preload; system SGPRs: workgroup ids; v0: the
gfx90a+ packed work-item ids x | y << 10 | z << 20), the LDS size (+ dynamic) and
the unified VGPR/AGPR file split (`.amdhsa_accum_offset`).

Modules: asm (parse), operands (tokens -> readers/writers), salu (SOP*, branches),
valu (VOP1/2/3/C/3P, DPP, SDWA, cross-lane, fp8 converts), matrix (MFMA operand
plumbing; the math is `mfma`), memops (global/flat/buffer/SMEM/LDS), memory
(mapped buffers, atomics), coherence (the memory model: L2s, L1s, scalar caches),
inflight (outstanding memory instructions, s_waitcnt, the scoreboard), machine
(launch set-up, scheduler, Stats), numerics and mfma (the arithmetic of converts,
transcendentals and MFMA).

Faithful where our kernels depend on it, loud elsewhere: an instruction, operand
form or modifier not modelled raises `UnsupportedInstruction` naming it and its
asm line when it executes; unmapped, out-of-range or misaligned accesses raise
`MemoryFault` with the address, wave and line; a register used before the
s_waitcnt covering the load that writes it raises `ScoreboardError`; a launch
without progress raises `Deadlock` listing the waiting waves and where they wait;
too few wait states between a producer and a consumer the hardware does not
interlock raise `HazardError` naming the rule and both lines (`hazards`).
Never kinder than the GPU: by default (`Machine(arch, memory="strict")`) a read
returns the oldest value the GFX942 memory model allows and stores perform as
late as the counters allow (coherence.py, inflight.py).
"""

from .errors import (
           AsmError,
           Deadlock,
           EmulatorError,
           HazardError,
           MemoryFault,
           ScoreboardError,
           UnsupportedInstruction,
)
from .machine import Machine, Stats

__all__ = [
           "AsmError",
           "Deadlock",
           "EmulatorError",
           "HazardError",
           "Machine",
           "MemoryFault",
           "ScoreboardError",
           "Stats",
           "UnsupportedInstruction",
]
