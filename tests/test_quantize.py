"""The quantiser's stated error bound, overflow-freedom and refusal of NaN/Inf."""

from __future__ import annotations

import numpy as np
import pytest

from bml.protocol import DEFAULT_LANES, EXPONENT_NONE
from hosts.quantize import (
    GradientError,
    block_exponents,
    check_finite,
    dequantize,
    error_bound,
    quantize,
    quantize_blocks,
    quantize_to_wire,
    shift,
)


def simulate(workers: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What the switch and hosts compute: int32 sums of quantised blocks, dequantised."""
    n = len(workers)
    blocks = [w.reshape(-1, DEFAULT_LANES) for w in workers]
    e_max = np.max([block_exponents(b) for b in blocks], axis=0)
    q = [np.stack([quantize(row, e, n) for row, e in zip(b, e_max, strict=True)])
         for b in blocks]
    wide = np.sum([x.astype(np.int64) for x in q], axis=0)
    assert np.all(np.abs(wide) <= 2 ** 30), "int32 sum would overflow"
    for x in q:
        assert x.dtype == np.int32
    result = dequantize(wide.astype(np.int32), e_max, n).reshape(-1)
    return result, e_max, wide


DATASETS = {
    "normal": lambda rng, n: rng.standard_normal(n),
    "huge": lambda rng, n: rng.standard_normal(n) * 3e38 / 256,  # sums of 32 stay in float32
    "tiny": lambda rng, n: rng.standard_normal(n) * 1e-40,
    "mixed": lambda rng, n: rng.standard_normal(n) * 10.0 ** rng.integers(-30, 30, n),
    "signs": lambda rng, n: np.where(rng.random(n) < 0.5, -1, 1) * rng.random(n),
    "zeros": lambda rng, n: np.zeros(n),
}


@pytest.mark.parametrize("workers", [2, 3, 8, 32])
@pytest.mark.parametrize("data", sorted(DATASETS))
def test_error_bound_against_float64(workers, data):
    rng = np.random.default_rng(workers * 1000 + len(data))
    length = 64 * 50
    grads = [DATASETS[data](rng, length).astype(np.float32) for _ in range(workers)]
    result, e_max, _ = simulate(grads)
    exact = np.sum([g.astype(np.float64) for g in grads], axis=0)
    rows = result.reshape(-1, DEFAULT_LANES)
    bound = error_bound(e_max, workers, rows).reshape(-1)
    error = np.abs(result.astype(np.float64) - exact)
    assert np.all(np.isfinite(result))
    assert np.all(error <= bound), f"max excess {np.max(error - bound)}"


def test_largest_float32_values_do_not_overflow():
    top = np.finfo(np.float32).max
    grads = [np.full(64, top, np.float32), np.full(64, -top, np.float32),
             np.full(64, top, np.float32)]
    result, _, _ = simulate(grads)
    assert np.allclose(result, top, rtol=1e-6)


def test_sum_beyond_float32_is_refused_not_inf():
    top = np.finfo(np.float32).max
    with pytest.raises(GradientError, match="beyond float32"):
        simulate([np.full(64, top, np.float32)] * 2)


def test_dequantize_refuses_exactly_the_sums_beyond_float32():
    """Only rows scaled up by more than OVERFLOW_SHIFT are checked for Inf: at every
    exponent the largest int32 sums give, dequantize refuses exactly where the float64
    route would be beyond float32, and writes into ``out`` where it accepts."""
    from hosts.quantize import EXPONENT_BIAS, MAX_EXPONENT, MIN_EXPONENT

    extremes = np.array([[2**31 - 1, -(2**31), 1, 0]], np.int32)
    for workers in (2, 7, 64):
        for exponent in range(MIN_EXPONENT, MAX_EXPONENT + 1):
            biased = np.array([exponent + EXPONENT_BIAS])
            wide = np.ldexp(extremes.astype(np.float64), -shift(biased, workers)[:, None])
            beyond = bool(np.any(np.abs(wide) > np.finfo(np.float32).max))
            out = np.full(extremes.shape, np.nan, np.float32)
            if beyond:
                with pytest.raises(GradientError, match="beyond float32"):
                    dequantize(extremes, biased, workers, out=out)
            else:
                assert dequantize(extremes, biased, workers, out=out) is out
                assert np.array_equal(out, wide.astype(np.float32))


@pytest.mark.parametrize("bad", [[np.nan], [np.inf], [-np.inf], [np.nan, np.inf, -np.inf]])
def test_nan_and_inf_anywhere_are_refused_with_counts(bad):
    """``check_finite`` looks at the max and the min first: a NaN or an Inf anywhere,
    alone or with the others, is still found, counted and located."""
    for at in (0, 4_999, 9_999 - len(bad)):
        values = np.random.default_rng(at).standard_normal(10_000).astype(np.float32)
        values[at:at + len(bad)] = bad
        nan = sum(np.isnan(b) for b in bad)
        with pytest.raises(GradientError, match=rf"{nan} NaN and {len(bad) - nan} Inf values "
                           rf"\(first at flat index {at}\)"):
            check_finite(values)
    check_finite(np.full(10, np.finfo(np.float32).max, np.float32))  # finite: no error


def test_bound_is_tight_enough_to_matter():
    rng = np.random.default_rng(1)
    grads = [rng.standard_normal(64 * 10).astype(np.float32) for _ in range(8)]
    result, e_max, _ = simulate(grads)
    bound = error_bound(e_max, 8, result.reshape(-1, 64))
    assert np.max(bound) < 1e-5  # relative to values of order 1


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_and_inf_refused(bad):
    values = np.ones(100, np.float32)
    values[17] = bad
    with pytest.raises(GradientError, match="first at flat index 17"):
        check_finite(values)


def test_wire_form_is_quantize_bit_for_bit():
    rng = np.random.default_rng(11)
    for scale in (1e-30, 1e-3, 1.0, 1e3, 1e30, 5e37):  # all finite in float32
        block = (rng.standard_normal(DEFAULT_LANES) * scale).astype(np.float32)
        block[3] = 0.0
        for workers in (1, 2, 3, 8, 32):
            own = int(block_exponents(block[None, :])[0])
            cases = [(block, own), (block, 255), (np.zeros_like(block), EXPONENT_NONE)]
            for values, exponent in cases:
                expected = quantize(values, exponent, workers).astype(">i4").tobytes()
                assert quantize_to_wire(values.astype(np.float64), exponent, workers) == expected


@pytest.mark.parametrize("data", sorted(DATASETS))
def test_float32_fast_paths_are_the_float64_route_bit_for_bit(data):
    """``quantize_blocks`` and ``dequantize`` run in float32 where that is exact, and the
    float64 route elsewhere (blocks so tiny that 2**s leaves float32): the same bits as
    quantising and dequantising each row in float64."""
    rng = np.random.default_rng(7)
    blocks = DATASETS[data](rng, 300 * DEFAULT_LANES).astype(np.float32).reshape(
        -1, DEFAULT_LANES)
    blocks[::7] *= np.float32(1e-30)  # rows near the bottom of float32's range too
    exponents = block_exponents(blocks)
    for workers in (2, 5, 32):
        fast = quantize_blocks(blocks, exponents, workers)
        slow = np.stack([quantize(row, e, workers) for row, e in zip(blocks, exponents,
                                                                     strict=True)])
        assert fast.dtype == np.int32 and np.array_equal(fast, slow)
        # Into given arrays, the scaled values kept in the blocks' own (as a call does):
        # the same bits.
        out, work = np.full(blocks.shape, 7, np.int32), blocks.copy()
        assert quantize_blocks(work, exponents, workers, out=out, work=work) is out
        assert np.array_equal(out, slow)
        sums = fast * np.int32(workers // 2)
        reference = np.ldexp(sums.astype(np.float64),
                             -shift(exponents, workers)[:, None]).astype(np.float32)
        assert np.array_equal(dequantize(sums, exponents, workers), reference)


def test_call_buffers_serve_each_shape_again_and_keep_a_few():
    """A worker's calls reuse their large arrays (``hosts.buffers``): the same array for the
    same name and shape, a new one for another shape, the last few shapes kept."""
    from hosts.buffers import SHAPES_KEPT, CallBuffers

    buffers = CallBuffers()
    first = buffers.get("sums", (4, 64), np.int32)
    assert buffers.get("sums", (4, 64), np.int32) is first
    assert buffers.get("sums", (4, 64), np.float32) is not first
    assert buffers.get("padded", (4, 64), np.int32) is not first
    first[:] = 5
    assert (buffers.get("sums", (4, 64), np.int32) == 5).all()  # as the last call left it
    for rows in range(5, 5 + SHAPES_KEPT):
        buffers.get("sums", (rows, 64), np.int32)
    assert buffers.get("sums", (4, 64), np.int32) is not first  # dropped: the oldest
