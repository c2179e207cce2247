"""The shared model of BML-INA: wire protocol, topology, synchronisation schedules and their
cost. Hosts, control plane, software target, emulation and benchmarks import it; it imports
none of them."""
