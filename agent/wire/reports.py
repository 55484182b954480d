"""The device's periodic reports: its retained state (which bundle it runs), the
heartbeat, health (fps, latency percentiles, queues, drops, host figures) and telemetry.

Health and telemetry share the telemetry topic, told apart by ``kind``. A heartbeat, a
health report or a telemetry sample is identified by (device_id, kind, seq, ts): ``seq``
counts up from 0 at agent start, ``ts`` tells two runs apart.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from agent.wire.base import WireModel
from agent.wire.envelope import Count, Finite, Message, Sample, Timestamp
from agent.wire.quality import ShadowSummary


class BundleRef(WireModel):
    """One bundle release on a device."""

    name: str = Field(description="Bundle name.")
    version: str = Field(description="Bundle version (semver).")
    release: int | None = Field(None, ge=0, description="Release number the fleet signed.")
    digest: str | None = Field(None, description="Digest of the bundle, when known.")


class ReportedState(Message):
    """Retained: what the device runs. Its last will is :meth:`offline`: no ``ts``, online
    false; a state without ``ts`` changes only ``online`` of the state held."""

    kind: Literal["state"] = Field("state", description="Message kind.")
    ts: Timestamp | None = Field(None, description="Unix time of the report; none in a will.")
    online: bool = Field(True, description="False in the last will.")
    agent_version: str | None = Field(None, description="edge-agent version.")
    profile: str | None = Field(None, description="Firmware profile name.")
    labels: dict[str, str] = Field(default_factory=dict, description="Selector labels.")
    active: BundleRef | None = Field(None, description="The bundle the device runs.")
    previous: BundleRef | None = Field(None, description="The bundle it ran before.")
    shadow: BundleRef | None = Field(
        None, description="The candidate in the shadow slot (runs beside, never acts)."
    )

    @classmethod
    def offline(cls, device_id: str) -> ReportedState:
        """The last will: ``online: false`` and no ``ts``."""
        return cls(device_id=device_id, online=False)


class Heartbeat(Sample):
    """The device is alive: sent every second or so."""

    kind: Literal["heartbeat"] = Field("heartbeat", description="Message kind.")


class Percentiles(WireModel):
    """Latency percentiles of one model over the report's window, in milliseconds."""

    p50: Finite = Field(ge=0, description="Median, ms.")
    p95: Finite = Field(ge=0, description="95th percentile, ms.")
    p99: Finite = Field(ge=0, description="99th percentile, ms.")
    count: Count = Field(0, description="Inferences in the window.")


class StationCounts(WireModel):
    """One station's counts since the agent started (the line's handshake, docs/stations.md)."""

    triggers: Count = Field(0, description="Triggers the station took.")
    deadline_missed: Count = Field(0, description="Results the fail-safe answered: too late.")
    overruns: Count = Field(0, description="Triggers that came while it was busy.")


class Health(Sample):
    """How the device and its pipelines are doing."""

    kind: Literal["health"] = Field("health", description="Message kind.")
    fps: dict[str, Annotated[Finite, Field(ge=0)]] = Field(
        default_factory=dict, description="Frames per second, per camera."
    )
    latency_ms: dict[str, Percentiles] = Field(
        default_factory=dict, description="Inference latency percentiles, per model."
    )
    queue_depth: dict[str, Count] = Field(default_factory=dict, description="Per queue.")
    drops: dict[str, Count] = Field(
        default_factory=dict, description="Dropped frames or requests since start, per cause."
    )
    cpu_percent: Finite | None = Field(None, ge=0, description="CPU use, % of one core x cores.")
    memory_mb: Finite | None = Field(None, ge=0, description="Resident memory of the agent, MB.")
    temperature_c: dict[str, Finite] = Field(
        default_factory=dict, description="Temperatures °C per zone; empty where unreadable."
    )
    disk_free_mb: Finite | None = Field(None, ge=0, description="Free space on the data disk.")
    disk_used_mb: Finite | None = Field(None, ge=0, description="Used space on the data disk.")
    disk_budget_mb: Finite | None = Field(
        None, ge=0, description="The agent's disk budget ([agent] disk_budget_mb), when set."
    )
    state_dir_mb: Finite | None = Field(
        None, ge=0, description="What the files of the agent's state directory take, MiB."
    )
    stations: dict[str, StationCounts] = Field(
        default_factory=dict, description="Each station's counts since the agent started."
    )
    shadow: ShadowSummary | None = Field(
        None, description="The shadow comparison, while a candidate runs in the shadow slot."
    )


class Telemetry(Sample):
    """Named numeric readings that fit no other message."""

    kind: Literal["telemetry"] = Field("telemetry", description="Message kind.")
    metrics: dict[str, Finite] = Field(default_factory=dict, description="Name -> value.")
    labels: dict[str, str] = Field(default_factory=dict, description="Labels of the sample.")
