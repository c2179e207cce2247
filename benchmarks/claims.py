"""Benchmark: the seed's claims side by side, every scheme on the same shaped links.

For each BCube(n, k) asked for (N = n^k servers): a star of N + P servers (one switch, every
link shaped by tc to ``--rate``) runs, on its first N servers, PS sharded over the N, ring
allreduce (gloo), single-switch in-network aggregation (one NIC each, hosts/transport.py), and
on all N + P a dedicated PS (P = ceil(sqrt N) PS servers apart from the N workers); then
BCube(n, k) with the same servers and link rate runs the host-based, in-network and mixed BML
schedules on every NIC. Every participant runs ``benchmarks.worker`` (the same warm-up
barrier, timing and NIC byte counting for all). Each scheme's GST and bytes per NIC are
printed beside the cost model's prediction (bml/cost_model.py), with ratios to PS and ring,
and written to results/claims.{md,json,png}; so is the model's table of BCube against a
Fat-Tree for N from 9 to 4096.

    python -m benchmarks.claims [--rate 4mbit] [--sizes 256K 1M] [--bcubes 2,2 3,2]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import Run, float_check, have_torch, parse_size, run_workers
from bml import cost_model
from bml.cost_model import PS, PS_DEDICATED, RING, SINGLE_SWITCH, WirePrediction
from bml.protocol import ONE_NIC_WINDOW
from bml.schedule import DEFAULT_WINDOW, HOST_BASED, IN_FLIGHT, IN_NETWORK, MIXED, make_schedule
from bml.topology import Topology
from control_plane.fabric import Fabric
from emulation import net
from emulation.netns import Shaping, rate_bits
from hosts.quantize import check_sum

RESULTS = Path("results")
SCHEMES = (PS, PS_DEDICATED, RING, SINGLE_SWITCH, HOST_BASED, IN_NETWORK, MIXED)
FAT_TREE_N = (9, 16, 27, 64, 81, 256, 512, 729, 1024, 4096)  # rows shown in the summary


def cpu_times() -> tuple[float, float]:
    """(all, idle) jiffies of the whole machine, from /proc/stat."""
    values = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return float(sum(values)), float(values[3] + values[4])


def timed(state, scheme: str, workers: int, size: int, tmp: Path, extra: list[str],
          prediction: WirePrediction, **kwargs) -> tuple[Run, float, str]:
    """``run_workers`` with every call bounded (6x the prediction, at least a minute); with
    it, the share of the machine's CPU time that was busy meanwhile (ours and everybody
    else's: this machine is shared). A run that fails or hangs is tried once more, and the
    returned note says so."""
    bound = ["--timeout", f"{max(60.0, 6 * prediction.gst):.0f}"]
    note = ""
    for attempt in (1, 2):
        total0, idle0 = cpu_times()
        try:
            run = run_workers(state, scheme, workers, size, tmp, [*extra, *bound], **kwargs)
        except RuntimeError as exc:
            first = str(exc).strip().splitlines()[-1][:160]
            print(f"  attempt {attempt} failed: {first}", flush=True)
            if attempt == 2:
                raise
            note = f"first attempt failed ({first}); "
            time.sleep(2)
            continue
        total1, idle1 = cpu_times()
        return run, 1 - (idle1 - idle0) / max(1.0, total1 - total0), note
    raise AssertionError("unreachable")


def quantised_check(result: np.ndarray, grads: list[np.ndarray]) -> bool:
    return check_sum(result, grads)[2]


def row(scheme: str, topology: str, size: int, run: Run, prediction: WirePrediction,
        busy: float) -> dict:
    up, down = run.busiest()
    return {"scheme": scheme, "machine_busy": busy, "topology": topology, "elements": size,
            "gst": run.gst, "predicted_gst": prediction.gst,
            "goodput_bps": 32 * size / run.gst,
            "up_bytes": up, "down_bytes": down,
            "predicted_up": prediction.max_up, "predicted_down": prediction.max_down,
            "switches": prediction.switches, "correct": run.correct,
            "retransmissions": run.retransmissions,
            "tcp_retransmissions": run.tcp_retransmissions,
            "worker_seconds": [round(r["seconds"], 3) for r in run.reports]}


def run_star(n: int, k: int, sizes: list[int], rate: str, name: str, tmp: Path,
             torch_ok: bool, window: int, log) -> list[dict]:
    workers = n ** k
    servers = math.isqrt(workers - 1) + 1  # ceil(sqrt(N))
    spec = f"star:{workers + servers}"
    bps = rate_bits(rate)
    rows = []
    net.down(name)
    state = net.up(name, spec, "soft", Shaping(rate=rate))
    try:
        Fabric.load(state.run_dir / "fabric.json").add_job(1, list(range(workers)))
        ring_extra = ["--master", state.topo().nics(0)[0].ip]
        for size in sizes:
            # (scheme, worker scheme, its options, participants, check, prediction)
            runs = [
                (SINGLE_SWITCH, "bml", ["--interface", "eth0", "--window", str(window)],
                 workers, quantised_check,
                 cost_model.predict_single_switch(size, workers, bps, window)),
                (PS, "ps", [], workers, float_check, cost_model.predict_ps(size, workers, bps)),
                (PS_DEDICATED, "ps", ["--servers", str(servers)], workers + servers,
                 float_check, cost_model.predict_ps(size, workers, bps, servers)),
            ]
            if torch_ok:
                runs.append((RING, "ring", ring_extra, workers, float_check,
                             cost_model.predict_ring(size, workers, bps)))
            for scheme, worker, extra, participants, check, prediction in runs:
                time.sleep(1)  # let the last run's queues drain
                run, busy, note = timed(state, worker, workers, size, tmp, extra, prediction,
                                        participants=participants, check=check)
                rows.append({**row(scheme, spec, size, run, prediction, busy), "note": note})
                log(rows[-1])
    finally:
        net.down(name)
    for r in rows:
        r["pair"] = f"{n},{k}"
        if r["scheme"] == PS_DEDICATED:
            r["note"] += f"{servers} PS servers apart from the {workers} workers"
    return rows


def run_bcube(n: int, k: int, sizes: list[int], rate: str, name: str, tmp: Path,
              window: int, log) -> list[dict]:
    spec = f"bcube:{n},{k}"
    topology = Topology.parse(spec)
    bps = rate_bits(rate)
    rows = []
    net.down(name)
    state = net.up(name, spec, "soft", Shaping(rate=rate))
    try:
        Fabric.load(state.run_dir / "fabric.json").add_scheduled_job(1)
        for size in sizes:
            for schedule in (HOST_BASED, IN_NETWORK, MIXED):
                time.sleep(1)
                prediction = cost_model.predict_schedule(make_schedule(topology, schedule),
                                                         size, bps, window)
                run, busy, note = timed(state, "bml", topology.num_servers, size, tmp,
                                        ["--schedule", schedule, "--window", str(window)],
                                        prediction, check=quantised_check)
                rows.append({**row(schedule, spec, size, run, prediction, busy),
                             "pair": f"{n},{k}", "note": note})
                log(rows[-1])
    finally:
        net.down(name)
    return rows


def log_row(r: dict) -> None:
    print(f"{r['topology']:>10} {r['scheme']:>13} {r['elements']:>8}: GST {r['gst']:7.2f} s, "
          f"predicted {r['predicted_gst']:7.2f} s ({r['gst'] / r['predicted_gst']:.2f}); "
          f"up {r['up_bytes'] / r['predicted_up']:.3f}, "
          f"down {r['down_bytes'] / r['predicted_down']:.3f} of predicted bytes; "
          f"re-sent frames={r['retransmissions']} segments={r['tcp_retransmissions']}, "
          f"machine busy {100 * r['machine_busy']:.0f}%, "
          f"correct={r['correct']}", flush=True)


def machine() -> str:
    """The machine, its load, and the code measured (others may be changing it)."""
    load = os.getloadavg()
    git = ["git", "-C", str(Path(__file__).resolve().parent.parent)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip() or "unknown"
    changed = subprocess.run([*git, "status", "--porcelain", "--", "hosts", "bml",
                              "soft_target", "benchmarks"], capture_output=True,
                             text=True).stdout.split("\n")
    changed = [line[3:] for line in changed if line.strip()]
    return (f"{platform.node()}: {os.cpu_count()} cores, Linux {platform.release()}, "
            f"Python {platform.python_version()}; load average before the run "
            f"{load[0]:.2f}/{load[1]:.2f}/{load[2]:.2f}; code at {head}"
            + (f" with uncommitted changes to {', '.join(changed)}" if changed else ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", default="2mbit")
    parser.add_argument("--window", type=int, default=DEFAULT_WINDOW,
                        help="slots per switch channel (BML schedules)")
    parser.add_argument("--one-nic-window", type=int, default=ONE_NIC_WINDOW,
                        help="slots in flight of the single-switch scheme")
    parser.add_argument("--sizes", type=parse_size, nargs="+", default=[1 << 18, 1 << 20])
    parser.add_argument("--bcubes", nargs="+", default=["2,2", "3,2"],
                        help="n,k of each BCube (a star of the same servers is run beside)")
    parser.add_argument("--name", default="clm", help="emulation name prefix (1-5 characters)")
    args = parser.parse_args(argv)
    torch_ok = have_torch()
    started = time.monotonic()
    host = machine()
    print(host, flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bml-claims-") as tmp:
        for pair in args.bcubes:
            n, k = (int(x) for x in pair.split(","))
            rows += run_star(n, k, args.sizes, args.rate, f"{args.name}s", Path(tmp),
                             torch_ok, args.one_nic_window, log_row)
            rows += run_bcube(n, k, args.sizes, args.rate, f"{args.name}b", Path(tmp),
                              args.window, log_row)
    minutes = (time.monotonic() - started) / 60
    write_results(rows, args, torch_ok, host, minutes)
    return 0


# --- tables and the plot -------------------------------------------------------------------

def scheme_table(rows: list[dict]) -> list[str]:
    lines = ["| floats | scheme | topology | switches | GST s | predicted s | meas/pred | "
             "goodput Mbit/s | up bytes/NIC | pred. up | down bytes/NIC | pred. down | "
             "vs PS | vs ring | re-sent frames / TCP segments | CPU busy | correct |",
             "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | "
             "---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        same = [x for x in rows if x["elements"] == r["elements"]]
        ps = next((x["gst"] for x in same if x["scheme"] == PS), None)
        ring = next((x["gst"] for x in same if x["scheme"] == RING), None)
        lines.append(
            f"| {r['elements']} | {r['scheme']} | {r['topology']} | {r['switches']} | "
            f"{r['gst']:.2f} | {r['predicted_gst']:.2f} | "
            f"{r['gst'] / r['predicted_gst']:.2f} | {r['goodput_bps'] / 1e6:.2f} | "
            f"{r['up_bytes']} | {r['predicted_up']:.0f} | {r['down_bytes']} | "
            f"{r['predicted_down']:.0f} | "
            f"{'%.2f' % (r['gst'] / ps) if ps else 'n/a'} | "
            f"{'%.2f' % (r['gst'] / ring) if ring else 'n/a'} | "
            f"{r['retransmissions']} / {r['tcp_retransmissions']} | "
            f"{100 * r['machine_busy']:.0f}% | {'yes' if r['correct'] else 'NO'} |")
    return lines


def fat_tree_table(all_rows: bool = False) -> list[str]:
    lines = ["| N | BCube(n,k) | BCube switches | Fat-Tree of n-port switches (layers, "
             "switches) | switches BCube/Fat-Tree | k/5 | GST/PS host-based | in-network | "
             "mixed | 1/k | payload only: host-based | in-network | mixed |",
             "| ---: | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | "
             "---: | ---: |"]
    for r in cost_model.claim_table():
        if not all_rows and r.servers not in FAT_TREE_N:
            continue
        tree = (f"{r.fat_tree[0]} layers, {r.fat_tree[1]}" if r.fat_tree
                else "none (n // 2 < 2)")
        ratio = f"{r.switch_ratio:.3f}" if r.switch_ratio else "n/a"
        g, p = r.gst_ratio, r.payload_ratio
        lines.append(
            f"| {r.servers} | ({r.n},{r.k}) | {r.bcube_switches} | {tree} | {ratio} | "
            f"{r.k / 5:.2f} | {g[HOST_BASED]:.3f} | {g[IN_NETWORK]:.3f} | {g[MIXED]:.3f} | "
            f"{1 / r.k:.3f} | {p[HOST_BASED]:.3f} | {p[IN_NETWORK]:.3f} | {p[MIXED]:.3f} |")
    return lines


def write_results(rows: list[dict], args, torch_ok: bool, host: str, minutes: float) -> None:
    rate = rate_bits(args.rate)
    out = [f"Machine: {host}. Links shaped to {rate / 1e6:g} Mbit/s per direction (tbf, "
           f"the project's default queue); software target; BML schedules {args.window} slots "
           f"per switch channel ({IN_FLIGHT} in flight), single-switch {args.one_nic_window}; "
           f"total run {minutes:.1f} min. CPU busy: the whole machine's busy share during "
           "the scheme's run (everybody's processes).", ""]
    for pair in args.bcubes:
        n, k = (int(x) for x in pair.split(","))
        mine = [r for r in rows if r["pair"] == pair]
        out += [f"### BCube({n},{k}) and a star of the same {n ** k} servers", "",
                *scheme_table(mine), ""]
        out += [f"- {r['scheme']}, {r['elements']} floats: {r['note']}" for r in mine
                if r.get("note")] + [""]
    if not torch_ok:
        out += ["ring: torch is not installed here (pip install -e .[torch]); no ring rows.",
                ""]
    out += ["### BCube against a Fat-Tree (cost model, every header counted; GST ratios to "
            "PS sharded over the same N on a full-bisection Fat-Tree)", "", *fat_tree_table()]
    table = "\n".join(out)
    print("\n" + table)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "claims.md").write_text("# The seed's claims, measured side by side\n\n"
                                       + table + "\n")
    (RESULTS / "claims_fat_tree.md").write_text(
        "# BCube(n,k) against a Fat-Tree of n-port switches, N = 9..4096\n\n"
        + "\n".join(fat_tree_table(all_rows=True)) + "\n")
    (RESULTS / "claims.json").write_text(json.dumps(
        {"machine": host, "rate_bps": rate, "minutes": minutes, "rows": rows}, indent=1))
    plot(rows, args, rate)
    print(f"written: {RESULTS}/claims.md, claims_fat_tree.md, claims.json, claims.png")


def plot(rows: list[dict], args, rate: float) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    size = max(r["elements"] for r in rows)
    pairs = args.bcubes
    fig, axes = plt.subplots(1, len(pairs), figsize=(5.5 * len(pairs), 3.8), squeeze=False)
    for ax, pair in zip(axes[0], pairs, strict=True):
        n, k = (int(x) for x in pair.split(","))
        servers = n ** k
        mine = [r for r in rows if r["elements"] == size and r["pair"] == pair]
        x = np.arange(len(mine))
        ax.bar(x - 0.2, [r["gst"] for r in mine], 0.4, label="measured")
        ax.bar(x + 0.2, [r["predicted_gst"] for r in mine], 0.4, label="predicted")
        ax.set_xticks(x, [r["scheme"] for r in mine], rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("GST (s)")
        ax.set_title(f"BCube({n},{k}) / star of {servers}: {size / (1 << 20):g}M floats, "
                     f"{rate / 1e6:g} Mbit/s", fontsize=9)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / "claims.png", dpi=120)


if __name__ == "__main__":
    sys.exit(main())
