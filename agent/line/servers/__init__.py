"""The agent as a server the line reads: OPC UA (OPC 40100 Machine Vision) and Modbus TCP."""
