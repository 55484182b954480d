"""The settings of the servers the agent offers the line (``[opcua_server]``,
``[modbus_server]``), both off by default."""

from __future__ import annotations

from pydantic import Field

from agent.kernel.configbase import Section


class OpcUaServerConfig(Section):
    """The agent as an OPC UA server: one OPC 40100 VisionSystem per station."""

    enabled: bool = Field(False, description="Serve OPC UA (off by default).")


class ModbusServerConfig(Section):
    """The agent as a Modbus TCP server: result registers, trigger coils, a heartbeat."""

    enabled: bool = Field(False, description="Serve Modbus TCP (off by default).")
