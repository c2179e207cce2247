"""The demo (``make run``): star:4 on the software target, four workers push, sums are checked.

Brings the emulation up, sets a job up over the four servers, runs ``bml-host push`` in each
server's namespace at once with a different random gradient, checks every worker's result
against the float64 sum within the quantiser's stated bound, prints a table and tears down.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from control_plane.fabric import Fabric
from emulation.net import NetError, down, up
from emulation.netns import Shaping
from hosts.quantize import block_exponents, error_bound


def run_pushes(state, fabric_path: Path, job: int, gradients: list[Path], outputs: list[Path],
               extra: list[str] | None = None, timeout: float = 120.0
               ) -> list[subprocess.CompletedProcess]:
    """``bml-host push`` on servers 0..N-1 at once; waits for all (bounded)."""
    world = len(gradients)
    processes = []
    for rank, (grad, out) in enumerate(zip(gradients, outputs, strict=True)):
        command = ["ip", "netns", "exec", state.namespace_of(rank), sys.executable, "-m",
                   "hosts.cli", "push", "--in", str(grad), "--out", str(out), "--job", str(job),
                   "--rank", str(rank), "--world", str(world), *(extra or [])]
        processes.append(subprocess.Popen(command, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
    results = []
    deadline = time.monotonic() + timeout
    for process in processes:
        try:
            stdout, stderr = process.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            stdout, stderr = process.communicate()
            stderr += "\n(killed by the demo: took too long)"
        results.append(subprocess.CompletedProcess(process.args, process.returncode, stdout,
                                                   stderr))
    return results


def check_sum(result: np.ndarray, grads: list[np.ndarray]) -> tuple[float, float, bool]:
    """(max error, largest allowed error, every element within its bound) of one result."""
    n = len(grads)
    exact = np.sum([g.astype(np.float64) for g in grads], axis=0)
    padded = -(-exact.size // 64) * 64
    blocks = [np.pad(g, (0, padded - g.size)).reshape(-1, 64) for g in grads]
    e_max = np.max([block_exponents(b) for b in blocks], axis=0)
    res = np.pad(result.astype(np.float64), (0, padded - result.size)).reshape(-1, 64)
    bound = error_bound(e_max, n, res).reshape(-1)[:exact.size]
    error = np.abs(result.astype(np.float64) - exact)
    return float(error.max()), float(bound.max()), bool(np.all(error <= bound))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bml-demo", description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="soft")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--elements", type=int, default=1 << 20)
    parser.add_argument("--name", default="demo")
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    print(f"demo: bringing up star:{args.workers} on the {args.target} target ...", flush=True)
    try:
        state = up(args.name, f"star:{args.workers}", args.target, Shaping())
    except NetError as exc:
        print(f"demo: error: {exc}", file=sys.stderr)
        return 2
    failures = 0
    try:
        fabric_path = state.run_dir / "fabric.json"
        Fabric.load(fabric_path).add_job(1, list(range(args.workers)))
        print(f"demo: up in {time.monotonic() - t0:.1f} s; job 1 set up on s0 for "
              f"{args.workers} workers; pushing {args.elements} float32 each", flush=True)
        rng = np.random.default_rng(2026)
        with tempfile.TemporaryDirectory(prefix="bml-demo-") as tmp:
            grads = [rng.standard_normal(args.elements).astype(np.float32) * (r + 1)
                     for r in range(args.workers)]
            ins = [Path(tmp, f"grad{r}.npy") for r in range(args.workers)]
            outs = [Path(tmp, f"sum{r}.npy") for r in range(args.workers)]
            for path, grad in zip(ins, grads, strict=True):
                np.save(path, grad)
            runs = run_pushes(state, fabric_path, 1, ins, outs)
            print(f"\n{'worker':>6} {'exit':>4} {'max error':>10} {'bound':>10}  "
                  "push figures")
            for rank, run in enumerate(runs):
                figures = run.stdout.strip().splitlines()[-1:] or [run.stderr.strip()[-200:]]
                if run.returncode != 0 or not outs[rank].exists():
                    failures += 1
                    print(f"{rank:>6} {run.returncode:>4} {'-':>10} {'-':>10}  "
                          f"{run.stderr.strip()[-300:]}")
                    continue
                error, bound, ok = check_sum(np.load(outs[rank]), grads)
                failures += not ok
                print(f"{rank:>6} {run.returncode:>4} {error:>10.2e} {bound:>10.2e}  "
                      f"{'' if ok else 'OUT OF BOUND '}{figures[0].replace('bml-host: ', '')}")
        print()
        from control_plane.status import counter_table

        print("\n".join(counter_table(Fabric.load(fabric_path).addresses())))
    finally:
        down(args.name)
    verdict = "all sums correct" if not failures else f"{failures} worker(s) FAILED"
    print(f"\ndemo: {verdict}; torn down; {time.monotonic() - t0:.1f} s in all")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
