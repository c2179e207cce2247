"""What a run is expected to show and what it showed: the cost model's figures, one run's
summary, the results files (table, JSON, plot) and the checks that set the exit status."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from train.model import LENET_ELEMENTS

RESULTS = Path("results")
SCHEMES = ("bml", "gloo")
LABELS = {"bml": "BML-INA", "gloo": "gloo ring allreduce"}
COLOURS = {"bml": "#4477aa", "gloo": "#cc6677"}


def summarise(reports: list[dict]) -> dict:
    """One run's figures: per-epoch loss/accuracy (train loss averaged over ranks), JCT (the
    slowest rank), sync share, and whether every rank holds the same parameters."""
    epochs = []
    for i, first in enumerate(reports[0]["epochs"]):
        epochs.append({"epoch": first["epoch"],
                       "train_loss": float(np.mean([r["epochs"][i]["train_loss"]
                                                    for r in reports])),
                       "test_loss": first["test_loss"],
                       "test_accuracy": first["test_accuracy"],
                       "accuracy_per_rank": [r["epochs"][i]["test_accuracy"] for r in reports]})
    step = float(np.mean([r["step_seconds"] for r in reports]))
    alone = float(np.mean([r["step_seconds_alone"] for r in reports]))
    summary = {"epochs": epochs, "jct": max(r["jct"] for r in reports),
               "steps": reports[0]["steps"], "step_seconds": step,
               "step_seconds_alone": alone,
               "sync_share": max(0.0, step - alone) / step,
               "hashes": sorted({r["parameter_hash"] for r in reports}),
               "final_accuracy": epochs[-1]["test_accuracy"]}
    if "hook_seconds" in reports[0]:
        summary["hook_seconds_per_step"] = float(np.mean(
            [r["hook_seconds"] / r["steps"] for r in reports]))
        summary["retransmissions"] = sum(r["retransmissions"] for r in reports)
        summary["hook_calls_per_step"] = reports[0]["hook_calls"] / reports[0]["steps"]
        summary["schedule"] = reports[0]["schedule"]
    return summary


def expected(topo: str, rate: str, schedule: str | None) -> dict:
    """The link-bound cost model's GST per step for BML-INA (the planned schedule on
    ``topo``) and for gloo's ring on ``launch.gloo_spec(topo)``, and their ratio."""
    from bml import cost_model
    from bml.schedule import make_schedule
    from bml.topology import Topology

    topology = Topology.parse(topo)
    bits = cost_model.rate_bits(rate)
    chosen = (make_schedule(topology, schedule) if schedule
              else cost_model.choose(topology, LENET_ELEMENTS, bits))
    ours = cost_model.predict(chosen, LENET_ELEMENTS, bits).gst
    ring = cost_model.ring_gst(LENET_ELEMENTS, topology.num_servers, bits)
    return {"schedule": chosen.name, "bml_gst": ours, "gloo_gst": ring, "ratio": ours / ring}


def result_stem(topo: str, schedule: str | None = None) -> Path:
    """results/train_lenet5_<topology>[_<schedule>]: one set of files per topology (and
    schedule, when one was asked for instead of the planner's)."""
    return RESULTS / ("train_lenet5_" + topo.replace(":", "").replace(",", "")
                      + (f"_{schedule}" if schedule else ""))


def model_jct_ratio(results: dict) -> float | None:
    """The JCT ratio the cost model gives with the measured compute time of a step:
    (compute + BML-INA's GST) / (compute + gloo's GST)."""
    runs, model = results["runs"], results["expected"]
    if not set(SCHEMES) <= runs.keys():
        return None
    compute = float(np.mean([runs[s]["step_seconds_alone"] for s in SCHEMES]))
    return (compute + model["bml_gst"]) / (compute + model["gloo_gst"])


def write_results(results: dict, args: argparse.Namespace) -> list[str]:
    """Table (md), figures (json), loss curves + JCT bars (png); the table's lines."""
    specs = results["topology"]
    lines = [f"LeNet-5, one rank per server, links shaped to {args.rate}, {args.epochs} epochs, "
             f"batch {args.batch} per rank, lr {args.lr}, seed {args.seed}; BML-INA on "
             f"{specs['bml']} ({results['expected']['schedule']}), gloo on {specs['gloo']}",
             "",
             "| scheme | final test accuracy | JCT s | steps | step s | compute alone s |"
             " sync share | ranks identical |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for scheme, s in results["runs"].items():
        name = f"{LABELS[scheme]} ({s['schedule']})" if "schedule" in s else LABELS[scheme]
        lines.append(f"| {name} | {100 * s['final_accuracy']:.2f}% | {s['jct']:.1f} | "
                     f"{s['steps']} | {s['step_seconds']:.3f} | {s['step_seconds_alone']:.4f} | "
                     f"{100 * s['sync_share']:.0f}% | {len(s['hashes']) == 1} |")
    runs = results["runs"]
    predicted = model_jct_ratio(results)
    if predicted is not None:
        results["jct_ratio"] = runs["bml"]["jct"] / runs["gloo"]["jct"]
        results["jct_ratio_model"] = predicted
        lines += ["", f"JCT BML-INA / gloo: {results['jct_ratio']:.2f} measured; cost model "
                      f"{predicted:.2f} with the measured compute time (GST ratio "
                      f"{results['expected']['ratio']:.2f})"]
    stem = result_stem(specs["bml"], args.schedule)
    RESULTS.mkdir(exist_ok=True)
    stem.with_suffix(".md").write_text("# LeNet-5 through BML-INA and gloo\n\n"
                                       + "\n".join(lines) + "\n")
    stem.with_suffix(".json").write_text(json.dumps(results, indent=1))
    plot(results, stem.with_suffix(".png"))
    return lines


def plot(results: dict, path: Path) -> None:
    """Loss curves, test accuracy per epoch, and JCT bars with the gradient-sync part."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs, specs = results["runs"], results["topology"]
    fig, (curves, accuracy, bars) = plt.subplots(1, 3, figsize=(14, 4))
    for scheme, s in runs.items():
        epochs = [e["epoch"] for e in s["epochs"]]
        colour, label = COLOURS[scheme], f"{LABELS[scheme]} ({specs[scheme]})"
        width, style = (2.5, "-") if scheme == "bml" else (1.2, ":")
        curves.plot(epochs, [e["train_loss"] for e in s["epochs"]], style, color=colour,
                    linewidth=width, marker="o", label=f"{label}: train")
        curves.plot(epochs, [e["test_loss"] for e in s["epochs"]], style, color=colour,
                    linewidth=width, marker="x", alpha=0.6, label=f"{label}: test")
        accuracy.plot(epochs, [100 * e["test_accuracy"] for e in s["epochs"]], style,
                      color=colour, linewidth=width, marker="o", label=label)
    curves.set(xlabel="epoch", ylabel="cross-entropy loss", title="LeNet-5 loss")
    curves.legend(fontsize=7)
    accuracy.set(xlabel="epoch", ylabel="test accuracy %", title="test accuracy (1,000 images)")
    accuracy.legend(fontsize=7)
    names = list(runs)
    labels = [f"{LABELS[n]}\n{specs[n]}" for n in names]
    jct = [runs[n]["jct"] for n in names]
    sync = [runs[n]["jct"] * runs[n]["sync_share"] for n in names]
    bars.bar(labels, jct, color="#bbbbbb", label="job completion time")
    bars.bar(labels, sync, color=[COLOURS[n] for n in names], label="of which gradient sync")
    for x, value in enumerate(jct):
        bars.text(x, value, f"{value:.0f} s", ha="center", va="bottom", fontsize=8)
    bars.set(ylabel="seconds", title=f"JCT, {results['rate']} links, {results['epochs']} epochs")
    bars.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def check(results: dict) -> int:
    """Exit status: 1 if ranks diverged or BML-INA's final accuracy is more than 1 point from
    gloo's."""
    problems = [f"{scheme}: ranks hold different parameters ({len(s['hashes'])} hashes)"
                for scheme, s in results["runs"].items() if len(s["hashes"]) != 1]
    runs = results["runs"]
    if set(SCHEMES) <= runs.keys():
        gap = 100 * (runs["gloo"]["final_accuracy"] - runs["bml"]["final_accuracy"])
        if abs(gap) > 1.0:
            problems.append(f"final accuracy: BML-INA {100 * runs['bml']['final_accuracy']:.2f}%"
                            f" vs gloo {100 * runs['gloo']['final_accuracy']:.2f}% differ by "
                            f"more than 1 point")
    for problem in problems:
        print(f"bml-train: CHECK FAILED: {problem}", file=sys.stderr)
    if not problems:
        print("checks: every rank identical (parameter SHA-256) in each run"
              + ("; final accuracy within 1 point of gloo's" if set(SCHEMES) <= runs.keys()
                 else ""))
    return 1 if problems else 0
