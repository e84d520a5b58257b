"""Loading, caching and launching code objects (HIP or the emulator)."""
