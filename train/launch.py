"""The launcher's side: the emulated network (and, on a BCube, the set-up network DDP's gloo
group needs), one process per rank in its server's namespace, and a whole run of a scheme."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bml.paths import REPO_ROOT
from train.model import LENET_ELEMENTS
from train.report import LABELS, check, expected, result_stem, summarise, write_results

GLOO_PORT = 29500
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
    """Remove what ``add_setup_network`` made and bml-net does not: the veths' outer ends and
    the bridge (each quietly, a half-built network may lack some)."""
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
            "train", "--epochs", str(args.epochs), "--batch", str(args.batch),
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


def gloo_spec(topo: str) -> str:
    """Where the gloo baseline runs: the same star, or for a BCube the star of as many
    servers with the same links (one NIC each; the design's Fat-Tree stand-in), since gloo's
    ring needs every pair of ranks to reach each other and a BCube's servers have no routes
    beyond their own switches."""
    from bml.topology import Topology

    topology = Topology.parse(topo)
    return topology.spec if topology.kind == "star" else f"star:{topology.num_servers}"


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
