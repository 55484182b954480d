"""The fleet's command lines, one module per tool and per command group.

``fleetctl`` (:mod:`fleet_server.cli.fleetctl`, the parser and ``main``) with its groups:
:mod:`~fleet_server.cli.bundle` (bundle init, build, publish, verify, list),
:mod:`~fleet_server.cli.repo` (keys, repo, directive), :mod:`~fleet_server.cli.fleet`
(devices, telemetry, rollouts over the HTTP API) and :mod:`~fleet_server.cli.users`
(users of the console and API, on the database). ``fleet-server``
(:mod:`fleet_server.cli.server`) runs the server or checks its configuration.

Both start light: a command imports its libraries when it runs, so the parsers, every
``--help`` and the commands over HTTP import neither pydantic, SQLAlchemy nor TUF; what the
parsers show of the library is in :mod:`~fleet_server.cli.defaults`, and
:mod:`~fleet_server.cli.logs` sets up logging.
"""
