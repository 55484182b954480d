"""Ingest on ``/healthz``: one probe per worker, asking :meth:`IngestWorker.health`;
and the worker options of the ``[ingest]`` section (:func:`worker_options`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fleet_server.config import IngestSection
from fleet_server.health import HealthRegistry, PartHealth
from fleet_server.ingest.clock import ClockBounds
from fleet_server.ingest.failures import RetryPolicy
from fleet_server.ingest.worker import IngestWorker


def register_health(registry: HealthRegistry, name: str, worker: IngestWorker) -> None:
    """Register ``worker.health`` as the probe of part ``name`` (e.g. ``ingest-0``)."""
    registry.register(name, worker.health)


def register_workers(
    registry: HealthRegistry, workers: Sequence[IngestWorker], prefix: str = "ingest"
) -> list[str]:
    """Register a probe per worker as ``<prefix>-<i>``; returns the names (to
    unregister them at stop)."""
    names = []
    for i, worker in enumerate(workers):
        name = f"{prefix}-{i}"
        register_health(registry, name, worker)
        names.append(name)
    return names


def ingest_health(workers: Sequence[IngestWorker]) -> PartHealth:
    """One answer for several workers: ok when every one is, with each one's detail."""
    parts = [w.health() for w in workers]
    return PartHealth(all(p.ok for p in parts), {"workers": [p.detail for p in parts]})


def worker_options(section: IngestSection) -> dict[str, Any]:
    """The :class:`IngestWorker` keyword arguments the ``[ingest]`` section sets."""
    return {
        "clock_bounds": ClockBounds(section.max_clock_skew_s, section.max_clock_age_s),
        "retry": RetryPolicy(attempts=section.transient_attempts),
        "max_lag_s": section.max_lag_s,
        "max_disconnected_s": section.max_disconnected_s,
    }
