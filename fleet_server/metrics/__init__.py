"""The fleet server's Prometheus metrics on ``GET /metrics`` (docs/metrics.md): figures
read at scrape time from the health probes, the leadership and the database
(:mod:`fleet_server.metrics.collector`), HTTP latency per route template
(:mod:`fleet_server.metrics.http`), the ``[metrics]`` section
(:mod:`fleet_server.metrics.config`)."""

from fleet_server.metrics.config import MetricsSection
from fleet_server.metrics.endpoint import METRICS_PATH, MetricsError, install_metrics

__all__ = ["METRICS_PATH", "MetricsError", "MetricsSection", "install_metrics"]
