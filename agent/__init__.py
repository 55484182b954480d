"""The device agent. Not built yet: see agent/README.md."""
