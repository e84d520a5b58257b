"""A wave-level emulator of gfx942/gfx950 machine code (SPEC §7)."""
