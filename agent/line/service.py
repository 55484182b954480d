"""The line, running in the hot path's process: the PLC links, the stations, and the
servers the line reads (when configured). :class:`agent.hotpath.HotPath` composes it:

- :meth:`LineService.wrap_source` gives a station's pipeline its triggered source;
- :meth:`LineService.answer` takes each triggered decision from the decision sink before
  it is logged (True: it came past the deadline);
- :meth:`stats` / :meth:`health` / :meth:`update_metrics` report it.

Start order: the links and stations start before the pipelines (a trigger that comes
while the model loads is answered with the fail-safe result at its deadline); stop
order: after the pipelines (their last decisions are still answered), before the log.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from agent.capture import Camera
from agent.config import AgentConfig
from agent.kernel.errors import EdgefleetError
from agent.line.handshake import Answer
from agent.line.link import PlcLink
from agent.line.recipes import Recipes
from agent.line.results import StationResult
from agent.line.servers.modbus import ModbusResultServer
from agent.line.servers.opcua import VisionServer
from agent.line.source import TriggeredSource
from agent.line.station import Station
from agent.metrics import AgentMetrics
from agent.pipeline.runner import Decision

log = logging.getLogger(__name__)

Alarm = Callable[[str, str], None]

LINK_DOWN = frozenset({"refused", "timeout", "disconnected", "unavailable"})
"""Failures that mean the PLC can't be reached (the ``plc_down`` alarm); a refused or
mistyped write is counted, and the connection is still up."""


class LineService:
    """Every ``[[plc]]`` link and ``[[stations]]`` entry of one agent."""

    def __init__(
        self,
        config: AgentConfig,
        *,
        metrics: AgentMetrics,
        on_alarm: Alarm | None = None,
        on_result: Callable[[StationResult], None] | None = None,
        recipes: Recipes | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics
        self._on_alarm = on_alarm
        self._on_result = on_result
        self.recipes = recipes
        self.opcua: VisionServer | None = None
        self.modbus: ModbusResultServer | None = None
        self.problems: list[str] = []
        """Servers that did not start, with why (the stations run without them)."""
        self.links: dict[str, PlcLink] = {}
        for link_cfg in config.plc:
            self.links[link_cfg.name] = PlcLink(
                link_cfg,
                driver_kw={"mqtt": config.mqtt} if link_cfg.driver == "mqtt" else None,
                on_failure=self._failure_counter(link_cfg.name, link_cfg.driver),
            )
        self.stations: dict[str, Station] = {}
        self._by_pipeline: dict[str, Station] = {}
        for st_cfg in config.stations:
            cam = _camera_of(config, st_cfg.pipeline)
            hardware = any(c.name == cam and c.trigger_mode == "hardware" for c in config.cameras)
            source = TriggeredSource(
                software_trigger=st_cfg.capture == "software_trigger" and cam is not None,
                window_ms=st_cfg.hardware_trigger_window_ms if hardware else None,
            )
            station = Station(
                st_cfg,
                source,
                self.links.get(st_cfg.plc) if st_cfg.plc else None,
                on_result=self._result,
                on_state=self._state,
            )
            self.stations[st_cfg.name] = station
            self._by_pipeline[st_cfg.pipeline] = station
        self._down: set[str] = set()

    @property
    def configured(self) -> bool:
        return bool(self.stations or self.links)

    @property
    def stations_wanted(self) -> bool:
        """Stations are configured: the sink and pipelines need their hooks."""
        return bool(self.stations)

    def start(self) -> None:
        self._start_servers()
        for station in self.stations.values():
            station.start()
        for link in self.links.values():
            link.start()

    def _start_servers(self) -> None:
        """The OPC UA and Modbus servers the line reads, when configured; one that can't
        start is a problem (and an alarm), and the stations run without it."""
        names = list(self.stations)
        cfg = self.config
        if cfg.opcua_server.enabled and names:
            try:
                server = VisionServer(
                    cfg.opcua_server,
                    names,
                    on_trigger=lambda st, part: self.stations[st].trigger(part, source="opcua"),
                    recipes=self.recipes.list if self.recipes else lambda _st: [],
                    select_recipe=(
                        self.recipes.select if self.recipes else lambda _st, _r: "no recipes"
                    ),
                    on_command=lambda st, what: self.stations[st].command(what),
                )
                server.start()
                self.opcua = server
            except EdgefleetError as exc:
                self._server_failed("opcua_server", str(exc))
        if cfg.modbus_server.enabled and names:
            try:
                modbus = ModbusResultServer(
                    cfg.modbus_server,
                    names,
                    lambda st: self.stations[st].trigger(source="modbus"),
                )
                modbus.start()
                self.modbus = modbus
            except (EdgefleetError, ValueError, OSError, RuntimeError) as exc:
                self._server_failed("modbus_server", str(exc))

    def _server_failed(self, which: str, why: str) -> None:
        self.problems.append(f"{which}: {why}")
        self._alarm("line_server", f"[{which}] not started: {why}")

    def stop(self, timeout_s: float = 2.0) -> None:
        for station in self.stations.values():
            station.stop(timeout_s / 2)
        for link in self.links.values():
            link.stop(timeout_s / 2)
        if self.opcua is not None:
            self.opcua.stop(timeout_s)
        if self.modbus is not None:
            self.modbus.stop()

    # -- the hot path's hooks ---------------------------------------------------------
    def wrap_source(self, pipeline: str, camera: Camera) -> TriggeredSource | None:
        station = self._by_pipeline.get(pipeline)
        return station.source.bind(camera) if station is not None else None

    def answer(self, d: Decision) -> bool:
        trigger = d.trigger
        station = self.stations.get(getattr(trigger, "station", ""))
        if station is None:
            return False
        rec = d.record
        return station.decided(
            trigger,
            Answer(
                outcome=rec.outcome,
                score=float(d.result.score),
                label=str(d.result.label),
                decision_id=rec.id,
                model_name=rec.model_name,
                model_version=rec.model_version,
            ),
        )

    # -- what it reports ------------------------------------------------------------------
    def _failure_counter(self, link: str, driver: str) -> Callable[[str, str], None]:
        family = self.metrics.line_failures

        def count(reason: str, detail: str) -> None:
            family.labels(link=link, driver=driver, reason=reason).inc()
            down = reason in LINK_DOWN
            if down and link not in self._down:
                self._down.add(link)
                self._alarm("plc_down", f"plc '{link}' ({driver}): {reason}: {detail}")

        return count

    def _result(self, r: StationResult) -> None:
        m = self.metrics
        m.station_results.labels(station=r.station, status=r.status).inc()
        m.station_latency.labels(station=r.station).observe(r.trigger_to_result_ms / 1000.0)
        for server in (self.opcua, self.modbus):
            if server is not None:
                server.on_result(r)
        if self._on_result is not None:
            self._on_result(r)

    def _state(self, station: str, state: str) -> None:
        if self.opcua is not None:
            self.opcua.set_state(station, state)
        if self.modbus is not None:
            self.modbus.set_busy(station, state == "SingleExecution")

    def _alarm(self, kind: str, message: str) -> None:
        log.warning("alarm %s: %s", kind, message)
        if self._on_alarm is not None:
            self._on_alarm(kind, message)

    def update_metrics(self) -> None:
        """Gauges from the links' state (the gauge thread calls this); a link that is
        connected again clears its alarm."""
        for name, link in self.links.items():
            self.metrics.line_connected.labels(link=name, driver=link.driver_key).set(
                1 if link.connected else 0
            )
            if link.connected and name in self._down:
                self._down.discard(name)
                self._alarm("plc_up", f"plc '{name}' connected again")

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "plc": {n: link.stats() for n, link in self.links.items()},
            "stations": {n: st.stats() for n, st in self.stations.items()},
        }
        if self.opcua is not None:
            out["opcua_server"] = self.opcua.stats()
        if self.modbus is not None:
            out["modbus_server"] = self.modbus.stats()
        if self.problems:
            out["problems"] = list(self.problems)
        return out

    def health(self) -> dict[str, Any]:
        """The line on /healthz: each link's connection and failures by reason word, each
        station's counts. A PLC that is down does not make the agent unhealthy (the
        stations answer with the fail-safe result; the link reconnects)."""
        return self.stats()


def _camera_of(config: AgentConfig, pipeline: str) -> str | None:
    for p in config.pipelines:
        if p.name == pipeline:
            return p.source
    return None
