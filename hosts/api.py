"""The Python API: ``allreduce(array, ...)`` sums an array over a job's workers in the switch."""

from __future__ import annotations

import re
import subprocess

import numpy as np

from hosts.quantize import GradientError, check_finite
from hosts.transport import AggregationTransport, Stats, TransportError

__all__ = ["GradientError", "TransportError", "Worker", "allreduce", "interface_addresses"]


def interface_addresses(interface: str) -> tuple[str, str]:
    """(own IPv4 address, switch address) of an interface in this namespace.

    The switch is the permanent neighbour whose address is x.y.255.z, as bml-net installs it.
    """
    addr = subprocess.run(["ip", "-o", "-4", "addr", "show", "dev", interface],
                          capture_output=True, text=True, check=False)
    match = re.search(r"inet (\d+\.\d+\.\d+\.\d+)/", addr.stdout)
    if not match:
        raise TransportError(f"interface {interface!r} has no IPv4 address here "
                             f"({addr.stderr.strip() or 'no inet line'})")
    neigh = subprocess.run(["ip", "-4", "neigh", "show", "dev", interface], capture_output=True,
                           text=True, check=False)
    switches = re.findall(r"^(\d+\.\d+\.255\.\d+) ", neigh.stdout, re.M)
    if len(switches) != 1:
        raise TransportError(f"cannot tell the switch behind {interface}: expected one "
                             f"x.y.255.z neighbour, found {switches or 'none'}; pass --switch")
    return match.group(1), switches[0]


class Worker:
    """A worker of one job on one switch; keep it to run many allreduce calls."""

    def __init__(self, job: int, rank: int, world: int, interface: str = "eth0",
                 switch: str | None = None, local_ip: str | None = None, window: int = 256,
                 timeout: float = 60.0, start_timeout: float = 10.0) -> None:
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} is not in 0..{world - 1}")
        if local_ip is None or switch is None:
            own, behind = interface_addresses(interface)
            local_ip = local_ip or own
            switch = switch or behind
        self.transport = AggregationTransport(job, rank, world, local_ip, switch, window,
                                              timeout, start_timeout)
        self.last_stats = Stats()

    def allreduce(self, array: np.ndarray, progress=None) -> np.ndarray:
        values = np.asarray(array)
        if values.dtype.kind not in "fiu":
            raise GradientError(f"gradient must be numeric, not {values.dtype}")
        values = values.astype(np.float32, copy=False)
        check_finite(values)
        result, self.last_stats = self.transport.allreduce(values, progress)
        return result.reshape(values.shape)

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def allreduce(array: np.ndarray, job: int, rank: int, world: int, interface: str = "eth0",
              switch: str | None = None, **options) -> np.ndarray:
    """Sum ``array`` over the ``world`` workers of ``job``; float32, same shape."""
    with Worker(job, rank, world, interface, switch, **options) as worker:
        return worker.allreduce(array)
