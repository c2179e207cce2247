"""The host agent's errors: each says what is missing and what to check."""

from __future__ import annotations


class TransportError(RuntimeError):
    """The call could not finish; the message says what is missing and what to check."""


class LengthMismatch(TransportError):
    """The workers' gradients have different lengths: nothing was summed."""
