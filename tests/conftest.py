"""Shared fixtures: emulations that tests bring up and always tear down."""

from __future__ import annotations

import contextlib

import pytest

from emulation import net
from emulation.testbed import have_netns
from soft_target.p4runtime_server import SoftP4RuntimeServicer
from soft_target.pipeline import Pipeline

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


def in_process_servicer(pipeline: Pipeline | None = None,
                        servicer_class: type = SoftP4RuntimeServicer,
                        **options) -> SoftP4RuntimeServicer:
    """The software target's P4Runtime servicer with no packet loop: tasks run at once and
    packets go nowhere."""
    return servicer_class(pipeline or Pipeline(), 1, lambda task: task(), lambda copies: None,
                          **options)
