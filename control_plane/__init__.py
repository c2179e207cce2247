"""BML-INA control plane: topology, P4Runtime sessions, provisioning, jobs, health."""
