"""Distribution of repository files to devices: the MQTT file server."""

from fleet_server.distribution.file_server import FileServerError, MqttFileServer, ServerStats

__all__ = ["FileServerError", "MqttFileServer", "ServerStats"]
