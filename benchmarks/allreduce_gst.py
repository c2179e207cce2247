"""Benchmark: in-network allreduce against gloo's ring allreduce on the same shaped star.

bml-net brings up star:N on the software target with every link shaped by tc to ``--rate``
(a rate the switch keeps up with). For each size, N workers push through the switch with
``bml-host`` (in-network aggregation), then torch.distributed's gloo ``all_reduce`` runs in the
same namespaces over the same links (the switch only forwards). Printed and written to
results/allreduce_gst.{md,json,png}: GST (``benchmarks.common.Run.gst``), goodput, bytes per
NIC against the link-bound model (bml/cost_model.py) and the ratio to gloo.

    python -m benchmarks.allreduce_gst [--rate 10mbit] [--sizes 1M 4M] [--workers 4]

torch is optional (`pip install torch==2.13.0`); without it the gloo rows say so.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import float_check, have_torch, parse_size, run_workers
from bml import cost_model
from control_plane.fabric import Fabric
from emulation import net
from emulation.netns import Shaping, rate_bits
from hosts.quantize import check_sum

RESULTS = Path("results")


def run(state, scheme: str, workers: int, size: int, tmp: Path,
        extra: list[str] | None = None) -> dict:
    """Both schemes run alike (``benchmarks/worker.py``): a small warm-up allreduce that also
    waits for every worker (a barrier), then the timed allreduce; GST from the last worker's
    start to the last sum (``Run.gst``), bytes the busiest NIC's sent."""
    check = float_check if scheme == "ring" else (
        lambda total, grads: check_sum(total, grads)[2])
    result = run_workers(state, scheme, workers, size, tmp, extra, check=check)
    return {"gst": result.gst, "nic_bytes": result.busiest()[0],
            "retransmissions": result.retransmissions, "correct": result.correct}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", default="10mbit")
    parser.add_argument("--sizes", type=parse_size, nargs="+", default=[1 << 20, 4 << 20])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--name", default="bench")
    args = parser.parse_args(argv)
    rate = rate_bits(args.rate)
    torch_ok = have_torch()
    rows = []
    net.down(args.name)
    state = net.up(args.name, f"star:{args.workers}", "soft", Shaping(rate=args.rate))
    try:
        Fabric.load(state.run_dir / "fabric.json").add_job(1, list(range(args.workers)))
        with tempfile.TemporaryDirectory(prefix="bml-gst-") as tmp:
            for size in args.sizes:
                bml = run(state, "bml", args.workers, size, Path(tmp))
                model = cost_model.in_network_gst(size, rate)
                row = {"elements": size, "workers": args.workers, "rate_bps": rate,
                       "bml_gst": bml["gst"], "bml_model_gst": model,
                       "bml_nic_bytes": bml["nic_bytes"],
                       "bml_model_bytes": cost_model.in_network_wire_bytes(size),
                       "bml_goodput_bps": 32 * size / bml["gst"],
                       "bml_retransmissions": bml["retransmissions"],
                       "bml_correct": bml["correct"],
                       "ring_model_gst": cost_model.ring_gst(size, args.workers, rate)}
                print(f"in-network {size:>8} floats: GST {bml['gst']:.2f} s (model {model:.2f} s)"
                      f", correct={bml['correct']}", flush=True)
                if torch_ok:
                    time.sleep(1)
                    gloo = run(state, "ring", args.workers, size, Path(tmp),
                               ["--master", state.topo().nics(0)[0].ip])
                    row.update({"gloo_gst": gloo["gst"], "gloo_nic_bytes": gloo["nic_bytes"],
                                "gloo_correct": gloo["correct"]})
                    print(f"gloo       {size:>8} floats: GST {gloo['gst']:.2f} s "
                          f"(model {row['ring_model_gst']:.2f} s), correct={gloo['correct']}",
                          flush=True)
                rows.append(row)
    finally:
        net.down(args.name)
    write_results(rows, rate, torch_ok)
    return 0


def write_results(rows: list[dict], rate: float, torch_ok: bool) -> None:
    share = cost_model.payload_share()
    lines = [f"Links shaped to {rate / 1e6:g} Mbit/s per direction; payload share of a BML "
             f"packet {share:.3f}, so the goodput ceiling is {rate * share / 1e6:.2f} Mbit/s.",
             "",
             "| floats | scheme | GST s | model s | GST/model | goodput Mbit/s | "
             "% of ceiling | bytes/NIC | model bytes | vs gloo |",
             "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        vs = f"{r['bml_gst'] / r['gloo_gst']:.2f}" if "gloo_gst" in r else "n/a"
        lines.append(
            f"| {r['elements']} | in-network | {r['bml_gst']:.2f} | {r['bml_model_gst']:.2f} | "
            f"{r['bml_gst'] / r['bml_model_gst']:.2f} | {r['bml_goodput_bps'] / 1e6:.2f} | "
            f"{100 * r['bml_goodput_bps'] / (rate * share):.0f} | {r['bml_nic_bytes']} | "
            f"{r['bml_model_bytes']} | {vs} |")
        if "gloo_gst" in r:
            lines.append(
                f"| {r['elements']} | gloo ring | {r['gloo_gst']:.2f} | "
                f"{r['ring_model_gst']:.2f} | {r['gloo_gst'] / r['ring_model_gst']:.2f} | "
                f"{32 * r['elements'] / r['gloo_gst'] / 1e6:.2f} | | {r['gloo_nic_bytes']} | "
                f"{cost_model.ring_wire_bytes(r['elements'], r['workers']):.0f} | 1.00 |")
    if not torch_ok:
        lines += ["", "gloo: torch is not installed here (pip install torch==2.13.0)."]
    table = "\n".join(lines)
    print("\n" + table)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "allreduce_gst.md").write_text("# In-network allreduce vs gloo\n\n" + table + "\n")
    (RESULTS / "allreduce_gst.json").write_text(json.dumps(rows, indent=1))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(6, 3.5))
    labels = [f"{r['elements'] / (1 << 20):g}M" for r in rows]
    x = np.arange(len(rows))
    ax.bar(x - 0.3, [r["bml_gst"] for r in rows], 0.2, label="in-network (measured)")
    ax.bar(x - 0.1, [r["bml_model_gst"] for r in rows], 0.2, label="in-network (model)")
    if torch_ok:
        ax.bar(x + 0.1, [r.get("gloo_gst", 0) for r in rows], 0.2, label="gloo ring (measured)")
    ax.bar(x + 0.3, [r["ring_model_gst"] for r in rows], 0.2, label="ring (model)")
    ax.set_xticks(x, labels)
    ax.set_xlabel("float32 elements per worker")
    ax.set_ylabel("GST (s)")
    ax.set_title(f"star:{rows[0]['workers']}, links {rate / 1e6:g} Mbit/s")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / "allreduce_gst.png", dpi=120)
    print(f"written: {RESULTS}/allreduce_gst.md, .json, .png")


if __name__ == "__main__":
    sys.exit(main())
