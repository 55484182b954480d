"""Simulated PLCs on loopback, for the line's tests, the benchmark and ``make demo``.

- :mod:`hil.plc.opcua_plc`: an OPC UA server (asyncua) with a trigger, a part id,
  result variables a client may write and one it may not, optional Basic256Sha256 with a
  certificate made at start and a user with a password.
- :mod:`hil.plc.modbus_plc`: a Modbus TCP server (pymodbus) with coils, discrete inputs,
  holding and input registers.
- :mod:`hil.plc.logix_plc`: cpppo's EtherNet/IP Logix simulator in a subprocess.

Each listens on a free port of 127.0.0.1, can be stalled (it stops answering for a
while, as a PLC whose scan hangs), and stopped and started again.
"""
