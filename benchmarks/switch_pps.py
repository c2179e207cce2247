"""Benchmark: aggregation packets per second through the software target and through BMv2.

For 2, 4 and 8 workers, a closed-loop generator keeps ``window`` slots in flight: for every
slot it sends the N workers' contributions (AF_PACKET, pre-built frames), and when the slot's
result comes back it sends the slot's next use. So the switch is always busy but never
flooded, and what is measured is its useful rate: contributions aggregated per second (the
switch's own AGGREGATED counter over the run). Targets: the software target, and BMv2's
simple_switch_grpc as found ($BMV2_SWITCH, /opt/bmv2) and an optimised build
($BMV2_OPT_SWITCH, /opt/bmv2-opt: no logging macros, no elogger, -O3), all in one run, same
traffic. Prints a table and writes results/switch_pps.{md,json}.

    python -m benchmarks.switch_pps [--seconds 4] [--workers 2 4 8]
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

from bml.protocol import VALUES_PER_PACKET
from emulation.testbed import SwitchTestbed, have_netns

RESULTS = Path("results")
JOB = 1
WINDOW = 128


def measure(workers: int, seconds: float, grpc: str) -> dict:
    """Runs inside the testbed's namespace: provision, generate, count. Returns figures."""
    from bml.frames import (
        BML_START,
        SWITCH_IP,
        SWITCH_MAC,
        aggregation_frame,
        host_ip,
        host_mac,
    )
    from bml.protocol import HEADER_STRUCT, PRIMING_OFFSET, Stat
    from bml.topology import Switch
    from control_plane.egress_rewrite import host_address_entry
    from control_plane.jobs import AggregationGroup
    from control_plane.p4info import Names
    from control_plane.provision import install_group
    from control_plane.session import SwitchSession
    from soft_target.switch import open_port

    session = SwitchSession("bench", grpc, 1, (0, 1))
    session.push_pipeline()
    ports = list(range(1, workers + 1))
    session.write_entries([host_address_entry(p, host_mac(p), host_ip(p), SWITCH_MAC, SWITCH_IP)
                           for p in ports])
    group = AggregationGroup("bench", JOB, dict(enumerate(ports)), 0, 0, WINDOW)
    install_group(session, Switch("bench", 0, 0, 1, tuple(ports)), group)
    # frames[slot][version][worker], built once; every use of a slot carries its own offset
    # (patched in as it is sent): a copy's next use with the offset of its last is a late copy
    # to the switch, a duplicate it ignores (IPv4 identifications numbered as the frames are
    # built, as a host's would be)
    idents = itertools.count(1)
    frames = [[[aggregation_frame(p, JOB, w, s, v, 0, range(64), ident=next(idents) & 0xFFFF)
                for w, p in enumerate(ports)] for v in (0, 1)] for s in range(WINDOW)]
    uses = [0] * WINDOW
    offset_start = BML_START + 12  # the header's offset field

    def use_frame(slot: int, worker: int) -> bytes:
        frame = frames[slot][uses[slot] & 1][worker]
        offset = ((uses[slot] * WINDOW + slot) * 64 % PRIMING_OFFSET).to_bytes(4, "big")
        return frame[:offset_start] + offset + frame[offset_start + 4:]

    senders = [open_port(f"t{p}") for p in ports]
    for sock in senders[1:]:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    receiver = senders[0]
    receiver.setblocking(False)
    version = [0] * WINDOW
    sent_at = [0.0] * WINDOW
    before = session.read_counter(Names.STATS)
    start = time.monotonic()
    for s in range(WINDOW):
        for w, sock in enumerate(senders):
            sock.send(use_frame(s, w))
        sent_at[s] = start
    completed = 0
    resends = 0
    buffer = bytearray(2048)
    end = start + seconds
    while (now := time.monotonic()) < end:
        select.select([receiver], [], [], 0.005)
        while True:
            try:
                size = receiver.recv_into(buffer)
            except BlockingIOError:
                break
            if size < 58:
                continue
            slot, ver = HEADER_STRUCT.unpack_from(buffer, BML_START)[5], buffer[BML_START + 1]
            if slot >= WINDOW or ver != version[slot]:
                continue
            completed += 1
            version[slot] ^= 1
            uses[slot] += 1
            sent_at[slot] = now
            for w, sock in enumerate(senders):
                sock.send(use_frame(slot, w))
        for s in range(WINDOW):  # a lost packet would stall its slot: re-send it (after 1 s,
            # longer than any queue here, so a slow switch is not fed spurious copies)
            if now - sent_at[s] > 1.0:
                sent_at[s] = now
                resends += 1
                for w, sock in enumerate(senders):
                    sock.send(use_frame(s, w))
    elapsed = time.monotonic() - start
    time.sleep(0.3)
    after = session.read_counter(Names.STATS)
    session.close()
    aggregated = after[Stat.AGGREGATED] - before[Stat.AGGREGATED]
    return {"workers": workers, "seconds": elapsed, "aggregated": aggregated,
            "input_pps": aggregated / elapsed, "completed_slots": completed,
            "slot_resends": resends}


def targets() -> list[tuple[str, str, str | None]]:
    """(label, target kind, switch binary) of every target present here."""
    found = [("software target", "soft", None)]
    for label, variable, default in (
            ("BMv2 (default build)", "BMV2_SWITCH", "/opt/bmv2/bin/simple_switch_grpc"),
            ("BMv2 (optimised build)", "BMV2_OPT_SWITCH",
             "/opt/bmv2-opt/bin/simple_switch_grpc")):
        path = os.environ.get(variable, default)
        if path and os.access(path, os.X_OK):
            found.append((label, "bmv2", path))
    return found


def run_one(kind: str, binary: str | None, workers: int, seconds: float, log_dir: Path) -> dict:
    bed = SwitchTestbed(kind, "bmlbench", log_dir, ports=workers, bmv2=binary)
    try:
        done = subprocess.run(
            ["ip", "netns", "exec", bed.namespace, sys.executable, "-m", "benchmarks.switch_pps",
             "--measure", str(workers), "--seconds", str(seconds)],
            capture_output=True, text=True, timeout=seconds + 120,
            cwd=Path(__file__).resolve().parent.parent)
        if done.returncode != 0:
            raise RuntimeError(f"measurement failed on {kind}: {done.stderr[-2000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        bed.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--measure", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args.measure, args.seconds, "127.0.0.1:9559")))
        return 0
    reason = have_netns()
    if reason:
        print(f"switch_pps: cannot run: {reason}", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory(prefix="bml-bench-") as tmp:
        for label, kind, binary in targets():
            for workers in args.workers:
                figures = run_one(kind, binary, workers, args.seconds, Path(tmp))
                figures["target"] = label
                rows.append(figures)
                print(f"{label:<24} {workers} workers: {figures['input_pps']:>9.0f} "
                      "aggregated packets/s", flush=True)
    lines = ["| target | workers | aggregated packets/s | slots completed/s | vs optimised BMv2 |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for row in rows:
        reference = next((r["input_pps"] for r in rows if r["workers"] == row["workers"]
                          and r["target"] == "BMv2 (optimised build)"), None)
        ratio = f"{row['input_pps'] / reference:.2f}x" if reference else "n/a"
        lines.append(f"| {row['target']} | {row['workers']} | {row['input_pps']:.0f} | "
                     f"{row['completed_slots'] / row['seconds']:.0f} | {ratio} |")
    table = "\n".join(lines)
    print("\n" + table)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "switch_pps.md").write_text(
        f"# Aggregation packets/s ({VALUES_PER_PACKET} values per packet, "
        f"window {WINDOW} slots)\n\n"
        f"{table}\n")
    (RESULTS / "switch_pps.json").write_text(json.dumps(rows, indent=1))
    print(f"\nwritten: {RESULTS / 'switch_pps.md'}, {RESULTS / 'switch_pps.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
