"""The fleet side: ``fleetctl`` and ``fleet-server`` (fleet_server.cli):
keys and the TUF repository, the CA and managed broker, ingest, rollouts and the HTTP API."""
