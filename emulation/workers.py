"""Workers on an emulated network: ``bml-host push`` on several servers at once, and the check
of a result against the quantiser's stated error bound. Used by the demo, the tests and the
benchmarks, so they all push and judge the same way."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bml.paths import REPO_ROOT
from bml.schedule import HOST_BASED
from control_plane.fabric import Fabric
from control_plane.status import read_counters


@dataclass(frozen=True)
class Push:
    """One worker's push: on ``server``, as ``rank``, through ``interface`` (None: every NIC
    of the server, the job's schedule). A ``None`` gradient writes no input file (to see the
    error for a missing one)."""

    server: int
    rank: int
    gradient: np.ndarray | None
    interface: str | None = "eth0"


@dataclass(frozen=True)
class PushResult:
    returncode: int
    stdout: str
    stderr: str
    output: Path  # where the sum was to be written

    def figure(self, name: str) -> str:
        """One ``name=value`` figure of bml-host's closing line."""
        return self.stdout.split(f"{name}=")[1].split()[0]

    def nic_bytes(self) -> list[tuple[int, int]]:
        """(sent, received) bytes of each NIC during the push, from its counters."""
        return [tuple(int(x) for x in nic.split(":")[1].split("/"))
                for nic in self.figure("nic_bytes").split(",")]


def run_pushes(state, job: int, pushes: list[Push], workdir: Path, world: int | None = None,
               extra: list[str] | None = None, timeout: float = 120.0) -> list[PushResult]:
    """Start every push at once, wait for all (bounded by ``timeout`` in all: a push still
    running then is killed and reported as failed)."""
    return wait_pushes(start_pushes(state, job, pushes, workdir, world, extra), timeout)


def start_pushes(state, job: int, pushes: list[Push], workdir: Path, world: int | None = None,
                 extra: list[str] | None = None) -> list[tuple[Path, subprocess.Popen]]:
    """Start every push at once: (output file, process) of each, for ``wait_pushes`` (a fault
    test may stop or kill some of the processes, by their PIDs, in between)."""
    processes = []
    for push in pushes:
        nics = push.interface or "all"
        source = workdir / f"grad-j{job}-h{push.server}-{nics}.npy"
        output = workdir / f"sum-j{job}-h{push.server}-{nics}.npy"
        output.unlink(missing_ok=True)
        if push.gradient is not None:
            np.save(source, push.gradient)
        command = ["ip", "netns", "exec", state.namespace_of(push.server), sys.executable,
                   "-m", "hosts.cli", "push", "--in", str(source), "--out", str(output),
                   "--job", str(job), "--rank", str(push.rank),
                   "--world", str(world or len(pushes)),
                   *(["--interface", push.interface] if push.interface else
                     ["--fabric", str(state.run_dir / "fabric.json")]),
                   *(extra or [])]
        processes.append((output, subprocess.Popen(command, stdout=subprocess.PIPE,
                                                   stderr=subprocess.PIPE, text=True,
                                                   cwd=REPO_ROOT)))
    return processes


def wait_pushes(processes: list[tuple[Path, subprocess.Popen]],
                timeout: float = 120.0) -> list[PushResult]:
    """Wait for pushes ``start_pushes`` started (a push still running after ``timeout`` in all
    is killed and reported as failed)."""
    results = []
    deadline = time.monotonic() + timeout
    for output, process in processes:
        try:
            stdout, stderr = process.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            stdout, stderr = process.communicate()
            stderr += f"\n(killed: still running after {timeout:g} s)"
        results.append(PushResult(process.returncode, stdout, stderr, output))
    return results


def switch_total(state, stat: str = "aggregated") -> int:
    """One stat of ``bml.protocol.Stat`` summed over the emulation's switches (read over
    P4Runtime): ``aggregated``, the contributions added; ``forwarded``, the packets routed
    host to host (the host-based schedule's streams)."""
    switches = Fabric.load(state.run_dir / "fabric.json").addresses()
    return sum(read_counters(name, address, device_id)[stat]
               for name, (address, device_id) in switches.items())


def progress_stat(schedule: str) -> str:
    """The switch stat a push's progress shows in: the contributions the switches add, or
    where they add none (host-based) the packets they route."""
    return "forwarded" if schedule == HOST_BASED else "aggregated"


def wait_for_progress(state, amount: int, timeout: float = 60.0,
                      running: list[tuple[Path, subprocess.Popen]] | None = None,
                      stat: str = "aggregated") -> None:
    """Until the switches' ``stat`` has grown by ``amount`` (a push is under way): where a
    fault test or benchmark injects its fault. ``running`` (from ``start_pushes``): if one of
    them ends first, or the time is up, they are stopped and the error says what they said."""
    start = switch_total(state, stat)
    deadline = time.monotonic() + timeout
    while switch_total(state, stat) - start < amount:
        ended = any(process.poll() is not None for _output, process in running or ())
        if ended or time.monotonic() > deadline:
            said = "".join(f"\n  push {i}: exit {r.returncode}: {r.stderr.strip()[-400:]}"
                           for i, r in enumerate(wait_pushes(running, 5.0) if running else ()))
            why = "a push ended" if ended else f"no progress within {timeout:g} s"
            raise RuntimeError(f"{why} before the switches' {stat} count grew by {amount}"
                               f"{said}")
        time.sleep(0.1)
