"""One rank of tests/test_torch_hook.py, run inside a server's namespace: a tiny model trained
2 steps twice from the same start, through the BML-INA hook and through DDP's default gloo
allreduce; saves both models' parameters and what the hook summed, for the test to compare.

    python tests/torch_ranks.py RANK WORLD JOB MASTER_IP PORT OUT.npz FABRIC.json

The hook runs as bml-train runs it: every NIC of the server, the job's recorded schedule.
"""

import copy
import datetime
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from hosts.torch_hook import BmlHookState, bml_allreduce_hook

STEPS = 2
LR = 0.1


def main() -> int:
    rank, world, job = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    master, port, out, fabric = sys.argv[4], int(sys.argv[5]), sys.argv[6], sys.argv[7]
    torch.set_num_threads(1)
    os.environ["GLOO_SOCKET_IFNAME"] = "eth0"
    dist.init_process_group("gloo", init_method=f"tcp://{master}:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
    generator = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    batches = [(torch.randn(8, 16, generator=generator), torch.randn(8, 4, generator=generator))
               for _ in range(STEPS)]
    # Small buckets (~1 KB; a list, since DDP's first bucket is otherwise 1 MB): several per
    # step, and DDP rebuilds them after step 1.
    caps = [0.001]
    bml = DistributedDataParallel(copy.deepcopy(model), bucket_cap_mb_list=caps)
    gloo = DistributedDataParallel(copy.deepcopy(model), bucket_cap_mb_list=caps)
    state = BmlHookState(job, rank, world, fabric=fabric, timeout=30.0)
    calls: list[tuple[np.ndarray, np.ndarray]] = []

    def recording_hook(state: BmlHookState,
                       bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        given = bucket.buffer().detach().numpy().copy()

        def keep(future: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
            calls.append((given, future.value().numpy().copy()))
            return future.value()

        return bml_allreduce_hook(state, bucket).then(keep)

    bml.register_comm_hook(state, recording_hook)
    for ddp in (bml, gloo):
        optimizer = torch.optim.SGD(ddp.parameters(), lr=LR)
        for x, y in batches:
            optimizer.zero_grad()
            nn.functional.mse_loss(ddp(x), y).backward()
            optimizer.step()
    state.close()

    def flat(ddp: DistributedDataParallel) -> np.ndarray:
        return np.concatenate([p.detach().numpy().ravel() for p in ddp.parameters()])

    np.savez(out, bml=flat(bml), gloo=flat(gloo), start=flat_module(model),
             sizes=np.array([given.size for given, _ in calls]),
             **{f"in{i}": given for i, (given, _) in enumerate(calls)},
             **{f"out{i}": mean for i, (_, mean) in enumerate(calls)})
    dist.destroy_process_group()
    return 0


def flat_module(model: nn.Module) -> np.ndarray:
    return np.concatenate([p.detach().numpy().ravel() for p in model.parameters()])


if __name__ == "__main__":
    sys.exit(main())
