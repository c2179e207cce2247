"""The large arrays of a worker's calls, kept from one call to the next.

A call of N floats works on arrays of about N values each: the padded gradient, its
quantised blocks, the partial sums other servers send in host-based steps. Made afresh for
every call, each one's pages are faulted in again on first touch; at 4M floats, with four
workers on two cores, that cost more CPU than the quantising itself (tens of ms a call). A
worker's calls run one at a time, so one set of arrays serves them all. A call's result is
never one of them: it is the caller's to keep.

The same holds for the many smaller objects of a call (frames of 9 KB, messages, their
parts): freed, they go back to the heap, and glibc gives the top of the heap back to the
system whenever enough of it is free (128 KB by default), so the next call's objects fault
fresh pages in again (docs/RESULTS.md, "Fresh pages"). ``keep_freed_heap`` raises that
threshold for the worker's process: its heap stays at the size its calls need.
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np

SHAPES_KEPT = 4  # per name: a training step's buckets come in a few sizes
M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter
HEAP_KEPT = 256 << 20  # free bytes at the heap's top that glibc keeps instead of returning


@functools.cache
def keep_freed_heap() -> bool:
    """Have glibc keep up to ``HEAP_KEPT`` bytes of free heap top (``mallopt``) instead of
    giving them back at 128 KB; whether it took the setting (False on another libc). glibc
    then also stops raising its mapping threshold as it goes: arrays above it (128 KB by
    default) are mapped and unmapped one by one."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_TRIM_THRESHOLD, HEAP_KEPT))


class CallBuffers:
    """Arrays by name and shape, reused by every call of one worker (one at a time)."""

    def __init__(self) -> None:
        self._arrays: dict[str, list[np.ndarray]] = {}
        keep_freed_heap()

    def get(self, name: str, shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
        """An array of ``shape`` and ``dtype`` for ``name``: the one the last call of that
        shape used (its values left as they were), else a new one (values undefined). The
        last ``SHAPES_KEPT`` shapes of each name are kept."""
        kept = self._arrays.setdefault(name, [])
        dtype = np.dtype(dtype)
        for i, array in enumerate(kept):
            if array.shape == shape and array.dtype == dtype:
                kept.append(kept.pop(i))  # most recently used last
                return array
        array = np.empty(shape, dtype)
        kept.append(array)
        del kept[:-SHAPES_KEPT]
        return array
