"""``bml-ctl``: the control plane's command line (status, jobs, counters, health events)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bml.protocol import ResultMode
from bml.topology import TopologyError
from control_plane.fabric import DEFAULT_FABRIC, Fabric, locked
from control_plane.jobs import DEFAULT_POOL_SIZE, JobError
from control_plane.session import SwitchError
from control_plane.status import counter_table, event_lines, switch_lines


def parse_servers(text: str) -> list[int]:
    """``0-3``, ``0,2,5`` or ``0-2,7``."""
    servers: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        try:
            servers += list(range(int(first), int(last or first) + 1))
        except ValueError:
            raise argparse.ArgumentTypeError(f"bad server list {text!r}") from None
    return servers


def job_lines(fabric: Fabric) -> list[str]:
    plans = fabric.plans()
    if not plans:
        return ["jobs: none"]
    lines = [f"{'job':>5} {'level':>5} {'servers':<16} {'switch':<8} {'mode':<9} "
             f"{'pool':<11} workers (id:port)"]
    for plan in plans:
        for group in plan.groups:
            members = " ".join(f"{w}:{p}" for w, p in sorted(group.members.items()))
            lines.append(f"{plan.job_id:>5} {plan.level:>5} "
                         f"{','.join(map(str, plan.servers)):<16} {group.switch:<8} "
                         f"{ResultMode(group.result_mode).name.lower():<9} "
                         f"{group.pool_base:>4}+{group.pool_size:<6} {members}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bml-ctl", description=__doc__)
    parser.add_argument("--fabric", type=Path, default=DEFAULT_FABRIC,
                        help=f"fabric file (default {DEFAULT_FABRIC}; "
                             "bml-net writes <run dir>/fabric.json)")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("status", help="switches, jobs, counters and recent health events")
    commands.add_parser("counters", help="counters per switch")
    commands.add_parser("jobs", help="jobs and their aggregation groups")
    p_events = commands.add_parser("events", help="health events")
    p_events.add_argument("--last", type=int, default=50)
    p_add = commands.add_parser("job-add", help="set a job up on the switches")
    p_add.add_argument("--job", type=int, required=True)
    p_add.add_argument("--servers", type=parse_servers, required=True, help="e.g. 0-3")
    p_add.add_argument("--level", type=int, default=0, help="BCube level whose switches "
                       "aggregate (default 0)")
    p_add.add_argument("--pool", type=int, default=DEFAULT_POOL_SIZE, help="slots per switch")
    p_add.add_argument("--to-owner", action="store_true",
                       help="results to the chunk's owner (reduce-scatter) instead of all")
    p_remove = commands.add_parser("job-remove", help="reset a job's slots and remove it")
    p_remove.add_argument("--job", type=int, required=True)
    p_monitor = commands.add_parser("monitor", help="watch switch health (runs until stopped)")
    p_monitor.add_argument("--period", type=float, default=0.5)
    p_monitor.add_argument("--duration", type=float, default=None)
    args = parser.parse_args(argv)
    try:
        if args.command in ("job-add", "job-remove"):
            with locked(args.fabric) as fabric:
                if args.command == "job-add":
                    mode = ResultMode.TO_OWNER if args.to_owner else ResultMode.MULTICAST
                    plan = fabric.add_job(args.job, args.servers, args.level, args.pool, mode)
                    print(f"bml-ctl: job {plan.job_id} set up on "
                          f"{', '.join(g.switch for g in plan.groups)}")
                else:
                    fabric.remove_job(args.job)
                    print(f"bml-ctl: job {args.job} removed")
            return 0
        fabric = Fabric.load(args.fabric)
        if args.command == "monitor":
            from control_plane.health import HealthMonitor

            monitor = HealthMonitor(fabric, period=args.period,
                                    on_event=lambda e: print(e, flush=True))
            monitor.run(args.duration)
            return 0
        sections = {
            "status": lambda: [f"fabric {fabric.path}: {fabric.topology}, "
                               f"{len(fabric.switches)} switches", "",
                               *switch_lines(fabric), "", *job_lines(fabric), "",
                               *counter_table(fabric.addresses()), "",
                               *event_lines(fabric.events_path, 10)],
            "counters": lambda: counter_table(fabric.addresses()),
            "jobs": lambda: job_lines(fabric),
            "events": lambda: event_lines(fabric.events_path, args.last),
        }
        print("\n".join(sections[args.command]()))
    except (FileNotFoundError, JobError, SwitchError, TopologyError, TimeoutError) as exc:
        print(f"bml-ctl: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
