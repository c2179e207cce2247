"""LeNet-5 and what a rank measures of it; torch is imported only inside the functions, so the
launcher (which never trains) does not need it."""

from __future__ import annotations

import argparse
import hashlib
import time

import numpy as np

LENET_ELEMENTS = 61706  # LeNet-5's parameters: every step's gradient


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
    """(loss, accuracy) on the whole of ``x``: every rank reports the same test set."""
    import torch

    with torch.no_grad():
        logits = model(x)
        loss = float(torch.nn.functional.cross_entropy(logits, y))
        accuracy = float((logits.argmax(1) == y).float().mean())
    return loss, accuracy
