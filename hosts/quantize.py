"""Block floating point quantisation with an in-band max exponent (SwitchML's scheme).

A block is the values of one packet (its lanes: ``bml.protocol.Wire``). Each worker
announces its block exponent e_w (the smallest e with |x| < 2**e for every x of the block);
the switch keeps the maximum e over the N workers. Every worker then sends

    q = rint(x * 2**s),   s = 30 - ceil(log2 N) - e

so |x * 2**s| < 2**(30 - ceil(log2 N)), hence |q| <= 2**(30 - ceil(log2 N)) and the switch's
int32 sum of N such values is at most N * 2**(30 - ceil(log2 N)) <= 2**30: it cannot overflow,
by construction, whatever the data. The sum is returned as sum * 2**-s.

Error bound (per element, against the exact sum of the float32 inputs):

    |result - exact| <= N * 2**(-s-1) + 2**-24 * |result|
                      = N * 2**(e + ceil(log2 N) - 31) + 2**-24 * |result|

i.e. each worker's rounding error is at most half a quantisation step, and the result is
rounded once more to float32. Relative to the block's largest magnitude (< 2**e) the first term
is about N**2 * 2**-31 (3e-8 at N = 8). Exponents are clamped to [-126, 128]: tinier values
are quantised on the 2**-126 grid, which the bound above still covers.
"""

from __future__ import annotations

import numpy as np

from bml.protocol import (
    DEFAULT_LANES,
    EXPONENT_BIAS,
    EXPONENT_NONE,
    MAX_EXPONENT,
    MIN_EXPONENT,
)


class GradientError(ValueError):
    """The gradient cannot be sent as it is (NaN, Inf, wrong shape or type)."""


def check_gradient(array: np.ndarray) -> np.ndarray:
    """The gradient as float32, or a GradientError for what cannot be sent (not numeric,
    empty, NaN or Inf), before anything is sent."""
    values = np.asarray(array)
    if values.dtype.kind not in "fiu":
        raise GradientError(f"gradient must be numeric, not {values.dtype}")
    if values.size == 0:
        raise GradientError("gradient is empty: nothing to sum")
    values = values.astype(np.float32, copy=False)
    check_finite(values)
    return values


def check_out(out: np.ndarray | None, size: int) -> np.ndarray | None:
    """``out``'s values as a flat view, or a GradientError (before anything is sent) if it
    cannot take a sum of ``size`` float32 values in place."""
    if out is None:
        return None
    if not isinstance(out, np.ndarray):
        raise GradientError(f"out must be a numpy array, not {type(out).__name__}")
    if out.dtype != np.float32 or out.size != size or not out.flags.c_contiguous \
            or not out.flags.writeable:
        raise GradientError(
            f"out must be a writable C-contiguous float32 array of the gradient's {size} "
            f"values; got {out.dtype} of {out.size} values"
            f"{'' if out.flags.c_contiguous else ', not contiguous'}"
            f"{'' if out.flags.writeable else ', read-only'}")
    return out.reshape(-1)


def check_finite(values: np.ndarray) -> None:
    """Refuse NaN and Inf before anything is sent. (NaN and Inf carry into the max or the
    min: two reading passes, where a mask would be a new array of the gradient's size.)"""
    if values.size == 0 or (np.isfinite(values.max()) and np.isfinite(values.min())):
        return
    bad = ~np.isfinite(values)
    if bad.any():
        nan = int(np.isnan(values).sum())
        inf = int(bad.sum()) - nan
        first = int(np.flatnonzero(bad)[0])
        raise GradientError(f"gradient has {nan} NaN and {inf} Inf values (first at flat index "
                            f"{first}); refusing to send it")


def ceil_log2(n: int) -> int:
    return max(0, (n - 1).bit_length())


def block_exponents(blocks: np.ndarray) -> np.ndarray:
    """Biased exponent of each row of ``blocks`` (EXPONENT_NONE for an all-zero row)."""
    # max |x| as the larger of max x and -min x: two passes, no array as large as ``blocks``
    peak = np.maximum(blocks.max(axis=1), -blocks.min(axis=1)).astype(np.float64)
    _, exponent = np.frexp(peak)  # peak = m * 2**exponent, 0.5 <= m < 1, so peak < 2**exponent
    exponent = np.clip(exponent, MIN_EXPONENT, MAX_EXPONENT) + EXPONENT_BIAS
    return np.where(peak > 0, exponent, EXPONENT_NONE).astype(np.int64)


def shift(biased_exponent: int | np.ndarray, num_workers: int) -> np.ndarray:
    """The power of two s that scales a block whose max exponent is ``biased_exponent``."""
    e = np.asarray(biased_exponent, dtype=np.int64) - EXPONENT_BIAS
    s = 30 - ceil_log2(num_workers) - e
    return np.where(np.asarray(biased_exponent) == EXPONENT_NONE, 0, s)


def quantize(block: np.ndarray, biased_exponent: int, num_workers: int) -> np.ndarray:
    """int32 values of one block (or rows of blocks) scaled for the announced max exponent."""
    scaled = np.ldexp(block.astype(np.float64), shift(biased_exponent, num_workers))
    return np.rint(scaled).astype(np.int32)


_WIRE_INT32 = np.dtype(">i4")
# The largest shift whose power of two, and every |x * 2**s| >= 0.5 it yields, float32 holds
# exactly: up to here quantising and dequantising run in float32, bit for bit as in float64.
FLOAT32_SHIFT = 126
# The largest scaling up (2**-s) that no int32 sum can overflow float32 at: |sum| <= 2**31,
# and 2**31 * 2**96 = 2**127 is below float32's max.
OVERFLOW_SHIFT = 96


def quantize_blocks(blocks: np.ndarray, biased_exponents: np.ndarray, num_workers: int,
                    out: np.ndarray | None = None, work: np.ndarray | None = None
                    ) -> np.ndarray:
    """``quantize`` of every row of float32 ``blocks`` at once (row i at exponent i), into
    ``out`` (int32, of the blocks' shape) if given; ``work``, float32 of that shape, holds the
    scaled values meanwhile (it may be ``blocks`` itself, which then ends up overwritten).

    In float32: x * 2**s is exact for every product of magnitude >= 0.5 (a power-of-two
    scaling of a normal float32 into the normal range), and smaller ones round to 0 either
    way, so this equals the float64 route bit for bit at a tenth of its cost. Rows of blocks
    so tiny that 2**s is beyond float32 (s > FLOAT32_SHIFT) take the float64 route."""
    s = shift(biased_exponents, num_workers)
    narrow = s <= FLOAT32_SHIFT
    rows = wide = None
    if not narrow.all():  # before ``work`` may overwrite the blocks
        rows = ~narrow
        wide = np.rint(np.ldexp(blocks[rows].astype(np.float64), s[rows][:, None])).astype(
            np.int32)
    scaled = np.multiply(blocks, np.ldexp(np.float32(1), np.where(narrow, s, 0).astype(
        np.int32))[:, None], out=work, dtype=np.float32)
    np.rint(scaled, out=scaled)
    if out is None:
        out = scaled.astype(np.int32)
    else:
        np.copyto(out, scaled, casting="unsafe")
    if rows is not None:
        out[rows] = wide
    return out


def quantize_to_wire(block: np.ndarray, biased_exponent: int, num_workers: int) -> bytes:
    """The hot path's ``quantize`` of one block, as big-endian int32 packet bytes.

    Scaling by 2**s is exact (see ``quantize_blocks``): in the block's own dtype (float32
    while s <= FLOAT32_SHIFT, else float64), so this equals ``quantize`` bit for bit at a
    fraction of its cost."""
    s = 0 if biased_exponent == EXPONENT_NONE else (
        30 - ceil_log2(num_workers) - (biased_exponent - EXPONENT_BIAS))
    if s > FLOAT32_SHIFT:
        block = block.astype(np.float64)
    return np.rint(block * block.dtype.type(2.0 ** s)).astype(_WIRE_INT32).tobytes()


def dequantize(sums: np.ndarray, biased_exponents: np.ndarray, num_workers: int,
               out: np.ndarray | None = None) -> np.ndarray:
    """float32 sums of rows of int32 sums, each row with its max exponent, into ``out``
    (float32, of the sums' shape) if given.

    In float32 where that is exact: int32 -> float32 rounds once, and scaling by 2**-s then
    is exact while every result stays a normal float32 (s <= FLOAT32_SHIFT), so this is the
    float64 route's single rounding bit for bit at a tenth of its cost; rows of tinier blocks
    take the float64 route. Raises GradientError where the true sum is beyond float32 (an
    Inf would be a wrong sum), before it writes anything: only rows scaled up by more than
    OVERFLOW_SHIFT can be, so only those are computed twice."""
    s = shift(biased_exponents, num_workers)
    narrow = s <= FLOAT32_SHIFT
    scale = np.ldexp(np.float32(1), np.where(narrow, -s, 0).astype(np.int32))[:, None]
    risky = s < -OVERFLOW_SHIFT
    if risky.any():
        with np.errstate(over="ignore"):
            if not np.isfinite(np.multiply(sums[risky], scale[risky], dtype=np.float32)).all():
                peak = float(np.max(np.abs(np.ldexp(sums[risky].astype(np.float64),
                                                    -s[risky][:, None]))))
                raise GradientError(
                    f"the sum reaches {peak:.3g}, beyond float32's range "
                    f"({np.finfo(np.float32).max:.3g}); scale the gradients down")
    # one pass: each int32 rounded to float32 (as astype would), then scaled exactly
    out = np.multiply(sums, scale, out=out, dtype=np.float32)
    if not narrow.all():
        rows = ~narrow
        out[rows] = np.ldexp(sums[rows].astype(np.float64), -s[rows][:, None])
    return out


def dequantize_flat(sums: np.ndarray, biased_exponents: np.ndarray, num_workers: int,
                    length: int, out: np.ndarray | None = None) -> np.ndarray:
    """The first ``length`` values of ``dequantize``'s rows, flat: in ``out`` (float32,
    C-contiguous, ``length`` values) if given, else in a new array (a view of whole rows).
    A refused sum leaves ``out`` as it was: it may be the caller's gradient itself (an
    in-place allreduce)."""
    if out is None:
        return dequantize(sums, biased_exponents, num_workers).reshape(-1)[:length]
    lanes = sums.shape[1]
    full = length // lanes
    rest = length - full * lanes
    tail = dequantize(sums[full:full + 1], biased_exponents[full:full + 1], num_workers) \
        if rest else None  # (first: it may be the one refused)
    dequantize(sums[:full], biased_exponents[:full], num_workers,
               out=out[:full * lanes].reshape(full, lanes))
    if tail is not None:
        out[full * lanes:] = tail.reshape(-1)[:rest]
    return out


def error_bound(biased_exponents: np.ndarray, num_workers: int,
                result: np.ndarray) -> np.ndarray:
    """The stated per-element bound for rows of results (see the module docstring)."""
    s = shift(biased_exponents, num_workers).astype(np.float64)
    quantisation = num_workers * np.ldexp(1.0, (-s - 1).astype(np.int64))
    quantisation = np.where(np.asarray(biased_exponents) == EXPONENT_NONE, 0.0, quantisation)
    return quantisation[:, None] + 2.0 ** -24 * np.abs(result.astype(np.float64))


class ExpectedSum:
    """The float64 sum of ``grads`` and the exponents of its stated bound, computed once for
    checking many results against it (every worker's: per result it would be N x N sums)."""

    def __init__(self, grads: list[np.ndarray], lanes: int = DEFAULT_LANES) -> None:
        self.workers, self.lanes = len(grads), lanes
        self.shape = grads[0].shape
        self.exact = np.sum([g.astype(np.float64) for g in grads], axis=0)
        self.padded = -(-self.exact.size // lanes) * lanes
        self.exponents = np.max(
            [block_exponents(np.pad(g, (0, self.padded - g.size)).reshape(-1, lanes))
             for g in grads], axis=0)

    def check(self, result: np.ndarray) -> tuple[float, float, bool]:
        """(max error, largest allowed error, every element within its bound)."""
        exact, lanes = self.exact, self.lanes
        res = np.pad(result.astype(np.float64), (0, self.padded - result.size))
        bound = error_bound(self.exponents, self.workers,
                            res.reshape(-1, lanes)).reshape(-1)[:exact.size]
        error = np.abs(result.astype(np.float64) - exact)
        return float(error.max()), float(bound.max()), bool(np.all(error <= bound))


def check_sum(result: np.ndarray, grads: list[np.ndarray],
              lanes: int = DEFAULT_LANES) -> tuple[float, float, bool]:
    """(max error, largest allowed error, every element within its bound) of one result
    against the float64 sum of ``grads``, with the bound ``hosts.quantize`` states for blocks
    of ``lanes`` values (the width the sum was taken at)."""
    return ExpectedSum(grads, lanes).check(result)
