"""MFMA instructions of gfx942/gfx950 as pure functions of a wave's registers.

`MFMA_FORMS[arch][mnemonic]` (the mnemonic as LLVM prints it) is an `MfmaForm`:
its register counts and `form(a, b, c, **modifiers) -> d`, where `a`, `b` are the
uint32 contents of the source tuples [64 lanes, regs], `c` the f32 accumulator
[64, c_regs], `d` the f32 result [64, c_regs].

Lane layouts of single-block M x M x K forms, G = 64 / M lane groups, kpl = K / G
values a lane, operand elements packed little-endian (element 0 in the lowest bits
of the first register):
  A: lane ℓ holds row ℓ % M; B: lane ℓ holds column ℓ % M. Element t of lane ℓ is
     k = chunk·G·(t // chunk) + chunk·(ℓ // M) + t % chunk: the lane groups take
     turns in runs of `chunk` consecutive k. For every form chunk = kpl
     (k = kpl·(ℓ // M) + t, SPEC §5) except the 8-bit operands of the gfx950
     f8f6f4 forms, where chunk = 16: lane group g holds k = 16g .. 16g+15 in
     elements 0..15 and K/2 + 16g .. in elements 16..31, while fp4 is one run of 32.
     Two AMD sources agree: the CDNA3/CDNA4 matrix-core article's example kernels
     (32x32x64, fp8 and fp4) and iree-org/wave's index map for 16x16x128 (k =
     64·(t // 16) + 16·(ℓ // 16) + t % 16, fp4 and scales 32·(ℓ // 16)). SPEC §5's
     "k = 32·(ℓ/16)+0..31" holds for fp4 only. The lane layout of fp6/bf6 operands
     (cbsz/blgp 2, 3) is documented nowhere we could read: those raise.
  C/D: lane ℓ, register r holds column ℓ % M, row 4G·(r // 4) + 4·(ℓ // M) + r % 4
     (16x16: row 4·(ℓ // 16) + r; 32x32: row 8·(r // 4) + 4·(ℓ // 32) + r % 4).
Scaled forms (gfx950 v_mfma_scale_*_f8f6f4): byte `scale_*_byte` of lane ℓ's scale
register is the E8M0 scale of row (A) / column (B) ℓ % M over the 32-k block
k = 32·(ℓ // M) .. +31, wherever the layout above puts those values. LLVM prints
the byte select of A as op_sel[0] + 2·op_sel_hi[0], of B as op_sel[1] +
2·op_sel_hi[1]. cbsz (A) and blgp (B) select the element format: 0 fp8 e4m3,
1 bf8 e5m2, 2 fp6 e2m3, 3 bf6 e3m2, 4 fp4 e2m1 (8, 8, 6, 6, 4 registers).

Arithmetic: element products are exact; how they are summed with C is the
`accumulate` argument (`k2back.emu.accumulate`): by default summed exactly and
rounded to f32 once. Real MFMA hardware accumulates in its own order and
precision, so results may differ from every model in the last bits. On the
non-scaled forms with a fixed element type, cbsz/abid/blgp (broadcast controls of
multi-block forms) must be 0: anything else raises.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from k2back.emu import numerics as nx
from k2back.emu.accumulate import accumulate as accumulate_products

WAVE = 64


# --------------------------------------------------------------------------- elements


@dataclass(frozen=True)
class Element:
    """A matrix element type: its width in bits, how bit patterns decode to f32,
    and its smallest normal exponent (where subnormals sit, for `accumulate`)."""

    name: str
    bits: int
    decode: Callable[[np.ndarray], np.ndarray]
    min_exponent: int

    def unpack(self, regs: np.ndarray) -> np.ndarray:
        """uint32 [lanes, n] registers -> f32 [lanes, 32n / bits] elements, in slot order."""
        regs = np.ascontiguousarray(regs, dtype="<u4")
        if self.bits in (8, 16):
            codes = regs.view(f"<u{self.bits // 8}")
        else:  # fp6 / fp4: a little-endian bit stream across the registers
            stream = np.unpackbits(regs.view(np.uint8), axis=-1, bitorder="little")
            fields = stream.reshape(regs.shape[0], -1, self.bits)
            codes = fields @ (1 << np.arange(self.bits, dtype=np.int64))
        return self.decode(codes)


def _minifloat(fmt: nx.MiniFloat) -> Element:
    return Element(fmt.name, fmt.bits, lambda codes: nx.decode(fmt, codes), 1 - fmt.bias)


BF16 = Element("bf16", 16, nx.bf16_to_f32, -126)
F16 = Element("f16", 16, nx.f16_to_f32, -14)


@dataclass(frozen=True)
class Operand:
    """An element type as one MFMA form lays it out in a lane: runs of `chunk`
    consecutive k (None: the layout is unknown and the operand is refused)."""

    element: Element
    chunk: int | None


# cbsz / blgp of the f8f6f4 forms -> operand (gfx950, OCP / MX formats)
F8F6F4 = {
    0: Operand(_minifloat(nx.E4M3FN), 16),
    1: Operand(_minifloat(nx.E5M2), 16),
    2: Operand(_minifloat(nx.E2M3), None),
    3: Operand(_minifloat(nx.E3M2), None),
    4: Operand(_minifloat(nx.E2M1), 32),
}


def _elements(arch: str) -> dict[str, Element]:
    """What an element name in a mnemonic means on `arch`."""
    fp8 = {kind: _minifloat(nx.fp8_format(arch, kind)) for kind in ("fp8", "bf8")}
    return {"bf16": BF16, "f16": F16, **fp8}


# --------------------------------------------------------------------------- layouts


@functools.cache
def _operand_gather(m: int, k: int, chunk: int) -> np.ndarray:
    """[m, k] indices into lane-major [64, kpl] values: where element (i, kk) sits."""
    groups, kpl = WAVE // m, k * m // WAVE
    i, kk = np.indices((m, k))
    run, within = np.divmod(kk, groups * chunk)
    group, offset = np.divmod(within, chunk)
    return (i + m * group) * kpl + run * chunk + offset


@functools.cache
def _register_gather(m: int, k: int, chunk: int, bits: int) -> np.ndarray:
    """[m, k] indices into the register-major codes [regs, 64, 32 / bits] of an
    8- or 16-bit operand: _operand_gather without the lane-major copy."""
    per_register, kpl = 32 // bits, k * m // WAVE
    lane, slot = np.divmod(_operand_gather(m, k, chunk), kpl)
    register, within = np.divmod(slot, per_register)
    return (register * WAVE + lane) * per_register + within


@functools.cache
def _accumulator_registers(m: int) -> tuple[np.ndarray, np.ndarray]:
    """_accumulator_gather on register-major C/D [regs, 64]: (-> [m, m], [m, m] -> registers)."""
    to_matrix, to_lanes = _accumulator_gather(m)
    regs = m * m // WAVE
    lane, register = np.divmod(to_matrix, regs)
    return register * WAVE + lane, to_lanes.T.reshape(-1)


@functools.cache
def _accumulator_gather(m: int) -> tuple[np.ndarray, np.ndarray]:
    """(lanes -> [m, m] matrix, [m, m] matrix -> lanes) index maps of C/D."""
    groups, regs = WAVE // m, m * m // WAVE
    row, col = np.indices((m, m))
    to_matrix = (col + m * ((row // 4) % groups)) * regs + 4 * (row // (4 * groups)) + row % 4
    to_lanes = np.empty(WAVE * regs, dtype=np.int64)
    to_lanes[to_matrix.ravel()] = np.arange(m * m)
    return to_matrix, to_lanes.reshape(WAVE, regs)


# --------------------------------------------------------------------------- forms


def _check_regs(name: str, regs: np.ndarray, count: int) -> None:
    if regs.shape[-2:] != (WAVE, count):
        raise ValueError(f"{name}: expected registers of shape ({WAVE}, {count}), got {regs.shape}")


def _exponent_of(factors: np.ndarray) -> np.ndarray:
    """log2 of power-of-two scale factors (0 where a scale is NaN)."""
    return np.where(np.isnan(factors), 0, np.log2(np.where(np.isnan(factors), 1, factors))).astype(np.int64)


def _e8m0_factor(scale: np.ndarray, byte: int) -> np.ndarray:
    if byte not in range(4):
        raise ValueError(f"scale byte select: expected 0..3, got {byte!r}")
    code = (np.asarray(scale, dtype=np.uint32) >> np.uint32(8 * byte)) & np.uint32(0xFF)
    return np.where(code == 0xFF, np.nan, np.exp2(code.astype(np.float64) - 127.0))


@dataclass(frozen=True)
class _Placement:
    """An operand's element type, register count and matrix positions in one form."""

    name: str
    element: Element
    regs: int
    gather: np.ndarray  # [m, k] indices into the lane-major unpacked values
    register_gather: np.ndarray | None  # the same into register-major codes (8- and 16-bit only)

    def matrix(self, regs: np.ndarray) -> np.ndarray:
        """Registers [..., 64, regs] -> the [..., m, k] matrices of row (A) / column (B)
        values, float64."""
        _check_regs(self.name, regs, self.regs)
        values = self.element.unpack(regs.reshape(-1, self.regs)).astype(np.float64)
        return values.reshape(*regs.shape[:-2], -1)[..., self.gather]


@dataclass(frozen=True)
class MfmaForm:
    """One MFMA instruction; `a_element`/`b_element` None means chosen by cbsz/blgp."""

    mnemonic: str
    m: int
    k: int
    a_element: Element | None
    b_element: Element | None
    scaled: bool = False

    @property
    def groups(self) -> int:
        return WAVE // self.m

    @property
    def c_regs(self) -> int:
        return self.m * self.m // WAVE

    def a_regs(self, cbsz: int = 0) -> int:
        return self._placement("a", cbsz).regs

    def b_regs(self, blgp: int = 0) -> int:
        return self._placement("b", blgp).regs

    @functools.cache  # noqa: B019 - forms are module-level constants
    def _placement(self, operand: str, select: int) -> _Placement:
        fixed, control = {"a": (self.a_element, "cbsz"), "b": (self.b_element, "blgp")}[operand]
        per_lane = self.k // self.groups
        if fixed is not None:
            if select:
                raise ValueError(
                    f"{self.mnemonic}: expected {control} 0 (broadcast controls of multi-block "
                    f"forms are not modelled), got {select}"
                )
            element, chunk = fixed, per_lane
        elif select in F8F6F4:
            element, chunk = F8F6F4[select].element, F8F6F4[select].chunk
        else:
            raise ValueError(f"{self.mnemonic}: expected {control} in 0..4, got {select!r}")
        if chunk is None:
            raise ValueError(
                f"{self.mnemonic}: {control} {select} ({element.name}) is not modelled: the lane "
                f"layout of its operands is documented nowhere we could verify"
            )
        regs = element.bits * per_lane // 32
        codes = _register_gather(self.m, self.k, chunk, element.bits) if element.bits in (8, 16) else None
        return _Placement(operand, element, regs, _operand_gather(self.m, self.k, chunk), codes)

    def _block_scales(self, scale: np.ndarray | None, byte: int) -> np.ndarray:
        """[m, k] factors: lane ℓ's E8M0 byte over row ℓ % m, k-block ℓ // m."""
        if scale is None:
            raise ValueError(f"{self.mnemonic}: expected scale operands, got None")
        blocks = _e8m0_factor(scale, byte).reshape(self.groups, self.m).T
        return np.repeat(blocks, self.k // self.groups, axis=1)

    def __call__(
        self,
        a: np.ndarray,
        b: np.ndarray,
        c: np.ndarray,
        *,
        cbsz: int = 0,
        abid: int = 0,
        blgp: int = 0,
        scale_a: np.ndarray | None = None,
        scale_b: np.ndarray | None = None,
        scale_a_byte: int = 0,
        scale_b_byte: int = 0,
        accumulate: str = "exact",
    ) -> np.ndarray:
        """`accumulate`: how the products are summed (`k2back.emu.accumulate.MODES`).
        a, b, c: [64, regs] of one wave, or [waves, 64, regs] of several (unscaled
        forms), giving [waves, 64, c_regs]."""
        if abid:
            raise ValueError(f"{self.mnemonic}: expected abid 0, got {abid}")
        a_place, b_place = self._placement("a", cbsz), self._placement("b", blgp)
        a_matrix, b_matrix = a_place.matrix(a), b_place.matrix(b)
        a_min, b_min = a_place.element.min_exponent, b_place.element.min_exponent
        _check_regs("c", c, self.c_regs)
        if self.scaled:
            a_scales = self._block_scales(scale_a, scale_a_byte)
            b_scales = self._block_scales(scale_b, scale_b_byte)
            a_matrix, b_matrix = a_matrix * a_scales, b_matrix * b_scales
            a_min, b_min = a_min + _exponent_of(a_scales), b_min + _exponent_of(b_scales)
        elif scale_a is not None or scale_b is not None:
            raise ValueError(f"{self.mnemonic}: takes no scale operands")
        to_matrix, to_lanes = _accumulator_gather(self.m)
        waves = a.shape[:-2]
        c = np.broadcast_to(np.asarray(c, dtype=np.float32), (*waves, WAVE, self.c_regs))
        c_matrix = c.reshape(*waves, -1)[..., to_matrix]
        d = _sum(accumulate, a_matrix, b_matrix, c_matrix, a_min, b_min,
                 max(a_place.element.bits, b_place.element.bits) <= 8)
        return d.reshape(*waves, -1)[..., to_lanes]

    @functools.cache  # noqa: B019 - forms are module-level constants
    def _register_plan(self, cbsz: int = 0, blgp: int = 0):
        """What on_registers needs (None: the form is not one it takes): per operand
        (element, code dtype, gather), then C/D's maps, the min exponents and the
        [m, k] lane of each element's scale (scaled forms)."""
        try:
            places = self._placement("a", cbsz), self._placement("b", blgp)
        except ValueError:
            return None
        if any(p.register_gather is None for p in places):
            return None
        operands = tuple((_float64_values(p.element), np.dtype(f"<u{p.element.bits // 8}"), p.register_gather)
                         for p in places)
        eight_bit = max(p.element.bits for p in places) <= 8
        i, kk = np.indices((self.m, self.k))
        scale_lanes = kk // (self.k // self.groups) * self.m + i  # _block_scales as one gather
        return operands, _accumulator_registers(self.m), places[0].element.min_exponent, \
            places[1].element.min_exponent, eight_bit, scale_lanes

    def on_registers_ok(self, cbsz: int = 0, blgp: int = 0) -> bool:
        """Whether on_registers takes this form at these element formats (8- or 16-bit elements)."""
        return self._register_plan(cbsz, blgp) is not None

    def on_registers(self, a: np.ndarray, b: np.ndarray, c: np.ndarray, accumulate: str = "exact", *,
                     cbsz: int = 0, blgp: int = 0, scales=None) -> np.ndarray:
        """`self(a, b, c)` of a form with 8- or 16-bit elements, on register-major
        operands: a, b uint32 [regs * 64] of one wave or [waves, regs * 64] of
        several, c f32 [c_regs * 64] or [waves, c_regs * 64]; `scales` (scaled
        forms): (scale_a, scale_a_byte, scale_b, scale_b_byte), a scale uint32
        [64] or [waves, 64]; returns d f32 like a (register r of lane ℓ at r * 64 + ℓ)."""
        operands, (to_matrix, to_registers), a_min, b_min, eight_bit, scale_lanes = \
            self._register_plan(cbsz, blgp)
        a_matrix, b_matrix = (values[codes.view(dtype)[..., gather]]
                              for (values, dtype, gather), codes in zip(operands, (a, b)))
        if self.scaled:
            if scales is None:
                raise ValueError(f"{self.mnemonic}: expected scale operands, got None")
            scale_a, a_byte, scale_b, b_byte = scales
            a_scales = _e8m0_factor(scale_a, a_byte)[..., scale_lanes]
            b_scales = _e8m0_factor(scale_b, b_byte)[..., scale_lanes]
            a_matrix, b_matrix = a_matrix * a_scales, b_matrix * b_scales
            if accumulate != "exact":  # (the exact sum needs no exponents)
                a_min, b_min = a_min + _exponent_of(a_scales), b_min + _exponent_of(b_scales)
        elif scales is not None:
            raise ValueError(f"{self.mnemonic}: takes no scale operands")
        c_matrix = c[..., to_matrix]
        if a.ndim > 1 and accumulate != "exact":
            c_matrix = np.broadcast_to(c_matrix, (a.shape[0], self.m, self.m))
        d = _sum(accumulate, a_matrix, b_matrix, c_matrix, a_min, b_min, eight_bit)
        return d.reshape(*a.shape[:-1], -1)[..., to_registers]


@functools.cache
def _float64_values(element: Element) -> np.ndarray:
    """float64 [2^bits]: every code of an 8- or 16-bit element decoded (a lookup
    instead of the decode's arithmetic, the same values)."""
    with np.errstate(invalid="ignore"):  # signalling NaNs quiet, as the decode's own cast does
        return element.decode(np.arange(1 << element.bits, dtype=f"<u{element.bits // 8}")).astype(np.float64)


def _sum(accumulate, a_matrix, b_matrix, c_matrix, a_min, b_min, eight_bit):
    """accumulate_products over a leading axis of waves when there is one."""
    if a_matrix.ndim > 2 and accumulate != "exact":  # the other models take one wave at a time
        def each(i, exponent):  # a scaled form's min exponents are per wave
            return exponent[i] if np.ndim(exponent) == a_matrix.ndim else exponent
        return np.stack([accumulate_products(accumulate, a_matrix[i], b_matrix[i], c_matrix[i],
                                             each(i, a_min), each(i, b_min), eight_bit)
                         for i in range(a_matrix.shape[0])])
    return accumulate_products(accumulate, a_matrix, b_matrix, c_matrix, a_min, b_min, eight_bit)


# mnemonic, M, K, A element, B element ('f8f6f4': by cbsz/blgp), scaled, archs
_FORMS = [
    ("v_mfma_f32_16x16x16_bf16", 16, 16, "bf16", "bf16", False, ("gfx942", "gfx950")),
    ("v_mfma_f32_32x32x8_bf16", 32, 8, "bf16", "bf16", False, ("gfx942", "gfx950")),
    ("v_mfma_f32_16x16x32_bf16", 16, 32, "bf16", "bf16", False, ("gfx950",)),
    ("v_mfma_f32_32x32x16_bf16", 32, 16, "bf16", "bf16", False, ("gfx950",)),
    ("v_mfma_f32_16x16x16_f16", 16, 16, "f16", "f16", False, ("gfx942", "gfx950")),
    ("v_mfma_f32_32x32x8_f16", 32, 8, "f16", "f16", False, ("gfx942", "gfx950")),
    ("v_mfma_f32_16x16x32_f16", 16, 32, "f16", "f16", False, ("gfx950",)),
    ("v_mfma_f32_32x32x16_f16", 32, 16, "f16", "f16", False, ("gfx950",)),
    *(
        (f"v_mfma_f32_{shape}_{a}_{b}", m, k, a, b, False, ("gfx942", "gfx950"))
        for shape, m, k in (("16x16x32", 16, 32), ("32x32x16", 32, 16))
        for a in ("fp8", "bf8")
        for b in ("fp8", "bf8")
    ),
    *(
        (f"v_mfma{scale}_f32_{shape}_f8f6f4", m, k, "f8f6f4", "f8f6f4", bool(scale), ("gfx950",))
        for shape, m, k in (("16x16x128", 16, 128), ("32x32x64", 32, 64))
        for scale in ("", "_scale")
    ),
]


def _build() -> dict[str, dict[str, MfmaForm]]:
    table: dict[str, dict[str, MfmaForm]] = {arch: {} for arch in nx.ARCHS}
    for mnemonic, m, k, a, b, scaled, archs in _FORMS:
        for arch in archs:
            elements = _elements(arch)
            table[arch][mnemonic] = MfmaForm(
                mnemonic, m, k, elements.get(a), elements.get(b), scaled
            )
    return table


MFMA_FORMS = _build()


def mfma_form(arch: str, mnemonic: str) -> MfmaForm:
    """The MFMA `mnemonic` of `arch`, or a ValueError naming what exists."""
    forms = MFMA_FORMS.get(arch)
    if forms is None:
        raise ValueError(f"arch: expected one of {nx.ARCHS}, got {arch!r}")
    if mnemonic not in forms:
        raise ValueError(
            f"mnemonic: {mnemonic!r} is not an MFMA form modelled for {arch} "
            f"(modelled: {', '.join(sorted(forms))})"
        )
    return forms[mnemonic]
