"""One rank of one run, started by the launcher inside its server's namespace
(``python -m train ... rank ...``); it reports as JSON, so the launcher needs no torch."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from train.data import load_digits
from train.model import calibrate, evaluate, lenet5, parameter_hash


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
