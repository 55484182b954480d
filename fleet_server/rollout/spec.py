"""What a rollout is asked to do: bundle, selector, waves, soak and policy (parsing only).

The command-line forms (``--select 'line=3,profile=jetson-orin' --waves 1,10%,50%,100%
--soak 10m``) and the stored JSON forms both validate through :class:`RolloutSpec`;
:func:`parse_spec` turns a validation error into a :class:`RolloutError` naming the field.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import Field, ValidationError, field_validator

from agent.kernel.configbase import Section
from agent.wire.base import slug
from fleet_server.rollout.errors import RolloutError
from fleet_server.rollout.windows import check_zone, format_range, parse_range

_LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")
_SEMVER_ISH = re.compile(r"^\d+\.\d+\.\d+([-+][0-9A-Za-z.+-]+)?$")
MAX_SOAK_S = 7 * 86_400
ALL = "*"
"""The selector that selects every device, and the ``shifts`` key for every line."""


def parse_selector(text: str) -> dict[str, str]:
    """``'line=3,profile=jetson-orin'`` as ``{"line": "3", "profile": "jetson-orin"}``.

    ``'*'`` selects every device (an empty dict). Raises ValueError for an empty text, a
    term without ``=``, a repeated key or a malformed key or value.
    """
    text = text.strip()
    if text == ALL:
        return {}
    if not text:
        raise ValueError("empty selector; use '*' to select every device")
    out: dict[str, str] = {}
    for term in text.split(","):
        key, sep, value = (part.strip() for part in term.partition("="))
        if not sep:
            raise ValueError(f"selector term {term.strip()!r} is not key=value")
        _check_label(key, value)
        if key in out:
            raise ValueError(f"selector key {key!r} given twice")
        out[key] = value
    return out


def _check_label(key: str, value: str) -> None:
    if not _LABEL_KEY.match(key):
        raise ValueError(f"selector key {key!r}: lowercase letter first, then [a-z0-9_-]")
    if not _LABEL_VALUE.match(value):
        raise ValueError(f"selector value {value!r} for {key!r}: [A-Za-z0-9_.-], 1-64 chars")


def matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    """Whether a device with ``labels`` is selected (every selector term equal)."""
    return all(labels.get(k) == v for k, v in selector.items())


def parse_wave_step(text: str) -> tuple[bool, float]:
    """``'10%'`` → (True, 10.0), ``'5'`` → (False, 5.0); ValueError when out of range."""
    text = text.strip()
    if text.endswith("%"):
        try:
            value = float(text[:-1])
        except ValueError:
            raise ValueError(f"wave {text!r} is not a percentage like '10%'") from None
        if not 0 < value <= 100 or not math.isfinite(value):
            raise ValueError(f"wave {text!r}: a percentage must be above 0% and at most 100%")
        return True, value
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"wave {text!r} is neither a device count >= 1 nor a percentage")
    return False, float(int(text))


def parse_waves(text: str | Sequence[str]) -> list[str]:
    """Waves ``'1,10%,50%,100%'`` as their canonical texts, checked for order.

    Counts come first, then percentages; each kind strictly increasing; the last wave
    is ``100%``. Raises ValueError otherwise.
    """
    items = text.split(",") if isinstance(text, str) else list(text)
    if not items or items == [""]:
        raise ValueError("no waves; e.g. '1,10%,50%,100%'")
    steps = [parse_wave_step(str(item)) for item in items]
    out: list[str] = []
    for i, (pct, value) in enumerate(steps):
        if i:
            prev_pct, prev = steps[i - 1]
            if prev_pct and not pct:
                raise ValueError(f"wave {i + 1}: a device count after a percentage")
            if prev_pct == pct and value <= prev:
                raise ValueError(f"wave {i + 1}: {_fmt(pct, value)} is not above wave {i}")
        out.append(_fmt(pct, value))
    if out[-1] != "100%":
        raise ValueError(f"the last wave is {out[-1]}, it must be 100%")
    return out


def _fmt(pct: bool, value: float) -> str:
    return f"{value:g}%" if pct else str(int(value))


def resolve_waves(steps: Sequence[str], total: int) -> list[int]:
    """Cumulative device counts per wave for ``total`` devices.

    A count is capped at ``total``; a percentage is rounded up. Each wave adds at least one
    device; waves that would add none once every device is covered are dropped, so the
    result is strictly increasing and ends at ``total`` (empty when ``total`` is 0).
    """
    out: list[int] = []
    for step in steps:
        pct, value = parse_wave_step(step)
        want = math.ceil(value * total / 100 - 1e-9) if pct else int(value)
        have = out[-1] if out else 0
        if have >= total:
            break
        out.append(min(total, max(want, have + 1)))
    if out and out[-1] != total:
        out.append(total)
    return out


def parse_duration(text: str | int | float) -> int:
    """``'10m'``, ``'90s'``, ``'1h30m'``, ``'2d'`` or a number of seconds, as seconds."""
    if not isinstance(text, str):
        whole = not isinstance(text, bool) and math.isfinite(text) and int(text) == text >= 0
        if not whole:
            raise ValueError(f"{text!r} is not a whole number of seconds >= 0")
        return int(text)
    t = text.strip()
    if t.isdigit():
        return int(t)
    m = _DURATION.match(t)
    if not t or m is None:
        raise ValueError(f"{text!r} is not a duration like '90s', '10m', '1h30m' or '2d'")
    d, h, mi, s = (int(g) if g else 0 for g in m.groups())
    return ((d * 24 + h) * 60 + mi) * 60 + s


def parse_bundle(text: str) -> tuple[str, str]:
    """``'detector@1.4.0'`` as (name, version); ValueError when malformed."""
    name, sep, version = text.strip().partition("@")
    if not sep or not _SEMVER_ISH.match(version):
        raise ValueError(f"{text!r} is not NAME@VERSION (e.g. 'detector@1.4.0')")
    return slug(name, "bundle name"), version


class GatePolicy(Section):
    """Thresholds a wave must stay within; over any one of them the wave fails."""

    max_install_failures: int = Field(
        0, ge=0, description="Install failures tolerated (absolute floor of the allowance)."
    )
    max_install_failure_fraction: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Install failures tolerated as a fraction of the devices assigned so far; "
        "the allowance is the larger of this (rounded down) and max_install_failures.",
    )
    max_auto_rollbacks: int = Field(
        0, ge=0, description="Devices that rolled the new bundle back by themselves, tolerated."
    )
    max_worker_crashes: int = Field(
        0, ge=0, description="Worker crashes under the new bundle, summed over devices."
    )
    latency_budget_factor: float = Field(
        1.0, gt=0, description="A device is over budget when its p99 > budget x this factor."
    )
    max_devices_over_budget: int = Field(
        0, ge=0, description="Devices over the bundle's latency budget, tolerated."
    )
    max_p99_ratio: float | None = Field(
        1.25,
        gt=0,
        description="Highest median p99 of the new bundle / median p99 of the previous one "
        "on the same devices; null turns the check off.",
    )
    max_outcome_tvd: float | None = Field(
        0.1,
        ge=0,
        le=1,
        description="Highest total variation distance between the decision outcome "
        "distribution under the new bundle and under the previous one; null: off.",
    )
    min_outcome_samples: int = Field(
        200,
        ge=1,
        description="Decisions needed on each side before the outcome shift is judged; "
        "below it the check is skipped (and reported as skipped).",
    )
    min_accuracy: float | None = Field(
        None,
        ge=0,
        le=1,
        description="Lowest accepted Wilson lower bound of the new version's labelled accuracy "
        "(confirmed / reviewed review labels on the rollout's lines), judged once min_labels "
        "labels exist; a wave cannot pass before it is shown; null: off.",
    )
    min_labels: int = Field(
        100,
        ge=1,
        description="Review labels of the new version needed before min_accuracy is judged, "
        "and on each side before accuracy_drop is.",
    )
    accuracy_drop: float | None = Field(
        None,
        ge=0,
        le=1,
        description="Highest accepted drop of labelled accuracy (previous version minus new, "
        "on the same lines) when the drop is significant at accuracy_alpha; null: off.",
    )
    accuracy_alpha: float = Field(
        0.05,
        gt=0,
        lt=1,
        description="Significance level of the accuracy drop test (one-sided two-proportion "
        "z-test).",
    )
    accuracy_confidence: float = Field(
        0.95,
        gt=0,
        lt=1,
        description="Confidence of the Wilson interval of the labelled accuracy.",
    )
    shadow_confidence: float = Field(
        0.95,
        gt=0,
        lt=1,
        description="Confidence of the Wilson interval of the shadow phase's agreement.",
    )


class Timeouts(Section):
    """How long each waiting state may last before it moves on (see docs/rollouts.md)."""

    assigning_s: int = Field(
        7_200,
        gt=0,
        description="A wave's devices must report done or failed within this; else paused.",
    )
    awaiting_approval_s: int = Field(
        86_400, gt=0, description="Wait for approval between waves; then paused."
    )
    finishing_s: int = Field(
        86_400,
        gt=0,
        description="After the last wave, wait this long for offline devices; then "
        "completed_partial.",
    )
    paused_s: int = Field(
        7 * 86_400, gt=0, description="A paused rollout is cancelled after this long."
    )
    rolling_back_s: int = Field(
        3_600, gt=0, description="Wait for reverted devices to confirm; then rolled_back."
    )


class RolloutPolicy(Section):
    """Gates, approvals, rollback, shifts and timeouts of a rollout."""

    gates: GatePolicy = Field(default_factory=GatePolicy, description="Gate thresholds.")
    approval_between_waves: bool = Field(
        False, description="Wait for an operator's approve after each wave but the last."
    )
    rollback_done_waves_on_failure: bool = Field(
        True,
        description="On a failed gate, revert every device the rollout assigned to its "
        "previous bundle (else only pause).",
    )
    timezone: str = Field("UTC", description="IANA time zone the shift times are in.")
    shifts: dict[str, list[str]] = Field(
        default_factory=dict,
        description="Per line (the device label 'line'; '*' for every line): daily ranges "
        "'HH:MM-HH:MM' in which the line produces and no device of it is switched.",
    )
    timeouts: Timeouts = Field(default_factory=Timeouts, description="Per-state timeouts.")

    @field_validator("timezone")
    @classmethod
    def _zone(cls, value: str) -> str:
        return check_zone(value)

    @field_validator("shifts")
    @classmethod
    def _shifts(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for line, ranges in value.items():
            if line != ALL and not _LABEL_VALUE.match(line):
                raise ValueError(f"line {line!r}: [A-Za-z0-9_.-], 1-64 characters, or '*'")
            out[line] = [format_range(*parse_range(r)) for r in ranges]
        return out


class RolloutSpec(Section):
    """A rollout as asked for: what, to which devices, in which waves, under which policy."""

    bundle: str = Field(description="Bundle name (slug).")
    version: str = Field(description="Bundle version (semantic version).")
    selector: dict[str, str] = Field(
        description="Device labels that must all match ('line=3,profile=jetson-orin'); "
        "empty (or '*') selects every device."
    )
    waves: list[str] = Field(
        description="Cumulative wave sizes: counts, then percentages, ending with 100%."
    )
    soak_s: int = Field(
        description="How long a wave is watched after its last device settled ('10m')."
    )
    policy: RolloutPolicy = Field(default_factory=RolloutPolicy, description="Policy.")
    shadow_s: int = Field(
        0,
        ge=0,
        description="How long each wave may run the candidate in the devices' shadow slot "
        "before it switches ('2h'); the wave fails when agreement is not shown by then. "
        "0: no shadow phase.",
    )
    shadow_min: int = Field(
        500,
        ge=1,
        description="Sampled frames, pooled over the wave's devices, before the shadow "
        "agreement is judged.",
    )
    min_agreement: float = Field(
        0.97,
        ge=0,
        le=1,
        description="Lowest accepted Wilson lower bound of the shadow's agreement with the "
        "live model (same outcome), pooled over the wave's devices.",
    )

    @field_validator("bundle")
    @classmethod
    def _bundle(cls, value: str) -> str:
        return slug(value, "bundle name")

    @field_validator("version")
    @classmethod
    def _version(cls, value: str) -> str:
        if not _SEMVER_ISH.match(value):
            raise ValueError(f"{value!r} is not a semantic version (e.g. 1.2.3)")
        return value

    @field_validator("selector", mode="before")
    @classmethod
    def _selector(cls, value: Any) -> Any:
        if isinstance(value, str):
            return parse_selector(value)
        if isinstance(value, dict):
            for k, v in value.items():
                _check_label(str(k), str(v))
        return value

    @field_validator("waves", mode="before")
    @classmethod
    def _waves(cls, value: Any) -> Any:
        if isinstance(value, str | list | tuple):
            return parse_waves(value if isinstance(value, str) else [str(v) for v in value])
        return value

    @field_validator("soak_s", "shadow_s", mode="before")
    @classmethod
    def _soak(cls, value: Any) -> Any:
        if isinstance(value, str | int | float):
            seconds = parse_duration(value)
            if seconds > MAX_SOAK_S:
                raise ValueError(f"{value!r} is longer than {MAX_SOAK_S // 86_400} days")
            return seconds
        return value


def parse_spec(data: Mapping[str, Any]) -> RolloutSpec:
    """A :class:`RolloutSpec` from a mapping (``bundle`` may be ``'NAME@VERSION'``).

    Raises:
        RolloutError: naming the first invalid field (and how many more there are).
    """
    raw = dict(data)
    bundle = raw.get("bundle")
    if isinstance(bundle, str) and "@" in bundle:
        if "version" in raw:
            raise RolloutError("version", "given both in bundle NAME@VERSION and on its own")
        try:
            raw["bundle"], raw["version"] = parse_bundle(bundle)
        except ValueError as exc:
            raise RolloutError("bundle", str(exc)) from None
    try:
        return RolloutSpec.model_validate(raw)
    except ValidationError as exc:
        errors = exc.errors()
        first = errors[0]
        field = ".".join(str(p) for p in first["loc"])
        reason = "unknown key" if first["type"] == "extra_forbidden" else first["msg"]
        if len(errors) > 1:
            reason += f" (and {len(errors) - 1} more)"
        raise RolloutError(field, reason) from None
