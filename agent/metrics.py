"""The agent's Prometheus metrics, in a registry of its own (never the global one).

One :class:`AgentMetrics` per agent, so that tests, or two agents in one process, don't
share counters. Names start with ``edgefleet_``; counters get ``_total`` in the text.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from typing import Any, Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import Metric

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
"""The media type of :meth:`AgentMetrics.render`: Prometheus text format 0.0.4."""

LATENCY_BUCKETS_S = (
    0.0001, 0.00025, 0.0005, 0.00075,
    0.001, 0.0015, 0.002, 0.003, 0.004, 0.005, 0.0075,
    0.01, 0.0125, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05,
    0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.0,
)  # fmt: skip
"""Latency buckets in seconds: 0.1 ms .. 2 s, fine-grained between 0.5 and 50 ms."""


class AgentMetrics:
    """Every metric the agent exposes on ``/metrics``. Thread-safe (prometheus-client)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        # capture
        self.frames = Counter(
            "edgefleet_frames_captured", "Frames read from a camera.", ["camera"], registry=r
        )
        self.frames_dropped = Counter(
            "edgefleet_frames_dropped",
            "Frames captured but not processed (pipeline busy, queue full).",
            ["camera"],
            registry=r,
        )
        self.camera_up = Gauge(
            "edgefleet_camera_up", "1 while the camera delivers frames, else 0.", ["camera"],
            registry=r,
        )  # fmt: skip
        self.camera_reopens = Counter(
            "edgefleet_camera_reopens", "Times a camera was reopened after a failure.",
            ["camera"], registry=r,
        )  # fmt: skip
        self.camera_failures = Counter(
            "edgefleet_camera_failures",
            "Camera failures by reason word (refused, unreachable, unauthorized, not_found, "
            "timeout, stalled, ended, unknown).",
            ["camera", "reason"], registry=r,
        )  # fmt: skip
        self.camera_lost_packets = Counter(
            "edgefleet_camera_lost_packets",
            "Packets of a camera's stream that never came: RTP packets (its ffmpeg "
            "decoder's count), GigE Vision stream packets (Aravis's, after resends).",
            ["camera"], registry=r,
        )  # fmt: skip
        self.camera_decode_errors = Counter(
            "edgefleet_camera_decode_errors",
            "Warnings and errors of a camera's video decoder (ffmpeg child), concealment "
            "not included.",
            ["camera"], registry=r,
        )  # fmt: skip
        self.camera_concealed_frames = Counter(
            "edgefleet_camera_concealed_frames",
            "Frames of a camera the decoder decoded with a concealed hole.",
            ["camera"], registry=r,
        )  # fmt: skip
        self.camera_damaged_frames = Counter(
            "edgefleet_camera_damaged_frames",
            "Frames read while the decoder reported damage for them, by action: kept "
            "(published) or skipped (damaged_frames = skip).",
            ["camera", "action"], registry=r,
        )  # fmt: skip
        self.camera_resent_packets = Counter(
            "edgefleet_camera_resent_packets",
            "GigE Vision stream packets a GenICam camera sent again when Aravis asked "
            "(lost on the link, then recovered).",
            ["camera"], registry=r,
        )  # fmt: skip
        self.camera_missed_triggers = Counter(
            "edgefleet_camera_missed_triggers",
            "Software triggers of a GenICam camera that got no frame within its "
            "stall_timeout_s (the camera is then reopened).",
            ["camera"], registry=r,
        )  # fmt: skip
        self.camera_clock_error = Gauge(
            "edgefleet_camera_clock_error_seconds",
            "How far a GenICam camera's frame timestamps, mapped to the host clock, may be "
            "off from frame to frame.",
            ["camera"], registry=r,
        )  # fmt: skip
        self.fps = Gauge(
            "edgefleet_camera_fps", "Measured frames per second of a camera.", ["camera"],
            registry=r,
        )  # fmt: skip
        self.camera_drop_ratio = Gauge(
            "edgefleet_camera_drop_ratio",
            "Of a camera's last 32 frames, the fraction replaced before its pipeline took "
            "them (above 0: the pipeline can't keep up).",
            ["camera"],
            registry=r,
        )
        self.camera_starved = Gauge(
            "edgefleet_camera_starved",
            "1 while a camera delivers frames but its pipeline took none for a second (or "
            "ten frame periods): the camera is not served; else 0.",
            ["camera"],
            registry=r,
        )
        # pipelines
        self.stage_latency = Histogram(
            "edgefleet_stage_latency_seconds",
            "Time spent in one stage of a pipeline.",
            ["pipeline", "stage"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.e2e_latency = Histogram(
            "edgefleet_e2e_latency_seconds",
            "From the frame's capture time to the decision.",
            ["pipeline"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.decisions = Counter(
            "edgefleet_decisions", "Decisions made, by outcome.", ["pipeline", "outcome"],
            registry=r,
        )  # fmt: skip
        self.inference_errors = Counter(
            "edgefleet_inference_errors", "Inferences that failed, by reason.",
            ["pipeline", "reason"], registry=r,
        )  # fmt: skip
        self.queue_depth = Gauge(
            "edgefleet_queue_depth", "Items waiting in a bounded queue.", ["queue"], registry=r
        )
        # actions
        self.actions = Counter(
            "edgefleet_actions",
            "Action deliveries by result: sent, failed, dropped, timeout.",
            ["action", "result"],
            registry=r,
        )
        # decision log
        self.decision_log_queued = Gauge(
            "edgefleet_decision_log_queued", "Decisions waiting to be written.", registry=r
        )
        self.decision_log_written = Counter(
            "edgefleet_decision_log_written", "Decisions written to the log.", registry=r
        )
        self.decision_log_dropped = Counter(
            "edgefleet_decision_log_dropped",
            "Decisions not written because the writer's queue was full.",
            registry=r,
        )
        self.decision_log_evicted = Counter(
            "edgefleet_decision_log_evicted",
            "Logged decisions deleted to stay within the disk budget.",
            registry=r,
        )
        # uplink outbox
        self.uplink_connected = Gauge(
            "edgefleet_uplink_connected", "1 while the fleet uplink is connected.", registry=r
        )
        self.outbox_pending = Gauge(
            "edgefleet_outbox_pending",
            "Records in the outbox waiting for their PUBACK, by kind.",
            ["kind"],
            registry=r,
        )
        self.outbox_bytes = Gauge(
            "edgefleet_outbox_bytes",
            "Bytes the outbox's records count against its budget.",
            registry=r,
        )
        self.outbox_dropped = Counter(
            "edgefleet_outbox_dropped",
            "Outbox records dropped by the drop policy (over budget, disk full), by kind.",
            ["kind"],
            registry=r,
        )
        self.outbox_delivered = Counter(
            "edgefleet_outbox_delivered",
            "Outbox records the broker acknowledged, by kind.",
            ["kind"],
            registry=r,
        )
        # sensors and alarms
        self.sensor_readings = Counter(
            "edgefleet_sensor_readings", "Sensor readings received.", ["sensor"], registry=r
        )
        self.sensor_bad_readings = Counter(
            "edgefleet_sensor_bad_readings",
            "Sensor readings rejected (malformed, out of range).",
            ["sensor"],
            registry=r,
        )
        self.sensor_up = Gauge(
            "edgefleet_sensor_up",
            "1 while the sensor can receive readings (connected and subscribed), else 0.",
            ["sensor"],
            registry=r,
        )
        self.sensor_silent_seconds = Gauge(
            "edgefleet_sensor_silent_seconds",
            "Seconds since the sensor's last reading (MQTT sensors).",
            ["sensor"],
            registry=r,
        )
        self.sensor_silent = Gauge(
            "edgefleet_sensor_silent",
            "1 while the sensor had no reading for longer than its max_silence_s, else 0.",
            ["sensor"],
            registry=r,
        )
        self.sensor_thread_restarts = Counter(
            "edgefleet_sensor_thread_restarts",
            "Times a sensor's MQTT network thread was found dead and restarted.",
            ["sensor"],
            registry=r,
        )
        self.sensor_callback_errors = Counter(
            "edgefleet_sensor_callback_errors",
            "Exceptions caught in a sensor's MQTT callbacks (the thread went on).",
            ["sensor"],
            registry=r,
        )
        # the line (agent/line)
        self.line_failures = Counter(
            "edgefleet_line_failures",
            "PLC calls that failed, by link, driver and reason word (refused, timeout, "
            "bad_node, type_mismatch, denied, queue_full, disconnected, protocol, unavailable).",
            ["link", "driver", "reason"], registry=r,
        )  # fmt: skip
        self.line_connected = Gauge(
            "edgefleet_line_connected", "1 while the PLC link is connected, else 0.",
            ["link", "driver"], registry=r,
        )  # fmt: skip
        self.station_results = Counter(
            "edgefleet_station_results",
            "Results a station answered, by status (ok, deadline_missed, overrun, error).",
            ["station", "status"], registry=r,
        )  # fmt: skip
        self.station_latency = Histogram(
            "edgefleet_station_trigger_to_result_seconds",
            "From seeing a station's trigger to queueing its result's writes.",
            ["station"], buckets=LATENCY_BUCKETS_S, registry=r,
        )  # fmt: skip
        self.alarms = Counter("edgefleet_alarms", "Alarms raised, by kind.", ["kind"], registry=r)
        # shadow candidate
        self.shadow_frames = Counter(
            "edgefleet_shadow_frames",
            "Frames offered to a pipeline's shadow candidate, by result: compared, agreed, "
            "skipped_busy (the pool was busy), skipped_behind (the shadow still had the "
            "frame before), errors.",
            ["pipeline", "result"],
            registry=r,
        )

        self._totals_lock = threading.Lock()
        self._totals: dict[tuple[Counter, tuple[tuple[str, str], ...]], float] = {}

    def set_counter(self, counter: Counter, total: float, **labels: str) -> None:
        """Bring a counter up to ``total``, a running total some part keeps itself (a
        camera's frames). A total lower than the last one (the part restarted its count)
        adds the new total, so the counter never goes down.
        """
        key = (counter, tuple(sorted(labels.items())))
        with self._totals_lock:
            last = self._totals.get(key, 0.0)
            self._totals[key] = total
        delta = total - last if total >= last else total
        child = counter.labels(**labels) if labels else counter
        if delta > 0:
            child.inc(delta)

    def update_decision_log(self, stats: Mapping[str, Any]) -> None:
        """Take the decision log's own figures: ``queued`` (now), and the running totals
        ``written``, ``dropped``, ``evicted``; a key that is missing is left alone.
        """
        if "queued" in stats:
            self.decision_log_queued.set(float(stats["queued"]))
        for key, counter in (
            ("written", self.decision_log_written),
            ("dropped", self.decision_log_dropped),
            ("evicted", self.decision_log_evicted),
        ):
            if key in stats:
                self.set_counter(counter, float(stats[key]))

    def update_sensor(self, name: str, stats: Mapping[str, Any]) -> None:
        """A sensor's figures from its ``stats()``: readings, up, and for an MQTT sensor
        its silence and its network thread's restarts and callback errors."""
        self.set_counter(self.sensor_readings, int(stats.get("readings", 0)), sensor=name)
        self.set_counter(self.sensor_bad_readings, int(stats.get("bad_readings", 0)), sensor=name)
        self.sensor_up.labels(sensor=name).set(1 if stats.get("up") else 0)
        if "silent_s" not in stats:
            return
        self.sensor_silent_seconds.labels(sensor=name).set(int(stats["silent_s"]))
        self.sensor_silent.labels(sensor=name).set(1 if stats.get("silent") else 0)
        restarts = int(stats.get("thread_restarts", 0))
        self.set_counter(self.sensor_thread_restarts, restarts, sensor=name)
        errors = int(stats.get("callback_errors", 0))
        self.set_counter(self.sensor_callback_errors, errors, sensor=name)

    def update_shadow(self, pipeline: str, counts: Mapping[str, int]) -> None:
        """Take a pipeline's shadow counters (:meth:`agent.pipelines.Pipelines.shadow_counters`)."""
        for result in ("compared", "agreed", "skipped_busy", "skipped_behind", "errors"):
            if result in counts:
                self.set_counter(
                    self.shadow_frames, float(counts[result]), pipeline=pipeline, result=result
                )

    def update_uplink(self, stats: Mapping[str, Any]) -> None:
        """Take the uplink's figures (:meth:`agent.uplink.service.Uplink.stats`)."""
        self.uplink_connected.set(float(stats.get("connected", 0)))
        outbox = stats.get("outbox") or {}
        for kind, n in dict(outbox.get("pending_by_kind", {})).items():
            self.outbox_pending.labels(kind=kind).set(float(n))
            self.set_counter(
                self.outbox_delivered, float(stats.get(f"delivered_{kind}", 0)), kind=kind
            )
        for kind, n in dict(outbox.get("dropped", {})).items():
            self.set_counter(self.outbox_dropped, float(n), kind=kind)
        self.outbox_bytes.set(float(outbox.get("bytes", 0)))

    def render(self) -> bytes:
        """Every metric in Prometheus text format (:data:`CONTENT_TYPE`)."""
        return generate_latest(self.registry)

    def companion_families(self) -> frozenset[str]:
        """The families the companion process keeps (the uplink's, the outbox's and the
        alarms it reports); every other family is the hot path's."""
        owned = (
            self.uplink_connected,
            self.outbox_pending,
            self.outbox_bytes,
            self.outbox_dropped,
            self.outbox_delivered,
            self.alarms,
        )
        return frozenset(m._name for m in owned)

    def render_part(self, part: Literal["hotpath", "companion"]) -> bytes:
        """The families one process keeps, in Prometheus text format: with the agent in
        two processes, each registry holds every family but only its own are counted,
        and ``/metrics`` joins the two parts."""
        mine = self.companion_families()
        keep_companion = part == "companion"
        registry = self.registry

        class _Part:
            def collect(self) -> Iterator[Metric]:
                for family in registry.collect():
                    if (family.name in mine) == keep_companion:
                        yield family

        return generate_latest(_Part())  # type: ignore[arg-type,unused-ignore] # any collector
