"""The parameter-server baseline (baselines/ps.py) on star:4: sharded over the four servers and
with one dedicated server for three workers, each participant run by one command in its
namespace; every worker's sum matches the float64 sum to float32 rounding."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from bml.paths import REPO_ROOT
from tests.conftest import NETNS_REASON, emulation

pytestmark = [pytest.mark.netns,
              pytest.mark.skipif(NETNS_REASON is not None, reason=NETNS_REASON or "")]

SIZE = 40009  # a prime: shards and chunks of uneven length


def run_ps(state, tmp_path, world: int, servers: int | None, grads: list[np.ndarray]
           ) -> list[subprocess.CompletedProcess]:
    processes = []
    for rank in range(world + (servers or 0)):
        command = ["ip", "netns", "exec", state.namespace_of(rank), sys.executable, "-m",
                   "baselines.ps", "run", "--rank", str(rank), "--world", str(world),
                   "--timeout", "20", *(["--servers", str(servers)] if servers else [])]
        if rank < world:
            np.save(tmp_path / f"g{rank}.npy", grads[rank])
            command += ["--in", str(tmp_path / f"g{rank}.npy"),
                        "--out", str(tmp_path / f"s{rank}.npy")]
        else:
            command += ["--elements", str(SIZE)]
        processes.append(subprocess.Popen(command, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT))
    return [subprocess.CompletedProcess(p.args, p.wait(60), *p.communicate())
            for p in processes]


@pytest.fixture(scope="module")
def star4():
    with emulation("tps", "star:4") as state:
        yield state


@pytest.mark.parametrize("world,servers", [(4, None), (3, 1)])
def test_ps_sums_on_star4(star4, world, servers, tmp_path):
    rng = np.random.default_rng(world)
    grads = [(rng.standard_normal(SIZE) * 10.0 ** rng.integers(-3, 3, SIZE)).astype(np.float32)
             for _ in range(world)]
    exact = np.sum([g.astype(np.float64) for g in grads], axis=0)
    for result in run_ps(star4, tmp_path, world, servers, grads):
        assert result.returncode == 0, result.stderr
        assert "seconds=" in result.stdout and "nic_bytes=eth0:" in result.stdout
    for rank in range(world):
        total = np.load(tmp_path / f"s{rank}.npy")
        # summed in float64 by each shard's holder, rounded once to float32
        np.testing.assert_array_equal(total, exact.astype(np.float32))
