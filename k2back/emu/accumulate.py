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
    if mode == "exact":  # (over a leading axis of waves too)
        return (a @ np.swapaxes(b, -1, -2) + c).astype(np.float32)
    products = a.T[:, :, None] * b.T[:, None, :]  # [K, m, n]: k first, exact
    if mode == "sequential":
        return _sequential(products, c)
    if mode != "blocked":
        raise ValueError(f"mfma_accumulate: expected one of {MODES}, got {mode!r}")
    exact = (a @ b.T + c).astype(np.float32)
    a_min, b_min = np.asarray(a_min_exponent).T, np.asarray(b_min_exponent).T  # [K, m] as a.T
    exponents = _exponents(a.T, a_min)[:, :, None] + _exponents(b.T, b_min)[:, None, :]
    k = products.shape[0]
    group = min(16 if eight_bit else 8, k)
    shape = (k // group, group, *products.shape[1:])  # the groups' sums need no accumulator
    p, e = products.reshape(shape), exponents.reshape(shape)
    totals, tops = _two_halves(p, e) if eight_bit else _aligned_sum(p, e)
    acc = np.asarray(c, np.float64)
    for g in range(k // group):
        acc = _add_accumulator(totals[g], tops[g], acc, eight_bit)
    return np.where(np.isfinite(exact), acc.astype(np.float32), exact)


def _sequential(products: np.ndarray, c: np.ndarray) -> np.ndarray:
    """f32 running sum in k order: with products exact in f32 (as 16- and 8-bit
    ones are) each f32 add is one fused add."""
    terms = products.astype(np.float32)
    acc = np.array(c, np.float32)
    if not (terms == products).all():  # not exact in f32 (or NaN): add in f64, then round
        for term in products:
            acc = (acc + term).astype(np.float32)
        return acc
    for term in terms:
        np.add(acc, term, out=acc)
    return acc


def _exponents(x: np.ndarray, min_exponent) -> np.ndarray:
    """floor(log2 |x|), at least the format's min exponent (subnormals); zeros lowest
    (read from the float64 exponent field: every element value is a normal double)."""
    field = (np.asarray(x, np.float64).view(np.int64) >> 52) & 0x7FF
    return np.where(field == 0, ZERO_EXPONENT, np.maximum(field - 1023, min_exponent))


def _pow2(exponent: np.ndarray) -> np.ndarray:
    """2^exponent as float64 (|exponent| < 1023), built from its bits."""
    return ((exponent + 1023) << 52).view(np.float64)


def _top(exponents: np.ndarray) -> np.ndarray:
    """The largest exponent over a group (axis 1); an all-zero group's is any
    finite value (its terms are 0): -900 keeps the scalings in range."""
    return np.maximum(exponents.max(axis=1), -900)


def _aligned_sum(p, e):
    """Per group (axis 1): Σ p truncated toward zero FRACTION_BITS below the largest
    exponent, and that exponent."""
    top = _top(e)
    units = np.trunc(p * _pow2(FRACTION_BITS - top)[:, None])
    return units.sum(axis=1) * _pow2(top - FRACTION_BITS), top


def _two_halves(p, e):
    """8-bit inputs: even and odd k summed apart, each floored to their common exponent."""
    (even, e0), (odd, e1) = _aligned_sum(p[:, 0::2], e[:, 0::2]), _aligned_sum(p[:, 1::2], e[:, 1::2])
    top = np.maximum(e0, e1)
    scale = _pow2(FRACTION_BITS - top)
    return (np.floor(even * scale) + np.floor(odd * scale)) * _pow2(top - FRACTION_BITS), top


def _add_accumulator(total, top, acc, eight_bit):
    e_acc = _exponents(acc, -126)
    common = np.maximum(top, np.maximum(e_acc, -900))
    s = np.floor(total * _pow2(SUM_BITS - common)) * _pow2(common - SUM_BITS)
    kept = np.floor(acc * _pow2(ACCUMULATOR_BITS - common)) * _pow2(common - ACCUMULATOR_BITS)
    if eight_bit:  # an accumulator far below the products is dropped
        kept = np.where(e_acc >= common - 25, kept, 0.0)
    return (s + kept).astype(np.float32).astype(np.float64)
