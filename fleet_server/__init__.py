"""The fleet server. Not built yet: see fleet_server/README.md."""
