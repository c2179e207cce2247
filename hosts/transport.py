"""One worker on one NIC: the single-level job's transport (``bml-host push --interface``).

It owns what outlives a call (the socket, the NIC's answer times and re-send budget, the
last good generation) and runs each allreduce as a ``hosts.single.SingleSwitchCall`` under
the engine's loop (``hosts/loop.py``): the same loss recovery and switch watch as the BCube
executor, on one NIC.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from bml.protocol import DEFAULT_WIRE, ONE_NIC_WINDOW, Wire
from hosts.errors import TransportError
from hosts.loop import NicSocket, drive
from hosts.recovery import NicState
from hosts.single import SingleSwitchCall
from hosts.stats import CallStats

__all__ = ["AggregationTransport", "TransportError"]


class AggregationTransport:
    """One worker's connection to one switch for one job; keep it for many calls."""

    def __init__(self, job_id: int, worker_id: int, num_workers: int, local_ip: str,
                 switch_ip: str, window: int = ONE_NIC_WINDOW, timeout: float = 60.0,
                 start_timeout: float = 10.0, wire: Wire = DEFAULT_WIRE) -> None:
        self.job_id, self.worker_id, self.num_workers = job_id, worker_id, num_workers
        self.wire = wire
        self.window, self.timeout, self.start_timeout = window, timeout, start_timeout
        self.link = NicSocket.open(0, local_ip, switch_ip, job_id)
        self.nic = NicState(0, switch_ip)
        # The last call's generation if it ended well; None: ask the switch (a fresh worker,
        # or one whose last call failed and may have left state behind).
        self.generation: int | None = None

    def close(self) -> None:
        self.link.sock.close()

    def allreduce(self, values: np.ndarray, progress: Callable[[int, int], None] | None = None,
                  out: np.ndarray | None = None) -> tuple[np.ndarray, CallStats]:
        """Sum of ``values`` (flat float32) over the job's workers (in ``out`` if given), and
        this call's stats."""
        flat = np.ascontiguousarray(values, dtype=np.float32).ravel()
        last, self.generation = self.generation, None
        call = SingleSwitchCall(self.job_id, self.worker_id, self.num_workers, self.nic, flat,
                                last, time.monotonic(), self.window, self.timeout,
                                self.start_timeout, self.wire, progress, out)
        drive(call, [self.link], {}, 0, call.who())
        if call.error is not None:
            raise call.error
        self.generation = call.generation
        return call.result, call.stats
