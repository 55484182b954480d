"""The line: PLC connections (drivers), triggered inspection stations with a deadline,
and the agent as a server the line reads (OPC UA Machine Vision, Modbus TCP).

- :mod:`agent.line.drivers`: one plugin per PLC protocol, registered by key, each with its
  own config model; a driver whose library can't load is reported unavailable with the
  reason (like the runtime's backends).
- :mod:`agent.line.link`: one thread per PLC connection that owns its driver, connects
  with backoff, polls or watches the inputs stations read and writes what they answer
  through a bounded queue, every call under a timeout.
- :mod:`agent.line.station`: the station's handshake (trigger -> busy -> result valid ->
  acknowledge) as a pure state machine, and the shell that enforces its deadline.
- :mod:`agent.line.source`: a pipeline's source for a station: the first frame captured
  at or after the trigger.

Nothing on the hot path waits on a PLC: the pipeline hands the result to the station,
which queues the writes; a write that can't be made in time is counted by its reason word.
"""
