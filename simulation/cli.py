"""``bml-sim``: the deterministic simulator's command line.

    bml-sim run --seed 17 --topo bcube:3,2          one trial, replayable; exit 1 if it fails
    bml-sim soak --seeds 20000 --jobs 0             many trials over several topologies, all CPUs
    bml-sim loss --floats 500K --rate 20e6          goodput under 0/1/5/10% loss, star:4
    bml-sim gst --topo bcube:3,2 --floats 1M        every schedule's GST beside the cost model
    bml-sim gst --topo bcube:4,3 --fail s0_1        ... with a switch killed mid-call
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor

from bml.protocol import BUILT_LANES, DEFAULT_LANES
from bml.schedule import SCHEDULES
from bml.topology import Topology
from control_plane.cli import parse_size
from simulation.world import (
    FAULT_KINDS,
    Verdict,
    failover_gst,
    lossy_gst,
    run_seed,
    simulated_gst,
)

SOAK_TOPOLOGIES = ("bcube:2,2", "star:4", "bcube:3,2", "bcube:2,3", "bcube:4,2", "bcube:3,3")


def print_verdict(verdict: Verdict) -> None:
    scenario = verdict.scenario
    faults = "; ".join(map(str, scenario.faults)) or "none"
    print(f"seed {scenario.seed}: {scenario.topo} {scenario.schedule}, {scenario.floats} "
          f"floats, fault: {faults}")
    for server, end in sorted(verdict.first_call.items()):
        print(f"  server {server}: {end}")
    print(f"  call ended after {verdict.gst * 1e3:.2f} ms (virtual)")
    if verdict.ok:
        print("  ok: no wrong sum, nobody hung, the next run is right")
    for problem in verdict.problems:
        print(f"  PROBLEM: {problem}")


def _trial(task: tuple) -> tuple[str, int, str | None]:
    """One soak trial (a worker process's task): its fault kind, whether a fault came after
    a first sum, and what failed (None if nothing), with the command that replays it."""
    seed, topo, floats, rate, loss, kinds, lanes = task
    verdict = run_seed(seed, topo, floats=floats, rate=rate, loss=loss, kinds=kinds,
                       lanes=lanes)
    failure = None
    if not verdict.ok:
        failure = (f"FAIL seed {seed} {topo} {verdict.scenario.schedule} "
                   f"{verdict.scenario.faults[0]}: {verdict.problems[0][:300]}\n"
                   f"  replay: {verdict.scenario.command()}")
    return verdict.scenario.faults[0].kind, verdict.late, failure


def soak(seeds: int, start: int, topologies: list[str], floats: int, rate: float,
         loss: float, kinds: tuple[str, ...], quiet: bool = False,
         lanes: int = DEFAULT_LANES, jobs: int = 1) -> int:
    """Trials spread over ``topologies``, on ``jobs`` processes (each trial is its own seeded
    world, so the outcome is the same on any number); per fault kind: trials, problems, and
    how many of the trials had a fault that leaves a way on come after the first whole block
    (where re-running the call cannot gather everyone, so the sums come from those that hold
    them)."""
    ran, failed, late = Counter(), Counter(), Counter()
    started = time.monotonic()
    tasks = [(start + i, topologies[i % len(topologies)], floats, rate, loss, kinds, lanes)
             for i in range(seeds)]
    pool = ProcessPoolExecutor(jobs) if jobs > 1 else None
    try:
        outcomes = pool.map(_trial, tasks, chunksize=8) if pool else map(_trial, tasks)
        for i, (kind, was_late, failure) in enumerate(outcomes):
            ran[kind] += 1
            late[kind] += was_late
            if failure:
                failed[kind] += 1
                print(failure, flush=True)
            elif not quiet and (i + 1) % 500 == 0:
                print(f"{i + 1} trials, {sum(failed.values())} failed, "
                      f"{time.monotonic() - started:.0f} s", flush=True)
    finally:
        if pool:
            pool.shutdown(cancel_futures=True)
    print(f"{'fault':<16} {'trials':>7} {'failed':>7} {'after a first sum':>18}")
    for kind in sorted(ran):
        print(f"{kind:<16} {ran[kind]:>7} {failed[kind]:>7} {late[kind]:>18}")
    print(f"{seeds} trials on {', '.join(topologies)} in {time.monotonic() - started:.1f} s "
          f"on {jobs} process(es): {sum(failed.values())} failed")
    return 1 if failed else 0


def loss_table(topo: str, floats: int, rate: float, reorder: float) -> int:
    """Each loss rate's GST beside the lossless one's, in virtual time."""
    print(f"{topo} in-network, {floats} floats, {rate / 1e6:g} Mbit/s links, "
          f"{reorder:.0%} reordering with loss")
    print(f"{'loss each way':>14} {'GST s':>8} {'share of lossless':>18} {'re-sends':>9} sums")
    lossless = 0.0
    right = True
    for loss in (0.0, 0.01, 0.05, 0.10):
        gst, ok, resent = lossy_gst(topo, "in-network", floats, rate, loss,
                                    reorder if loss else 0.0)
        lossless = lossless or gst
        right &= ok
        print(f"{loss:>14.0%} {gst:>8.3f} {lossless / gst:>18.0%} {resent:>9} "
              f"{'correct' if ok else 'WRONG'}", flush=True)
    return 0 if right else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bml-sim", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("run", "soak"):
        sub = commands.add_parser(name)
        sub.add_argument("--floats", type=parse_size, default=4096)
        sub.add_argument("--rate", type=float, default=100e6, help="bits/s of every link")
        sub.add_argument("--loss", type=float, default=0.0, help="drop probability each way")
        sub.add_argument("--lanes", type=int, default=DEFAULT_LANES, choices=BUILT_LANES,
                         help="values per packet: the P4 build the switches run")
        sub.add_argument("--kinds", default=",".join(FAULT_KINDS),
                         help=f"fault kinds to draw from ({', '.join(FAULT_KINDS)})")
    loss = commands.add_parser("loss")
    loss.add_argument("--topo", default="star:4")
    loss.add_argument("--floats", type=parse_size, default=500_000)
    loss.add_argument("--rate", type=float, default=20e6)
    loss.add_argument("--reorder", type=float, default=0.25)
    run = commands.choices["run"]
    run.add_argument("--seed", type=int, required=True)
    run.add_argument("--topo", default="bcube:2,2")
    run.add_argument("--schedule", choices=SCHEDULES)
    soak_parser = commands.choices["soak"]
    soak_parser.add_argument("--seeds", type=int, default=1000)
    soak_parser.add_argument("--start", type=int, default=0)
    soak_parser.add_argument("--topos", default=",".join(SOAK_TOPOLOGIES[:4]),
                             help="topologies to spread the trials over")
    soak_parser.add_argument("--jobs", type=int, default=1,
                             help="processes to run the trials on (0: one per CPU)")
    gst = commands.add_parser("gst")
    gst.add_argument("--topo", default="bcube:2,2")
    gst.add_argument("--schedule", choices=SCHEDULES, action="append",
                     help="one schedule (again for more); default: every one the topology has")
    gst.add_argument("--floats", type=parse_size, default=1 << 20)
    gst.add_argument("--rate", type=float, default=100e6)
    gst.add_argument("--lanes", type=int, default=DEFAULT_LANES, choices=BUILT_LANES)
    gst.add_argument("--json", action="store_true",
                     help="one JSON object per schedule, with this process's peak memory")
    gst.add_argument("--fail", metavar="SWITCH",
                     help="kill this switch part-way through the call (e.g. s0_1): detection, "
                     "recovery, and the degraded plan's GST against the model's")
    gst.add_argument("--fail-at", type=float, default=0.5,
                     help="when, as a fraction of the fault-free call's GST")
    args = parser.parse_args(argv)
    if args.command == "gst":
        schedules = args.schedule or [s for s in SCHEDULES
                                      if s != "mixed" or args.topo.startswith("bcube")]
        if args.fail:
            if args.fail not in {s.name for s in Topology.parse(args.topo).switches}:
                parser.error(f"{args.topo} has no switch {args.fail}")
            return failover_table(args.topo, schedules, args.floats, args.rate, args.lanes,
                                  args.fail, args.fail_at, args.json)
        return gst_table(args.topo, schedules, args.floats, args.rate, args.lanes, args.json)
    if args.command == "loss":
        return loss_table(args.topo, args.floats, args.rate, args.reorder)
    kinds = tuple(k for k in args.kinds.split(",") if k)
    unknown = [k for k in kinds if k not in FAULT_KINDS]
    if unknown or not kinds:
        parser.error(f"unknown fault kind(s) {', '.join(unknown) or '(none)'}: "
                     f"{', '.join(FAULT_KINDS)}")
    if args.command == "soak" and args.jobs < 0:
        parser.error(f"--jobs {args.jobs}: a number of processes, or 0 for one per CPU")
    if args.command == "run":
        verdict = run_seed(args.seed, args.topo, args.schedule, args.floats, args.rate,
                           args.loss, kinds, lanes=args.lanes)
        print_verdict(verdict)
        return 0 if verdict.ok else 1
    return soak(args.seeds, args.start, _topologies(args.topos), args.floats, args.rate,
                args.loss, kinds, lanes=args.lanes, jobs=args.jobs or os.cpu_count() or 1)


def gst_table(topo: str, schedules: list[str], floats: int, rate: float, lanes: int,
              as_json: bool = False) -> int:
    """Each schedule's simulated GST and busiest NIC's bytes beside the cost model's."""
    if not as_json:
        print(f"{topo}, {floats} floats per server, {rate / 1e6:g} Mbit/s links, {lanes} "
              "values per packet; virtual time, the real engine and pipeline")
        print(f"{'schedule':<11} {'GST s':>9} {'model s':>9} {'GST/model':>9} {'up/NIC':>12} "
              f"{'model up':>12} {'down/NIC':>12} {'model down':>12} {'wall s':>7} sums")
    right = True
    for schedule in schedules:
        started = time.monotonic()
        run = simulated_gst(topo, schedule, floats, rate, lanes)
        up, down = run.busiest
        model = run.prediction
        right &= run.correct
        if as_json:
            print(json.dumps({
                "topo": topo, "schedule": schedule, "floats": floats, "rate": rate,
                "lanes": lanes, "gst": run.gst, "model_gst": model.gst, "max_up": up,
                "max_down": down, "model_up": model.max_up, "model_down": model.max_down,
                "correct": run.correct, "wall_s": time.monotonic() - started,
                "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}),
                flush=True)
            continue
        print(f"{schedule:<11} {run.gst:>9.4f} {model.gst:>9.4f} {run.gst / model.gst:>9.3f} "
              f"{up:>12,} {model.max_up:>12,.0f} {down:>12,} {model.max_down:>12,.0f} "
              f"{time.monotonic() - started:>7.1f} {'right' if run.correct else 'WRONG'}")
    return 0 if right else 1


def failover_table(topo: str, schedules: list[str], floats: int, rate: float, lanes: int,
                   switch: str, at: float, as_json: bool = False) -> int:
    """Each schedule's call with ``switch`` killed ``at`` of the way through, in virtual time."""
    if not as_json:
        print(f"{topo}, {floats} floats per server, {rate / 1e6:g} Mbit/s links, {lanes} "
              f"values per packet; {switch} killed at {at:.0%} of the fault-free GST")
        print(f"{'schedule':<11} {'no fault s':>10} {'GST s':>9} {'re-planned':>10} "
              f"{'detect s':>9} {'recover s':>9} {'degraded s':>10} {'model s':>9} "
              f"{'/model':>7} {'wall s':>7} sums")
    right = True
    for schedule in schedules:
        started = time.monotonic()
        run = failover_gst(topo, schedule, floats, rate, switch, at, lanes)
        right &= run.correct
        wall = time.monotonic() - started
        if as_json:
            print(json.dumps(dataclasses.asdict(run) | {
                "topo": topo, "schedule": schedule, "floats": floats, "rate": rate,
                "lanes": lanes, "at": at, "wall_s": wall,
                "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}),
                flush=True)
            continue
        print(f"{schedule:<11} {run.no_fault_gst:>10.4f} {run.gst:>9.4f} {run.replanned:>10} "
              f"{run.detection:>9.4f} {run.recovery:>9.4f} {run.degraded_gst:>10.4f} "
              f"{run.predicted:>9.4f} {run.degraded_gst / run.predicted:>7.3f} {wall:>7.1f} "
              f"{'right' if run.correct else f'{run.errors} with an error'}")
    return 0 if right else 1


def _topologies(text: str) -> list[str]:
    """'bcube:2,2,star:4' -> ['bcube:2,2', 'star:4'] (a topology's own comma kept)."""
    out: list[str] = []
    for part in text.split(","):
        if ":" in part or not out:
            out.append(part)
        else:
            out[-1] += "," + part
    return out


if __name__ == "__main__":
    sys.exit(main())
