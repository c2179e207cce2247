"""Baselines BML-INA is measured against: a parameter server and gloo's ring allreduce."""
