"""Benchmark: the BCube schedules side by side on all NICs of bcube:3,2.

bml-net brings up the BCube on the software target with every link shaped by tbf to
``--rate`` each way (a rate this machine's CPUs keep up with: the links, not the nine workers
and six switch processes, must be the limit). One job is set up on every switch; for each
schedule (in-network, host-based, mixed) every server runs ``benchmarks.worker`` at once (a
warm-up allreduce as a barrier, then the timed one on all its NICs). Printed, and written to
results/bcube_schedules.{md,json}: GST (``benchmarks.common.Run.gst``) against the schedule's
own prediction (``bml.cost_model.predict``), the bytes each NIC carried each way (its kernel
counters) against the prediction for that NIC, and every schedule's GST over host-based's.

    python -m benchmarks.bcube_schedules [--topo bcube:3,2] [--rate 5mbit] [--size 4M]
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
from pathlib import Path

from benchmarks.common import parse_size, run_workers
from bml import cost_model
from bml.protocol import BUILT_LANES, DEFAULT_LANES, wire
from bml.schedule import DEFAULT_WINDOW, HOST_BASED, IN_NETWORK, MIXED, make_schedule
from bml.topology import Topology
from control_plane.fabric import Fabric
from emulation import net
from emulation.netns import Shaping, rate_bits
from hosts.quantize import check_sum

RESULTS = Path("results")
SCHEDULES = (IN_NETWORK, HOST_BASED, MIXED)


def measure(state, schedule: str, size: int, rate: float, tmp: Path, window: int,
            lanes: int = DEFAULT_LANES) -> dict:
    """One schedule: every worker at once; measured GST and NIC bytes beside the prediction."""
    topo = state.topo()
    workers = topo.num_servers
    run = run_workers(state, "bml", workers, size, tmp,
                      ["--schedule", schedule, "--window", str(window), "--lanes", str(lanes)],
                      check=lambda total, grads: check_sum(total, grads, lanes)[2])
    prediction = cost_model.predict(make_schedule(topo, schedule), size, rate, window,
                                    wire=wire(lanes))
    ratios = []  # measured / predicted, per server, NIC and direction
    for report in run.reports:
        server = report["rank"]
        for level, name in enumerate(sorted(report["nics"])):
            sent, received = report["nics"][name]
            up, down = prediction.nic_bytes[server][level]
            ratios += [sent / up, received / down]
    busiest_up, busiest_down = run.busiest()
    return {"schedule": schedule, "elements": size, "rate_bps": rate, "gst": run.gst,
            "predicted_gst": prediction.gst, "correct": run.correct,
            "busiest_up": busiest_up, "busiest_down": busiest_down,
            "predicted_up": prediction.max_up, "predicted_down": prediction.max_down,
            "bytes_ratio_min": min(ratios), "bytes_ratio_max": max(ratios),
            "retransmissions": run.retransmissions, "resent": run.resent(),
            "probes": sum(r.get("probes", 0) for r in run.reports),
            "tcp_retransmissions": run.tcp_retransmissions,
            "goodput_bps": 32 * size / run.gst}


def table(rows: list[dict]) -> list[str]:
    base = next((r["gst"] for r in rows if r["schedule"] == HOST_BASED), None)
    lines = ["| schedule | GST s | predicted s | GST/pred | busiest NIC up / pred | "
             "busiest NIC down / pred | every NIC, each way: measured/pred | retx | probes | "
             "vs host-based | sums |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        lines.append(
            f"| {r['schedule']} | {r['gst']:.2f} | {r['predicted_gst']:.2f} | "
            f"{r['gst'] / r['predicted_gst']:.2f} | "
            f"{r['busiest_up']:,} / {r['predicted_up']:,.0f} | "
            f"{r['busiest_down']:,} / {r['predicted_down']:,.0f} | "
            f"{r['bytes_ratio_min']:.3f} - {r['bytes_ratio_max']:.3f} | "
            f"{r['retransmissions']} | {r.get('probes', 0)} | "
            + (f"{r['gst'] / base:.2f}" if base else "n/a")
            + f" | {'correct' if r['correct'] else 'WRONG'} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--topo", default="bcube:3,2")
    parser.add_argument("--rate", default="5mbit",
                        help="tbf rate of every link, each way (default: what 2 cores keep "
                        "up with for 9 workers and 6 switch processes)")
    parser.add_argument("--size", type=parse_size, default=4 << 20, help="float32 per server")
    parser.add_argument("--schedules", nargs="+", default=list(SCHEDULES))
    parser.add_argument("--window", type=int, default=DEFAULT_WINDOW,
                        help="slots per switch channel (the job's pool is made to fit)")
    parser.add_argument("--lanes", type=int, default=DEFAULT_LANES, choices=BUILT_LANES,
                        help="values per packet: the P4 build the switches run")
    parser.add_argument("--name", default="bsched")
    args = parser.parse_args(argv)
    rate = rate_bits(args.rate)
    topo = Topology.parse(args.topo)
    print(f"{args.topo}: {topo.num_servers} servers x {topo.k} NICs, links {args.rate} each "
          f"way, {args.size} float32 per server", flush=True)
    for prediction in cost_model.plan(topo, args.size, rate, wire(args.lanes)):
        print(f"  predicted {prediction.schedule.name:>10}: GST {prediction.gst:7.2f} s, "
              f"busiest NIC up {prediction.max_up:,.0f} B, down {prediction.max_down:,.0f} B")
    rows = []
    # A SIGTERM (timeout, kill) unwinds through the finally below, so the namespaces go too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    net.down(args.name)
    state = net.up(args.name, args.topo, "soft", Shaping(rate=args.rate), lanes=args.lanes)
    try:
        fabric = Fabric.load(state.run_dir / "fabric.json")
        fabric.add_scheduled_job(1, pool_size=max(DEFAULT_WINDOW, args.window))
        with tempfile.TemporaryDirectory(prefix="bml-bsched-") as tmp:
            for schedule in args.schedules:
                row = measure(state, schedule, args.size, rate, Path(tmp), args.window,
                              args.lanes)
                rows.append(row)
                print(f"  measured  {schedule:>10}: GST {row['gst']:7.2f} s "
                      f"({row['gst'] / row['predicted_gst']:.2f} of predicted), NIC bytes "
                      f"{row['bytes_ratio_min']:.3f}-{row['bytes_ratio_max']:.3f} of predicted,"
                      f" sums {'correct' if row['correct'] else 'WRONG'}; re-sent frames by "
                      f"rule {row['resent']}, TCP segments {row['tcp_retransmissions']}",
                      flush=True)
    finally:
        net.down(args.name)
    lines = table(rows)
    print("\n" + "\n".join(lines))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bcube_schedules.md").write_text(
        f"{args.topo}, links {args.rate} each way, {args.size} float32 per server\n\n"
        + "\n".join(lines) + "\n")
    (RESULTS / "bcube_schedules.json").write_text(json.dumps(rows, indent=1))
    return 0 if all(r["correct"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
