"""The emulator's errors: every one names what it could not do and where."""


class EmulatorError(RuntimeError):
    """Base class of everything the emulator raises about a kernel or a launch."""


class AsmError(EmulatorError):
    """The asm text lacks something the launch needs (kernel label, directives)."""


class UnsupportedInstruction(EmulatorError):
    """An instruction or operand form the emulator does not implement."""


class ScoreboardError(EmulatorError):
    """A register used before the memory instruction that writes it returned (no
    s_waitcnt covering it in between)."""


class MemoryFault(EmulatorError):
    """An access the hardware would fault on or the emulator cannot place."""


class Deadlock(EmulatorError):
    """The launch made no progress for a long stretch; names the waiting waves."""


class HazardError(EmulatorError):
    """Too few wait states between a producer and a consumer the hardware does not
    interlock (`k2back.emu.hazards`): names the rule and both asm lines."""
