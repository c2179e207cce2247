"""Shared fixtures: emulations that tests bring up and always tear down."""

from __future__ import annotations

import contextlib

import pytest

from emulation import net
from emulation.testbed import have_netns

NETNS_REASON = have_netns()


@contextlib.contextmanager
def emulation(name: str, topo: str, **kwargs):
    """An emulation that is torn down however the test ends; asserts nothing is left."""
    if NETNS_REASON:
        pytest.skip(NETNS_REASON)
    net.down(name)  # a crashed earlier run must not block this one
    state = net.up(name, topo, **kwargs)
    try:
        yield state
    finally:
        net.down(name)
        assert net.leftovers(name) == []
