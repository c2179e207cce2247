"""A port's batch of frames on its way through the pipeline, and the copies it leaves, kept as
numpy rows where they lie: the software target's batched hot path (``Pipeline.process_batch``)
makes no Python object per frame in and none per copy out of the runs it takes as numpy.

Frames in (``FrameBatch``) are rows of the port's receive ring (``bml.sockets.BatchReceiver``);
the RESULT copies a run completes (``ResultBlock``) are rows of one array, sent from there
(``bml.sockets.BatchSender.send_rows``). Anything taken frame by frame goes as bytes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from soft_target.parser import HEADER_END, HEADERS


class FrameBatch:
    """Frames as rows: frame ``i`` is ``rows[i, :lengths[i]]``; past its length a row holds
    whatever it held (a receive ring's row: an earlier, longer frame), never read."""

    __slots__ = ("_bytes", "_sizes", "lengths", "rows")

    def __init__(self, rows: np.ndarray, lengths: np.ndarray) -> None:
        if rows.shape[1] < HEADER_END:
            raise ValueError(f"rows of {rows.shape[1]} bytes cannot hold a BML header")
        if not rows.flags.c_contiguous:
            raise ValueError("a batch's rows must lie one after the other")
        self.rows, self.lengths = rows, lengths
        self._bytes: memoryview | None = None  # the rows as one run of bytes (``frame``)
        self._sizes: list[int] = []

    @classmethod
    def of(cls, frames: Sequence[bytes]) -> FrameBatch:
        """``frames`` (bytes-like) copied into rows of their own."""
        lengths = np.fromiter(map(len, frames), np.int64, len(frames))
        rows = np.zeros((len(frames), max(HEADER_END, int(lengths.max(initial=0)))), np.uint8)
        for row, frame, length in zip(rows, frames, lengths.tolist(), strict=True):
            row[:length] = np.frombuffer(frame, np.uint8)
        return cls(rows, lengths)

    def __len__(self) -> int:
        return len(self.lengths)

    def frame(self, index: int) -> bytes:
        """Frame ``index``'s bytes, for what takes it frame by frame."""
        if self._bytes is None:
            self._bytes = memoryview(self.rows).cast("B")
            self._sizes = self.lengths.tolist()
        start = index * self.rows.shape[1]
        return bytes(self._bytes[start:start + self._sizes[index]])

    def headers(self) -> np.ndarray:
        """Every frame's first HEADER_END bytes as one ``parser.HEADERS`` record (a frame
        shorter than that reads as zeros there: no BML packet)."""
        raw = np.array(self.rows[:, :HEADER_END])
        short = self.lengths < HEADER_END
        if short.any():
            raw[short] = 0
        return raw.view(HEADERS).reshape(len(raw))


@dataclass(frozen=True)
class ResultBlock:
    """The copies of many RESULTs to the same ports: ``frames[i, j]`` is trigger i's copy to
    ``ports[j]``, a whole frame."""

    ports: tuple[int, ...]
    frames: np.ndarray  # (triggers, ports, frame bytes) uint8

    def copies(self, trigger: int) -> list[tuple[int, bytes]]:
        """Trigger ``trigger``'s copies as (egress port, frame), in port order."""
        return [(port, self.frames[trigger, j].tobytes()) for j, port in enumerate(self.ports)]


class Copies:
    """What a batch leaves, in the order ``Pipeline.process`` of its frames one by one would
    leave it: single copies as (egress port, bytes), and runs of a ``ResultBlock``'s triggers
    kept as its rows. Iterating gives every copy as (egress port, bytes); ``by_port`` gives
    each port's, in order, as the sender takes them."""

    __slots__ = ("_items",)

    def __init__(self, copies: list[tuple[int, bytes]] | None = None) -> None:
        # (port, bytes), or [block, first trigger, end trigger]: a run of a block's rows
        self._items: list = [] if copies is None else copies

    def extend(self, copies: list[tuple[int, bytes]]) -> None:
        self._items += copies

    def add_results(self, block: ResultBlock, first: int, end: int) -> None:
        """The copies of ``block``'s triggers ``first..end-1``: joined to the run before them
        where they follow it."""
        items = self._items
        if items:
            last = items[-1]
            if type(last) is list and last[0] is block and last[2] == first:
                last[2] = end
                return
        items.append([block, first, end])

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        for item in self._items:
            if type(item) is tuple:
                yield item
            else:
                block, first, end = item
                for trigger in range(first, end):
                    yield from block.copies(trigger)

    def by_port(self) -> dict[int, list[list[bytes] | np.ndarray]]:
        """Each egress port's copies in order, as runs: a list of bytes, or a 2-D array whose
        rows are frames (a block's run to that port)."""
        out: dict[int, list[list[bytes] | np.ndarray]] = {}
        for item in self._items:
            if type(item) is tuple:
                port, frame = item
                runs = out.setdefault(port, [])
                if runs and type(runs[-1]) is list:
                    runs[-1].append(frame)
                else:
                    runs.append([frame])
            else:
                block, first, end = item
                for j, port in enumerate(block.ports):
                    out.setdefault(port, []).append(block.frames[first:end, j])
        return out
