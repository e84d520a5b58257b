"""How an MFMA adds its K products to the accumulator: the models
`Machine(mfma_accumulate=...)` offers. The ISA guides specify none of this;
hardware results may differ from each model in the last bits.

exact       each product exact, all K products and C summed exactly (float64) and
            rounded once to f32: the kindest model (no intermediate rounding).
sequential  an fp32 accumulator, C first, then one fused add per k in k order:
            acc = f32(acc + a_k * b_k).
blocked     MMA-Sim's bit-accurate model of CDNA3 matrix cores (Xie, Wang, Yang,
            Yang, "MMA-Sim: Bit-Accurate Reference Model of Tensor Cores and Matrix
            Cores", 2025; github.com/microsoft/MMA-Sim, `simulator/amd.py` and
            `amd_fused_dot_add` in `simulator/functions.py`), validated there
            bit for bit on MI300X: k in groups of 8 (16-bit inputs) or 16 (8-bit
            inputs); in a group the products are aligned to the largest product
            exponent and truncated toward zero 24 fraction bits below it, then
            summed (8-bit inputs: the even and the odd k separately, each pair
            floored to their common exponent); the group sum is floored 31 and the
            accumulator 24 fraction bits below their common exponent (toward -inf:
            the model's asymmetry), added and rounded to f32 (nearest even) to
            become the accumulator. No one we could read has measured CDNA4: the
            CDNA3 model stands in for gfx950, scaled products included.
"""

from __future__ import annotations

import numpy as np

MODES = ("exact", "sequential", "blocked")
FRACTION_BITS = 24  # of an aligned product in MMA-Sim's CDNA3 model
SUM_BITS, ACCUMULATOR_BITS = 31, 24  # where the group sum and C are floored
ZERO_EXPONENT = -(1 << 14)  # a zero's exponent: below every other


def accumulate(mode: str, a: np.ndarray, b: np.ndarray, c: np.ndarray, a_min_exponent,
               b_min_exponent, eight_bit: bool) -> np.ndarray:
    """D = A·Bᵀ + C in f32 under `mode`. a: [m, K], b: [n, K] exact element values
    (scales applied) in k order, float64; c: [m, n] f32. The min exponents (of the
    element formats, scales added; scalars or arrays like a / b) place subnormal
    elements as MMA-Sim does."""
    if mode == "exact":
        return (a @ b.T + c).astype(np.float32)
    products = a[:, None, :] * b[None, :, :]  # [m, n, K], exact
    if mode == "sequential":
        acc = np.asarray(c, np.float32)
        for k in range(products.shape[-1]):
            acc = (acc + products[..., k]).astype(np.float32)  # exact product, one rounding
        return acc
    if mode != "blocked":
        raise ValueError(f"mfma_accumulate: expected one of {MODES}, got {mode!r}")
    exact = (a @ b.T + c).astype(np.float32)
    exponents = (_exponents(a, a_min_exponent)[:, None, :] + _exponents(b, b_min_exponent)[None, :, :])
    group = min(16 if eight_bit else 8, products.shape[-1])
    acc = np.asarray(c, np.float64)
    for start in range(0, products.shape[-1], group):
        p, e = products[..., start:start + group], exponents[..., start:start + group]
        if eight_bit:
            total, top = _two_halves(p, e)
        else:
            total, top = _aligned_sum(p, e)
        acc = _add_accumulator(total, top, acc, eight_bit)
    return np.where(np.isfinite(exact), acc.astype(np.float32), exact)


def _exponents(x: np.ndarray, min_exponent) -> np.ndarray:
    """floor(log2 |x|), at least the format's min exponent (subnormals); zeros lowest."""
    _, e = np.frexp(x)
    return np.where(x == 0, ZERO_EXPONENT, np.maximum(e - 1, min_exponent)).astype(np.int64)


def _aligned_sum(p, e):
    """Σ p truncated toward zero FRACTION_BITS below the largest exponent, and that exponent."""
    top = e.max(axis=-1)
    units = np.trunc(np.ldexp(p, FRACTION_BITS - top[..., None]))
    return np.ldexp(units.sum(axis=-1), top - FRACTION_BITS), top


def _two_halves(p, e):
    """8-bit inputs: even and odd k summed apart, each floored to their common exponent."""
    (even, e0), (odd, e1) = _aligned_sum(p[..., 0::2], e[..., 0::2]), _aligned_sum(p[..., 1::2], e[..., 1::2])
    top = np.maximum(e0, e1)
    units = (np.floor(np.ldexp(even, FRACTION_BITS - top)) + np.floor(np.ldexp(odd, FRACTION_BITS - top)))
    return np.ldexp(units, top - FRACTION_BITS), top


def _add_accumulator(total, top, acc, eight_bit):
    e_acc = _exponents(acc, -126)
    common = np.maximum(top, e_acc)
    s = np.ldexp(np.floor(np.ldexp(total, SUM_BITS - common)), common - SUM_BITS)
    kept = np.ldexp(np.floor(np.ldexp(acc, ACCUMULATOR_BITS - common)), common - ACCUMULATOR_BITS)
    if eight_bit:  # an accumulator far below the products is dropped
        kept = np.where(e_acc >= common - 25, kept, 0.0)
    return (s + kept).astype(np.float32).astype(np.float64)
