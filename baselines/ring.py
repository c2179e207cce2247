"""Ring allreduce baseline: torch.distributed's gloo ``all_reduce`` on one NIC.

gloo sums CPU tensors with a ring (reduce-scatter, then all-gather), 2 (N-1)/N of the
gradient each way per NIC, over TCP; the switches between the workers only forward. torch is
optional (``pip install -e .[torch]``); importing this module does not need it.

    python -m baselines.ring run --rank R --world N --master 10.1.0.1 --in grad.npy --out sum.npy
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
from pathlib import Path

import numpy as np

from hosts.discovery import nic_counters

RING_TCP_PORT = 29500


def have_torch() -> bool:
    """Whether torch.distributed can be imported here."""
    try:
        import torch.distributed  # noqa: F401
    except ImportError:
        return False
    return True


class GlooRing:
    """A gloo process group of ``world`` workers on ``interface``; keep it for many calls."""

    def __init__(self, rank: int, world: int, master: str, interface: str = "eth0",
                 port: int = RING_TCP_PORT, timeout: float = 120.0) -> None:
        os.environ["GLOO_SOCKET_IFNAME"] = interface
        import torch
        import torch.distributed as dist

        self._torch, self._dist = torch, dist
        dist.init_process_group("gloo", init_method=f"tcp://{master}:{port}", rank=rank,
                                world_size=world,
                                timeout=datetime.timedelta(seconds=timeout))
        torch.set_num_threads(1)

    def allreduce(self, gradient: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """The sum of ``gradient`` over the group: gloo sums in place, so in a copy of it,
        which is ``out`` (float32, of its size) if given, else a new array."""
        if out is None:
            out = np.array(gradient, dtype=np.float32, copy=True)
        else:
            np.copyto(out, gradient.reshape(out.shape), casting="same_kind")
        self._dist.all_reduce(self._torch.from_numpy(out))
        return out

    def barrier(self) -> None:
        self._dist.barrier()

    def close(self) -> None:
        self._dist.destroy_process_group()

    def __enter__(self) -> GlooRing:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m baselines.ring",
                                     description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="one worker of a gloo ring allreduce")
    run.add_argument("--rank", type=int, required=True)
    run.add_argument("--world", type=int, required=True)
    run.add_argument("--master", required=True, help="rank 0's address")
    run.add_argument("--interface", default="eth0")
    run.add_argument("--in", dest="input", type=Path, required=True)
    run.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if not have_torch():
        print("ring: error: torch is not installed (pip install -e .[torch])", file=sys.stderr)
        return 2
    grad = np.load(args.input)
    with GlooRing(args.rank, args.world, args.master, args.interface) as ring:
        ring.allreduce(np.ones(1024, np.float32))  # warm-up, and a barrier
        ring.barrier()
        before = nic_counters([args.interface])[0]
        started = time.monotonic()
        total = ring.allreduce(grad)
        seconds = time.monotonic() - started
        after = nic_counters([args.interface])[0]
    np.save(args.out, total.reshape(grad.shape))
    print(f"ring: rank={args.rank} elements={grad.size} seconds={seconds:.3f} "
          f"goodput={32 * grad.size / max(seconds, 1e-9) / 1e6:.1f}Mbit/s "
          f"nic_bytes={args.interface}:{after[0] - before[0]}/{after[1] - before[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
