"""The demo (``make run``): bcube:3,2 on the software target, nine servers push on all NICs.

Brings the emulation up, sets job 1 up on every switch, runs ``bml-host push`` on every
server at once (every NIC, the planned schedule, a different random gradient each), checks
every worker's result against the float64 sum within the quantiser's stated bound, prints per
server the bytes each NIC carried beside the cost model's prediction, and tears down.
``--topo star:4`` runs the single-switch demo instead.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bml import cost_model
from bml.protocol import BUILT_LANES, DEFAULT_LANES, WIDEST_LANES, wire
from bml.schedule import AUTO, SCHEDULES, make_schedule
from control_plane.fabric import Fabric
from emulation.net import NetError, down, up
from emulation.netns import Shaping
from emulation.workers import Push, PushResult, run_pushes
from hosts.quantize import check_sum


def nic_table(runs: list[PushResult], prediction: cost_model.Prediction,
              grads: list[np.ndarray]) -> tuple[list[str], int]:
    """Per server: exit, error against bound, seconds, and per NIC the bytes sent/received
    beside the prediction; and how many servers failed."""
    k = len(prediction.nic_bytes[0])
    nic_heads = "  ".join(f"{f'eth{level} sent /pred':>16} {'received /pred':>16}"
                          for level in range(k))
    lines = [f"{'server':>6} {'exit':>4} {'max error':>10} {'bound':>10} {'seconds':>7}  "
             + nic_heads]
    failures = 0
    for server, run in enumerate(runs):
        if run.returncode != 0 or not run.output.exists():
            failures += 1
            lines.append(f"{server:>6} {run.returncode:>4}  {run.stderr.strip()[-300:]}")
            continue
        error, bound, ok = check_sum(np.load(run.output), grads, prediction.lanes)
        failures += not ok
        cells = []
        for (sent, received), (up_bytes, down_bytes) in zip(
                run.nic_bytes(), prediction.nic_bytes[server], strict=True):
            cells.append(f"{sent:>10,} {sent / up_bytes:>5.2f} {received:>10,} "
                         f"{received / down_bytes:>5.2f}".replace(",", " "))
        lines.append(f"{server:>6} {run.returncode:>4} {error:>10.2e} {bound:>10.2e} "
                     f"{float(run.figure('seconds')):>7.2f}  " + "  ".join(cells)
                     + ("" if ok else "  OUT OF BOUND"))
    return lines, failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bml-demo", description=__doc__.split("\n")[0])
    parser.add_argument("--topo", default="bcube:3,2", help="bcube:n,k or star:N")
    parser.add_argument("--target", default="soft")
    parser.add_argument("--schedule", choices=[AUTO, *SCHEDULES], default=AUTO)
    parser.add_argument("--elements", type=int, default=None,
                        help="float32 per server (default 1M; 128K on bmv2, which is slower)")
    parser.add_argument("--lanes", type=int, choices=BUILT_LANES,
                        help=f"values per packet: the P4 build the switches run (default "
                             f"{WIDEST_LANES} on the software target, {DEFAULT_LANES} on bmv2)")
    parser.add_argument("--name", default="demo")
    args = parser.parse_args(argv)
    if args.elements is None:
        args.elements = 1 << 17 if args.target == "bmv2" else 1 << 20
    if args.lanes is None:
        args.lanes = DEFAULT_LANES if args.target == "bmv2" else WIDEST_LANES
    t0 = time.monotonic()
    print(f"demo: bringing up {args.topo} on the {args.target} target, {args.lanes} values "
          "per packet ...", flush=True)
    try:
        state = up(args.name, args.topo, args.target, Shaping(), lanes=args.lanes)
    except NetError as exc:
        print(f"demo: error: {exc}", file=sys.stderr)
        return 2
    failures = 0
    try:
        topo = state.topo()
        fabric_path = state.run_dir / "fabric.json"
        Fabric.load(fabric_path).add_scheduled_job(1, args.schedule)
        schedule = (cost_model.choose(topo, args.elements, wire=wire(args.lanes))
                    if args.schedule == AUTO
                    else make_schedule(topo, args.schedule))
        print(f"demo: up in {time.monotonic() - t0:.1f} s; job 1 set up on all "
              f"{topo.num_switches} switches; {topo.num_servers} servers push "
              f"{args.elements} float32 each on all {topo.k} NIC(s), schedule "
              f"{schedule.name}" + (" (the planner's choice)" if args.schedule == AUTO else ""),
              flush=True)
        for line in schedule.describe():
            print(f"      {line}")
        rng = np.random.default_rng(2026)
        grads = [rng.standard_normal(args.elements).astype(np.float32) * (r + 1)
                 for r in range(topo.num_servers)]
        with tempfile.TemporaryDirectory(prefix="bml-demo-") as tmp:
            runs = run_pushes(state, 1, [Push(s, s, grad, None) for s, grad in enumerate(grads)],
                              Path(tmp), extra=["--schedule", schedule.name, "--timeout", "240"],
                              timeout=300)
            prediction = cost_model.predict(schedule, args.elements, 1e9,
                                            wire=wire(args.lanes))
            lines, failures = nic_table(runs, prediction, grads)
        print("\n" + "\n".join(lines))
        print("(sent/pred, recv/pred: the NIC's byte counters over the cost model's prediction "
              "for this schedule, every header counted)\n")
        from control_plane.status import counter_table

        print("\n".join(counter_table(Fabric.load(fabric_path).addresses())))
    finally:
        down(args.name)
    verdict = "all sums correct" if not failures else f"{failures} server(s) FAILED"
    print(f"\ndemo: {verdict}; torn down; {time.monotonic() - t0:.1f} s in all")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
