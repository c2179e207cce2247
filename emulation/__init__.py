"""Emulated topologies on one Linux machine: namespaces, veths, tc, switch processes."""
