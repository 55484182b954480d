"""The fleet server's HTTP API (FastAPI): enrollment, devices, telemetry, bundles, rollouts."""

from fleet_server.api.app import create_app, error_status
from fleet_server.api.context import BrokerEndpoint, ServerContext
from fleet_server.api.ports import ACTIONS, Action, ActionRefused, RolloutOps

__all__ = [
    "ACTIONS",
    "Action",
    "ActionRefused",
    "BrokerEndpoint",
    "RolloutOps",
    "ServerContext",
    "create_app",
    "error_status",
]
