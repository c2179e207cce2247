"""One benchmark worker, the same for every scheme: set up, warm up, time one allreduce.

Every scheme runs alike in each server's namespace: connect (switch channels, TCP mesh, PS
connections or a gloo group), a small warm-up allreduce that also waits for every worker (a
barrier), then the timed allreduce of the gradient; the worker reports its seconds and the
bytes each of its NICs sent and received during the timed call (sysfs counters), as JSON.

    python -m benchmarks.worker SCHEME RANK WORLD SIZE OUT [--schedule S] [--servers P]
        [--master IP]

With ``BML_PROFILE=DIR`` in the environment, the timed calls run under cProfile, dumped to
``DIR/SCHEME-rankR.prof``, timed in the process's CPU seconds: on a machine whose cores the
workers and switches share, wall time would charge a function for the time it was
preempted.

SCHEME: ``bml`` (hosts.api, every NIC, the job's or the given schedule), ``ps`` (baselines.ps,
sharded, or with ``--servers`` dedicated; ranks >= WORLD are the servers), ``ring``
(baselines.ring, gloo). The gradient of rank r is ``benchmarks.common.gradient(SIZE, r)``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.common import gradient

WARM_UP = 1024


def interfaces() -> list[str]:
    return sorted(name for name in os.listdir("/sys/class/net") if name.startswith("eth"))


def tcp_retransmissions() -> int:
    """Segments TCP re-sent in this namespace so far (/proc/net/snmp is per namespace)."""
    lines = [line.split() for line in Path("/proc/net/snmp").read_text().splitlines()
             if line.startswith("Tcp:")]
    return int(lines[1][lines[0].index("RetransSegs")])


def packet_counters(names: list[str]) -> list[tuple[int, int]]:
    """(tx, rx) packets of each interface: with the bytes, the mean frame size on the wire."""
    base = Path("/sys/class/net")
    return [tuple(int((base / name / "statistics" / f"{way}_packets").read_text())
                  for way in ("tx", "rx")) for name in names]


def main(argv: list[str] | None = None) -> int:
    from hosts.discovery import nic_counters

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("scheme", choices=["bml", "ps", "ring"])
    parser.add_argument("rank", type=int)
    parser.add_argument("world", type=int)
    parser.add_argument("size", type=int)
    parser.add_argument("out")
    parser.add_argument("--job", type=int, default=1)
    parser.add_argument("--schedule")
    parser.add_argument("--window", type=int, help="bml: slots per switch channel (bml-host's "
                        "default)")
    parser.add_argument("--timeout", type=float, default=600.0, help="bound on each call (s)")
    parser.add_argument("--servers", type=int)
    parser.add_argument("--master")
    parser.add_argument("--lanes", type=int, help="bml: values per packet (the switches' build)")
    parser.add_argument("--interface", help="bml: this one NIC and its switch (a job on one "
                        "level, hosts/transport.py)")
    parser.add_argument("--repeat", type=int, default=1, help="timed calls, one after the "
                        "other (the report has each one's seconds; CPU is per call, NIC "
                        "bytes are over all of them)")
    args = parser.parse_args(argv)
    is_worker = args.rank < args.world
    grad = gradient(args.size, args.rank) if is_worker else None
    if args.scheme == "bml":
        from hosts.api import Worker

        scheme = Worker(job=args.job, rank=args.rank, world=args.world,
                        interface=args.interface, window=args.window, timeout=args.timeout,
                        start_timeout=60,
                        schedule=args.schedule, lanes=args.lanes)
    elif args.scheme == "ps":
        from baselines.ps import ParameterServer

        scheme = ParameterServer(args.rank, args.world, args.servers, timeout=args.timeout,
                                 start_timeout=60)
    else:
        from baselines.ring import GlooRing

        scheme = GlooRing(args.rank, args.world, args.master, timeout=args.timeout)

    # The timed calls' sums go into one array that the loop keeps, as a training loop's
    # in-place allreduce does (BML writes the sum there; gloo sums a copy of the gradient
    # there): the same memory traffic for both, and no allocator in the timing.
    work = np.empty(args.size, np.float32) if is_worker else None

    def call(values: np.ndarray | None, length: int) -> np.ndarray | None:
        if args.scheme == "ps":  # a dedicated PS server has no gradient, only its length
            return scheme.allreduce(values, length)
        return scheme.allreduce(values, out=work if length == args.size else None)

    names = interfaces()
    try:
        call(np.ones(WARM_UP, np.float32) if is_worker else None, WARM_UP)
        if args.scheme == "ring":
            scheme.barrier()
        before, packets_before = nic_counters(names), packet_counters(names)
        retrans = tcp_retransmissions()
        started, cpu_started = time.monotonic(), time.process_time()
        faults_started = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        seconds_each, begun_each = [], []
        profile = os.environ.get("BML_PROFILE")  # a folder: the timed calls' cProfile there
        if profile:
            import cProfile

            profiler = cProfile.Profile(time.process_time)
            profiler.enable()
        for repetition in range(args.repeat):
            if repetition and args.scheme == "ring":
                scheme.barrier()
            begun = time.monotonic()
            begun_each.append(begun)
            total = call(grad, args.size)
            seconds_each.append(time.monotonic() - begun)
        if profile:
            profiler.disable()
            profiler.dump_stats(Path(profile) / f"{args.scheme}-rank{args.rank}.prof")
        seconds = seconds_each[0]
        cpu_seconds = (time.process_time() - cpu_started) / args.repeat
        # Fresh pages the process faulted in per call (minor faults): each costs a page
        # cleared by the kernel, a sign of memory made and dropped on the hot path.
        page_faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                       - faults_started) / args.repeat
        if hasattr(scheme, "drain"):  # PS: its last sends may still be leaving
            scheme.drain()
        after, packets_after = nic_counters(names), packet_counters(names)
        stats = {"tcp_retransmissions": tcp_retransmissions() - retrans}
        if args.scheme == "bml":
            stats |= {"retransmissions": scheme.last_stats.retransmissions,
                      "probes": getattr(scheme.last_stats, "probes", 0),
                      "pending": scheme.last_stats.pending,
                     "exponent_seconds": getattr(scheme.last_stats, "exponent_seconds", 0.0),
                     "repairs_asked": getattr(scheme.last_stats, "repairs_asked", 0),
                     "resent": getattr(scheme.last_stats, "resent", {}),
                     "last_result": getattr(scheme.last_stats, "last_result", 0.0) - started,
                     "schedule": scheme.schedule_name}
    finally:
        scheme.close()
    if total is not None:
        np.save(args.out, total)
    print(json.dumps({"rank": args.rank, "seconds": seconds, "seconds_each": seconds_each,
                      "begun_each": begun_each,
                      "cpu_seconds": cpu_seconds, "page_faults": page_faults,
                      **stats,
                      "nics": {name: [a[0] - b[0], a[1] - b[1]]
                               for name, b, a in zip(names, before, after, strict=True)},
                      "packets": {name: [a[0] - b[0], a[1] - b[1]] for name, b, a
                                  in zip(names, packets_before, packets_after, strict=True)}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
