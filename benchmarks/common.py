"""What the GST benchmarks share: sizes, the workers' gradients, and running one worker per
server namespace at once (``benchmarks/worker.py``, the same warm-up, timing and byte
counting for every scheme)."""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bml.paths import REPO_ROOT


def parse_size(text: str) -> int:
    """``256K`` -> 262144 float32 elements."""
    match = re.fullmatch(r"(\d+)([KMkm]?)", text)
    if not match:
        raise argparse.ArgumentTypeError(f"bad size {text!r}")
    return int(match.group(1)) * {"": 1, "k": 1 << 10, "m": 1 << 20}[match.group(2).lower()]


def gradient(size: int, rank: int) -> np.ndarray:
    """Worker ``rank``'s gradient: seeded, so the harness can check every worker's sum."""
    return np.random.default_rng([size, rank]).standard_normal(size).astype(np.float32)


def gradients(workers: int, size: int) -> list[np.ndarray]:
    return [gradient(size, rank) for rank in range(workers)]


def float_check(result: np.ndarray, grads: list[np.ndarray]) -> bool:
    """TCP baselines sum floats: within float32 rounding of the float64 sum."""
    exact = np.sum([g.astype(np.float64) for g in grads], axis=0)
    tolerance = 1e-6 * len(grads) * np.abs(np.stack(grads)).max(axis=0)
    return bool(np.all(np.abs(result.astype(np.float64) - exact) <= tolerance + 1e-30))


def have_torch() -> bool:
    return subprocess.run([sys.executable, "-c", "import torch.distributed"],
                          capture_output=True).returncode == 0


@dataclass
class Run:
    """One scheme's run: every participant's report, and the call's GST from them."""

    reports: list[dict]
    correct: bool
    workers: int
    nic_bytes: dict[str, list[int]] = field(default_factory=dict)

    @property
    def gst(self) -> float:
        """From the moment the last worker called the allreduce until the last one had its
        sum, as if a barrier had started them together; over repeated calls
        (``benchmarks.worker --repeat``), the median of the calls. Workers finish a call
        apart (under loss by up to a few hundred ms), and the one that starts the next call
        first would otherwise count the others' lateness as its own time. (Every namespace
        reads the one CLOCK_MONOTONIC.)"""
        workers = self.reports[:self.workers]
        if all("begun_each" in r for r in workers):
            calls = [max(b + s for b, s in each) - max(b for b, _ in each)
                     for each in zip(*(zip(r["begun_each"], r["seconds_each"], strict=True)
                                       for r in workers), strict=True)]
        else:
            calls = [max(each) for each in zip(*(r.get("seconds_each", [r["seconds"]])
                                                 for r in workers), strict=True)]
        return statistics.median(calls)

    def busiest(self) -> tuple[int, int]:
        """(most bytes one NIC sent, most bytes one NIC received) over all participants."""
        pairs = [pair for r in self.reports for pair in r["nics"].values()]
        return max(tx for tx, _ in pairs), max(rx for _, rx in pairs)

    @property
    def retransmissions(self) -> int:
        """Aggregation frames the BML workers re-sent."""
        return sum(r.get("retransmissions", 0) for r in self.reports)

    def resent(self) -> dict[str, int]:
        """The BML workers' re-sends by why the slot was overdue (hosts.stats.CallStats)."""
        totals: dict[str, int] = {}
        for report in self.reports:
            for why, count in report.get("resent", {}).items():
                totals[why] = totals.get(why, 0) + count
        return totals

    @property
    def tcp_retransmissions(self) -> int:
        """Segments TCP re-sent (host-to-host traffic: PS, ring, the BML mesh)."""
        return sum(r.get("tcp_retransmissions", 0) for r in self.reports)


def run_workers(state, scheme: str, workers: int, size: int, tmp: Path,
                extra: list[str] | None = None, participants: int | None = None,
                timeout: float = 900, check=None) -> Run:
    """``benchmarks.worker`` in the first ``participants`` (default ``workers``) server
    namespaces at once; ``check(result, grads)`` -> bool judges each worker's sum."""
    outs = [tmp / f"{scheme}-sum{rank}.npy" for rank in range(workers)]
    processes = [subprocess.Popen(
        ["ip", "netns", "exec", state.namespace_of(rank), sys.executable, "-m",
         "benchmarks.worker", scheme, str(rank), str(workers), str(size),
         str(tmp / f"{scheme}-sum{rank}.npy"), *(extra or [])],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
        for rank in range(participants or workers)]
    reports, errors = [], []
    for rank, process in enumerate(processes):
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            out, err = process.communicate()
        if process.returncode != 0:
            errors.append(f"rank {rank} ({scheme}) failed: {err[-1500:]}")
            continue
        reports.append(json.loads(out.strip().splitlines()[-1]))
    if errors:
        raise RuntimeError("\n".join(errors))
    grads = gradients(workers, size)
    correct = all(check(np.load(out), grads) for out in outs) if check else True
    return Run(reports, correct, workers)
