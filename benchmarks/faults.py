"""Benchmark: loss, reordering and faults, on the same shaped links (star:4, every NIC).

Two tables, printed and written to results/faults.{md,json}:

1. **Loss**: the GST and goodput of a push (every server, in-network, ``--size`` floats) at
   0, 1, 5 and 10% loss each way with 25% reordering (nftables on every link, ``bml-net
   shape``), against the same push with neither on the same links, in the same run; the
   targets are 95% of the lossless goodput at 1%, 80% at 5% and 60% at 10%. Timed by
   ``benchmarks.worker``: a warm-up allreduce (the barrier), then ``--repeat`` timed pushes,
   the GST the median of the pushes, each from the last worker's start to the last sum
   (one push at 500K floats varies by +-10% under loss).
2. **Faults**, each injected with bml-net's own functions once the switch has added a
   quarter of the push: a worker killed, a worker frozen (SIGSTOP), the switch killed, a NIC
   losing its carrier, the controller killed. For each: how long until every survivor had
   stopped (detection), how long from the fault until a push of the same job works again with
   the fault repaired (recovery), that push's GST against the no-fault GST and against the
   cost model's prediction, and whether every sum was right. A star has no other path: a
   failed switch or link fails the push (named) and the job works after the repair.
3. **Re-planned** on bcube:3,2, in-network, mixed and host-based (``--bcube-rate``): a
   level-0 switch killed before the push starts and once its switches have added 25%, 50%
   and 90% of the push's contributions (host-based, where the switches only route: of the
   packets they route), and a level-1 NIC losing its carrier at 25%. Every worker re-plans
   (the failed group's level in the hosts over detours) and finishes: detection (the fault to
   the last worker giving up on the old plan), recovery (to the last worker's first sum of the
   new plan), the degraded attempt's GST against the no-fault push's and against the cost
   model's prediction for the degraded plan, the sums, and after the repair the next push's
   GST against the no-fault one (the switch is used again).

    python -m benchmarks.faults [--rate 20mbit] [--size 1M] [--repeat 3] [--skip-faults]
                                [--bcube-rate 2mbit] [--bcube-size 256K] [--skip-replans]
                                [--only-replans] [--schedules in-network mixed host-based]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import parse_size, run_workers
from bml import cost_model
from bml.schedule import HOST_BASED, IN_NETWORK, MIXED, make_schedule
from control_plane.fabric import Fabric
from emulation import net
from emulation.netns import Shaping, rate_bits
from emulation.workers import (
    Push,
    progress_stat,
    run_pushes,
    start_pushes,
    switch_total,
    wait_for_progress,
    wait_pushes,
)
from hosts.quantize import check_sum

RESULTS = Path("results")
NAME = "bfault"
JOB = 7
LOSSES = (0.0, 1.0, 5.0, 10.0)
REORDER = 25.0
TARGETS = {1.0: 0.95, 5.0: 0.80, 10.0: 0.60}  # share of the lossless goodput to reach


def gradients(size: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(size).astype(np.float32) for _ in range(4)]


def push(state, grads: list[np.ndarray], tmp: Path, timeout: float = 600) -> tuple[float, bool,
                                                                                   int]:
    """(GST, every sum right, retransmissions) of one push by all four servers."""
    results = run_pushes(state, JOB, [Push(s, s, g, None) for s, g in enumerate(grads)], tmp, 4,
                         ["--timeout", str(timeout)], timeout=timeout + 30)
    ok = all(r.returncode == 0 and check_sum(np.load(r.output), grads)[2] for r in results)
    if not ok:
        return float("nan"), False, 0
    return (max(float(r.figure("seconds")) for r in results), True,
            sum(int(r.figure("retransmissions")) for r in results))


def loss_table(state, size: int, rate: str, tmp: Path, repeat: int) -> list[dict]:
    """Each push through ``benchmarks.worker`` (a warm-up allreduce as the barrier, then the
    timed one), so no worker's time includes waiting for the others to start."""
    rows = []
    base = None
    for loss, reorder in ((0.0, 0.0), *((loss, REORDER) for loss in LOSSES)):
        net.reshape(state, Shaping(rate, None, loss, reorder))
        run = run_workers(state, "bml", 4, size, tmp,
                          ["--job", str(JOB), "--schedule", IN_NETWORK, "--repeat", str(repeat)],
                          check=lambda total, grads: check_sum(total, grads)[2])
        gst, ok, retx = run.gst, run.correct, run.retransmissions
        goodput = 32 * size / gst
        base = base or goodput
        rows.append({"loss": loss, "reorder": reorder, "gst": gst, "goodput_bps": goodput,
                     "share": goodput / base, "correct": ok, "retransmissions": retx,
                     "target": TARGETS.get(loss) if reorder else None})
        print(f"  loss {loss:4.1f}% reorder {reorder:4.1f}%: GST {gst:6.2f} s, goodput "
              f"{goodput / 1e6:5.2f} Mbit/s = {goodput / base:4.0%} of lossless, {retx} re-sends, "
              f"{'correct' if ok else 'WRONG'}", flush=True)
    net.reshape(state, Shaping(rate, None, 0.0, 0.0))
    return rows


def fault_row(state, fault: str, size: int, tmp: Path, baseline: float,
              predicted: float) -> dict:
    """Inject ``fault`` mid-push; time the detection and the recovery (with the repair)."""
    grads = gradients(size, 2)
    running = start_pushes(state, JOB, [Push(s, s, g, None) for s, g in enumerate(grads)], tmp,
                           4, ["--timeout", "60"])
    wait_for_progress(state, size // 64, running=running)  # a quarter of the contributions
    victim = running[2][1]
    failed = time.monotonic()
    if fault == "worker killed":
        os.kill(victim.pid, signal.SIGKILL)
    elif fault == "worker frozen":
        os.kill(victim.pid, signal.SIGSTOP)
    elif fault == "switch killed":
        net.fail_switch(state, "s0")
    elif fault == "NIC down":
        net.fail_link(state, "h2", "eth0", end="switch")
    elif fault == "controller killed":
        net.fail_controller(state)
    others = [r for i, r in enumerate(running) if i != 2 or fault in (
        "switch killed", "NIC down", "controller killed")]
    results = wait_pushes(others, 120)
    detection = time.monotonic() - failed
    if fault == "worker frozen":
        os.kill(victim.pid, signal.SIGKILL)
    if "worker" in fault:
        victim.communicate()
    stopped = sum(r.returncode != 0 for r in results)
    if fault == "switch killed":
        net.restore_switch(state, "s0")
    elif fault == "NIC down":
        net.restore_link(state, "h2", "eth0")
    elif fault == "controller killed":
        net.restore_controller(state)
    grads = gradients(size, 3)
    while True:  # until a push of the same job works again (a restarted switch: re-provisioned)
        gst, ok, _ = push(state, grads, tmp, timeout=120)
        if ok or time.monotonic() - failed > 180:
            break
    recovery = time.monotonic() - failed
    row = {"fault": fault, "where": "h2" if "worker" in fault or "NIC" in fault else
           ("s0" if "switch" in fault else "monitor"),
           "stopped": stopped, "detection": detection if stopped else None,
           "recovery": recovery, "gst_after": gst, "vs_no_fault": gst / baseline,
           "vs_predicted": gst / predicted, "correct": ok}
    if fault == "controller killed":
        row["detection"] = None  # nothing to detect: the pushes went on
        row["pushes_during"] = "all correct" if stopped == 0 else f"{stopped} failed"
    seen = f"all stopped {detection:.1f} s after it" if stopped else "nothing stopped"
    print(f"  {fault:18s}: {stopped} push(es) stopped, {seen}, "
          f"working again {recovery:.1f} s after the fault, next GST {gst:.2f} s "
          f"({gst / baseline:.2f}x no-fault), {'correct' if ok else 'WRONG'}", flush=True)
    return row


REPLAN_CASES = (("bcube:3,2", IN_NETWORK), ("bcube:3,2", MIXED), ("bcube:3,2", HOST_BASED))
# (fault, share of the push's contributions added when it comes; None: before the push)
REPLAN_FAULTS = (("switch killed", None), ("switch killed", 0.25), ("switch killed", 0.5),
                 ("switch killed", 0.9), ("NIC down", 0.25))
REPLAN_NAME = "bfrp"


def bcube_push(state, schedule: str, size: int, tmp: Path, seed: int, start: bool = False):
    """Every server pushes on every NIC (``start``: returns the running pushes)."""
    servers = state.topo().num_servers
    rng = np.random.default_rng(seed)
    grads = [rng.standard_normal(size).astype(np.float32) for _ in range(servers)]
    args = (state, JOB, [Push(s, s, g, None) for s, g in enumerate(grads)], tmp, servers,
            ["--timeout", "120", "--schedule", schedule])
    if start:
        return start_pushes(*args), grads
    results = run_pushes(*args, timeout=150)
    ok = all(r.returncode == 0 and check_sum(np.load(r.output), grads)[2] for r in results)
    gst = max(float(r.figure("seconds")) for r in results) if ok else float("nan")
    return gst, ok, results


def replan_row(state, schedule: str, fault: str, size: int, tmp: Path, baseline: float,
               rate: str, moment: float | None, progress: int) -> dict:
    """``fault`` once the switches' ``progress_stat`` grew by ``moment`` of a push's
    ``progress`` (None: before the push starts)."""
    topo = state.topo()
    if fault == "switch killed":
        switch = topo.switch_at(0, topo.n ** (topo.k - 1) - 1)
        where, broken = switch.name, (0, switch.index)
    else:
        server = 1
        where, broken = f"h{server}:eth1", (1, topo.switch_index(server, 1))

    def inject() -> float:
        if fault == "switch killed":
            net.fail_switch(state, where)
        else:
            net.fail_link(state, f"h{server}", "eth1", end="switch")
        return time.monotonic()

    if moment is None:
        failed = inject()
        (running, grads) = bcube_push(state, schedule, size, tmp, 4, start=True)
    else:
        (running, grads) = bcube_push(state, schedule, size, tmp, 4, start=True)
        wait_for_progress(state, int(progress * moment), running=running,
                          stat=progress_stat(schedule))
        failed = inject()
    results = wait_pushes(running, 200)
    ok = all(r.returncode == 0 and check_sum(np.load(r.output), grads)[2] for r in results)
    replanned = [r for r in results if r.returncode == 0 and "replans=" in r.stdout]
    wrong = [r for r in results
             if r.returncode == 0 and not check_sum(np.load(r.output), grads)[2]]
    # A failure at the push's end: the sums returned all the same, blocks asked of a
    # neighbour that held them (docs/PROTOCOL.md, "A failure at the end").
    at_end = [r for r in results if r.returncode == 0 and "a failure came at the end" in r.stdout]
    row = {"topology": topo.spec, "schedule": schedule, "fault": fault, "where": where,
           "moment": "start" if moment is None else f"{moment:.0%}",
           "replanned": len(replanned), "at_end": len(at_end),
           "salvaged": sum(int(r.figure("salvaged")) for r in results
                           if r.returncode == 0 and "salvaged=" in r.stdout),
           "workers": len(results), "correct": ok,
           "failed": sum(r.returncode != 0 for r in results), "wrong": len(wrong)}
    if replanned:
        degraded = make_schedule(topo, schedule).degraded({broken})
        predicted = cost_model.predict(degraded, size, rate_bits(rate)).gst
        gst = max(float(r.figure("degraded_seconds")) for r in replanned)
        row |= {"detection": max(float(r.figure("gave_up_at")) for r in replanned) - failed,
                "recovery": max(float(r.figure("resumed_at")) for r in replanned) - failed,
                "gst_degraded": gst, "vs_no_fault": gst / baseline, "predicted": predicted,
                "vs_predicted": gst / predicted}
    elif said := [r.stderr[-600:] for r in results if r.stderr.strip()]:
        print("\n".join(said))
    if fault == "switch killed":
        net.restore_switch(state, where)
    else:
        net.restore_link(state, f"h{server}", "eth1")
    while True:  # the repaired part used again (a restarted switch: once re-provisioned)
        gst_after, after_ok, results = bcube_push(state, schedule, size, tmp, 5)
        if after_ok or time.monotonic() - failed > 180:
            break
    row |= {"after_repair": gst_after / baseline,
            "after_replans": sum("replans=" in r.stdout for r in results)}
    print(f"  {topo.spec} {schedule:10s} {fault:13s} {where:8s} at {row['moment']:5s}: "
          f"{len(replanned)}/{len(results)} re-planned"
          + (f", {len(at_end)} saw it at the end ({row['salvaged']} blocks salvaged)"
             if at_end else "")
          + (f", detection {row['detection']:.1f} s, recovery {row['recovery']:.1f} s, degraded "
             f"GST {row['gst_degraded']:.2f} s ({row['vs_no_fault']:.2f}x no-fault, "
             f"{row['vs_predicted']:.2f}x its prediction)" if replanned else "")
          + (", correct" if ok else f", {row['failed']} failed, {len(wrong)} wrong")
          + f"; after the repair {gst_after:.2f} s", flush=True)
    return row


def replan_table(rate: str, size: int, tmp: Path, schedules: list[str]) -> list[dict]:
    rows = []
    for spec, schedule in REPLAN_CASES:
        if schedule not in schedules:
            continue
        net.down(REPLAN_NAME)
        state = net.up(REPLAN_NAME, spec, shaping=Shaping(rate, None, 0.0, 0.0))
        try:
            Fabric.load(state.run_dir / "fabric.json").add_scheduled_job(JOB, schedule)
            bcube_push(state, schedule, size, tmp, 1)  # warm-up (first-run costs)
            stat = progress_stat(schedule)
            before = switch_total(state, stat)
            baseline, ok, _ = bcube_push(state, schedule, size, tmp, 2)
            progress = switch_total(state, stat) - before
            print(f"  {spec} {schedule}: no-fault GST {baseline:.2f} s, {progress} "
                  f"{stat}{'' if ok else ' (WRONG sums)'}", flush=True)
            for fault, moment in REPLAN_FAULTS:
                rows.append(replan_row(state, schedule, fault, size, tmp, baseline, rate,
                                       moment, progress) | {"no_fault": baseline})
        finally:
            net.down(REPLAN_NAME)
    return rows


def replan_markdown(rows: list[dict], rate: str, size: int) -> list[str]:
    lines = ["", f"Re-planned (every link {rate}, {size} floats per push, every NIC):", "",
             "| topology | schedule | fault | where | when | re-planned | saw it at the end "
             "(blocks salvaged) | detection s | recovery s | degraded GST s | / no-fault | "
             "/ predicted (degraded plan) | sums | next push after repair / no-fault |",
             "| --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | "
             "--- | ---: |"]
    for r in rows:
        figures = (f"{r['detection']:.1f} | {r['recovery']:.1f} | {r['gst_degraded']:.2f} | "
                   f"{r['vs_no_fault']:.2f} | {r['vs_predicted']:.2f}" if "detection" in r
                   else "n/a | n/a | n/a | n/a | n/a")
        sums = ("correct" if r["correct"] else
                f"{r['wrong']} wrong, {r['failed']} failed with an error")
        lines.append(f"| {r['topology']} | {r['schedule']} | {r['fault']} | {r['where']} | "
                     f"{r['moment']} | {r['replanned']}/{r['workers']} | "
                     f"{r['at_end']}/{r['workers']} ({r['salvaged']}) | {figures} | {sums} | "
                     f"{r['after_repair']:.2f} |")
    return lines


def markdown(loss_rows: list[dict], fault_rows: list[dict], rate: str, size: int,
             replan_rows: list[dict], bcube_rate: str, bcube_size: int) -> str:
    lines = [f"star:4, every link {rate} each way, {size} floats per push, in-network on every "
             "NIC (the default path)", "",
             "| loss each way | reordering | GST s | goodput Mbit/s | share of lossless | target "
             "| re-sends (last push) | sums |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    if not loss_rows:
        lines = []
    for r in loss_rows:
        target = f">= {r['target']:.0%}" if r["target"] else ""
        lines.append(f"| {r['loss']:g}% | {r['reorder']:g}% | {r['gst']:.2f} | "
                     f"{r['goodput_bps'] / 1e6:.2f} | {r['share']:.0%} | {target} | "
                     f"{r['retransmissions']} | {'correct' if r['correct'] else 'WRONG'} |")
    if fault_rows:
        lines += ["", "| fault | where | survivors stopped | detection s | recovery s "
                  "(fault to a working push, repair included) | next GST / no-fault | next GST / "
                  "predicted | sums |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
        for r in fault_rows:
            detection = f"{r['detection']:.1f}" if r["detection"] is not None else "n/a"
            lines.append(f"| {r['fault']} | {r['where']} | {r['stopped']} | {detection} | "
                         f"{r['recovery']:.1f} | {r['vs_no_fault']:.2f} | "
                         f"{r['vs_predicted']:.2f} | {'correct' if r['correct'] else 'WRONG'} |")
    if replan_rows:
        lines += replan_markdown(replan_rows, bcube_rate, bcube_size)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", default="20mbit")
    parser.add_argument("--size", type=parse_size, default=parse_size("1M"))
    parser.add_argument("--repeat", type=int, default=3,
                        help="timed pushes per row of the loss table (GST: their median)")
    parser.add_argument("--skip-faults", action="store_true")
    parser.add_argument("--bcube-rate", default="2mbit",
                        help="link rate of the re-planning runs (9 workers on this machine's "
                        "cores: higher rates measure the CPU)")
    parser.add_argument("--bcube-size", type=parse_size, default=parse_size("256K"))
    parser.add_argument("--skip-replans", action="store_true")
    parser.add_argument("--only-replans", action="store_true")
    parser.add_argument("--schedules", nargs="+", default=[s for _t, s in REPLAN_CASES],
                        choices=[s for _t, s in REPLAN_CASES], help="of the re-planning runs")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    loss_rows: list[dict] = []
    fault_rows: list[dict] = []
    replan_rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        if not args.only_replans:
            net.down(NAME)
            try:
                state = net.up(NAME, "star:4", shaping=Shaping(args.rate, None, 0.0, 0.0))
                Fabric.load(state.run_dir / "fabric.json").add_scheduled_job(JOB, IN_NETWORK)
                print(f"loss and reordering, star:4, {args.rate} links, {args.size} floats:")
                loss_rows = loss_table(state, args.size, args.rate, Path(tmp), args.repeat)
                if not args.skip_faults:
                    baseline = loss_rows[0]["gst"]
                    predicted = cost_model.predict(make_schedule(state.topo(), IN_NETWORK),
                                                   args.size, rate_bits(args.rate)).gst
                    print(f"faults (no-fault GST {baseline:.2f} s, predicted {predicted:.2f} "
                          "s):")
                    for fault in ("worker killed", "worker frozen", "switch killed",
                                  "NIC down", "controller killed"):
                        fault_rows.append(fault_row(state, fault, args.size, Path(tmp),
                                                    baseline, predicted))
            finally:
                net.down(NAME)
        if not (args.skip_replans or args.skip_faults):
            print(f"re-planned around a failed switch or link ({args.bcube_rate} links, "
                  f"{args.bcube_size} floats):")
            replan_rows = replan_table(args.bcube_rate, args.bcube_size, Path(tmp),
                                       args.schedules)
    text = markdown(loss_rows, fault_rows, args.rate, args.size, replan_rows, args.bcube_rate,
                    args.bcube_size)
    print(text)
    RESULTS.mkdir(exist_ok=True)
    stem = "faults-replans" if args.only_replans else "faults"  # a part run keeps the whole
    (RESULTS / f"{stem}.md").write_text(text)
    (RESULTS / f"{stem}.json").write_text(json.dumps(
        {"loss": loss_rows, "faults": fault_rows, "replans": replan_rows}, indent=1))
    met = all(r["share"] >= r["target"] for r in loss_rows if r["target"])
    correct = all(r["correct"] for r in loss_rows + fault_rows + replan_rows)
    return 0 if met and correct else 1

if __name__ == "__main__":
    sys.exit(main())
