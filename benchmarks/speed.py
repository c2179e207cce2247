"""Benchmark (`make bench-speed`): BML-INA against gloo's ring on fast links, per lane width.

The same namespaces and veths, links left fast (tbf at 10 Gbit/s): star:N with the switch at
each lane width (64: the Tofino-class build; the widest a 9000-byte frame holds), the
in-network allreduce beside gloo's ring allreduce on the same servers, every size; with
``--bcube``, the planner's schedule on bcube:n,k (or each of ``--bcube-schedules``) beside
gloo's ring over a star of as many servers. Each scheme makes ``--repeat`` timed calls after
its warm-up; each row prints the median GST, its ratio to gloo's in the same run, the CPU
seconds per GB of gradient of the hosts (the workers' processes) and of the switches (their
processes), and the fresh pages a worker faults in per call. Results go to
``results/speed.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from benchmarks.common import float_check, have_torch, parse_size, run_workers
from bml.protocol import BUILT_LANES, DEFAULT_LANES, WIDEST_LANES
from bml.schedule import SCHEDULES
from bml.topology import Topology
from control_plane.fabric import Fabric
from emulation import net
from emulation.netns import Shaping, rate_bits
from hosts.quantize import check_sum

RESULTS = Path("results")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu(pids: list[int]) -> float:
    """CPU seconds (user + system) the processes have used so far; 0 for one that is gone."""
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime
    return total


def switch_pids(state) -> list[int]:
    return [int(sw["pid"]) for sw in state.switches.values()]


def measure(state, scheme: str, workers: int, size: int, tmp: Path, extra: list[str],
            lanes: int, repeat: int) -> dict:
    """``repeat`` timed allreduces of ``size`` floats per worker (after a warm-up that is
    also a barrier): the median GST, correctness, and CPU seconds per GB of gradient (4 bytes
    x size x workers) of the workers and of the switches, per call."""
    switches = switch_pids(state)
    before = process_cpu(switches)
    run = run_workers(state, scheme, workers, size, tmp, [*extra, "--repeat", str(repeat)],
                      check=(lambda total, grads: check_sum(total, grads, lanes)[2])
                      if scheme == "bml" else float_check)
    # Per call; the warm-up's share included: an upper bound.
    switch_cpu = (process_cpu(switches) - before) / repeat
    gigabytes = 4 * size * workers / 1e9
    host_cpu = sum(r.get("cpu_seconds", 0.0) for r in run.reports)
    faults = [r.get("page_faults", 0.0) for r in run.reports]
    return {"gst": run.gst, "correct": run.correct, "host_cpu_per_gb": host_cpu / gigabytes,
            "page_faults": sum(faults) / max(1, len(faults)),
            "switch_cpu_per_gb": switch_cpu / gigabytes,
            "schedule": run.reports[0].get("schedule", scheme),
            "resent": sum(r.get("retransmissions", 0) for r in run.reports),
            "probes": sum(r.get("probes", 0) for r in run.reports)}


def star_rows(args, sizes: list[int], tmp: Path) -> list[dict]:
    rows = []
    gloo: dict[int, dict] = {}
    for lanes in args.lanes:
        name = args.name
        net.down(name)
        state = net.up(name, f"star:{args.workers}", "soft", Shaping(rate=args.rate),
                       lanes=lanes)
        try:
            Fabric.load(state.run_dir / "fabric.json").add_job(1, list(range(args.workers)))
            if args.gloo and not gloo:  # the same namespaces and veths for every width
                for size in sizes:
                    gloo[size] = measure(state, "ring", args.workers, size, tmp,
                                         ["--master", state.topo().nics(0)[0].ip], lanes,
                                         args.repeat)
                    print(f"gloo ring   star:{args.workers} {size:>8} floats: GST "
                          f"{gloo[size]['gst']:.3f} s", flush=True)
            for size in sizes:
                time.sleep(0.5)
                bml = measure(state, "bml", args.workers, size, tmp,
                              ["--lanes", str(lanes)], lanes, args.repeat)
                ring = gloo.get(size)
                row = {"topo": f"star:{args.workers}", "lanes": lanes, "elements": size,
                       "bml": bml, "gloo": ring,
                       "ratio": bml["gst"] / ring["gst"] if ring else None}
                rows.append(row)
                print(f"in-network  star:{args.workers} {size:>8} floats, {lanes:>4} lanes: "
                      f"GST {bml['gst']:.3f} s"
                      + (f" = {row['ratio']:.2f} x gloo" if ring else "")
                      + f", {bml['resent']} re-sent, {bml['probes']} probes,"
                      f" correct={bml['correct']}", flush=True)
        finally:
            net.down(name)
    return rows


def bcube_rows(args, size: int, tmp: Path) -> list[dict]:
    """The planner's schedule on the BCube at the widest width (or each of
    ``--bcube-schedules``, one job each, set up and removed in turn), and gloo's ring over a
    star of as many servers, on the same machine."""
    topology = Topology.parse(args.bcube)
    servers = topology.num_servers
    ring = None
    if args.gloo:
        net.down(args.name)
        state = net.up(args.name, f"star:{servers}", "soft", Shaping(rate=args.rate))
        try:
            ring = measure(state, "ring", servers, size, tmp,
                           ["--master", state.topo().nics(0)[0].ip], DEFAULT_LANES,
                           args.repeat)
            print(f"gloo ring   star:{servers} {size:>8} floats: GST {ring['gst']:.3f} s",
                  flush=True)
        finally:
            net.down(args.name)
    lanes = max(args.lanes)
    net.down(args.name)
    state = net.up(args.name, args.bcube, "soft", Shaping(rate=args.rate), lanes=lanes)
    rows = []
    try:
        fabric = Fabric.load(state.run_dir / "fabric.json")
        for job, schedule in enumerate(args.bcube_schedules, 1):
            fabric.add_scheduled_job(job, schedule)
            named = [] if schedule == "auto" else ["--schedule", schedule]
            bml = measure(state, "bml", servers, size, tmp,
                          ["--job", str(job), "--lanes", str(lanes), *named], lanes, args.repeat)
            fabric.remove_job(job)
            row = {"topo": args.bcube, "lanes": lanes, "elements": size, "bml": bml,
                   "gloo": ring, "ratio": bml["gst"] / ring["gst"] if ring else None}
            rows.append(row)
            print(f"{bml['schedule']:<11} {args.bcube} {size:>8} floats, {lanes} lanes: GST "
                  f"{bml['gst']:.3f} s" + (f" = {row['ratio']:.2f} x gloo (star:{servers})"
                                           if ring else ""), flush=True)
    finally:
        net.down(args.name)
    return rows


def write_results(rows: list[dict], rate: str, repeat: int) -> None:
    lines = [f"Links: tbf at {rate} each way; GST = the median over {repeat} timed calls, each "
             "from the last worker's start to the last sum. CPU: "
             "seconds per GB of gradient (4 bytes x floats x workers). Pages: fresh pages a "
             "worker's process faulted in per call (minor faults), the mean over workers.", "",
             "| topology | lanes | floats | schedule | GST s | gloo GST s | vs gloo | "
             "host CPU s/GB | switch CPU s/GB | gloo CPU s/GB | host pages | gloo pages | "
             "correct |",
             "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
             "| --- |"]
    for r in rows:
        bml, gloo = r["bml"], r["gloo"]
        lines.append(
            f"| {r['topo']} | {r['lanes']} | {r['elements']} | {bml['schedule']} | "
            f"{bml['gst']:.3f} | {gloo['gst']:.3f} | {r['ratio']:.2f} | "
            if gloo else f"| {r['topo']} | {r['lanes']} | {r['elements']} | "
            f"{bml['schedule']} | {bml['gst']:.3f} | n/a | n/a | ")
        lines[-1] += (f"{bml['host_cpu_per_gb']:.1f} | {bml['switch_cpu_per_gb']:.1f} | "
                      f"{gloo['host_cpu_per_gb']:.1f} | " if gloo else
                      f"{bml['host_cpu_per_gb']:.1f} | {bml['switch_cpu_per_gb']:.1f} | n/a | ")
        lines[-1] += f"{bml['page_faults']:.0f} | " + (
            f"{gloo['page_faults']:.0f} | " if gloo else "n/a | ")
        lines[-1] += f"{bml['correct']} |"
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "speed.md").write_text(text)
    (RESULTS / "speed.json").write_text(json.dumps(rows, indent=1))
    print("written: results/speed.md, .json")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", default="10gbit")
    parser.add_argument("--sizes", type=parse_size, nargs="+", default=[1 << 20, 4 << 20])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--lanes", type=int, nargs="+", default=[DEFAULT_LANES, WIDEST_LANES],
                        choices=BUILT_LANES)
    parser.add_argument("--bcube", help="also the planner's schedule on this BCube (e.g. "
                        "bcube:3,2) against gloo over a star of as many servers")
    parser.add_argument("--bcube-schedules", nargs="+", default=["auto"],
                        choices=["auto", *SCHEDULES],
                        help="the schedules to run on the BCube (auto: the planner's)")
    parser.add_argument("--name", default="speed")
    parser.add_argument("--repeat", type=int, default=5,
                        help="timed calls per scheme and size; GST is their median (single "
                        "calls on this VM vary by a third)")
    args = parser.parse_args(argv)
    rate_bits(args.rate)  # refuses a bad rate before anything is built
    args.gloo = have_torch()
    if not args.gloo:
        print("bench-speed: torch is not installed here: no gloo baseline, no ratios")
    with tempfile.TemporaryDirectory(prefix="bml-speed-") as tmp:
        rows = star_rows(args, args.sizes, Path(tmp))
        if args.bcube:
            rows += bcube_rows(args, max(args.sizes), Path(tmp))
    write_results(rows, args.rate, args.repeat)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
