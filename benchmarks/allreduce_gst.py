"""Benchmark: in-network allreduce against gloo's ring allreduce on the same shaped star.

bml-net brings up star:N on the software target with every link shaped by tc to ``--rate``
(a rate the switch keeps up with). For each size, N workers push through the switch with
``bml-host`` (in-network aggregation), then torch.distributed's gloo ``all_reduce`` runs in the
same namespaces over the same links (the switch only forwards). Printed and written to
results/allreduce_gst.{md,json,png}: GST (slowest worker), goodput, bytes per NIC against the
link-bound model (bml/cost_model.py) and the ratio to gloo.

    python -m benchmarks.allreduce_gst [--rate 10mbit] [--sizes 1M 4M] [--workers 4]

torch is optional (`pip install torch==2.13.0`); without it the gloo rows say so.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

from bml import cost_model
from control_plane.fabric import Fabric
from emulation import net
from emulation.netns import Shaping, rate_bits
from emulation.workers import check_sum

RESULTS = Path("results")
REPO = Path(__file__).resolve().parent.parent
# Both schemes run alike: a small warm-up allreduce that also waits for every worker (a
# barrier), then the timed allreduce; each worker reports its seconds and its NIC's bytes.
WORKER_PRELUDE = """
import json, sys, time
import numpy as np
rank, world, size, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
grad = np.random.default_rng([size, rank]).standard_normal(size).astype(np.float32)
def nic_tx_bytes():
    return int(open("/sys/class/net/eth0/statistics/tx_bytes").read())
"""
BML_SCRIPT = WORKER_PRELUDE + textwrap.dedent("""
    from hosts.api import Worker
    with Worker(job=1, rank=rank, world=world, timeout=600) as worker:
        worker.allreduce(np.ones(1024, np.float32))
        sent = nic_tx_bytes()
        t0 = time.monotonic()
        total = worker.allreduce(grad)
        seconds = time.monotonic() - t0
        sent = nic_tx_bytes() - sent
        stats = worker.last_stats
    np.save(out, total)
    print(json.dumps({"seconds": seconds, "nic_bytes": sent,
                      "retransmissions": stats.retransmissions}))
""")
GLOO_SCRIPT = WORKER_PRELUDE + textwrap.dedent("""
    import datetime, os
    import torch, torch.distributed as dist
    os.environ["GLOO_SOCKET_IFNAME"] = "eth0"
    dist.init_process_group("gloo", init_method=f"tcp://{sys.argv[5]}:29500", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=120))
    torch.set_num_threads(1)
    x = torch.from_numpy(grad.copy())
    dist.all_reduce(torch.ones(1024))
    dist.barrier()
    sent = nic_tx_bytes()
    t0 = time.monotonic()
    dist.all_reduce(x)
    seconds = time.monotonic() - t0
    sent = nic_tx_bytes() - sent
    np.save(out, x.numpy())
    print(json.dumps({"seconds": seconds, "nic_bytes": sent}))
    dist.destroy_process_group()
""")


def parse_size(text: str) -> int:
    match = re.fullmatch(r"(\d+)([KMkm]?)", text)
    if not match:
        raise argparse.ArgumentTypeError(f"bad size {text!r}")
    return int(match.group(1)) * {"": 1, "k": 1 << 10, "m": 1 << 20}[match.group(2).lower()]


def have_torch() -> bool:
    return subprocess.run([sys.executable, "-c", "import torch.distributed"],
                          capture_output=True).returncode == 0


def gradients(workers: int, size: int) -> list[np.ndarray]:
    """What the worker scripts sum (same seeds), to check their results against."""
    return [np.random.default_rng([size, rank]).standard_normal(size).astype(np.float32)
            for rank in range(workers)]


def run_workers(state, script_text: str, workers: int, size: int, tmp: Path,
                extra: list[str] | None = None) -> dict:
    """The script in every server's namespace at once; GST is the slowest worker's time."""
    script = tmp / "worker.py"
    script.write_text(script_text)
    outs = [tmp / f"sum{rank}.npy" for rank in range(workers)]
    processes = [subprocess.Popen(
        ["ip", "netns", "exec", state.namespace_of(rank), sys.executable, str(script),
         str(rank), str(workers), str(size), str(outs[rank]), *(extra or [])],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)}) for rank in range(workers)]
    reports = []
    for process in processes:
        try:
            out, err = process.communicate(timeout=900)
        except subprocess.TimeoutExpired:
            process.kill()
            out, err = process.communicate()
        if process.returncode != 0:
            raise RuntimeError(f"worker failed: {err[-1500:]}")
        reports.append(json.loads(out.strip().splitlines()[-1]))
    grads = gradients(workers, size)
    return {"gst": max(r["seconds"] for r in reports),
            "nic_bytes": max(r["nic_bytes"] for r in reports),
            "retransmissions": sum(r.get("retransmissions", 0) for r in reports),
            "correct": all(check_sum(np.load(out), grads)[2] for out in outs)}


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
                bml = run_workers(state, BML_SCRIPT, args.workers, size, Path(tmp))
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
                    gloo = run_workers(state, GLOO_SCRIPT, args.workers, size, Path(tmp),
                                       [state.topo().nics(0)[0].ip])
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
