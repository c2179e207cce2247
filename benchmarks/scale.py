"""Benchmark: BCube at scale in virtual time, beside the cost model and the baselines.

For each BCube(n, k) every schedule's whole call at ``--floats`` values per server runs in
virtual time (``bml-sim gst``: the real engine and pipeline code), each in a process of its
own so that its wall time and peak memory are its own. Beside it: the cost model's GST, and
the model's GST of a sharded PS, of gloo's ring and of one switch per rack (SwitchML-style,
one NIC per server) on a Fat-Tree of ``n``-port switches for the same servers; the BCube's
switches over the Fat-Tree's, and each schedule's GST over PS's (the seed claims k/5 and
1/k). Nothing is sampled: the simulator's cost is about N x F / lanes frames (see
docs/RESULTS.md for what that allows on this machine). Written to results/scale.{md,json,png}.
With ``--fail-at``, each call instead has switch s0_0 killed that far into it (a fraction of
its fault-free GST): when the workers gave up on the old plan and resumed on the new one, and
the degraded plan's GST beside the model's (results/NAME.md, ``--name`` scale-failover).

    python -m benchmarks.scale [--sizes bcube:4,2 bcube:8,2] [--floats 256K] [--rate 100e6]
    python -m benchmarks.scale --sizes bcube:4,3 bcube:8,3 --fail-at 0.5 --name scale-failover
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from benchmarks.common import parse_size
from bml import cost_model
from bml.protocol import DEFAULT_LANES
from bml.schedule import MIXED, SCHEDULES
from bml.topology import Topology

RESULTS = Path("results")
SIZES = ("bcube:4,2", "bcube:3,3", "bcube:8,2", "bcube:4,3", "bcube:6,3", "bcube:16,2")
FAILED_SWITCH = "s0_0"  # level 0's first: on every server's path, none has it as a detour
MODEL_GAP = 0.10  # simulator and model further apart than this: the table says why


def simulate(topo: str, schedule: str, floats: int, rate: float,
             fault: tuple[str, ...] = ()) -> dict | None:
    """One ``bml-sim gst`` row in a process of its own, with its wall time and peak RSS;
    ``fault``: ``bml-sim gst``'s ``--fail`` arguments."""
    process = subprocess.Popen(
        [sys.executable, "-m", "simulation.cli", "gst", "--topo", topo, "--schedule",
         schedule, "--floats", str(floats), "--rate", str(rate), "--json", *fault],
        stdout=subprocess.PIPE, text=True)
    out = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode not in (0, 1) or not out.strip():  # 1: a row with a wrong sum
        print(f"scale: bml-sim gst --topo {topo} --schedule {schedule} exited "
              f"{process.returncode} without a row (its error is above); no row", flush=True)
        return None
    row = json.loads(out.strip().splitlines()[-1])
    row["peak_mb"] = usage.ru_maxrss / 1024
    return row


def baselines(topology: Topology, floats: int, rate: float) -> dict:
    """The model's GST of the baselines for the same servers, and the Fat-Tree's switches."""
    servers = topology.num_servers
    tree = cost_model.fat_tree(servers, topology.n)
    return {"ps": cost_model.predict_ps(floats, servers, rate).gst,
            "ring": cost_model.predict_ring(floats, servers, rate).gst,
            "rack": cost_model.predict_single_switch(floats, servers, rate).gst,
            "fat_tree_switches": tree[1] if tree else None,
            "bcube_switches": cost_model.bcube_switches(topology.n, topology.k)}


def base_key(topo: str, floats: int) -> str:
    """The baselines' key: they depend on the servers and the floats."""
    return f"{topo} {floats}"


def table(rows: list[dict], base: dict[str, dict]) -> list[str]:
    lines = ["| BCube | N | floats | schedule | sim GST s | model GST s | sim / model | PS s | "
             "ring s | switch per rack s | BML / PS | 1/k | switches BCube / Fat-Tree | k/5 | "
             "wall s | peak MB | sums |",
             "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | "
             "---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        topology = Topology.parse(r["topo"])
        b = base[base_key(r["topo"], r["floats"])]
        switches = (f"{b['bcube_switches']} / {b['fat_tree_switches']} = "
                    f"{b['bcube_switches'] / b['fat_tree_switches']:.2f}"
                    if b["fat_tree_switches"] else f"{b['bcube_switches']} / none")
        lines.append(
            f"| {r['topo']} | {topology.num_servers} | {r['floats']:,} | {r['schedule']} | "
            f"{r['gst']:.4f} | "
            f"{r['model_gst']:.4f} | {r['gst'] / r['model_gst']:.3f} | {b['ps']:.4f} | "
            f"{b['ring']:.4f} | {b['rack']:.4f} | {r['gst'] / b['ps']:.3f} | "
            f"{1 / topology.k:.3f} | {switches} | {topology.k / 5:.2f} | "
            f"{r['wall_s']:.0f} | {r['peak_mb']:.0f} | "
            f"{'right' if r['correct'] else 'WRONG'} |")
    return lines


def failover_table(rows: list[dict]) -> list[str]:
    lines = ["| BCube | N | floats | schedule | switch killed at | fault-free GST s | "
             "GST with the fault s | re-planned | detection s | recovery s | degraded GST s | "
             "model, degraded schedule s | degraded / model | wall s | peak MB | sums |",
             "| --- | ---: | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
             "| ---: | ---: | ---: | --- |"]
    for r in rows:
        lines.append(
            f"| {r['topo']} | {Topology.parse(r['topo']).num_servers} | {r['floats']:,} | "
            f"{r['schedule']} | "
            f"{r['switch']} at {r['fault_at']:.4f} s ({r['at']:.0%}) | {r['no_fault_gst']:.4f} | "
            f"{r['gst']:.4f} | {r['replanned']} | {r['detection']:.3f} | {r['recovery']:.3f} | "
            f"{r['degraded_gst']:.4f} | {r['predicted']:.4f} | "
            f"{r['degraded_gst'] / r['predicted']:.3f} | {r['wall_s']:.0f} | "
            f"{r['peak_mb']:.0f} | {_sums(r)} |")
    return lines


def _sums(row: dict) -> str:
    """Every sum right, or how many workers ended with an error (a wrong sum fails the
    simulator's own check: there is none)."""
    if row["correct"]:
        return "right"
    return f"{row.get('errors', '?')} of {Topology.parse(row['topo']).num_servers} with an error"


def plot(rows: list[dict], base: dict[str, dict], path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for k in sorted({Topology.parse(r["topo"]).k for r in rows}):
        for schedule in SCHEDULES:
            mine = [r for r in rows if r["schedule"] == schedule
                    and Topology.parse(r["topo"]).k == k]
            if not mine:
                continue
            xs = [Topology.parse(r["topo"]).num_servers for r in mine]
            ps = [base[base_key(r["topo"], r["floats"])]["ps"] for r in mine]
            ax.plot(xs, [r["gst"] / b for r, b in zip(mine, ps, strict=True)], marker="o",
                    label=f"k={k} {schedule} (simulated)")
            ax.plot(xs, [r["model_gst"] / b for r, b in zip(mine, ps, strict=True)], ls=":",
                    color=ax.lines[-1].get_color())
        ax.axhline(1 / k, color="grey", lw=0.8, ls="--")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("servers N")
    ax.set_ylabel("GST / PS's GST on a Fat-Tree (model)")
    ax.set_title("BML on BCube in virtual time (dotted: cost model; dashed: 1/k)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def simulated_rows(args: argparse.Namespace, fault: tuple[str, ...] = ()):
    """Every schedule's row of every size (``simulate``), those bml-sim refused left out."""
    for topo in args.sizes:
        for schedule in SCHEDULES:
            if schedule == MIXED and Topology.parse(topo).k < 2:
                continue
            row = simulate(topo, schedule, args.floats, args.rate, fault)
            if row is not None:
                yield row


def failover(args: argparse.Namespace) -> int:
    """The ``--fail-at`` run: every schedule of every size with a switch killed mid-call."""
    rows = []
    fault = ("--fail", FAILED_SWITCH, "--fail-at", str(args.fail_at))
    for row in simulated_rows(args, fault):
        topo, schedule = row["topo"], row["schedule"]
        rows.append(row)
        print(f"{topo:>11} {schedule:>10}: detection {row['detection']:.3f} s, degraded "
              f"{row['degraded_gst']:.4f} s (model {row['predicted']:.4f}), "
              f"{row['wall_s']:.0f} s wall, {row['peak_mb']:.0f} MB", flush=True)
    correct = all(r["correct"] for r in rows)
    rows, _ = kept_rows(args.name, rows, {})
    lines = [f"{args.rate / 1e6:g} Mbit/s links, {DEFAULT_LANES} values per packet; switch "
             f"{FAILED_SWITCH} killed part-way through a call, in virtual time", "",
             *failover_table(rows)]
    print("\n" + "\n".join(lines))
    (RESULTS / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    (RESULTS / f"{args.name}.json").write_text(json.dumps({"rows": rows}, indent=1))
    return 0 if correct else 1


def kept_rows(name: str, rows: list[dict], base: dict[str, dict]
              ) -> tuple[list[dict], dict[str, dict]]:
    """``rows`` and ``base`` with an earlier run's under the same name that these do not
    replace (same topology, schedule, floats and fault), so that sizes too big for one sitting
    can run one at a time."""
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    if not path.exists():
        return rows, base
    earlier = json.loads(path.read_text())

    def key(row: dict) -> tuple:
        return row["topo"], row["schedule"], row["floats"], row.get("at")

    new = {key(row) for row in rows}
    return ([r for r in earlier["rows"] if key(r) not in new] + rows,
            earlier.get("baselines", {}) | base)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", nargs="+", default=list(SIZES))
    parser.add_argument("--floats", type=parse_size, default=256 << 10)
    parser.add_argument("--rate", type=float, default=100e6)
    parser.add_argument("--name", default="scale",
                        help="results/NAME.{md,json,png} (another run's rows stay)")
    parser.add_argument("--fail-at", type=float, metavar="FRACTION",
                        help="instead, kill switch s0_0 this far into each call (a fraction of "
                        "its fault-free GST): detection, recovery, and the degraded plan's GST "
                        "beside the model's")
    args = parser.parse_args(argv)
    if args.fail_at is not None:
        return failover(args)
    lines = [f"float32 per server as given, {args.rate / 1e6:g} Mbit/s links, {DEFAULT_LANES} "
             "values per packet; whole calls in virtual time", ""]
    base = {base_key(topo, args.floats): baselines(Topology.parse(topo), args.floats,
                                                   args.rate) for topo in args.sizes}
    rows = []
    for row in simulated_rows(args):
        rows.append(row)
        print(f"{row['topo']:>11} {row['schedule']:>10}: {row['gst']:.4f} s (model "
              f"{row['model_gst']:.4f}), {row['wall_s']:.0f} s wall, {row['peak_mb']:.0f} MB",
              flush=True)
    correct = all(r["correct"] for r in rows)
    rows, base = kept_rows(args.name, rows, base)
    lines += table(rows, base)
    gaps = [r for r in rows if abs(r["gst"] / r["model_gst"] - 1) > MODEL_GAP]
    if gaps:
        lines.append(f"\n{len(gaps)} of {len(rows)} rows differ from the model by more than "
                     f"{MODEL_GAP:.0%}.")
    print("\n" + "\n".join(lines))
    (RESULTS / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    (RESULTS / f"{args.name}.json").write_text(json.dumps({"rows": rows, "baselines": base},
                                                         indent=1))
    plot(rows, base, RESULTS / f"{args.name}.png")
    return 0 if correct else 1


if __name__ == "__main__":
    sys.exit(main())
