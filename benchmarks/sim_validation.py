"""Benchmark: the simulator against the emulation, on the same shaped links.

For each topology (star:4, bcube:2,2, bcube:3,2 by default) bml-net brings up the software
target with every link shaped by tbf to ``--rate`` each way, and every schedule the topology
has runs one timed call on all its servers (``benchmarks.bcube_schedules.measure``). The same
call then runs in virtual time (``simulation.world.simulated_gst``: the same engine and
pipeline code on simulated links of that rate). Printed, and written to
results/sim_validation.{md,json}: both GSTs, the simulator's over the emulation's, and the
cost model's prediction beside them.

    python -m benchmarks.sim_validation [--topos star:4 bcube:2,2] [--rate 2mbit] [--size 1M]
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
from pathlib import Path

from benchmarks.bcube_schedules import measure
from benchmarks.common import parse_size
from bml.schedule import DEFAULT_WINDOW, HOST_BASED, IN_NETWORK, MIXED
from control_plane.fabric import Fabric
from emulation import net
from emulation.netns import Shaping, rate_bits
from simulation.world import simulated_gst

RESULTS = Path("results")
TOPOLOGIES = ("star:4", "bcube:2,2", "bcube:3,2")
AGREEMENT = 0.15  # the simulator is validated where it is within this of the emulation


def schedules_of(topo: str) -> list[str]:
    return [IN_NETWORK, HOST_BASED] + ([MIXED] if topo.startswith("bcube") else [])


def emulated(topo: str, size: int, rate: str, name: str) -> list[dict]:
    """Every schedule's measured call on ``topo`` in the emulation."""
    net.down(name)
    state = net.up(name, topo, "soft", Shaping(rate=rate))
    try:
        Fabric.load(state.run_dir / "fabric.json").add_scheduled_job(1, pool_size=DEFAULT_WINDOW)
        with tempfile.TemporaryDirectory(prefix="bml-simval-") as tmp:
            return [measure(state, schedule, size, rate_bits(rate), Path(tmp), DEFAULT_WINDOW)
                    for schedule in schedules_of(topo)]
    finally:
        net.down(name)


def table(rows: list[dict]) -> list[str]:
    lines = ["| topology | schedule | emulation GST s | simulator GST s | sim / emulation | "
             "model GST s | emulation / model | sim / model | re-sent frames (emulation) | "
             "sums |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        lines.append(
            f"| {r['topo']} | {r['schedule']} | {r['gst']:.2f} | {r['sim_gst']:.2f} | "
            f"**{r['sim_gst'] / r['gst']:.2f}** | {r['predicted_gst']:.2f} | "
            f"{r['gst'] / r['predicted_gst']:.2f} | {r['sim_gst'] / r['predicted_gst']:.2f} | "
            f"{r['retransmissions']} | "
            f"{'correct' if r['correct'] and r['sim_correct'] else 'WRONG'} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--topos", nargs="+", default=list(TOPOLOGIES))
    parser.add_argument("--rate", default="2mbit", help="tbf rate of every link, each way")
    parser.add_argument("--size", type=parse_size, default=1 << 20, help="float32 per server")
    parser.add_argument("--name", default="simval")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rows = []
    for topo in args.topos:
        for row in emulated(topo, args.size, args.rate, args.name):
            sim = simulated_gst(topo, row["schedule"], args.size, rate_bits(args.rate))
            row.update(topo=topo, sim_gst=sim.gst, sim_correct=sim.correct)
            rows.append(row)
            print(f"{topo:>10} {row['schedule']:>10}: emulation {row['gst']:.2f} s, simulator "
                  f"{sim.gst:.2f} s ({sim.gst / row['gst']:.2f}), model "
                  f"{row['predicted_gst']:.2f} s; re-sent {row['retransmissions']}", flush=True)
    lines = table(rows)
    within = sum(abs(r["sim_gst"] / r["gst"] - 1) <= AGREEMENT for r in rows)
    lines.append(f"\nThe simulator is within {AGREEMENT:.0%} of the emulation in {within} of "
                 f"{len(rows)} rows.")
    print("\n" + "\n".join(lines))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "sim_validation.md").write_text(
        f"links {args.rate} each way, {args.size} float32 per server\n\n" + "\n".join(lines)
        + "\n")
    (RESULTS / "sim_validation.json").write_text(json.dumps(rows, indent=1))
    return 0 if all(r["correct"] and r["sim_correct"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
