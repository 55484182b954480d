"""The device agent: capture -> inference on the runtime pool -> decision -> log and actions;
signed bundle installs and the uplink to the fleet. Entry point: ``edge-agent`` (agent.cli)."""
