"""Tooling the long-running tests share: test-only frame shapes, the reference model the
differential test compares against, targets to run, network namespaces, switch counters.
``tests/diffgen.py``, ``tests/diffrun.py`` and ``tests/hostile.py`` are the entry points that
put them together; the frame layout itself is ``bml.frames``."""
