"""The shared kernel: what the device agent and the fleet server both need.

Beside the wire contract (:mod:`agent.wire`: topics, messages, manifests), this is the only
part of ``agent/`` that ``fleet_server`` imports (``tests/test_layers.py`` checks it):

- :mod:`agent.kernel.errors`: the root every edgefleet error derives from, and the errors
  both sides raise (configuration, bundles);
- :mod:`agent.kernel.configbase`: the base of every typed configuration section;
- :mod:`agent.kernel.toml`: reading a TOML configuration file within a size limit;
- :mod:`agent.kernel.durable`: durable writes (temp file, fsync, rename, fsync the directory);
- :mod:`agent.kernel.secrets`: secrets from ``$CREDENTIALS_DIRECTORY`` or the environment;
- :mod:`agent.kernel.readlimit`: reading a file no larger than a limit;
- :mod:`agent.kernel.bundle`: model bundles on disk (load, digest, create);
- :mod:`agent.kernel.mqtt`: the one MQTT session helper every client goes through
  (connect, reconnect, reason codes, subscription registry, publishes and their answers:
  :mod:`agent.kernel.mqttoptions`, :mod:`agent.kernel.mqttpublish`), on
  :mod:`agent.kernel.mqttguard` (wrapped callbacks, a supervised network thread);
  :mod:`agent.kernel.clientid`: client ids no other client can guess.

Nothing here imports the rest of ``agent`` or ``fleet_server``.
"""
