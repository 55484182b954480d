"""Remote actions on the device: the fleet's signed requests for the agent's logs, a
restart, a reload of the configuration or a diagnostics archive, verified, carried out
and answered by the companion (never the hot path). See docs/device-logs-and-actions.md.

- :mod:`~agent.remote.config`: the ``[remote]`` and ``[logs]`` sections;
- :mod:`~agent.remote.request`: verify a request (the directive's signature check);
- :mod:`~agent.remote.counter`: which verified requests are carried out (counter, expiry,
  replay), a pure rule, and the handled counter kept on disk;
- :mod:`~agent.remote.redact`: secrets out of what leaves the device;
- :mod:`~agent.remote.logfile` and :mod:`~agent.remote.logread`: the agent's own rotating
  log files, and reading them or the journal of its unit;
- :mod:`~agent.remote.diagnostics`: the diagnostics archive;
- :mod:`~agent.remote.upload`: answers and chunks through the device's MQTT session,
  within a rate;
- :mod:`~agent.remote.service`: the companion's thread that does it all.
"""
