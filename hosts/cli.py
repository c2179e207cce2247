"""``bml-host``: push a gradient file through the switches and write the sum."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

from bml.protocol import ONE_NIC_WINDOW
from bml.schedule import AUTO, DEFAULT_WINDOW, IN_FLIGHT, SCHEDULES
from hosts.api import GradientError, TransportError, Worker
from hosts.quantize import check_gradient


def load_gradient(path: Path) -> np.ndarray:
    if not path.exists():
        raise GradientError(f"no gradient file {path}")
    try:
        return np.load(path, allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise GradientError(f"{path} is not a .npy array: {exc}") from None


class ProgressBar:
    """A one-line bar on stderr; silent when stderr is not a terminal."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        width = 30
        filled = width * done // max(total, 1)
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} chunks")
        if done == total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bml-host", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    push = commands.add_parser("push", help="allreduce a .npy gradient with the job's workers")
    push.add_argument("--in", dest="input", type=Path, required=True, help="gradient .npy")
    push.add_argument("--out", type=Path, required=True, help="where to write the sum (.npy)")
    push.add_argument("--job", type=int, required=True)
    push.add_argument("--rank", type=int, help="this worker's rank (all NICs: the server's "
                      "number, checked; one NIC: required)")
    push.add_argument("--world", type=int, help="number of workers (checked against the "
                      "topology on all NICs; required with --interface)")
    push.add_argument("--schedule", choices=[AUTO, *SCHEDULES],
                      help="all NICs: the schedule to run (default: the job's, else auto)")
    push.add_argument("--fabric", default=os.environ.get("BML_FABRIC"),
                      help="fabric file to read the job's schedule from (default $BML_FABRIC)")
    push.add_argument("--interface", help="use this one NIC and its switch only (a job set "
                      "up on one level); default: every NIC")
    push.add_argument("--switch", help="with --interface: the switch address (default: "
                      "found on the interface)")
    push.add_argument("--window", type=int, help="slots of the job's pool a stripe's first "
                      f"switch channel uses (default {DEFAULT_WINDOW}); every channel keeps at "
                      f"most {IN_FLIGHT} frames in flight, and a later step's no more slots "
                      f"than that (one NIC: default {ONE_NIC_WINDOW}, fewer of wide frames, all in "
                      "flight)")
    push.add_argument("--elastic", action="store_true", default=None,
                      help="on a star: if a worker leaves mid-push, finish with the others "
                           "(default: as the job was set up, bml-ctl job-add --elastic)")
    push.add_argument("--lanes", type=int, help="values per packet (default: the width of the "
                      "P4 build the job's switches run, as bml-ctl recorded it, else 64)")
    push.add_argument("--timeout", type=float, default=60.0, help="bound on the whole push (s)")
    push.add_argument("--start-timeout", type=float, default=10.0,
                      help="bound on the first answer, i.e. on all workers starting (s)")
    args = parser.parse_args(argv)
    try:
        gradient = check_gradient(load_gradient(args.input))
        with Worker(args.job, args.rank, args.world, args.interface, args.switch,
                    window=args.window, timeout=args.timeout,
                    start_timeout=args.start_timeout, schedule=args.schedule,
                    fabric=args.fabric, elastic=args.elastic, lanes=args.lanes) as worker:
            total = worker.allreduce(gradient, ProgressBar(sys.stderr.isatty()))
            stats = worker.last_stats
            nic_bytes = ",".join(f"{name}:{tx}/{rx}" for name, (tx, rx)
                                 in zip(worker.interfaces, worker.last_nic_bytes, strict=True))
            schedule = worker.schedule_name
            rank = args.rank if worker.engine is None else worker.engine.home
            survivors = (None if worker.engine is None or len(worker.engine.members)
                         == worker.engine.whole.num_servers else worker.engine.members)
        np.save(args.out, total)
    except (GradientError, TransportError, ValueError) as exc:
        print(f"bml-host: error: {exc}", file=sys.stderr)
        return 2
    goodput = 8 * 4 * gradient.size / max(stats.seconds, 1e-9) / 1e6
    counts = (f"frames={stats.frames_sent} repairs={stats.repairs_asked} resent="
              + ",".join(f"{why}:{count}" for why, count in stats.resent.items()))
    for replan in stats.replans:
        print(f"bml-host: re-planned after: {replan.cause}\n"
              f"bml-host: recovery: {replan.recovery_seconds:.2f} s from giving up on the "
              "old plan to the first sum of the new one; the new plan:\n  "
              + "\n  ".join(replan.schedule))
    if stats.failure_after_sum:
        print(f"bml-host: the sum is whole, but a failure came at the end: "
              f"{stats.failure_after_sum}; the next call re-plans around it")
    if stats.gone:
        print(f"bml-host: the sum is whole; server(s) {', '.join(map(str, stats.gone))} fell "
              "silent at the end (their DONE never came): left, cut off or frozen")
    if stats.salvaged:
        counts += f" salvaged={stats.salvaged}"
    if survivors is not None:
        counts += f" summed_over={','.join(map(str, survivors))}"
    if stats.replans:  # times on CLOCK_MONOTONIC, which every namespace shares
        counts += (f" replans={len(stats.replans)} degraded_seconds="
                   f"{stats.attempt_seconds:.3f} gave_up_at={stats.replans[0].gave_up_at:.3f}"
                   f" resumed_at={stats.replans[-1].resumed_at:.3f}")
    print(f"bml-host: job={args.job} rank={rank} elements={gradient.size} "
          f"seconds={stats.seconds:.3f} goodput={goodput:.1f}Mbit/s {counts} "
          f"retransmissions={stats.retransmissions} probes={stats.probes} pending={stats.pending} "
          f"schedule={schedule} "
          f"nic_bytes={nic_bytes}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
