"""Benches, simulators and seeders: tools that drive the product, not part of it.

Each bench runs as ``hil bench NAME [flags]`` (or ``python -m hil.bench.NAME``):

- ``fleet`` (:mod:`~hil.bench.fleet`): N light agents with TLS identities, heartbeats
  and a rollout across all of them.
- ``drain`` (:mod:`~hil.bench.drain`, its sides in :mod:`~hil.bench.drain_fleet` and
  :mod:`~hil.bench.drain_device`): a device's outage backlog drained into the fleet
  database, and its live latency meanwhile.
- ``ingest`` (:mod:`~hil.bench.ingest`, :mod:`~hil.bench.ingest_sql`): storage inserts,
  and ingest workers against a simulated fleet (:mod:`~hil.bench.simfleet`).
- ``review`` (:mod:`~hil.bench.review`, :mod:`~hil.bench.review_timing`): the decision
  review at 1,000,000 decisions seeded by :mod:`~hil.bench.review_seed` (images from
  :mod:`~hil.bench.seed_images`).
- ``restart`` (:mod:`~hil.bench.restart`): ``edge-agent run``'s hot path and companion
  SIGKILLed in turn; the time to the next decision and to ``/healthz`` again.
- ``retention`` (:mod:`~hil.bench.retention`): one retention pass over 100k heartbeats
  and 20k decisions with images, SQLite and PostgreSQL: rows/s and the longest
  transaction.
- ``decode`` (:mod:`~hil.bench.decode`): decode cost per camera stream (H.264, H.265,
  720p, 1080p): CPU per frame and the cameras whose decoding fills the cores.

- ``line`` (:mod:`~hil.bench.line`, its PLCs in :mod:`~hil.bench.line_plcs`): a station
  triggered by a simulated OPC UA or Modbus PLC; trigger -> result as the PLC sees it
  against the bare model, deadlines, overruns and the agent's CPU per decision.
- ``genicam-station`` (:mod:`~hil.bench.genicam_station`): the same station with a GigE
  Vision camera fired by TriggerSoftware (the simulator on a link of its own), against
  the synthetic camera in the same run.
- ``alerts`` (:mod:`~hil.bench.alerts`): one evaluation of the fleet server's alert rules
  at 1,000 and 10,000 devices, SQLite and PostgreSQL: CPU and wall time.
- ``remote`` (:mod:`~hil.bench.remote`): what device logs and remote actions cost a
  device: idle CPU with and without them, and per action the companion's CPU, the wall
  time and the bytes it sent.

The demo's video and bundles the benches run on come from :mod:`hil.demo_assets`.
"""

BENCHES = {
    "fleet": "hil.bench.fleet",
    "drain": "hil.bench.drain",
    "ingest": "hil.bench.ingest",
    "review": "hil.bench.review",
    "restart": "hil.bench.restart",
    "retention": "hil.bench.retention",
    "decode": "hil.bench.decode",
    "alerts": "hil.bench.alerts",
    "remote": "hil.bench.remote",
    "line": "hil.bench.line",
    "genicam-station": "hil.bench.genicam_station",
}
"""``hil bench`` name -> the module whose ``main(argv)`` runs it."""
