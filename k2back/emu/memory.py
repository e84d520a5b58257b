"""Global memory (host buffers at device addresses) and LDS, with their accesses.

Buffers are mapped in place: a numpy array or a CPU torch tensor is viewed as
bytes, so kernel writes land in the caller's object. Each buffer gets its own
64 KiB-aligned range with an unmapped gap after it, so running off the end of a
buffer faults instead of reading its neighbour.

Global and buffer accesses may be unaligned (HSA runs gfx9 in unaligned mode);
atomics must be naturally aligned. LDS dword-and-wider accesses must be 4-byte
aligned and inside the workgroup's allocation (the emulator faults where the
hardware would silently wrap or drop).
"""

from __future__ import annotations

import bisect
import dataclasses

import numpy as np

from .errors import EmulatorError, MemoryFault

BASE_ADDRESS = 1 << 32
ALIGNMENT = 1 << 16


@dataclasses.dataclass
class Region:
    base: int
    data: np.ndarray  # uint8 view of the mapped object
    name: str
    owner: object  # keeps the mapped object alive
    read: int = 0
    written: int = 0
    touched: bool = False  # a store of the current launch wrote to it
    windows: dict = dataclasses.field(default_factory=dict, repr=False)  # size -> sliding_window_view
    end: int = dataclasses.field(init=False)  # one past the last byte

    def __post_init__(self):
        self.end = self.base + self.data.size

    def rows(self, offsets: np.ndarray, size: int) -> np.ndarray:
        """uint8 [lanes, size]: the `size` bytes at each byte offset (all in range), copied:
        a record each when the offsets are all aligned to a power-of-two size."""
        window = self.windows.get(size)
        if window is None:
            window = self.windows[size] = np.lib.stride_tricks.sliding_window_view(self.data, size)
            if size in (4, 8, 16):
                self.windows[-size] = self.data[:self.data.size // size * size].view(f"V{size}")
        if size in (4, 8, 16) and not (offsets & (size - 1)).any():
            return self.windows[-size][offsets // size].view(np.uint8).reshape(-1, size)
        return window[offsets]


def byte_view(array, argument: str = "array") -> np.ndarray:
    """A flat uint8 view sharing memory with a numpy array or CPU torch tensor."""
    if type(array).__module__.startswith("torch"):
        if array.device.type != "cpu" or not array.is_contiguous():
            raise EmulatorError(
                f"{argument}: expected a contiguous CPU tensor, got device={array.device}, "
                f"contiguous={array.is_contiguous()}")
        import torch

        return array.detach().reshape(-1).view(torch.uint8).numpy()
    if not isinstance(array, np.ndarray):
        raise EmulatorError(f"{argument}: expected a numpy array or torch tensor, got {type(array).__name__}")
    if not array.flags.c_contiguous:
        raise EmulatorError(f"{argument}: expected a C-contiguous array, got strides {array.strides}")
    return array.reshape(-1).view(np.uint8)


class GlobalMemory:
    def __init__(self):
        self.regions: list[Region] = []
        self.bases: list[int] = []
        self._next = BASE_ADDRESS
        self._last = None  # the region last found: accesses come in runs on one buffer

    def map(self, array, name: str | None = None) -> int:
        data = byte_view(array)
        base = self._next
        self._next = base + (data.size + 2 * ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT
        region = Region(base, data, name or f"0x{base:x}", array)
        index = bisect.bisect(self.bases, base)
        self.regions.insert(index, region)
        self.bases.insert(index, base)
        self._last = None
        return base

    def unmap(self, base: int) -> None:
        index = self.bases.index(base)
        del self.regions[index], self.bases[index]
        self._last = None

    def region_of(self, address: int, size: int, who) -> Region:
        region = self._last
        if region is not None and region.base <= address and address + size <= region.end:
            return region
        index = bisect.bisect(self.bases, address) - 1
        if index >= 0:
            region = self.regions[index]
            if address + size <= region.end:
                self._last = region
                return region
        raise MemoryFault(f"unmapped global address 0x{address:x} (+{size} bytes) by {who()}")

    def region_at(self, address: int) -> Region | None:
        """The buffer mapped at `address`, or None."""
        region = self._last
        if region is not None and region.base <= address < region.end:
            return region
        index = bisect.bisect(self.bases, address) - 1
        if index >= 0 and address < self.regions[index].end:
            self._last = self.regions[index]
            return self._last
        return None

    def read_touched(self, addresses: np.ndarray, size: int, who) -> tuple[np.ndarray, bool]:
        """(read(addresses, size, who), whether the access reaches a buffer some store
        of the launch wrote to)."""
        low, high = int(addresses.min()), int(addresses.max())
        region = self.region_at(low)
        if region is None or high + size > region.end or size > region.data.size:
            parts = self.locate(addresses, size, who)
            return self.read(addresses, size, who), any(r.touched for r, _, _ in parts)
        region.read += addresses.size * size
        return region.rows(addresses.astype(np.int64) - region.base, size), region.touched

    def _spans(self, flat: np.ndarray):
        """(region, positions in flat, byte offsets) for the mapped bytes of `flat`."""
        region = self.region_at(int(flat[0]))
        if region is not None and int(flat.max()) < region.end and int(flat.min()) >= region.base:
            return ((region, slice(None), flat - region.base),)
        spans = []
        for region in self.regions:
            where = np.flatnonzero((flat >= region.base) & (flat < region.end))
            if where.size:
                spans.append((region, where, flat[where] - region.base))
        return spans

    def peek(self, flat: np.ndarray) -> np.ndarray:
        """uint8 at byte addresses `flat` (0 where nothing is mapped), uncounted."""
        out = np.zeros(flat.size, np.uint8)
        for region, where, offsets in self._spans(flat):
            out[where] = region.data[offsets]
        return out

    def poke(self, flat: np.ndarray, values: np.ndarray) -> None:
        """Write bytes at `flat` (unmapped ones are dropped), uncounted."""
        for region, where, offsets in self._spans(flat):
            region.data[offsets] = values[where]

    def locate(self, addresses: np.ndarray, size: int, who) -> list[tuple[Region, np.ndarray, np.ndarray]]:
        """[(region, lane positions, byte offsets)] covering every address (one region usually)."""
        region = self.region_of(int(addresses[0]), size, who)
        offsets = addresses - np.uint64(region.base)
        if not (offsets > np.uint64(region.data.size - size)).any():
            return [(region, slice(None), offsets.astype(np.int64))]
        parts = []
        for address in np.unique(addresses):
            region = self.region_of(int(address), size, who)
            lanes = np.flatnonzero(addresses == address)
            parts.append((region, lanes, np.full(lanes.size, int(address) - region.base, np.int64)))
        return parts

    def read(self, addresses: np.ndarray, size: int, who) -> np.ndarray:
        """uint8 [lanes, size] read at each address."""
        out = np.empty((addresses.size, size), np.uint8)
        span = np.arange(size)
        for region, lanes, offsets in self.locate(addresses, size, who):
            out[lanes] = region.data[offsets[:, None] + span]
            region.read += offsets.size * size
        return out

    def atomic(self, addresses: np.ndarray, dtype, update, sources, who) -> np.ndarray:
        """Apply `update(old, *lane_sources)` lane by lane in lane order; returns the old values."""
        dtype = np.dtype(dtype)
        old = np.empty(addresses.size, dtype)
        for region, lanes, offsets in self.locate(addresses, dtype.itemsize, who):
            old[lanes] = apply_atomic(region.data, offsets, dtype, update,
                                      [s[lanes] for s in sources], who)
            region.read += offsets.size * dtype.itemsize
            region.written += offsets.size * dtype.itemsize
        return old


def apply_atomic(data: np.ndarray, offsets: np.ndarray, dtype, update, sources, who) -> np.ndarray:
    size = dtype.itemsize
    if (offsets % size).any():
        bad = int(offsets[np.flatnonzero(offsets % size)[0]])
        raise MemoryFault(f"misaligned {size}-byte atomic at byte offset {bad} by {who()}")
    cells = data[: data.size // size * size].view(dtype)
    old = np.empty(offsets.size, dtype)
    for lane, index in enumerate(offsets // size):
        old[lane] = cells[index]
        cells[index] = update(cells[index], *(s[lane] for s in sources))
    return old


# old, source[, compare] -> new (numpy scalars of the access type)
ATOMICS = {
    "add": lambda old, s: old + s, "sub": lambda old, s: old - s,
    "swap": lambda old, s: s, "wrxchg": lambda old, s: s,
    "and": lambda old, s: old & s, "or": lambda old, s: old | s, "xor": lambda old, s: old ^ s,
    "smin": min, "smax": max, "umin": min, "umax": max, "min": min, "max": max,
    "inc": lambda old, s: 0 if old >= s else old + 1,
    "dec": lambda old, s: s if old == 0 or old > s else old - 1,
    "cmpswap": lambda old, s, c: s if old == c else old,
    "cmpst": lambda old, c, s: s if old == c else old,
}
