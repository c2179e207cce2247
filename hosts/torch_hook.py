"""PyTorch DistributedDataParallel communication hook that sums gradients through BML-INA.

    from hosts.torch_hook import BmlHookState, bml_allreduce_hook
    state = BmlHookState(job=1, rank=rank, world=world, fabric=".../fabric.json")
    ddp.register_comm_hook(state, bml_allreduce_hook)
    ...
    state.close()

Each gradient bucket DDP hands the hook is summed through BML-INA, divided by the world size
and returned as a ``torch.futures.Future``. By default the hook's ``hosts.api.Worker`` uses
every NIC of the server and the job's recorded schedule (``hosts/engine.py``): on a star the
switch sums each block, on a BCube the planned schedule runs on all levels at once. Given
``interface``, it uses that NIC's switch only (a single-level job, ``hosts/transport.py``).

The allreduce runs on one background thread, so the backward pass goes on while a bucket is
in the network, and one Worker (its sockets and its TCP mesh) serves the whole run. One thread
also keeps the calls in bucket order, which is the same on every rank (DDP launches buckets in
index order), so every worker's n-th call is the same bucket.

DDP itself still needs a process group (gloo) for its set-up: the broadcast of the initial
parameters and, after step 1, of the rebuilt bucket order. Gradients never go through it.

A failed allreduce (a worker killed, a switch gone: ``TransportError``, at the latest after
the worker's timeout) fails the future, so ``loss.backward()`` raises; ``HookFailed`` carries
the first cause, and every later call fails at once instead of waiting out its own timeout.

Importing this module needs torch (``pip install -e '.[torch]'``).
"""

# No ``from __future__ import annotations``: DDP checks the hook's annotations as objects.
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import torch.distributed as dist

from hosts.api import Worker

__all__ = ["BmlHookState", "HookFailed", "bml_allreduce_hook"]


class HookFailed(RuntimeError):
    """Gradient synchronisation through BML-INA failed; training cannot go on."""


class BmlHookState:
    """The hook's state: one BML-INA worker and one thread for the whole run, plus figures
    (calls, elements, seconds in allreduce, retransmissions) that the training example
    reports.

    ``interface`` None: every NIC, the job's schedule (read from ``fabric``, the control
    plane's file, when given; ``schedule`` overrides it); ``rank`` and ``world`` must then be
    the server's number and the topology's server count. ``timeout`` bounds every call and,
    unless ``start_timeout`` says otherwise, the set-up of the worker's connections too."""

    def __init__(self, job: int, rank: int, world: int, interface: str | None = None,
                 fabric: str | None = None, schedule: str | None = None,
                 timeout: float = 30.0, start_timeout: float | None = None,
                 worker: Worker | None = None) -> None:
        self.job, self.rank, self.world = job, rank, world
        self.timeout = timeout
        if worker is None:
            start = start_timeout or timeout
            if interface is not None:
                worker = Worker(job, rank, world, interface=interface, timeout=timeout,
                                start_timeout=start)
            else:
                worker = Worker(job, rank, world, timeout=timeout, start_timeout=start,
                                schedule=schedule, fabric=fabric)
        self.worker = worker
        self.executor = ThreadPoolExecutor(1, thread_name_prefix=f"bml-hook-r{rank}")
        self.lock = threading.Lock()
        self.error: BaseException | None = None
        self.calls = 0
        self.elements = 0
        self.seconds = 0.0
        self.retransmissions = 0

    @property
    def schedule_name(self) -> str:
        return self.worker.schedule_name

    def allreduce_mean(self, flat: np.ndarray) -> np.ndarray:
        """Sum over the ranks through BML-INA, divided by the world size (float32), in
        ``flat`` itself (the hook's own copy of the bucket): no new array per bucket."""
        if self.error is not None:
            raise HookFailed(f"rank {self.rank}: an earlier gradient allreduce failed: "
                             f"{self.error}") from self.error
        started = time.monotonic()
        try:
            total = self.worker.allreduce(flat, out=flat)
        except Exception as exc:
            self.error = exc
            raise HookFailed(f"rank {self.rank}: gradient allreduce through BML-INA (job "
                             f"{self.job}, {self.world} workers) failed: {exc}") from exc
        with self.lock:
            self.calls += 1
            self.elements += flat.size
            self.seconds += time.monotonic() - started
            self.retransmissions += self.worker.last_stats.retransmissions
        # An elastic job that lost a worker sums over fewer: the mean is over those.
        total /= np.float32(self.worker.workers or self.world)
        return total

    def close(self) -> None:
        """Stop the thread (dropping calls not started) and release the worker's sockets."""
        self.executor.shutdown(wait=True, cancel_futures=True)
        self.worker.close()


def bml_allreduce_hook(state: BmlHookState,
                       bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: the bucket's mean over all ranks, summed through BML-INA."""
    buffer = bucket.buffer()
    # A copy: DDP may reuse the bucket's memory once the hook has returned.
    flat = buffer.detach().to("cpu", torch.float32).numpy().copy()
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()

    def run() -> None:
        try:
            mean = state.allreduce_mean(flat)
            future.set_result(torch.from_numpy(mean).to(buffer.device, buffer.dtype))
        except BaseException as exc:  # the training thread must see every failure
            if state.error is None:
                state.error = exc
            future.set_exception(exc)

    state.executor.submit(run)
    return future
