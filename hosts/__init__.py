"""BML-INA host agent: wire protocol, quantiser, packetiser, reliable transport, API, CLI."""
