"""The demo (``make run``): star:4 on the software target, four workers push, sums are checked.

Brings the emulation up, sets a job up over the four servers, runs ``bml-host push`` in each
server's namespace at once with a different random gradient, checks every worker's result
against the float64 sum within the quantiser's stated bound, prints a table and tears down.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from control_plane.fabric import Fabric
from emulation.net import NetError, down, up
from emulation.netns import Shaping
from emulation.workers import Push, check_sum, run_pushes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bml-demo", description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="soft")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--elements", type=int, default=None,
                        help="float32 per worker (default 1M; 256K on bmv2, which is slower)")
    parser.add_argument("--name", default="demo")
    args = parser.parse_args(argv)
    if args.elements is None:
        args.elements = 1 << 18 if args.target == "bmv2" else 1 << 20
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
            runs = run_pushes(state, 1, [Push(r, r, grad) for r, grad in enumerate(grads)],
                              Path(tmp), extra=["--timeout", "240"], timeout=300)
            print(f"\n{'worker':>6} {'exit':>4} {'max error':>10} {'bound':>10}  "
                  "push figures")
            for rank, run in enumerate(runs):
                figures = run.stdout.strip().splitlines()[-1:] or [run.stderr.strip()[-200:]]
                if run.returncode != 0 or not run.output.exists():
                    failures += 1
                    print(f"{rank:>6} {run.returncode:>4} {'-':>10} {'-':>10}  "
                          f"{run.stderr.strip()[-300:]}")
                    continue
                error, bound, ok = check_sum(np.load(run.output), grads)
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
