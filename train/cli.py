"""``bml-train``'s command line: the launcher by default, one rank with ``rank`` (how the
launcher starts each rank, ``python -m train ... rank ...``)."""

from __future__ import annotations

import argparse
import os
import sys

import train
from bml.schedule import SCHEDULES
from train.launch import GLOO_PORT, launch
from train.rank import run_rank
from train.report import SCHEMES


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The launcher's options; the ``rank`` command adds what only a rank needs."""
    parser = argparse.ArgumentParser(prog="bml-train", description=train.__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32, help="images per rank and step")
    parser.add_argument("--lr", type=float, default=0.03)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=30.0,
                        help="seconds a gradient allreduce may take before the run stops")
    parser.add_argument("--job", type=int, default=11)
    commands = parser.add_subparsers(dest="command")
    rank = commands.add_parser("rank", help="one rank (run by the launcher in a namespace)")
    rank.add_argument("--scheme", choices=SCHEMES, required=True)
    rank.add_argument("--rank", type=int, required=True)
    rank.add_argument("--world", type=int, required=True)
    rank.add_argument("--master", required=True, help="rank 0's address (gloo rendezvous)")
    rank.add_argument("--port", type=int, default=GLOO_PORT)
    rank.add_argument("--interface", default="eth0", help="gloo's NIC (DDP's set-up)")
    rank.add_argument("--fabric", help="the control plane's file: the job's schedule")
    rank.add_argument("--report", required=True)
    rank.add_argument("--max-steps", type=int, default=0, help="stop after this many steps")
    rank.add_argument("--progress", action="store_true", help="print 'step N' after each step")
    parser.add_argument("--topo", default="star:4",
                        help="where BML-INA runs: star:N or bcube:n,k (one rank per server)")
    parser.add_argument("--schedule", choices=SCHEDULES,
                        help="BML-INA's schedule (default: the planner's for LeNet-5's size)")
    parser.add_argument("--rate", default="5mbit", help="tc rate of every link and direction")
    parser.add_argument("--name", default="train", help="emulation name (1-6 chars)")
    parser.add_argument("--schemes", nargs="+", choices=SCHEMES, default=list(SCHEMES))
    parser.add_argument("--deadline", type=float, default=3600.0,
                        help="seconds after which the launcher kills a run's ranks")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run one rank, or (as root, it brings up namespaces) the whole comparison."""
    args = parse(argv)
    if args.command == "rank":
        return run_rank(args)
    if os.geteuid() != 0:
        print("bml-train: needs root (it brings up network namespaces)", file=sys.stderr)
        return 2
    return launch(args)
