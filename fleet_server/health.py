"""What each running part of the fleet server says about its own health.

A service (an ingest worker, the bundle file server, the rollout loop) registers a
probe with :meth:`HealthRegistry.register`; ``GET /healthz`` calls every probe and
answers 503 when one says the part is not working, with the probe's detail (how far
ingest lags, whether the file server's client thread is alive). A probe that raises
counts as a failed part, never as a failed health check.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PartHealth:
    """One part's answer.

    Attributes:
        ok: the part does its job.
        detail: figures that say why (JSON-able values only).
    """

    ok: bool
    detail: dict[str, Any] = field(default_factory=dict)


Probe = Callable[[], PartHealth]


class HealthRegistry:
    """The probes of the running parts, by name; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._probes: dict[str, Probe] = {}

    def register(self, name: str, probe: Probe) -> None:
        """Add (or replace) the probe of part ``name``."""
        with self._lock:
            self._probes[name] = probe

    def unregister(self, name: str) -> None:
        """Forget part ``name`` (a service that stopped on purpose)."""
        with self._lock:
            self._probes.pop(name, None)

    def check(self) -> dict[str, PartHealth]:
        """Every part's health, by name; a probe that raises reports the error."""
        with self._lock:
            probes = dict(self._probes)
        out: dict[str, PartHealth] = {}
        for name, probe in sorted(probes.items()):
            try:
                out[name] = probe()
            except Exception as exc:  # a broken probe is a broken part, not a 500
                log.exception("health probe %s failed", name)
                out[name] = PartHealth(False, {"error": f"{type(exc).__name__}: {exc}"})
        return out
