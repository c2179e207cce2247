"""Benchmark: aggregation packets and values per second through the software target and BMv2.

At each built lane width (``bml.protocol.BUILT_LANES``: 64, 256, 2208 values per packet) and
for 2, 4 and 8 workers, a closed-loop generator keeps ``WINDOW`` slots in flight: for every
slot it sends the N workers' contributions, and when the slot's result comes back it sends
the slot's next use. So the switch is always busy but never flooded, and what is measured is
its useful rate: contributions aggregated per second (the switch's own AGGREGATED counter over
the run), and values aggregated per second (that times the width).

Targets, all in one run, same traffic:

* the software target's pipeline alone, in-process, no I/O: frame by frame
  (``Pipeline.process`` in a loop) and in the batches a port brings (``process_batch`` of
  each worker's frames, up to 64 at a time, as the switch process runs it);
* the software target as a process on real veths (``bml-switch``, batched I/O: recvmmsg /
  sendmmsg), and at 64 lanes the same switch unbatched (``BML_BATCHED_IO=0``: a system call
  per frame) -- the baseline every ratio is taken against;
* BMv2's simple_switch_grpc as found ($BMV2_SWITCH, /opt/bmv2) and an optimised build
  ($BMV2_OPT_SWITCH, /opt/bmv2-opt: no logging macros, no elogger, -O3), where present.

The generator on the veths sends and receives with the same batched calls (one sendmmsg per
worker port per batch of completed slots), so that it is not what limits a fast target. A
width the software pipeline or p4src/build does not have (yet) is skipped with the reason
printed. Prints a table and writes results/switch_pps.{md,json}.

    python -m benchmarks.switch_pps [--seconds 4] [--workers 2 4 8] [--lanes 64 256 2208]
        [--targets pipeline pipeline-batched soft-unbatched soft bmv2 bmv2-opt]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import select
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bml.protocol import BUILT_LANES, DEFAULT_LANES
from emulation.testbed import SwitchTestbed, have_netns
from soft_target.switch import PORT_BATCH

RESULTS = Path("results")
JOB = 1
WINDOW = 128
USES = 4  # frames are built for 4 uses of a slot, whose offsets differ (see ``build_frames``)
BASELINE = "software target, unbatched"
TARGETS = {  # --targets name -> (label, kind, binary variable, default binary)
    "pipeline": ("software pipeline, in-process", "pipeline", None, None),
    "pipeline-batched": ("software pipeline, in-process, batches", "pipeline", None, None),
    "soft-unbatched": (BASELINE, "soft", None, None),
    "soft": ("software target, batched", "soft", None, None),
    "bmv2": ("BMv2 (default build)", "bmv2", "BMV2_SWITCH",
             "/opt/bmv2/bin/simple_switch_grpc"),
    "bmv2-opt": ("BMv2 (optimised build)", "bmv2", "BMV2_OPT_SWITCH",
                 "/opt/bmv2-opt/bin/simple_switch_grpc"),
}


def width_unsupported(lanes: int, kind: str) -> str | None:
    """Why a ``kind`` target cannot be measured at ``lanes`` here, or None."""
    from control_plane.p4info import PipelineNotBuilt, built_device_config, built_p4info
    from soft_target.pipeline import Pipeline

    try:
        built_p4info(lanes)
        built_device_config(lanes)
    except (PipelineNotBuilt, ValueError) as exc:
        return f"no {lanes}-lane build: {exc}"
    if kind in ("pipeline", "soft"):
        try:
            pipeline = Pipeline(lanes=lanes)
        except (TypeError, ValueError) as exc:
            return f"the software pipeline has no {lanes}-lane width yet: {exc}"
        if getattr(pipeline, "lanes", DEFAULT_LANES) != lanes:
            return f"the software pipeline ignores lanes={lanes}"
    return None


def provision(session, ports: list[int]) -> None:
    """The bench job on the switch behind ``session``: its pipeline, the ports' addresses, one
    aggregation group of ``WINDOW`` slots over every port."""
    from bml.frames import SWITCH_IP, SWITCH_MAC, host_ip, host_mac
    from bml.topology import Switch
    from control_plane.egress_rewrite import host_address_entry
    from control_plane.jobs import AggregationGroup
    from control_plane.provision import install_group

    session.push_pipeline()
    session.write_entries([host_address_entry(p, host_mac(p), host_ip(p), SWITCH_MAC, SWITCH_IP)
                           for p in ports])
    group = AggregationGroup("bench", JOB, dict(enumerate(ports)), result_mode=0, pool_base=0,
                             pool_size=WINDOW)
    install_group(session, Switch("bench", 0, 0, 1, tuple(ports)), group)


def build_frames(ports: list[int], lanes: int) -> list[list[list[bytes]]]:
    """frames[slot][use % USES][worker], built once. A use's offset is its own: a copy's next
    use with the offset of its last would be a late copy to the switch, a duplicate it
    answers from the stored sum; with four uses' frames, the two that share a version (and so
    a slot copy) in a row differ. IPv4 identifications are numbered as a host's would be."""
    from bml.frames import aggregation_frame
    from bml.protocol import PRIMING_OFFSET

    idents = itertools.count(1)
    values = np.arange(lanes, dtype=np.int64)
    return [[[aggregation_frame(p, JOB, w, s, use & 1, (use * WINDOW + s) * lanes % PRIMING_OFFSET,
                                values, ident=next(idents) & 0xFFFF)
              for w, p in enumerate(ports)] for use in range(USES)] for s in range(WINDOW)]


def measure_pipeline(lanes: int, workers: int, seconds: float, batched: bool = False) -> dict:
    """The pipeline alone: each worker's contributions to every slot in turn, through
    ``Pipeline.process`` (or ``batched``: ``process_batch``, up to a port's batch at a time)."""
    from control_plane.p4info import built_p4info
    from control_plane.session import SwitchSession
    from soft_target.batch import FrameBatch
    from soft_target.defines import STAT_AGGREGATED
    from soft_target.p4runtime_server import SoftP4RuntimeServicer, serve
    from soft_target.pipeline import Pipeline

    pipeline = Pipeline(lanes=lanes)
    servicer = SoftP4RuntimeServicer(pipeline, 1, lambda task: task(), lambda copies: None)
    server, port = serve(servicer, "127.0.0.1:0")
    try:
        session = SwitchSession("bench", f"127.0.0.1:{port}", 1, (0, 1),
                                p4info=built_p4info(lanes))
        ports = list(range(1, workers + 1))
        provision(session, ports)
        session.close()
    finally:
        server.stop(0)
    frames = build_frames(ports, lanes)
    batch = PORT_BATCH if batched else 1
    # A batch as the switch's receive ring holds it: its frames as rows (``FrameBatch``).
    batches = [[[(port, frames[slot][use][w] if batch == 1 else FrameBatch.of(
                  [frames[s][use][w] for s in range(slot, min(slot + batch, WINDOW))]))
                 for slot in range(0, WINDOW, batch)] for w, port in enumerate(ports)]
               for use in range(USES)]
    process = pipeline.process_batch if batched else pipeline.process
    before = pipeline.stats[STAT_AGGREGATED]
    start = time.perf_counter()
    end = start + seconds
    uses = 0
    while time.perf_counter() < end:
        for worker_batches in batches[uses % USES]:
            for port, what in worker_batches:
                process(port, what)
        uses += 1
    elapsed = time.perf_counter() - start
    aggregated = pipeline.stats[STAT_AGGREGATED] - before
    if aggregated != uses * WINDOW * workers:
        raise RuntimeError(f"the pipeline aggregated {aggregated} of "
                           f"{uses * WINDOW * workers} contributions")
    return {"workers": workers, "lanes": lanes, "seconds": elapsed, "aggregated": aggregated,
            "input_pps": aggregated / elapsed, "values_per_s": aggregated * lanes / elapsed,
            "completed_slots": uses * WINDOW, "slot_resends": 0}


def measure(workers: int, lanes: int, seconds: float, grpc: str) -> dict:
    """Runs inside the testbed's namespace: provision, generate, count. Returns figures."""
    from bml.frames import BML_START
    from bml.protocol import HEADER_STRUCT, Stat
    from bml.sockets import BatchReceiver, BatchSender
    from control_plane.p4info import Names, built_p4info
    from control_plane.session import SwitchSession
    from soft_target.switch import open_port

    session = SwitchSession("bench", grpc, 1, (0, 1), p4info=built_p4info(lanes))
    ports = list(range(1, workers + 1))
    provision(session, ports)
    frames = build_frames(ports, lanes)
    senders = [open_port(f"t{p}") for p in ports]
    for sock in senders[1:]:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # results go to port 1
    receiver_sock = senders[0]
    receiver = BatchReceiver(256)
    sender = BatchSender(256)
    version = [0] * WINDOW
    uses = [0] * WINDOW
    sent_at = [0.0] * WINDOW

    def send_uses(slots: list[int]) -> None:
        """The next use of every slot in ``slots``: one batch per worker port."""
        for w, sock in enumerate(senders):
            batch = [frames[s][uses[s] % USES][w] for s in slots]
            done = 0
            while done < len(batch):  # a full queue here is the generator's: wait for room
                sent, err = sender.send(sock, batch[done:])
                done += sent
                if err:
                    select.select([], [sock], [], 0.001)

    before = session.read_counter(Names.STATS)
    start = time.monotonic()
    send_uses(list(range(WINDOW)))
    for s in range(WINDOW):
        sent_at[s] = start
    completed = 0
    resends = 0
    end = start + seconds
    while (now := time.monotonic()) < end:
        select.select([receiver_sock], [], [], 0.005)
        ready: list[int] = []
        for _ in range(16):
            views = receiver.receive(receiver_sock)
            for view in views:
                if len(view) < BML_START + 16:
                    continue
                slot, ver = HEADER_STRUCT.unpack_from(view, BML_START)[5], view[BML_START + 1]
                if slot >= WINDOW or ver != version[slot]:
                    continue
                completed += 1
                version[slot] ^= 1
                uses[slot] += 1
                sent_at[slot] = now
                ready.append(slot)
            if len(views) < receiver.count:
                break
        if ready:
            send_uses(ready)
        # A lost packet would stall its slot: re-send it (after 1 s, longer than any queue
        # here, so a slow switch is not fed spurious copies).
        stale = [s for s in range(WINDOW) if now - sent_at[s] > 1.0]
        if stale:
            for s in stale:
                sent_at[s] = now
            resends += len(stale)
            send_uses(stale)
    elapsed = time.monotonic() - start
    time.sleep(0.3)
    after = session.read_counter(Names.STATS)
    session.close()
    aggregated = after[Stat.AGGREGATED] - before[Stat.AGGREGATED]
    return {"workers": workers, "lanes": lanes, "seconds": elapsed, "aggregated": aggregated,
            "input_pps": aggregated / elapsed, "values_per_s": aggregated * lanes / elapsed,
            "completed_slots": completed, "slot_resends": resends}


def targets(wanted: list[str]) -> list[tuple[str, str, str | None]]:
    """(label, target kind, switch binary) of every wanted target present here."""
    found = []
    for name in wanted:
        label, kind, variable, default = TARGETS[name]
        if kind != "bmv2":
            found.append((label, kind, None))
            continue
        path = os.environ.get(variable, default)
        if path and os.access(path, os.X_OK):
            found.append((label, kind, path))
        else:
            print(f"switch_pps: {label}: no binary at {path}: skipped", flush=True)
    return found


def run_one(label: str, kind: str, binary: str | None, workers: int, lanes: int,
            seconds: float, log_dir: Path) -> dict:
    if kind == "pipeline":
        return measure_pipeline(lanes, workers, seconds, batched=label != TARGETS["pipeline"][0])
    # The switch process inherits the environment; the generator keeps batched I/O.
    saved = os.environ.get("BML_BATCHED_IO")
    if label == BASELINE:
        os.environ["BML_BATCHED_IO"] = "0"
    try:
        bed = SwitchTestbed(kind, "bmlbench", log_dir, ports=workers, bmv2=binary)
    finally:
        if saved is None:
            os.environ.pop("BML_BATCHED_IO", None)
        else:
            os.environ["BML_BATCHED_IO"] = saved
    try:
        done = subprocess.run(
            ["ip", "netns", "exec", bed.namespace, sys.executable, "-m", "benchmarks.switch_pps",
             "--measure", str(workers), "--lanes", str(lanes), "--seconds", str(seconds)],
            capture_output=True, text=True, timeout=seconds + 180,
            cwd=Path(__file__).resolve().parent.parent)
        if done.returncode != 0:
            raise RuntimeError(f"measurement failed on {label}: {done.stderr[-2000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        bed.close()


def table(rows: list[dict]) -> str:
    """The figures, with each row's ratio to the unbatched software target at 64 lanes and
    the same number of workers (packets/s, and values/s)."""
    lines = ["| target | lanes | workers | aggregated packets/s | aggregated values/s | "
             "slots completed/s | packets/s vs baseline | values/s vs baseline |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in rows:
        base = next((r for r in rows if r["workers"] == row["workers"]
                     and r["target"] == BASELINE and r["lanes"] == DEFAULT_LANES), None)
        if base and base["input_pps"]:
            pps = f"{row['input_pps'] / base['input_pps']:.3g}x"
            values = f"{row['values_per_s'] / base['values_per_s']:.3g}x"
        else:
            pps = values = "n/a"
        lines.append(f"| {row['target']} | {row['lanes']} | {row['workers']} | "
                     f"{row['input_pps']:.0f} | {row['values_per_s']:.3g} | "
                     f"{row['completed_slots'] / row['seconds']:.0f} | {pps} | {values} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--lanes", type=int, nargs="+", default=list(BUILT_LANES))
    parser.add_argument("--targets", nargs="+", choices=list(TARGETS), default=list(TARGETS))
    parser.add_argument("--measure", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args.measure, args.lanes[0], args.seconds, "127.0.0.1:9559")))
        return 0
    reason = have_netns()
    wanted = targets(args.targets)
    if reason:
        print(f"switch_pps: no veth targets: {reason}", file=sys.stderr)
        wanted = [t for t in wanted if t[1] == "pipeline"]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bml-bench-") as tmp:
        for label, kind, binary in wanted:
            for lanes in args.lanes:
                if label == BASELINE and lanes != DEFAULT_LANES:
                    continue  # the baseline is the 64-lane build's
                why = width_unsupported(lanes, kind)
                if why:
                    print(f"switch_pps: {label} at {lanes} lanes skipped: {why}", flush=True)
                    continue
                for workers in args.workers:
                    figures = run_one(label, kind, binary, workers, lanes, args.seconds,
                                      Path(tmp))
                    figures["target"] = label
                    rows.append(figures)
                    print(f"{label:<31} {lanes:>4} lanes {workers} workers: "
                          f"{figures['input_pps']:>9.0f} packets/s "
                          f"{figures['values_per_s']:>11.4g} values/s", flush=True)
    text = table(rows)
    print("\n" + text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "switch_pps.md").write_text(
        f"# Aggregation packets and values per second (window {WINDOW} slots)\n\n"
        f"Ratios against the unbatched software target at {DEFAULT_LANES} lanes, same "
        f"workers, same run.\n\n{text}\n")
    (RESULTS / "switch_pps.json").write_text(json.dumps(rows, indent=1))
    print(f"\nwritten: {RESULTS / 'switch_pps.md'}, {RESULTS / 'switch_pps.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
