"""Remote actions on devices (logs, restart, reload, diagnostics): requests signed by
the director key and published to the device (:mod:`~fleet_server.actions.service`),
and the fleet's record of them and of what devices answered
(:mod:`~fleet_server.actions.store`). See docs/device-logs-and-actions.md."""
