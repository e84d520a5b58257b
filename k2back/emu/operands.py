"""Operand tokens -> closures that read or write wave state.

Decoding resolves every operand once: a register number, an inline constant or
a literal becomes a small closure, so execution does no string work.

Types are numpy dtypes plus `MASK`, a 64-bit SGPR pair read or written as one
bit per lane (vcc, carries, compares). 16-bit types live in the low half of a
32-bit register unless op_sel picks the high one; 64-bit types in register pairs.
"""

from __future__ import annotations

import functools
import re

import ml_dtypes
import numpy as np

from .errors import UnsupportedInstruction
from .state import LANES, M0, M32, M64, VCC, lane_masks, mask_to_int

MASK = "mask"
BF16 = np.dtype(ml_dtypes.bfloat16)
TYPES = {
    "f32": np.dtype(np.float32), "i32": np.dtype(np.int32), "u32": np.dtype(np.uint32),
    "b32": np.dtype(np.uint32), "f16": np.dtype(np.float16), "i16": np.dtype(np.int16),
    "u16": np.dtype(np.uint16), "b16": np.dtype(np.uint16), "bf16": BF16,
    "f64": np.dtype(np.float64), "i64": np.dtype(np.int64), "u64": np.dtype(np.uint64),
    "b64": np.dtype(np.uint64), "mask": MASK,
}
UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_REGISTER = re.compile(r"^([sva])(?:(\d+)|\[(\d+):(\d+)\])$")
_SPECIAL = {  # name -> (slot, count)
    "vcc": (VCC, 2), "vcc_lo": (VCC, 1), "vcc_hi": (VCC + 1, 1), "m0": (M0, 1),
}
_EXEC = {"exec": (0, 2), "exec_lo": (0, 1), "exec_hi": (1, 1)}
# The inline float constants gfx9 encodes without a literal (0.15915494 = 1/(2*pi)).
INLINE_FLOATS = {"0.5", "-0.5", "1.0", "-1.0", "2.0", "-2.0", "4.0", "-4.0", "0.15915494"}


class Operand:
    """A parsed operand: a register range, exec, or a constant (bits or float)."""

    __slots__ = ("abs", "count", "file", "index", "neg", "token", "value")

    def __init__(self, token: str, accum_offset: int):
        self.token, self.neg, self.abs = token, False, False
        self.file, self.index, self.count, self.value = "const", 0, 1, None
        text = token
        if text.startswith("-") and not _is_number(text):
            self.neg, text = True, text[1:]
        if text.startswith("|") and text.endswith("|"):
            self.abs, text = True, text[1:-1]
        match = _REGISTER.match(text)
        if match:
            kind, single, first, last = match.groups()
            first = int(single if single is not None else first)
            self.count = 1 if single is not None else int(last) - first + 1
            self.file = "s" if kind == "s" else "v"
            self.index = first + (accum_offset if kind == "a" else 0)
        elif text in _SPECIAL:
            self.file, (self.index, self.count) = "s", _SPECIAL[text]
        elif text in _EXEC:
            self.file, (self.index, self.count) = "exec", _EXEC[text]
        elif _is_number(text):
            self.value = float(text) if "." in text else int(text, 0)
        else:
            raise ValueError(token)

    @property
    def is_float_constant(self) -> bool:
        return isinstance(self.value, float)


def _is_number(text: str) -> bool:
    try:
        float(text) if "." in text else int(text, 0)
    except ValueError:
        return False
    return True


def parse(token: str, accum_offset: int, ins) -> Operand:
    """The operand `token` of instruction `ins` (shared: decoders copy before changing one)."""
    try:
        return _parsed(token, accum_offset)
    except ValueError:
        raise UnsupportedInstruction(f"operand {token!r} not supported ({ins.where()})") from None


@functools.lru_cache(maxsize=65536)
def _parsed(token: str, accum_offset: int) -> Operand:
    return Operand(token, accum_offset)


# ---------------------------------------------------------------- scalar (Python ints)


def scalar_reader(op: Operand, bits: int, where: str):
    """fn(wave) -> int of `bits` bits (32 or 64), for SALU, SMEM and lane selects."""
    _plain(op, where)
    return _scalar_source(op, bits, where)


def _scalar_source(op: Operand, bits: int, where: str):
    if op.file == "const":
        value = _constant_bits(op, bits, np.dtype(np.uint32 if bits == 32 else np.uint64))
        return lambda w: value
    if op.file == "exec":
        shift = 32 * op.index
        return (lambda w: w.exec) if bits == 64 else (lambda w: (w.exec >> shift) & M32)
    if op.file != "s":
        raise UnsupportedInstruction(f"expected a scalar operand, got {op.token!r} ({where})")
    i = op.index
    if bits == 64:
        return lambda w: w.s[i] | (w.s[i + 1] << 32)
    return lambda w: w.s[i]


def sgpr_or_constant(op: Operand, bits: int) -> tuple[int | None, int | None]:
    """(its SGPR, None) for a 32-bit SGPR operand, (None, its bits) for a constant
    one, (None, None) for any other (a pair, exec): what a closure may read from
    the wave's SGPR list itself instead of through `scalar_reader`."""
    if bits != 32 or op.neg or op.abs:
        return None, None
    if op.file == "s":
        return op.index, None
    if op.file == "const":
        return None, _constant_bits(op, bits, np.dtype(np.uint32))
    return None, None


def scalar_writer(op: Operand, bits: int, where: str):
    """fn(wave, int) storing the low `bits` bits into SGPRs or exec."""
    _plain(op, where)
    if op.file == "exec":
        if bits == 64:
            return lambda w, v: w.set_exec(v)
        keep, shift = (M32 << 32, 0) if op.index == 0 else (M32, 32)
        return lambda w, v: w.set_exec((w.exec & keep) | ((v & M32) << shift))
    if op.file != "s":
        raise UnsupportedInstruction(f"expected a scalar destination, got {op.token!r} ({where})")
    i = op.index
    if bits == 64:
        def write64(w, v):
            w.s[i] = v & M32
            w.s[i + 1] = (v >> 32) & M32
        return write64
    def write32(w, v):
        w.s[i] = v & M32
    return write32


def _plain(op: Operand, where: str) -> None:
    if op.neg or op.abs:
        raise UnsupportedInstruction(f"source modifier on scalar operand {op.token!r} ({where})")


def _constant_bits(op: Operand, bits: int, dtype: np.dtype) -> int:
    """The bit pattern of a constant operand for an operand of `dtype`."""
    if op.is_float_constant:
        if dtype.kind != "f" and dtype != BF16:
            # Float inline constants on integer operands carry f32 bits (gfx9 rule).
            return int(np.float32(op.value).view(np.uint32))
        return int(np.array(op.value, dtype).view(UNSIGNED[dtype.itemsize]))
    value = op.value
    if dtype == np.float64 and not -16 <= value <= 64:
        return (value & M32) << 32  # a 32-bit literal is the high half of an f64
    return value & ((1 << bits) - 1)


# ---------------------------------------------------------------- vector (numpy lanes)


def vector_reader(op: Operand, dtype, where: str, high: bool = False):
    """fn(wave) -> lanes (array [64] or scalar) of `dtype`; `high` = op_sel upper half."""
    if dtype is MASK:
        read = scalar_reader(op, 64, where)
        return lambda w: lane_masks(read(w))
    return with_modifiers(op, _vector_value(op, np.dtype(dtype), where, high), np.dtype(dtype))


def _mask_rows(m, waves: int) -> np.ndarray:
    """uint64 [waves]: each wave's bits of a Batch's compare result `m` ([waves or 1,
    64 or 1] lanes, or one bool for all: both compare operands scalar)."""
    if np.ndim(m) == 0:
        return np.full(waves, M64 if m else 0, np.uint64)
    if m.shape[-1] != LANES:
        m = np.broadcast_to(m, (waves, LANES))
    rows = np.packbits(m, axis=-1, bitorder="little").view("<u8")
    return np.broadcast_to(rows, (waves, 1)).ravel().astype(np.uint64, copy=False)


def with_modifiers(op: Operand, read, dtype: np.dtype):
    """Apply the operand's |abs| and -neg source modifiers (in that order) to `read`.

    The modifiers are float sign operations; on an operand read as bits (e.g. the
    sources of v_cndmask_b32) they clear / flip the type's top bit."""
    if not (op.abs or op.neg):
        return read
    if dtype.kind in "ui":
        sign = np.array(1 << (8 * dtype.itemsize - 1), UNSIGNED[dtype.itemsize]).view(dtype)[()]
        absolute, negate = (lambda x: x & ~sign), (lambda x: x ^ sign)
    else:
        absolute, negate = np.abs, np.negative
    if op.abs and op.neg:
        return lambda w: negate(absolute(read(w)))
    if op.abs:
        return lambda w: absolute(read(w))
    return lambda w: negate(read(w))


def _vector_value(op: Operand, dtype: np.dtype, where: str, high: bool):
    size = dtype.itemsize
    if op.file == "const":
        bits = _constant_bits(op, 8 * size, dtype)
        value = np.array(bits, UNSIGNED[size]).view(dtype)[()]
        if high:  # the high half of a 16-bit inline constant is zero
            value = np.array(0, UNSIGNED[size]).view(dtype)[()]
        return lambda w: value
    if op.file == "s" or op.file == "exec":
        read = _scalar_source(op, 64 if size == 8 else 32, where)
        shift = 16 if high else 0
        utype = UNSIGNED[size]
        mask = (1 << (8 * size)) - 1
        return lambda w: utype((read(w) >> shift) & mask).view(dtype)
    i = op.index
    if dtype == np.uint32:
        return lambda w: w.r[i]
    if dtype == np.float32:
        return lambda w: w.f[i]
    if dtype == np.int32:
        return lambda w: w.i[i]
    if size == 4:
        return lambda w: w.r[i].view(dtype)
    if size == 2:
        half = 1 if high else 0
        return lambda w: w.r[i].view(np.uint16)[..., half::2].view(dtype)  # [64] or [waves, 64]
    if size == 8:
        return lambda w: (w.r[i].astype(np.uint64) | (w.r[i + 1].astype(np.uint64) << 32)).view(dtype)
    raise UnsupportedInstruction(f"operand type {dtype} ({where})")


_REGISTER_VIEWS = {np.dtype(np.uint32): "r", np.dtype(np.float32): "f", np.dtype(np.int32): "i"}


def vector_writer(op: Operand, dtype, where: str, high: bool = False, zero_high: bool = True):
    """fn(wave, lanes) storing `dtype` lanes into active lanes of a VGPR/AGPR (or a mask)."""
    if dtype is MASK:
        write = scalar_writer(op, 64, where)
        pair = op.index if op.file == "s" else None  # an SGPR pair (vcc, s[n:n+1]); else exec

        def write_mask(w, m):
            if w.waves is None:
                write(w, mask_to_int(m) & w.exec if np.ndim(m) else w.exec if m else 0)
            elif getattr(w, "write_mask", None) is not None:  # the rows of a launch's opening (opening.Rows)
                w.write_mask(write, _mask_rows(m, w.count))
            elif pair is None:  # a Batch: each wave its row
                for wave, bits in zip(w.waves, _mask_rows(m, len(w.waves)).tolist()):
                    write(wave, bits & wave.exec)
            else:  # the same into an SGPR pair: the rows and exec ANDed at once, stored wave by wave
                waves = w.waves
                execs = [wave.exec for wave in waves]
                same = execs.count(execs[0]) == len(execs)  # mostly: every lane on
                values = _mask_rows(m, len(waves)) & (np.uint64(execs[0]) if same else np.array(execs, np.uint64))
                for wave, lo, hi in zip(waves, (values & np.uint64(M32)).tolist(),
                                        (values >> np.uint64(32)).tolist()):
                    s = wave.s
                    s[pair] = lo
                    s[pair + 1] = hi
        return write_mask
    if op.file != "v" or op.neg or op.abs:
        raise UnsupportedInstruction(f"expected a vector destination, got {op.token!r} ({where})")
    dtype, i = np.dtype(dtype), op.index
    if dtype in _REGISTER_VIEWS:  # numpy's assignment casts (integers wrap around)
        view = _REGISTER_VIEWS[dtype]

        def write_typed(w, value):
            if w.full:
                getattr(w, view)[i] = value
            else:
                np.copyto(getattr(w, view)[i], value, where=w.mask, casting="unsafe")
        return write_typed
    if dtype.itemsize == 4:
        def write32(w, value):
            bits = np.asarray(value, dtype).view(np.uint32)
            if w.full:
                w.r[i] = bits
            else:
                np.copyto(w.r[i], bits, where=w.mask)
        return write32
    if dtype.itemsize == 8:
        def write64(w, value):
            bits = np.asarray(value, dtype).view(np.uint64)
            low, high = bits.astype(np.uint32), (bits >> np.uint64(32)).astype(np.uint32)
            if w.full:
                w.r[i], w.r[i + 1] = low, high
            else:
                np.copyto(w.r[i], low, where=w.mask)
                np.copyto(w.r[i + 1], high, where=w.mask)
        return write64
    if dtype.itemsize == 2:
        shift = 16 if high else 0
        keep = np.uint32(0 if zero_high else (0xFFFF0000 if not high else 0x0000FFFF))
        def write16(w, value):
            bits = np.asarray(value, dtype).view(np.uint16).astype(np.uint32) << np.uint32(shift)
            np.copyto(w.r[i], (w.r[i] & keep) | bits, where=w.mask)
        return write16
    raise UnsupportedInstruction(f"destination type {dtype} ({where})")
