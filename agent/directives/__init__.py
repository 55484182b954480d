"""The agent's link to the fleet for bundles: signed directives over MQTT or from
removable media, verified with python-tuf, handed to the installer, and the running
pipelines switched to the result."""
