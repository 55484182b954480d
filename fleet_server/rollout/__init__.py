"""Staged rollouts: spec parsing, a pure state machine, gates, and its JSON form.

The I/O shell (reconciliation loop) calls :func:`plan` once, then :func:`step` for every
device report, operator action and tick, stores the state with :func:`dumps`, and turns
the returned commands into signed directives and notifications. See docs/rollouts.md.
"""

from __future__ import annotations

from fleet_server.rollout.errors import RolloutError
from fleet_server.rollout.events import (
    MODE_ACTIVE,
    MODE_SHADOW,
    RESOLUTIONS,
    Approve,
    AssignDirective,
    Cancel,
    Command,
    DeviceReport,
    Event,
    InstallOutcome,
    LabelReport,
    Notify,
    Pause,
    Resolve,
    Resume,
    RevertDirective,
    RevertRefused,
    Rollback,
    ShadowReport,
    Tick,
)
from fleet_server.rollout.gates import (
    DeviceSample,
    GateFail,
    GatePass,
    GateWait,
    LabelCounts,
    evaluate,
    tvd,
)
from fleet_server.rollout.machine import outstanding, refusal, step, step_all
from fleet_server.rollout.plan import DeviceInfo, plan
from fleet_server.rollout.serialize import dumps, from_dict, loads, to_dict
from fleet_server.rollout.shadowgate import ShadowSample, evaluate_shadow
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
    "MODE_ACTIVE",
    "MODE_SHADOW",
    "RESOLUTIONS",
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
    "LabelCounts",
    "LabelReport",
    "Notify",
    "Pause",
    "Phase",
    "Resolve",
    "Resume",
    "RevertDirective",
    "RevertRefused",
    "Rollback",
    "Rollout",
    "RolloutError",
    "RolloutPolicy",
    "RolloutSpec",
    "ShadowReport",
    "ShadowSample",
    "Tick",
    "Timeouts",
    "Wave",
    "dumps",
    "evaluate",
    "evaluate_shadow",
    "from_dict",
    "loads",
    "outstanding",
    "parse_duration",
    "parse_selector",
    "parse_spec",
    "parse_waves",
    "plan",
    "refusal",
    "resolve_waves",
    "step",
    "step_all",
    "to_dict",
    "tvd",
]
