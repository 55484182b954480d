"""The fleet server's Prometheus metrics on ``GET /metrics`` (docs/metrics.md): figures
read at scrape time from the health probes, the leadership and the database
(:mod:`fleet_server.metrics.collector`), HTTP latency per route template
(:mod:`fleet_server.metrics.http`), the endpoint and its access rule
(:mod:`fleet_server.metrics.endpoint`), the ``[metrics]`` section
(:mod:`fleet_server.metrics.config`).

This package imports only its configuration here, so that ``fleet_server.config`` can
import the section without pulling in the server's parts."""

from fleet_server.metrics.config import MetricsSection

__all__ = ["MetricsSection"]
