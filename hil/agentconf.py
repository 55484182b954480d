"""The agent configuration a device under test runs (agent.toml), from a few settings.

One camera (a looped video file, or an MJPEG stream when the scenario takes the stream
away), the text-direction classifier on every frame, and a robot action on *every*
outcome, so that the robot topic carries one message per decision and the harness can
count what reached local actions. Uplink intervals are short so that a short run still
produces enough telemetry to check.

With a :class:`StationSettings`, the device also runs an inspection station: a second
camera (synthetic, fired by the station's software trigger) with its own pipeline on the
same bundle, triggered and answered by a Modbus TCP PLC on the LAN (the register map is
:data:`STATION_MAP`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

BUNDLE = "text-cls"
"""The bundle the device runs (the installer manages it; rollouts target it)."""
ROBOT_TOPIC = "factory/{line}/{source}/{outcome}"
ROBOT_FILTER = "factory/#"
LOCAL_MQTT_PORT = 1883
HTTP_PORT = 9464


STATION = "gate"
"""The station's name (decision log, /healthz, metrics)."""
STATION_CAMERA = "cam2"
STATION_PLC = "plc1"
STATION_MAP = {
    "trigger": 0,  # hr:0-1, uint32, stepped once per part by the PLC (edge = "change")
    "part_id": 2,  # hr:2-9, 8 registers of text
    "outcome_code": 20,
    "status": 21,
    "seq": 22,  # hr:22-23, uint32
    "part_echo": 30,  # hr:30-37: the part id the result is for
    "result_valid": 0,  # coil:0, written last
}
"""The station's Modbus map: holding registers (``hr``) and one coil."""
PART_REGS = 8


@dataclass(frozen=True)
class StationSettings:
    """An inspection station on a Modbus TCP PLC at ``host:port``.

    Attributes:
        host: the PLC's address (as the device reaches it).
        port: its Modbus TCP port.
        deadline_ms: trigger to result, else the fail-safe result.
        timeout_ms: the PLC link's call timeout.
        poll_ms: how often the trigger counter is read.
        reconnect_max_s: the link's longest wait between reconnects.
    """

    host: str
    port: int
    deadline_ms: float = 2000.0
    timeout_ms: float = 500.0
    poll_ms: float = 10.0
    reconnect_max_s: float = 2.0


@dataclass
class AgentSettings:
    """What differs between devices and scenarios.

    Attributes:
        device_id: the device.
        video: path of the video on the device (file camera), unless ``camera_url``.
        bundle_dir: path of the fallback bundle directory on the device.
        camera_url: an http:// MJPEG URL instead of the video file.
        fps: frames per second the camera delivers.
        profile: firmware profile name.
        health_interval_s, heartbeat_interval_s, decisions_interval_s,
        reconnect_max_s: the uplink's pace.
        decisions_batch: most decision rows in one upload batch.
        outbox: more ``[uplink]`` outbox settings (outbox_max_mb, drain_rate_per_s ...).
        drop_order: the outbox's drop policy, written out so that a scenario checks
            against what the device was configured with.
        health_window_s: the installer's health window after a switch.
        fetch_timeout_s: timeout of one bundle chunk request.
        station: an inspection station on a PLC (None: none).
    """

    device_id: str
    video: str
    bundle_dir: str
    camera_url: str | None = None
    fps: float = 15.0
    profile: str = "auto"
    health_interval_s: float = 1.0
    heartbeat_interval_s: float = 1.0
    decisions_interval_s: float = 1.0
    reconnect_max_s: int = 3
    decisions_batch: int = 200
    outbox: dict[str, float] = field(default_factory=dict)
    drop_order: tuple[str, ...] = ("health", "event", "decisions")
    health_window_s: float = 4.0
    fetch_timeout_s: float = 5.0
    station: StationSettings | None = None


def _toml(value: Any) -> str:
    """A TOML scalar (strings JSON-quoted, which TOML accepts for basic strings)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(str(value))


def render(s: AgentSettings) -> str:
    """The agent.toml text for ``s`` (state in ``state/`` beside the file)."""
    if s.camera_url:
        camera = f'kind = "http"\nuri = {_toml(s.camera_url)}\nstall_timeout_s = 2.0\n'
    else:
        camera = f'kind = "file"\nuri = {_toml(s.video)}\nloop = true\n'
    outbox = "".join(f"{k} = {_toml(v)}\n" for k, v in sorted(s.outbox.items()))
    return f"""# Written by the HIL harness for device {s.device_id}.
[agent]
device_id = {_toml(s.device_id)}
state_dir = "state"
profile = {_toml(s.profile)}
log_level = "warning"

[runtime]
workers = 1
pin = false

[mqtt]
host = "127.0.0.1"
port = {LOCAL_MQTT_PORT}

[http]
host = "127.0.0.1"
port = {HTTP_PORT}

[decision_log]
thumbnails = "none"

[[cameras]]
name = "cam1"
{camera}fps = {_toml(s.fps)}
line = "line1"

[[pipelines]]
name = "orientation"
source = "cam1"
installed = {_toml(BUNDLE)}
bundle = {_toml(s.bundle_dir)}

[pipelines.policy]
default = "pass"
rules = [
  {{ outcome = "reject", label = "180", min_score = 0.8 }},
  {{ outcome = "review", max_score = 0.8 }},
]

[uplink]
enabled = true
heartbeat_interval_s = {_toml(s.heartbeat_interval_s)}
health_interval_s = {_toml(s.health_interval_s)}
decisions_interval_s = {_toml(s.decisions_interval_s)}
reconnect_max_s = {_toml(s.reconnect_max_s)}
decisions_batch = {_toml(s.decisions_batch)}
drop_order = {_toml(s.drop_order)}
{outbox}
[bundles]
enabled = true
fetch_timeout_s = {_toml(s.fetch_timeout_s)}
installer = {{ health_window_s = {_toml(s.health_window_s)}, benchmark_runs = 5 }}

[[actions.actions]]
name = "robot"
kind = "mqtt"
topic = {_toml(ROBOT_TOPIC)}
qos = 1
outcomes = ["pass", "reject", "review"]
""" + (_station(s.station, s.bundle_dir) if s.station is not None else "")


def _station(st: StationSettings, bundle_dir: str) -> str:
    """The station's camera, pipeline, PLC link and ``[[stations]]`` entry (TOML: array
    entries may follow other tables)."""
    m = STATION_MAP
    outputs = [
        (f"hr:{m['outcome_code']}", "int16", "outcome_code"),
        (f"hr:{m['status']}", "uint16", "status"),
        (f"hr:{m['seq']}", "uint32", "seq"),
        (f"hr:{m['part_echo']}:{PART_REGS}", "string", "part_id"),
        (f"coil:{m['result_valid']}", "bool", "result_valid"),
    ]
    lines = ",\n".join(
        f"  {{ point = {_toml(p)}, type = {_toml(t)}, value = {_toml(v)} }}" for p, t, v in outputs
    )
    trigger = (
        f'{{ point = "hr:{m["trigger"]}", type = "uint32", edge = "change", '
        f"poll_ms = {_toml(st.poll_ms)} }}"
    )
    part_id = f'{{ point = "hr:{m["part_id"]}:{PART_REGS}", type = "string" }}'
    return f"""
[[cameras]]
name = {_toml(STATION_CAMERA)}
kind = "synthetic"
fps = 30.0
width = 320
height = 240
trigger_mode = "software"
line = "line1"

[[pipelines]]
name = "station"
source = {_toml(STATION_CAMERA)}
bundle = {_toml(bundle_dir)}

[[plc]]
name = {_toml(STATION_PLC)}
driver = "modbus"
host = {_toml(st.host)}
port = {_toml(st.port)}
timeout_ms = {_toml(st.timeout_ms)}
reconnect_max_s = {_toml(st.reconnect_max_s)}

[[stations]]
name = {_toml(STATION)}
pipeline = "station"
plc = {_toml(STATION_PLC)}
capture = "software_trigger"
deadline_ms = {_toml(st.deadline_ms)}
fail_safe = "reject"
trigger = {trigger}
part_id = {part_id}
outputs = [
{lines},
]
"""
