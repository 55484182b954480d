"""The fleet side: ``fleetctl`` (fleet_server.cli) and ``fleet-server`` (fleet_server.server_cli):
keys and the TUF repository, the CA and managed broker, ingest, rollouts and the HTTP API."""
