"""MFMA instructions of gfx942/gfx950 as pure functions of a wave's registers.

`MFMA_FORMS[arch][mnemonic]` (the mnemonic as LLVM prints it) is an `MfmaForm`:
its register counts and `form(a, b, c, **modifiers) -> d`, where `a`, `b` are the
uint32 contents of the source tuples [64 lanes, regs], `c` the f32 accumulator
[64, c_regs], `d` the f32 result [64, c_regs].

Lane layouts (SPEC §5; the AMD matrix instruction calculator's rule for
single-block MxNxK forms, M = N, G = 64 / M lane groups, kpl = K / G values a lane):
  A: lane ℓ holds row ℓ % M, k = kpl·(ℓ // M) + 0 .. kpl−1, packed little-endian
     (element 0 in the lowest bits of the first register);
  B: lane ℓ holds column ℓ % M, same k;
  C/D: lane ℓ, register r holds column ℓ % M, row 4G·(r // 4) + 4·(ℓ // M) + r % 4
     (16x16: row 4·(ℓ // 16) + r; 32x32: row 8·(r // 4) + 4·(ℓ // 32) + r % 4).
Scaled forms (gfx950 v_mfma_scale_*_f8f6f4): the E8M0 byte `scale_*_byte` of lane
ℓ's scale register scales the kpl values lane ℓ holds (one 32-k block of one row
of A or column of B); LLVM prints the byte select of A as op_sel[0] + 2·op_sel_hi[0]
and of B as op_sel[1] + 2·op_sel_hi[1]. cbsz (A) and blgp (B) select the element
format: 0 fp8 e4m3, 1 bf8 e5m2, 2 fp6 e2m3, 3 bf6 e3m2, 4 fp4 e2m1 (8, 8, 6, 6, 4
registers).

Arithmetic: element products are exact, summed over k in float64 (numpy matmul),
C added, and the sum rounded to f32 once. Real MFMA hardware accumulates in its
own order and precision, so results may differ from it in the last bits (never
more than fp32 summation-order differences for our sizes). On the non-scaled
single-block forms cbsz/abid/blgp (broadcast controls that only mean something
for multi-block forms) must be 0: anything else raises.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from k2back.emu import numerics as nx

WAVE = 64


# --------------------------------------------------------------------------- elements


@dataclass(frozen=True)
class Element:
    """A matrix element type: its width in bits and how bit patterns decode to f32."""

    name: str
    bits: int
    decode: Callable[[np.ndarray], np.ndarray]

    def unpack(self, regs: np.ndarray) -> np.ndarray:
        """uint32 [lanes, n] registers -> f32 [lanes, 32n / bits] elements, in k order."""
        regs = np.ascontiguousarray(regs, dtype="<u4")
        if self.bits in (8, 16):
            codes = regs.view(f"<u{self.bits // 8}")
        else:  # fp6 / fp4: a little-endian bit stream across the registers
            stream = np.unpackbits(regs.view(np.uint8), axis=-1, bitorder="little")
            fields = stream.reshape(regs.shape[0], -1, self.bits)
            codes = fields @ (1 << np.arange(self.bits, dtype=np.int64))
        return self.decode(codes)


def _minifloat(fmt: nx.MiniFloat) -> Element:
    return Element(fmt.name, fmt.bits, lambda codes: nx.decode(fmt, codes))


BF16 = Element("bf16", 16, nx.bf16_to_f32)
F16 = Element("f16", 16, nx.f16_to_f32)

# cbsz / blgp of the f8f6f4 forms -> element format (gfx950, OCP / MX formats)
F8F6F4 = {
    code: _minifloat(fmt)
    for code, fmt in enumerate((nx.E4M3FN, nx.E5M2, nx.E2M3, nx.E3M2, nx.E2M1))
}


def _elements(arch: str) -> dict[str, Element]:
    """What an element name in a mnemonic means on `arch`."""
    fp8 = {kind: _minifloat(nx.fp8_format(arch, kind)) for kind in ("fp8", "bf8")}
    return {"bf16": BF16, "f16": F16, **fp8}


# --------------------------------------------------------------------------- layouts


@dataclass(frozen=True)
class Layout:
    """Lane <-> matrix index maps of one M x M x K single-block MFMA shape."""

    m: int
    k: int
    a_gather: np.ndarray = field(init=False, repr=False, compare=False)
    b_gather: np.ndarray = field(init=False, repr=False, compare=False)
    c_gather: np.ndarray = field(init=False, repr=False, compare=False)
    d_gather: np.ndarray = field(init=False, repr=False, compare=False)

    @property
    def groups(self) -> int:
        return WAVE // self.m

    @property
    def per_lane(self) -> int:
        return self.k // self.groups

    @property
    def c_regs(self) -> int:
        return self.m * self.m // WAVE

    def __post_init__(self):
        m, kpl, nc = self.m, self.per_lane, self.c_regs
        # operand element (row or column i, k index kk) sits in lane i + m·(kk // kpl), slot kk % kpl
        i, kk = np.indices((m, self.k))
        a = (i + m * (kk // kpl)) * kpl + kk % kpl
        # accumulator element (row, col) sits in lane col + m·((row // 4) % G), register
        # 4·(row // 4G) + row % 4
        row, col = np.indices((m, m))
        c = (col + m * ((row // 4) % self.groups)) * nc + 4 * (row // (4 * self.groups)) + row % 4
        d = np.empty(WAVE * nc, dtype=np.int64)
        d[c.ravel()] = np.arange(m * m)
        for name, value in (("a_gather", a), ("b_gather", a.T), ("c_gather", c), ("d_gather", d)):
            object.__setattr__(self, name, value)

    def matrix_a(self, values: np.ndarray) -> np.ndarray:
        """[64, kpl] lane values -> A [m, k]."""
        return values.reshape(-1)[self.a_gather]

    def matrix_b(self, values: np.ndarray) -> np.ndarray:
        """[64, kpl] lane values -> B [k, m]."""
        return values.reshape(-1)[self.b_gather]

    def matrix_c(self, c: np.ndarray) -> np.ndarray:
        return c.reshape(-1)[self.c_gather]

    def lanes_d(self, d: np.ndarray) -> np.ndarray:
        return d.reshape(-1)[self.d_gather].reshape(WAVE, self.c_regs)


# --------------------------------------------------------------------------- forms


def _check_regs(name: str, regs: np.ndarray, count: int) -> None:
    if regs.shape != (WAVE, count):
        raise ValueError(f"{name}: expected registers of shape ({WAVE}, {count}), got {regs.shape}")


def _e8m0_factor(scale: np.ndarray, byte: int) -> np.ndarray:
    if byte not in range(4):
        raise ValueError(f"scale byte select: expected 0..3, got {byte!r}")
    code = (np.asarray(scale, dtype=np.uint32) >> np.uint32(8 * byte)) & np.uint32(0xFF)
    return np.where(code == 0xFF, np.nan, np.exp2(code.astype(np.float64) - 127.0))


@dataclass(frozen=True)
class MfmaForm:
    """One MFMA instruction; `a_element`/`b_element` None means chosen by cbsz/blgp."""

    mnemonic: str
    layout: Layout
    a_element: Element | None
    b_element: Element | None
    scaled: bool = False

    @property
    def c_regs(self) -> int:
        return self.layout.c_regs

    def a_regs(self, cbsz: int = 0) -> int:
        return self._element("cbsz", self.a_element, cbsz).bits * self.layout.per_lane // 32

    def b_regs(self, blgp: int = 0) -> int:
        return self._element("blgp", self.b_element, blgp).bits * self.layout.per_lane // 32

    def _element(self, name: str, fixed: Element | None, select: int) -> Element:
        if fixed is not None:
            if select:
                raise ValueError(
                    f"{self.mnemonic}: expected {name} 0 (broadcast controls of multi-block "
                    f"forms are not modelled), got {select}"
                )
            return fixed
        if select not in F8F6F4:
            raise ValueError(f"{self.mnemonic}: expected {name} in 0..4, got {select!r}")
        return F8F6F4[select]

    def operand(self, name: str, regs: np.ndarray, element: Element) -> np.ndarray:
        _check_regs(name, regs, element.bits * self.layout.per_lane // 32)
        return element.unpack(regs).astype(np.float64)

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
    ) -> np.ndarray:
        if abid:
            raise ValueError(f"{self.mnemonic}: expected abid 0, got {abid}")
        a_values = self.operand("a", a, self._element("cbsz", self.a_element, cbsz))
        b_values = self.operand("b", b, self._element("blgp", self.b_element, blgp))
        _check_regs("c", c, self.c_regs)
        if self.scaled:
            a_values = a_values * _e8m0_factor(scale_a, scale_a_byte)[:, None]
            b_values = b_values * _e8m0_factor(scale_b, scale_b_byte)[:, None]
        elif scale_a is not None or scale_b is not None:
            raise ValueError(f"{self.mnemonic}: takes no scale operands")
        lay = self.layout
        d = lay.matrix_a(a_values) @ lay.matrix_b(b_values)
        d += lay.matrix_c(np.asarray(c, dtype=np.float32)).astype(np.float64)
        return lay.lanes_d(d).astype(np.float32)


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
    layouts: dict[tuple[int, int], Layout] = {}
    table: dict[str, dict[str, MfmaForm]] = {arch: {} for arch in nx.ARCHS}
    for mnemonic, m, k, a, b, scaled, archs in _FORMS:
        layout = layouts.setdefault((m, k), Layout(m, k))
        for arch in archs:
            elements = _elements(arch)
            table[arch][mnemonic] = MfmaForm(
                mnemonic, layout, elements.get(a), elements.get(b), scaled
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
