"""The new-rollout form: its fields as a rollout spec, and the preview of which devices
each wave would reach.

The form carries the id the rollout will get (generated when the form is first shown),
because the planner's device order is a hash of rollout id and device id: the preview
plans with that id, so the devices it lists per wave are the ones the rollout will
assign, provided they are online and outside their line's shift when the wave runs.
Devices offline now are listed apart: the controller assigns them when they are back,
in whichever wave runs then.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from sqlalchemy.engine import Engine

from fleet_server.db import store
from fleet_server.rollout import BundleRef, DeviceInfo, DeviceStatus, RolloutError, plan
from fleet_server.rollout.collect import health_facts
from fleet_server.rollout.spec import ALL, RolloutSpec, parse_spec
from fleet_server.rollout.windows import in_ranges
from fleet_server.web.bundles import Catalog

ROLLOUT_ID = re.compile(r"^ro-[0-9a-f]{12}$")
SHOWN_PER_WAVE = 24
"""Device ids listed per wave in the preview (the rest are counted)."""


def new_rollout_id() -> str:
    """An id in the rollout service's form (``ro-`` and 12 hex digits)."""
    return f"ro-{secrets.token_hex(6)}"


@dataclass
class RolloutForm:
    """The form's fields as typed (strings), so a refused form is shown again as it was."""

    rollout_id: str = ""
    bundle: str = ""
    selector: str = ""
    """Blank until the operator chooses: a new form selects no device (``*`` is every
    device, typed on purpose)."""
    waves: str = "1,10%,50%,100%"
    soak: str = "10m"
    approval: str = ""
    rollback_on_failure: str = "on"
    timezone: str = "UTC"
    shifts: str = ""
    max_install_failures: str = "0"
    max_p99_ratio: str = "1.25"
    max_outcome_tvd: str = "0.1"
    shadow: str = ""
    shadow_min: str = "500"
    min_agreement: str = "0.97"
    min_accuracy: str = ""
    min_labels: str = "100"
    accuracy_drop: str = ""

    @classmethod
    def from_fields(cls, data: Mapping[str, str]) -> RolloutForm:
        """The form from posted fields (unknown ones ignored; a missing checkbox is off).

        A field posted blank stays blank (a "blank: off" gate is off); only a field not
        posted at all takes its default.
        """
        names = {f.name for f in fields(cls)}
        given = {k: v.strip() for k, v in data.items() if k in names}
        given.setdefault("approval", "")
        given.setdefault("rollback_on_failure", "")
        return cls(**given)

    def shift_map(self) -> dict[str, list[str]]:
        """``LINE: HH:MM-HH:MM, ...`` per line of the text as the policy's ``shifts``.

        Raises:
            RolloutError: a line without ``LINE:`` or a line named twice.
        """
        out: dict[str, list[str]] = {}
        for n, raw in enumerate(self.shifts.splitlines(), 1):
            text = raw.strip()
            if not text:
                continue
            line, sep, ranges = text.partition(":")
            line = line.strip()
            if not sep or not line or not re.match(r"^\s*\d{1,2}:\d{2}\s*-", ranges):
                raise RolloutError(
                    "policy.shifts", f"line {n} {text!r} is not 'LINE: HH:MM-HH:MM, ...' "
                    f"(LINE a line label or '{ALL}')",
                )  # fmt: skip
            if line in out:
                raise RolloutError("policy.shifts", f"line {line!r} is named twice")
            out[line] = [r.strip() for r in ranges.split(",") if r.strip()]
        return out

    def spec_data(self) -> dict[str, Any]:
        """The spec as :func:`parse_spec` takes it.

        Raises:
            RolloutError: a gate field that is not a number.
        """
        gates = _numbers(
            "policy.gates.",
            (
                ("max_install_failures", self.max_install_failures, int),
                ("max_p99_ratio", self.max_p99_ratio, float),
                ("max_outcome_tvd", self.max_outcome_tvd, float),
                ("min_accuracy", self.min_accuracy, float),
                ("min_labels", self.min_labels, int),
                ("accuracy_drop", self.accuracy_drop, float),
            ),
        )
        shadow = _numbers(
            "",
            (
                ("shadow_min", self.shadow_min, int),
                ("min_agreement", self.min_agreement, float),
            ),
        )
        if not self.selector:
            raise RolloutError(
                "selector", f"choose the devices: labels like site=plant-a,line=2, or {ALL} "
                "for every device",
            )  # fmt: skip
        return {
            "bundle": self.bundle,
            "selector": self.selector,
            "waves": self.waves,
            "soak_s": self.soak,
            "shadow_s": self.shadow or 0,
            **{k: v for k, v in shadow.items() if v is not None},
            "policy": {
                "approval_between_waves": bool(self.approval),
                "rollback_done_waves_on_failure": bool(self.rollback_on_failure),
                "timezone": self.timezone or "UTC",
                "shifts": self.shift_map(),
                "gates": gates,
            },
        }

    def spec(self) -> RolloutSpec:
        """The validated spec.

        Raises:
            RolloutError: naming the first field that is wrong.
        """
        if not ROLLOUT_ID.match(self.rollout_id):
            raise RolloutError("rollout_id", f"{self.rollout_id!r} is not 'ro-' and 12 hex digits")
        if "@" not in self.bundle:
            raise RolloutError("bundle", "choose a published bundle (NAME@VERSION)")
        return parse_spec(self.spec_data())


_REQUIRED = frozenset({"max_install_failures", "min_labels", "shadow_min", "min_agreement"})
"""Number fields a blank does not turn off (a blank one takes its default)."""


def _numbers(prefix: str, items: Sequence[tuple[str, str, type]]) -> dict[str, Any]:
    """The typed values of number fields; a blank optional one is None (check off), a
    blank required one is left out (the spec's default).

    Raises:
        RolloutError: a field that is not a number, naming it.
    """
    out: dict[str, Any] = {}
    for key, text, kind in items:
        if not text:
            if key not in _REQUIRED:
                out[key] = None
            elif key == "max_install_failures":
                out[key] = 0
            continue
        try:
            out[key] = kind(text)
        except ValueError:
            what = "a whole number" if kind is int else "a number, or blank for off"
            raise RolloutError(f"{prefix}{key}", f"{text!r} is not {what}") from None
    return out


@dataclass(frozen=True)
class WavePreview:
    """One wave: how many devices it adds, which, and on which site/line."""

    number: int
    target: int
    devices: Sequence[str]
    groups: Mapping[str, int]

    @property
    def shown(self) -> Sequence[str]:
        return self.devices[:SHOWN_PER_WAVE]


@dataclass(frozen=True)
class Preview:
    """The rollout the form would create, as planned now."""

    rollout_id: str
    spec: RolloutSpec
    release: int
    budget_ms: float | None
    selected: int
    waves: Sequence[WavePreview]
    already: Sequence[str] = ()
    offline: Sequence[str] = ()
    in_shift: Sequence[str] = field(default_factory=list)


def release_of(catalog: Catalog, spec: RolloutSpec) -> tuple[int, float | None]:
    """The newest published release of ``spec``'s NAME@VERSION and its latency budget.

    Raises:
        RolloutError: not published.
    """
    found = [b for b in catalog.repo.bundles(spec.bundle) if b.version == spec.version]
    if not found:
        raise RolloutError("bundle", f"{spec.bundle}@{spec.version} is not published")
    bundle = max(found, key=lambda b: b.release)
    manifest = catalog.manifest(bundle)
    return bundle.release, manifest.latency_budget_ms if manifest is not None else None


def _group(labels: Mapping[str, str]) -> str:
    return f"{labels.get('site', '—')} / line {labels.get('line', '—')}"


def preview(
    engine: Engine, catalog: Catalog, form: RolloutForm, now: float | None = None
) -> Preview:
    """Plan the form's rollout against the registry as it is now (nothing is stored).

    Raises:
        RolloutError: an invalid field, a bundle not published, no device selected.
    """
    spec = form.spec()
    release, budget = release_of(catalog, spec)
    at = time.time() if now is None else now
    infos = []
    for d in store.list_devices(engine, spec.selector, include_revoked=False):
        active = None
        if d.active_bundle is not None and d.active_release is not None:
            active = BundleRef(d.active_bundle, d.active_release)
        _, p99, outcomes = health_facts(d.health)
        labels = {**d.labels, store.PROFILE_KEY: d.profile}
        infos.append(DeviceInfo(d.device_id, labels, d.online, active, p99, outcomes))
    rollout = plan(form.rollout_id, spec, release, infos, at, budget)
    queue = [i for i in rollout.order if rollout.devices[i].status is DeviceStatus.PENDING]
    waves, taken = [], 0
    for wave in rollout.waves:
        ids = queue[taken : wave.target]
        groups: dict[str, int] = {}
        for i in ids:
            key = _group(rollout.devices[i].labels)
            groups[key] = groups.get(key, 0) + 1
        waves.append(WavePreview(wave.index + 1, wave.target, ids, groups))
        taken = max(taken, wave.target)
    shifts = spec.policy.shifts
    held = [
        line
        for line, ranges in sorted(shifts.items())
        if in_ranges(ranges, at, spec.policy.timezone)
    ]
    return Preview(
        rollout_id=form.rollout_id,
        spec=spec,
        release=release,
        budget_ms=budget,
        selected=len(rollout.devices),
        waves=waves,
        already=[i for i, d in rollout.devices.items() if d.status is DeviceStatus.DONE],
        offline=[i for i in rollout.order if rollout.devices[i].status is DeviceStatus.OFFLINE],
        in_shift=held,
    )
