"""A deterministic simulator of the whole system in virtual time (network: ``network.py``)."""
