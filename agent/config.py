"""The agent's configuration file (TOML): typed, strict, with errors naming file and field.

Each subsystem declares its own section model next to its code; this module composes
them, resolves relative paths against the config file's directory, and checks the
cross-references (a pipeline's source must be a camera or sensor, a line's policy may
only name the outcomes the line defines).
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from agent.actions.config import ActionsConfig
from agent.capture.config import CameraConfig
from agent.decisionlog.config import DecisionLogConfig
from agent.directives.config import BundlesConfig
from agent.drift.config import DriftConfig
from agent.http import HttpConfig
from agent.kernel.configbase import MAX_MB, MAX_TIMEOUT_S, MAX_WORKERS, Section, dotted
from agent.kernel.errors import ConfigError
from agent.kernel.toml import MAX_CONFIG_BYTES, load_toml_file
from agent.line.config import InputConfig, OutputConfig, StationConfig
from agent.line.drivers.configs import PlcConfig
from agent.line.points import parse_point, writable
from agent.line.servers.config import ModbusServerConfig, OpcUaServerConfig
from agent.mqtt_config import LocalMqttConfig
from agent.policy import STANDARD_OUTCOMES, PolicySpec
from agent.remote.config import LogsConfig, RemoteConfig
from agent.sensors.config import SensorConfig
from agent.shadow.config import ShadowConfig
from agent.uplink.config import UplinkConfig
from agent.wire.messages import MAX_THUMBNAIL_BYTES
from agent.wire.topics import is_device_id

log = logging.getLogger(__name__)

DEPRECATED_SECTIONS = {"fleet": "bundles"}
"""Sections renamed, old name -> new: the old name is still read, with a warning, for one
release (``[fleet]`` became ``[bundles]``: it configures signed bundles, not the fleet)."""


PATH_MAX = 4096
NAME_MAX = 255
"""Linux's limits on a path and on one name in it, in bytes."""


def check_path(path: Path) -> Path:
    """``path`` when the system can hold it as a file name.

    Raises:
        ValueError: it holds a NUL character (no path can), is not encodable, or is longer
            than PATH_MAX bytes or has a name longer than NAME_MAX bytes.
    """
    text = str(path)
    if "\0" in text:
        raise ValueError(f"{text!r} holds a NUL character, which no path can")
    try:
        raw = os.fsencode(text)
    except UnicodeError:
        raise ValueError(f"{text!r} can't be encoded as a file name") from None
    if len(raw) >= PATH_MAX:
        raise ValueError(f"{text[:60]!r}... is {len(raw)} bytes, over {PATH_MAX - 1}")
    for part in path.parts:
        if len(os.fsencode(part)) > NAME_MAX:
            raise ValueError(f"{text[:60]!r}: the name {part[:40]!r}... is over {NAME_MAX} bytes")
    return path


def check_state_dir(path: Path) -> Path:
    """``path`` when it is a directory, or can be made one (its nearest existing ancestor
    is a directory), and the system can hold it (:func:`check_path`).

    Raises:
        ValueError: it can't be a path, or it or an ancestor exists and is not a directory.
    """
    check_path(path)
    if path.exists() or path.is_symlink():
        if not path.is_dir():
            raise ValueError(f"{path} exists and is not a directory")
        return path
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ValueError(f"{path} can't be created: {parent} is not a directory")
            break
    return path


class AgentSection(Section):
    """Who this device is and where it keeps its data."""

    device_id: str = Field(
        default_factory=socket.gethostname,
        validate_default=True,
        description="Device id (default: host name): 1-64 of A-Z a-z 0-9 _ . -, starting "
        "with a letter or digit (one MQTT topic level: no '/', '#' or '+').",
    )
    state_dir: Path = Field(
        Path("/var/lib/edgefleet"),
        description="Directory for the decision log, thumbnails and other state; a relative "
        "path is taken from the config file's directory.",
    )
    profile: str = Field("auto", description="Firmware profile name or TOML path; auto detects.")
    disk_budget_mb: float | None = Field(
        None,
        gt=0,
        le=MAX_MB,
        description="The device's one disk budget (MiB) for the state directory: the decision "
        "log with its thumbnails ([decision_log] budget_mb) and the outbox ([uplink] "
        "outbox_max_mb) must fit in it together; staged bundles use what is left.",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="Log level of the agent process."
    )

    @field_validator("device_id")
    @classmethod
    def _device_id(cls, value: str) -> str:
        if not is_device_id(value):
            shown = value if len(value) <= 80 else f"{value[:80]}... ({len(value)} characters)"
            raise ValueError(
                f"{shown!r} is not a device id (1-64 of A-Z a-z 0-9 _ . -, starting with a "
                "letter or digit; no '/', '#', '+' or spaces)"
            )
        return value

    @field_validator("state_dir")
    @classmethod
    def _state_dir(cls, value: Path) -> Path:
        return check_state_dir(value)


class RuntimeSection(Section):
    """Overrides of the firmware profile's worker pool settings."""

    workers: int | None = Field(
        None, ge=1, le=MAX_WORKERS, description="Worker processes (default: profile), 1-256."
    )
    pin: bool = Field(True, description="Pin each worker to one core.")
    heartbeat_timeout_s: float = Field(
        5.0, gt=0, le=3600, description="A worker silent this long between requests is replaced."
    )


class _BundleRef(Section):
    bundle: Path | None = Field(
        None,
        description="Bundle directory; with `installed`, the bundle used until one is installed.",
    )
    installed: str | None = Field(
        None,
        description="Name of a bundle the installer manages (signed, from the fleet or "
        "side-loaded); its active slot is used.",
    )

    @field_validator("bundle")
    @classmethod
    def _bundle_path(cls, value: Path | None) -> Path | None:
        return None if value is None else check_path(value)

    @model_validator(mode="after")
    def _one_source(self) -> _BundleRef:
        if self.bundle is None and self.installed is None:
            raise ValueError("give `bundle` (a directory) or `installed` (a bundle name)")
        return self


class ChainStage(_BundleRef):
    """A model run on every detection of the stage before (e.g. a classifier on crops)."""

    max_crops: int = Field(8, ge=1, le=64, description="At most this many crops per frame.")
    padding: float = Field(0.05, ge=0, le=1, description="Crop padding, fraction of box size.")


class PipelineConfig(_BundleRef):
    """One source's frames (or sensor windows) through one model or a chain."""

    name: str = Field(description="Pipeline name, used in metrics and the decision log.")
    source: str = Field(description="Name of the camera or sensor this pipeline reads.")
    chain: list[ChainStage] = Field(
        default_factory=list, description="Models run on the first model's detections."
    )
    policy: PolicySpec | None = Field(
        None, description="Rules for this pipeline (default: the line's, then the bundle's)."
    )
    deadline_ms: float | None = Field(
        None,
        gt=0,
        le=MAX_TIMEOUT_S * 1000,
        description="Drop a frame whose inference would start later than this.",
    )


class LineConfig(Section):
    """A production line: the outcomes it knows and its default policy."""

    outcomes: list[str] = Field(
        default_factory=lambda: list(STANDARD_OUTCOMES),
        description="Outcome names this line defines.",
    )
    policy: PolicySpec | None = Field(None, description="Policy for this line's pipelines.")


class AgentConfig(Section):
    """The whole agent configuration file."""

    agent: AgentSection = Field(default_factory=AgentSection, description="This device.")
    runtime: RuntimeSection = Field(default_factory=RuntimeSection, description="Worker pool.")
    mqtt: LocalMqttConfig = Field(default_factory=LocalMqttConfig, description="Local broker.")
    http: HttpConfig = Field(default_factory=HttpConfig, description="Local HTTP endpoint.")
    decision_log: DecisionLogConfig = Field(
        default_factory=DecisionLogConfig, description="Decision log."
    )
    actions: ActionsConfig = Field(default_factory=ActionsConfig, description="Actions.")
    cameras: list[CameraConfig] = Field(default_factory=list, description="Cameras.")
    sensors: list[SensorConfig] = Field(default_factory=list, description="Sensors.")
    lines: dict[str, LineConfig] = Field(default_factory=dict, description="Production lines.")
    pipelines: list[PipelineConfig] = Field(default_factory=list, description="Pipelines.")
    bundles: BundlesConfig = Field(
        default_factory=BundlesConfig,
        description="Signed bundles from the fleet (formerly [fleet], still read for one release).",
    )
    uplink: UplinkConfig = Field(
        default_factory=UplinkConfig, description="Reports to the fleet (state, health...)."
    )
    shadow: ShadowConfig = Field(
        default_factory=ShadowConfig,
        description="A candidate in a bundle's shadow slot, run beside the live model.",
    )
    drift: DriftConfig = Field(
        default_factory=DriftConfig,
        description="Drift histograms per model version, line, source and bucket.",
    )

    plc: list[PlcConfig] = Field(
        default_factory=list, description="PLC connections (OPC UA, Modbus TCP, Logix, S7, MQTT)."
    )
    stations: list[StationConfig] = Field(
        default_factory=list, description="Triggered inspection stations (see docs/stations.md)."
    )
    opcua_server: OpcUaServerConfig = Field(
        default_factory=OpcUaServerConfig,
        description="The agent as an OPC UA Machine Vision server (off by default).",
    )
    modbus_server: ModbusServerConfig = Field(
        default_factory=ModbusServerConfig,
        description="The agent as a Modbus TCP server (off by default).",
    )
    remote: RemoteConfig = Field(
        default_factory=RemoteConfig,
        description="The fleet's signed remote actions: logs, restart, reload, diagnostics.",
    )
    logs: LogsConfig = Field(
        default_factory=LogsConfig,
        description="The agent's own rotating log files (when its log is not the journal).",
    )

    def uses_installer(self) -> bool:
        return self.bundles.enabled or any(
            ref.installed for p in self.pipelines for ref in (p, *p.chain)
        )

    @field_validator("cameras", "sensors", "pipelines", "plc", "stations")
    @classmethod
    def _unique_names(cls, items: list[Any]) -> list[Any]:
        seen: set[str] = set()
        for item in items:
            if item.name in seen:
                raise ValueError(f"name '{item.name}' is used twice")
            seen.add(item.name)
        return items

    def source_line(self, source: str) -> str:
        for cam in self.cameras:
            if cam.name == source:
                return cam.line
        for sensor in self.sensors:
            if sensor.name == source:
                return sensor.line
        raise KeyError(source)

    def digest(self) -> str:
        """The config hash every decision records (sha256 of the canonical JSON)."""
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:16]


def _cross_check(cfg: AgentConfig, path: str) -> None:
    budget = cfg.agent.disk_budget_mb
    shares = cfg.decision_log.budget_mb + (cfg.uplink.outbox_max_mb if cfg.uplink.enabled else 0)
    if budget is not None and shares > budget:
        raise ConfigError(
            path,
            "agent.disk_budget_mb",
            f"{budget:g} MiB is less than decision_log.budget_mb ({cfg.decision_log.budget_mb:g}) "
            f"+ uplink.outbox_max_mb ({cfg.uplink.outbox_max_mb:g}) = {shares:g} MiB",
        )
    uploads = cfg.uplink.enabled and cfg.uplink.upload_thumbnails
    if uploads and cfg.decision_log.thumbnails != "none":
        biggest = cfg.decision_log.thumbnail_max_bytes
        if biggest > MAX_THUMBNAIL_BYTES:
            raise ConfigError(
                path,
                "decision_log.thumbnail_max_bytes",
                f"{biggest} bytes is over the {MAX_THUMBNAIL_BYTES} a thumbnail upload carries; "
                "lower it, or set uplink.upload_thumbnails = false",
            )
    sources = {c.name for c in cfg.cameras} | {s.name for s in cfg.sensors}
    for i, p in enumerate(cfg.pipelines):
        if p.source not in sources:
            known = ", ".join(sorted(sources)) or "none configured"
            raise ConfigError(
                path, f"pipelines[{i}].source", f"no camera or sensor '{p.source}' ({known})"
            )
        line = cfg.source_line(p.source)
        allowed = set(cfg.lines[line].outcomes) if line in cfg.lines else None
        if p.policy is not None and allowed is not None:
            extra = p.policy.outcomes() - allowed
            if extra:
                raise ConfigError(
                    path,
                    f"pipelines[{i}].policy",
                    f"outcome(s) {sorted(extra)} not defined by line '{line}' {sorted(allowed)}",
                )
    _check_stations(cfg, path)
    for name, line_cfg in cfg.lines.items():
        if line_cfg.policy is not None:
            extra = line_cfg.policy.outcomes() - set(line_cfg.outcomes)
            if extra:
                raise ConfigError(
                    path, f"lines.{name}.policy", f"outcome(s) {sorted(extra)} not in outcomes"
                )


def _check_stations(cfg: AgentConfig, path: str) -> None:
    """Each station's pipeline reads a camera and has no other station; its connection
    exists; every address parses in its driver's syntax for its type; its fail-safe
    outcome is one its line defines."""
    links = {link.name: link for link in cfg.plc}
    for i, sensor in enumerate(cfg.sensors):
        if sensor.kind != "plc":
            continue
        sensor_link = links.get(sensor.plc)
        if sensor_link is None:
            known = ", ".join(sorted(links)) or "none configured"
            raise ConfigError(path, f"sensors[{i}].plc", f"no [[plc]] '{sensor.plc}' ({known})")
        for j, sensor_point in enumerate(sensor.points):
            try:
                parse_point(sensor_link.driver, sensor_point.point, sensor_point.type)
            except ValueError as exc:
                raise ConfigError(path, f"sensors[{i}].points[{j}].point", str(exc)) from None
    pipelines = {p.name: p for p in cfg.pipelines}
    cameras = {c.name: c for c in cfg.cameras}
    taken: dict[str, str] = {}
    for i, st in enumerate(cfg.stations):
        where = f"stations[{i}]"
        pipe = pipelines.get(st.pipeline)
        if pipe is None:
            known = ", ".join(sorted(pipelines)) or "none configured"
            raise ConfigError(path, f"{where}.pipeline", f"no pipeline '{st.pipeline}' ({known})")
        if pipe.source not in cameras:
            why = f"pipeline '{pipe.name}' reads '{pipe.source}', not a camera"
            raise ConfigError(path, f"{where}.pipeline", why)
        if pipe.name in taken:
            why = f"pipeline '{pipe.name}' already belongs to station '{taken[pipe.name]}'"
            raise ConfigError(path, f"{where}.pipeline", why)
        taken[pipe.name] = st.name
        _check_pairing(st, cameras[pipe.source], path, where)
        line = cfg.source_line(pipe.source)
        if line in cfg.lines and st.fail_safe not in cfg.lines[line].outcomes:
            raise ConfigError(
                path,
                f"{where}.fail_safe",
                f"'{st.fail_safe}' is not an outcome of line '{line}' {cfg.lines[line].outcomes}",
            )
        if st.plc is None:
            continue
        link = links.get(st.plc)
        if link is None:
            known = ", ".join(sorted(links)) or "none configured"
            raise ConfigError(path, f"{where}.plc", f"no [[plc]] '{st.plc}' ({known})")
        named: list[tuple[str, InputConfig | OutputConfig | None]] = [
            ("trigger", st.trigger),
            ("part_id", st.part_id),
            ("ack", st.ack),
        ]
        named += [(f"outputs[{j}]", out) for j, out in enumerate(st.outputs)]
        for field, point in named:
            if point is None:
                continue
            try:
                parsed = parse_point(link.driver, point.point, point.type)
            except ValueError as exc:
                raise ConfigError(path, f"{where}.{field}.point", str(exc)) from None
            if isinstance(point, OutputConfig) and not writable(link.driver, parsed):
                why = (
                    f"{point.point!r} is read only on a {link.driver} PLC: an output can't go there"
                )
                raise ConfigError(path, f"{where}.{field}.point", why)


def _check_pairing(st: StationConfig, camera: CameraConfig, path: str, where: str) -> None:
    """A hardware-triggered camera is paired by the window, and only it."""
    hardware = camera.trigger_mode == "hardware"
    if hardware and st.capture == "software_trigger":
        why = (
            f"camera '{camera.name}' is triggered by its input line (trigger_mode = "
            '"hardware"): its frames are paired by hardware_trigger_window_ms, leave '
            "capture unset"
        )
        raise ConfigError(path, f"{where}.capture", why)
    if not hardware and "hardware_trigger_window_ms" in st.model_fields_set:
        why = (
            f"applies to a camera with trigger_mode = \"hardware\"; camera '{camera.name}' "
            f"is {camera.trigger_mode}"
        )
        raise ConfigError(path, f"{where}.hardware_trigger_window_ms", why)


def _resolve_paths(data: dict[str, Any], base: Path) -> None:
    agent = data.get("agent")
    if isinstance(agent, dict) and isinstance(agent.get("state_dir"), str):
        agent["state_dir"] = str(base / agent["state_dir"])
    for pipe in data.get("pipelines") or []:
        if not isinstance(pipe, dict):
            continue
        if isinstance(pipe.get("bundle"), str):
            pipe["bundle"] = str(base / pipe["bundle"])
        for stage in pipe.get("chain") or []:
            if isinstance(stage, dict) and isinstance(stage.get("bundle"), str):
                stage["bundle"] = str(base / stage["bundle"])
    bundles = data.get("bundles")
    if isinstance(bundles, dict) and isinstance(bundles.get("initial_root"), str):
        bundles["initial_root"] = str(base / bundles["initial_root"])
    for sensor in data.get("sensors") or []:
        if isinstance(sensor, dict) and sensor.get("kind") == "replay" and sensor.get("path"):
            sensor["path"] = str(base / sensor["path"])
    for cam in data.get("cameras") or []:
        if isinstance(cam, dict) and cam.get("kind") in ("file", "images") and cam.get("uri"):
            cam["uri"] = str(base / cam["uri"])
    for link in data.get("plc") or []:
        if not isinstance(link, dict):
            continue
        for key in ("certificate", "private_key", "server_certificate"):
            if isinstance(link.get(key), str):
                link[key] = str(base / link[key])


def _rename_deprecated(data: dict[str, Any], path: str) -> dict[str, str]:
    """Read a section under its old name (:data:`DEPRECATED_SECTIONS`), with a warning;
    the sections renamed, new name -> old, so that errors name what the file says.

    Raises:
        ConfigError: both the old and the new name are given.
    """
    renamed: dict[str, str] = {}
    for old, new in DEPRECATED_SECTIONS.items():
        if old not in data:
            continue
        if new in data:
            raise ConfigError(
                path, old, f"[{old}] is the deprecated name of [{new}]; give only [{new}]"
            )
        log.warning(
            "%s: [%s] is deprecated and will not be read in the next release: rename it [%s]",
            path or "config",
            old,
            new,
        )
        data[new] = data.pop(old)
        renamed[new] = old
    return renamed


def parse_config(data: dict[str, Any], path: str = "", base: Path | None = None) -> AgentConfig:
    """Validate an already-parsed config mapping.

    Raises:
        ConfigError: naming ``path`` and the first offending field (all of them in the
            message when several are wrong).
    """
    renamed = _rename_deprecated(data, path)
    if base is not None:
        _resolve_paths(data, base)
    try:
        cfg = AgentConfig.model_validate(data)
    except ValidationError as e:
        errors = e.errors()
        first = errors[0]
        loc = tuple(first["loc"])
        if loc and loc[0] in renamed:
            loc = (renamed[str(loc[0])], *loc[1:])
        field = dotted(loc)
        reason = str(first["msg"]).removeprefix("Value error, ")
        if first["type"] == "extra_forbidden":
            reason = "unknown key"
        if len(errors) > 1:
            others = "; ".join(f"{dotted(tuple(x['loc']))}: {x['msg']}" for x in errors[1:4])
            reason += f" (and {len(errors) - 1} more: {others})"
        raise ConfigError(path, field, reason) from None
    _cross_check(cfg, path)
    return cfg


def load_config(path: Path) -> AgentConfig:
    """Read and validate ``path`` (TOML). Relative paths inside are taken from its directory.

    Raises:
        ConfigError: the file is missing, not TOML, or not a valid configuration.
    """
    data = load_toml_file(path, MAX_CONFIG_BYTES)
    return parse_config(data, str(path), path.resolve().parent)
