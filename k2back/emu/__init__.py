"""A wave-level emulator of gfx942/gfx950 machine code (SPEC §7).

    m = Machine("gfx942")
    x = m.map(array)                      # device address; kernel writes land in `array`
    stats = m.launch(asm, "kernel", grid=(n, 1, 1), block=(256, 1, 1), kernargs=packed)
"""

from .errors import AsmError, Deadlock, EmulatorError, MemoryFault, UnsupportedInstruction
from .machine import Machine, Stats

__all__ = ["Machine", "Stats", "EmulatorError", "AsmError", "UnsupportedInstruction",
           "MemoryFault", "Deadlock"]
