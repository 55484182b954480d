"""Staged rollouts: spec parsing, a pure state machine, gates, and its JSON form.

The I/O shell (reconciliation loop) calls :func:`plan` once, then :func:`step` for every
device report, operator action and tick, stores the state with :func:`dumps`, and turns
the returned commands into signed directives and notifications. See docs/rollouts.md.
"""

from __future__ import annotations

from fleet_server.rollout.errors import RolloutError
from fleet_server.rollout.events import (
    Approve,
    AssignDirective,
    Cancel,
    Command,
    DeviceReport,
    Event,
    InstallOutcome,
    Notify,
    Pause,
    Resume,
    RevertDirective,
    Rollback,
    Tick,
)
from fleet_server.rollout.gates import DeviceSample, GateFail, GatePass, GateWait, evaluate, tvd
from fleet_server.rollout.machine import refusal, step
from fleet_server.rollout.plan import DeviceInfo, plan
from fleet_server.rollout.serialize import dumps, from_dict, loads, to_dict
from fleet_server.rollout.spec import (
    GatePolicy,
    RolloutPolicy,
    RolloutSpec,
    Timeouts,
    parse_duration,
    parse_selector,
    parse_spec,
    parse_waves,
    resolve_waves,
)
from fleet_server.rollout.state import (
    TERMINAL,
    BundleRef,
    DeviceState,
    DeviceStatus,
    Phase,
    Rollout,
    Wave,
)

__all__ = [
    "TERMINAL",
    "Approve",
    "AssignDirective",
    "BundleRef",
    "Cancel",
    "Command",
    "DeviceInfo",
    "DeviceReport",
    "DeviceSample",
    "DeviceState",
    "DeviceStatus",
    "Event",
    "GateFail",
    "GatePass",
    "GatePolicy",
    "GateWait",
    "InstallOutcome",
    "Notify",
    "Pause",
    "Phase",
    "Resume",
    "RevertDirective",
    "Rollback",
    "Rollout",
    "RolloutError",
    "RolloutPolicy",
    "RolloutSpec",
    "Tick",
    "Timeouts",
    "Wave",
    "dumps",
    "evaluate",
    "from_dict",
    "loads",
    "parse_duration",
    "parse_selector",
    "parse_spec",
    "parse_waves",
    "plan",
    "refusal",
    "resolve_waves",
    "step",
    "to_dict",
    "tvd",
]
