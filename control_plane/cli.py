"""``bml-ctl``: the control plane's command line (status, jobs, counters, health events)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bml import cost_model
from bml.protocol import BUILT_LANES, DEFAULT_LANES, ResultMode, wire
from bml.schedule import AUTO, DEFAULT_WINDOW, SCHEDULES
from bml.topology import Topology, TopologyError
from control_plane.fabric import DEFAULT_FABRIC, Fabric, locked
from control_plane.jobs import DEFAULT_POOL_SIZE, JobError
from control_plane.session import SwitchError
from control_plane.status import counter_table, event_lines, switch_lines


def parse_servers(text: str) -> list[int] | None:
    """``0-3``, ``0,2,5``, ``0-2,7``, or ``all`` (None: every server, a scheduled job)."""
    if text == "all":
        return None
    servers: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        try:
            servers += list(range(int(first), int(last or first) + 1))
        except ValueError:
            raise argparse.ArgumentTypeError(f"bad server list {text!r}") from None
    return servers


def parse_size(text: str) -> int:
    """``16M``, ``512K``, ``1G`` or a plain number of bytes."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    try:
        if text[-1:].upper() in units:
            return int(float(text[:-1]) * units[text[-1].upper()])
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad size {text!r}: e.g. 16M") from None


def plan_lines(topology: Topology, size: int, rate: str, lanes: int = DEFAULT_LANES
               ) -> list[str]:
    """Every candidate schedule with its predicted wire bytes per NIC and GST at a lane
    width; the choice marked."""
    rate_bps = cost_model.rate_bits(rate)
    elements = max(1, size // 4)
    predictions = cost_model.plan(topology, elements, rate_bps, wire(lanes))
    lines = [f"plan for {topology.spec} ({topology.num_servers} servers, "
             f"{topology.num_switches} switches, {topology.k} NIC(s) each), "
             f"{size} gradient bytes, links {rate} each way, {lanes} values per packet",
             f"  {'schedule':<11} {'share':>5} {'up/NIC':>12} {'down/NIC':>12} "
             f"{'x G up':>6} {'x G down':>8} {'GST':>9}"]
    for i, prediction in enumerate(predictions):
        schedule = prediction.schedule
        lines.append(f"{'*' if i == 0 else ' '} {schedule.name:<11} "
                     f"{float(schedule.alpha):>5.2f} {prediction.max_up:>12,.0f} "
                     f"{prediction.max_down:>12,.0f} {prediction.max_up / size:>6.3f} "
                     f"{prediction.max_down / size:>8.3f} {prediction.gst:>8.2f}s")
    lines.append("* = chosen (least predicted GST: the busier direction of the busiest NIC, "
                 "every header counted)")
    return lines


def job_lines(fabric: Fabric) -> list[str]:
    plans = fabric.plans()
    if not plans:
        return ["jobs: none"]
    lines = [f"{'job':>5} {'level':>10} {'servers':<16} {'switch':<8} {'mode':<9} "
             f"{'pool':<11} workers (id:port)"]
    for plan in plans:
        for group in plan.groups:
            members = " ".join(f"{w}:{p}" for w, p in sorted(group.members.items()))
            level = str(plan.level) if plan.schedule is None else plan.schedule
            servers = ("all" if plan.schedule is not None
                       else ",".join(map(str, plan.servers)))
            lines.append(f"{group.job_id:>5} {level:>10} {servers:<16} {group.switch:<8} "
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
    p_add.add_argument("--servers", type=parse_servers, required=True,
                       help="all (every server, every NIC, run by a schedule) or e.g. 0-3 "
                            "(one level's switches aggregate)")
    p_add.add_argument("--schedule", choices=[AUTO, *SCHEDULES], default=AUTO,
                       help="with --servers all: the job's default schedule (default auto: "
                            "the planner's choice)")
    p_add.add_argument("--level", type=int, default=0, help="with a server list: the BCube "
                       "level whose switches aggregate (default 0)")
    p_add.add_argument("--pool", type=int, default=None, help="slots per switch and stripe "
                       f"(default {DEFAULT_WINDOW} for --servers all, else "
                       f"{DEFAULT_POOL_SIZE})")
    p_add.add_argument("--elastic", action="store_true",
                       help="with --servers all on a star: when a worker leaves mid-call the "
                            "others finish without it and go on as a smaller job")
    p_add.add_argument("--to-owner", action="store_true",
                       help="with a server list: results to the chunk's owner "
                            "(reduce-scatter) instead of all")
    p_plan = commands.add_parser("plan", help="every schedule's predicted bytes per NIC and "
                                 "GST on a topology, and the planner's choice")
    p_plan.add_argument("--topo", help="star:N or bcube:n,k (default: the fabric's)")
    p_plan.add_argument("--bytes", type=parse_size, default=16 << 20,
                        help="gradient bytes (default 16M)")
    p_plan.add_argument("--rate", default="10mbit", help="link rate each way (default 10mbit)")
    p_plan.add_argument("--lanes", type=int, nargs="+", choices=BUILT_LANES,
                        help="values per packet: the P4 builds to plan for (default: every "
                             f"build, {', '.join(map(str, BUILT_LANES))})")
    p_remove = commands.add_parser("job-remove", help="reset a job's slots and remove it")
    p_remove.add_argument("--job", type=int, required=True)
    p_monitor = commands.add_parser("monitor", help="watch switch health (runs until stopped)")
    p_monitor.add_argument("--period", type=float, default=0.5)
    p_monitor.add_argument("--duration", type=float, default=None)
    args = parser.parse_args(argv)
    try:
        if args.command == "plan":
            topology = (Topology.parse(args.topo) if args.topo
                        else Fabric.load(args.fabric).topo)
            for lanes in args.lanes or BUILT_LANES:
                print("\n".join(plan_lines(topology, args.bytes, args.rate, lanes)))
            return 0
        if args.command in ("job-add", "job-remove"):
            with locked(args.fabric) as fabric:
                if args.command == "job-add" and args.servers is None:
                    plan = fabric.add_scheduled_job(args.job, args.schedule,
                                                    args.pool or DEFAULT_WINDOW, args.elastic)
                    switches = sorted({g.switch for g in plan.groups})
                    print(f"bml-ctl: job {plan.job_id} set up on all {len(switches)} switches "
                          f"({fabric.topo.k} stripe(s) each), schedule {args.schedule}"
                          + (", elastic" if plan.elastic else ""))
                elif args.command == "job-add":
                    if args.elastic:
                        raise JobError("--elastic is for a job on every server (--servers all)")
                    mode = ResultMode.TO_OWNER if args.to_owner else ResultMode.MULTICAST
                    plan = fabric.add_job(args.job, args.servers, args.level,
                                          args.pool or DEFAULT_POOL_SIZE, mode)
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
    except (FileNotFoundError, JobError, SwitchError, TopologyError, TimeoutError,
            ValueError) as exc:
        print(f"bml-ctl: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
